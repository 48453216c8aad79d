"""A/B in one process: engine with pointwise vs without (pointwise.available patched False). Per-step and total."""
import sys, statistics, time, functools, collections, os
sys.path.insert(0, "/work/main")
import numpy as np
from bench import models as bm
import minfer_core.plan as plan
from minfer_core import Engine
from minfer_ops_numba import pointwise
name = sys.argv[1]; batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
model = bm.build(name, batch); feeds = bm.random_feeds(model)
CUR = {}
orig = plan.generate
def label(fn):
    f = fn
    for _ in range(4):
        while isinstance(f, functools.partial): f = f.func
        f = getattr(f, "fn", f)
    return (getattr(f, "__module__", "") or "").split(".")[-1] + ":" + (getattr(f, "__qualname__", None) or type(f).__name__)
def timed_generate(steps):
    T = CUR["T"]; L = CUR["L"]
    wrapped = []
    for i, (fn, *rest) in enumerate(steps):
        def w(*a, _fn=fn, _i=i, **k):
            t = time.perf_counter_ns(); r = _fn(*a, **k); T[_i].append(time.perf_counter_ns() - t)
            o = r[0] if isinstance(r, (tuple, list)) else r
            if _i not in L: L[_i] = (label(_fn), getattr(o, "shape", None))
            return r
        wrapped.append((w, *rest))
    return orig(wrapped)
STEPS = "--steps" in sys.argv
if STEPS: plan.generate = timed_generate
engines = {}
for lab in ("new", "old"):
    if lab == "old":
        pass
        import minfer_core
        reg = minfer_core.get_registry()
        saved = {key: list(v) for key, v in reg.kernels.items()}
        for key, v in reg.kernels.items():
            reg.kernels[key] = [k for k in v if os.environ["DROP"] not in f"{k.fn.__module__}:{getattr(k.fn, '__qualname__', '')}"]
    CUR.update(T=collections.defaultdict(list), L={})
    e = Engine(model, threads=2)
    for _ in range(5): e.run(None, feeds)
    engines[lab] = (e, CUR["T"], CUR["L"])
pointwise._AVAILABLE = None
reg.kernels.update(saved)
for lab in engines: engines[lab][1].clear()
tot = {k: [] for k in engines}
for _ in range(8):
    for lab, (e, T, L) in engines.items():
        time.sleep(0.1)
        for _ in range(15):
            t = time.perf_counter(); e.run(None, feeds); tot[lab].append(time.perf_counter() - t)
print(name, " ".join(f"{lab} {statistics.median(v)*1e3:.3f} ms" for lab, v in tot.items()), "modes", [list(engines[l][0].executor.teams.values()) for l in engines])
if STEPS:
    rows = {lab: [(engines[lab][2][i][0], engines[lab][2][i][1], statistics.median(engines[lab][1][i]) / 1e3) for i in sorted(engines[lab][1])] for lab in engines}
    for (ln, sn, tn), (lo, so, to) in zip(rows["new"], rows["old"]):
        if ln != lo or abs(tn - to) > 10:
            print(f"{ln[-30:]:<30} {str(sn):<20} {tn:7.1f} | {lo[-30:]:<30} {to:7.1f}  d={tn-to:+.1f}")
