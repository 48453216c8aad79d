"""Session 26: the float stem conv by stem_rows.py's direct loop (A) against fewchannels.py's im2col + GEMM (B) in one
process: run medians and the stem step's in-run median. env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python
bench/results/session26/stem_ab.py MODEL [BATCH]"""
import sys, time, statistics, collections
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
from bench import models as bm
import minfer_core.plan as plan
from minfer_core import Engine
import minfer_ops_numba.fewchannels as fc
T = collections.defaultdict(list)
orig = plan.generate
tag = ["A"]
def gen(steps):
    wrapped = list(steps)
    fn, *rest = steps[0]
    key = tag[0]
    def w(*a, _fn=fn, **k):
        t = time.perf_counter_ns(); r = _fn(*a, **k); T[key].append(time.perf_counter_ns() - t); return r
    wrapped[0] = (w, *rest)
    return orig(wrapped)
plan.generate = gen
model = bm.build(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1)
feeds = bm.random_feeds(model)
A = Engine(model, threads=2)
A.run(None, feeds)
tag[0] = "B"
real = fc.direct.fits
fc.direct.fits = lambda *a: False
B = Engine(model, threads=2)
B.run(None, feeds)
fc.direct.fits = real
T.clear()
tt = {"A": [], "B": []}
for r in range(10):
    for k, e in (("A", A), ("B", B)):
        time.sleep(0.1)
        for _ in range(30):
            t = time.perf_counter(); e.run(None, feeds); tt[k].append(time.perf_counter() - t)
print(sys.argv[1], "direct(A) vs gemm(B): run ms", {k: round(statistics.median(v)*1e3, 3) for k, v in tt.items()}, "stem us", {k: round(statistics.median(v)/1e3, 1) for k, v in T.items()})
