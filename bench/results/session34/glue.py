"""Where a run's time goes between compiled code and Python, per kernel.

``python bench/results/session34/glue.py FORMAT RUNS [MODEL]`` from the checkout (FORMAT float, qdq, qdq_pc,
qoperator or dynamic; MODEL a bench.models name, mobilenet_v2 by default): each step's median time, the time inside
the numba dispatchers its Python calls (each module-level one of minfer-ops-numba wrapped with a timer), and the
rest, Python "glue" (numpy calls, the kernels' own Python), summed per kernel. Run it with no other load.
"""
import statistics, sys, tempfile, time, importlib, pkgutil
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import minfer_core.sequential as seq
from minfer_core import Engine
from bench import models as bench_models
from bench.quantized import quantize
from minfer_parallel.loops import _store
fmt = sys.argv[1]; runs = int(sys.argv[2]); name = sys.argv[3] if len(sys.argv) > 3 else "mobilenet_v2"
model = bench_models.build(name, 1); model.ir_version = bench_models.ORT_IR_VERSION
feeds = bench_models.random_feeds(model)
eng = Engine(quantize(model, fmt, feeds, Path(tempfile.mkdtemp()) / fmt)) if fmt != "float" else Engine(model)
for _ in range(5): eng.run(None, feeds)
import numba, minfer_ops_numba
from numba.core.registry import CPUDispatcher
ACC = [0.0]
def wrap(d):
    def w(*a, **k):
        t0 = time.perf_counter(); r = d(*a, **k); ACC[0] += time.perf_counter() - t0; return r
    return w
n = 0
for m in pkgutil.iter_modules(minfer_ops_numba.__path__):
    mod = importlib.import_module(f"minfer_ops_numba.{m.name}")
    for k, v in list(vars(mod).items()):
        if isinstance(v, CPUDispatcher):
            setattr(mod, k, wrap(v)); n += 1
print("wrapped", n)
TOT, COMP = [], []
def ex(vals, steps):
    tt, cc = [], []
    for i, (fn, ins, out0, outs, free) in enumerate(steps):
        ACC[0] = 0.0
        t0 = time.perf_counter(); res = fn(*[vals[s] for s in ins]); tt.append(time.perf_counter() - t0); cc.append(ACC[0])
        _store(vals, res, out0, outs, free)
    TOT.append(tt); COMP.append(cc)
orig = seq.execute; seq.execute = ex
for _ in range(runs): eng.run(None, feeds)
seq.execute = orig
nodes = eng.executor.program.step_nodes
t = [statistics.median(c) * 1e6 for c in zip(*TOT)]; c = [statistics.median(x) * 1e6 for x in zip(*COMP)]
g = [statistics.median([a - b for a, b in zip(x, y)]) * 1e6 for x, y in zip(zip(*TOT), zip(*COMP))]
from collections import defaultdict
by = defaultdict(lambda: [0, 0.0, 0.0])
steps = eng.executor.plans.bound[eng.executor.plans.last]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session28"))
from steps import kernel_name
for i, node in enumerate(nodes):
    kn = kernel_name(steps[i]); by[kn][0] += 1; by[kn][1] += t[i]; by[kn][2] += g[i]
for kn, (cnt, tt, gg) in sorted(by.items(), key=lambda x: -x[1][2]):
    print(f"{kn:45s} n={cnt:3d} total {tt:8.1f} glue {gg:7.1f} us ({gg/cnt:.1f}/call)")
print(f"run: total {sum(t):.0f} us, glue {sum(g):.0f} us")
