"""Session 26: a quantized model's stem FloatQLinearConv by qstem.py (A) against igemm (B) in one process, and the
stem's parts. env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session26/qstem_ab.py
mobilenet_v2 qdq|qoperator"""
import sys, time, statistics, collections, tempfile
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
from pathlib import Path
from bench import models as bm
from bench.quantized import quantize
import minfer_core.plan as plan
from minfer_core import Engine
import minfer_ops_numba.qstem as qs
import numpy as np
name, fmt = sys.argv[1], sys.argv[2]
model = bm.build(name, 1)
feeds = bm.random_feeds(model)
folder = tempfile.mkdtemp()
model = quantize(model, fmt, feeds, Path(folder) / fmt)
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
A = Engine(model, threads=2); A.run(None, feeds)
tag[0] = "B"
real = qs.fits
qs.fits = lambda *a: False
B = Engine(model, threads=2); B.run(None, feeds)
qs.fits = real
print("A stem kernel:", A.program.specs[0].kernel.op_type, "same:", np.abs(A.run(None, feeds)[0] - B.run(None, feeds)[0]).max())
T.clear()
tt = {"A": [], "B": []}
for r in range(10):
    for k, e in (("A", A), ("B", B)):
        time.sleep(0.1)
        for _ in range(20):
            t = time.perf_counter(); e.run(None, feeds); tt[k].append(time.perf_counter() - t)
print(name, fmt, "qstem(A) vs not(B): run ms", {k: round(statistics.median(v)*1e3, 3) for k, v in tt.items()}, "first step us", {k: round(statistics.median(v)/1e3, 1) for k, v in T.items()})
import minfer_ops_numba.qconv as qc
S = collections.defaultdict(list)
def timed(cls, name, label):
    real = getattr(cls, name)
    def w(self, *a, **k):
        t = time.perf_counter_ns(); r = real(self, *a, **k); S[label].append(time.perf_counter_ns() - t); return r
    setattr(cls, name, w)
timed(qs.QStem, "__call__", "stem sums")
timed(qc.QConv, "finish", "finish")
rc = qs.centered
def cw(*a):
    t = time.perf_counter_ns(); r = rc(*a); S["centered"].append(time.perf_counter_ns() - t); return r
qs.centered = cw
for _ in range(200): A.run(None, feeds)
print({k: round(statistics.median(v[-150:])/1e3, 1) for k, v in S.items()}, {k: len(v) for k, v in S.items()})
