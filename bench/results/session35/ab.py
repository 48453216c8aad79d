"""Per-step A/B of a module attribute's two values: the same engine switched between alternate runs.

``python bench/results/session35/ab.py FORMAT RUNS MODEL MODULE ATTR OFF ON`` from the checkout (FORMAT float, qdq,
qdq_pc, qoperator or dynamic; ATTR may be dotted, Class.attribute; OFF and ON Python expressions evaluated in
MODULE's namespace before either is set): whether both give the
same output bits, each step whose median moved by more than 3 us, the sums of the step medians and the unpatched
runs' medians. E.g. ``... dynamic 300 mobilenet_v2 minfer_ops_numba.qmatmul FEW_ROWS 0 4`` (the dynamic classifier
on igemm, then on `FewRows`). Session 34's ab_fixed.py, for any attribute.
"""
import statistics, sys, tempfile, time, importlib
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
import minfer_core.sequential as seq
from minfer_core import Engine
from bench import models as bench_models
from bench.quantized import quantize
from minfer_parallel.loops import execute_timed
fmt, runs, name, modname, attr = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
mod = importlib.import_module(modname)
vals = {False: eval(sys.argv[6], vars(mod)), True: eval(sys.argv[7], vars(mod))}
model = bench_models.build(name, 1); model.ir_version = bench_models.ORT_IR_VERSION
feeds = bench_models.random_feeds(model)
eng = Engine(quantize(model, fmt, feeds, Path(tempfile.mkdtemp()) / fmt)) if fmt != "float" else Engine(model)
owner = mod  # ATTR may be dotted (Class.attribute): set on the class
for part in attr.split(".")[:-1]: owner = getattr(owner, part)
def set_on(on): setattr(owner, attr.split(".")[-1], vals[on])
for _ in range(5): eng.run(None, feeds)
set_on(False); ref = eng.run(None, feeds)[0]; set_on(True); got = eng.run(None, feeds)[0]
print("same bits", ref.tobytes() == got.tobytes())
REC = {True: [], False: []}; WALL = {True: [], False: []}
orig = seq.execute
for r in range(runs):
    on = r % 2 == 0; set_on(on)
    seq.execute = lambda vals, steps: REC[on].append(execute_timed(vals, steps)); eng.run(None, feeds); seq.execute = orig
    t0 = time.perf_counter(); eng.run(None, feeds); WALL[on].append(time.perf_counter() - t0)
nodes = eng.executor.program.step_nodes
med = {k: [statistics.median(c) * 1e6 for c in zip(*v)] for k, v in REC.items()}
for i, n in enumerate(nodes):
    d = med[True][i] - med[False][i]
    if abs(d) > 3: print(i, n.op_type, n.outputs[0][:25], f"off {med[False][i]:.1f} on {med[True][i]:.1f} diff {d:+.1f}")
print(f"sum of step medians off {sum(med[False]):.0f} on {sum(med[True]):.0f} us")
print(f"wall median off {statistics.median(WALL[False]) * 1e3:.3f} on {statistics.median(WALL[True]) * 1e3:.3f} ms")
