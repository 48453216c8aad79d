"""The Python time of chosen functions in a run: each call's time less the time inside minfer-ops-numba's compiled
functions it calls (each module-level dispatcher wrapped with a timer), medians per call.

``python bench/results/session35/gluefn.py FORMAT RUNS MODEL MODULE:QUALNAME ...`` from the checkout, e.g.
``dynamic 200 mobilenet_v2 minfer_ops_numba.qconv:ScaledConv.__call__ minfer_ops_numba.qconv:ScaledConv._input``.
Nested wrapped functions count in their callers' Python too; each wrapper adds ~0.5 us. Run it with no other load.
"""
import sys, tempfile, time, statistics, importlib, pkgutil
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
from minfer_core import Engine
from bench import models as bm
from bench.quantized import quantize
fmt, runs, name = sys.argv[1], int(sys.argv[2]), sys.argv[3]
model = bm.build(name, 1); model.ir_version = bm.ORT_IR_VERSION
feeds = bm.random_feeds(model)
eng = Engine(quantize(model, fmt, feeds, Path(tempfile.mkdtemp()) / fmt)) if fmt != "float" else Engine(model)
for _ in range(5): eng.run(None, feeds)
import minfer_ops_numba
from numba.core.registry import CPUDispatcher
pc = time.perf_counter
COMP = [0.0]
def wrapd(d):
    def w(*a, **k):
        t0 = pc(); r = d(*a, **k); COMP[0] += pc() - t0; return r
    return w
for m in pkgutil.iter_modules(minfer_ops_numba.__path__):
    mod = importlib.import_module(f"minfer_ops_numba.{m.name}")
    for k, v in list(vars(mod).items()):
        if isinstance(v, CPUDispatcher): setattr(mod, k, wrapd(v))
R = {}
def wrapf(label, f):
    def w(*a, **k):
        c0 = COMP[0]; t0 = pc(); r = f(*a, **k); t = pc() - t0; c = COMP[0] - c0
        R.setdefault(label, []).append((t, c)); return r
    return w
for spec in sys.argv[4:]:
    modname, qual = spec.split(":")
    mod = importlib.import_module(modname)
    parts = qual.split("."); owner = mod
    for p in parts[:-1]: owner = getattr(owner, p)
    setattr(owner, parts[-1], wrapf(qual, getattr(owner, parts[-1])))
R.clear()
for _ in range(runs): eng.run(None, feeds)
for k, v in R.items():
    tot = statistics.median([t for t, c in v]) * 1e6; gl = statistics.median([t - c for t, c in v]) * 1e6
    print(f"{k:35s} calls/run {len(v)/runs:5.1f}  total {tot:7.2f}  python {gl:6.2f} us")
