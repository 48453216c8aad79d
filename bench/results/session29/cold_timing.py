"""Engines of MobileNetV2 (float or a quantized form) built with the core's timing as it is and with a cold-cache
timing (a 4 MB buffer written before each candidate's timed call), each with its own empty choice store, then
run alternately (medians of 300 runs).

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session29/cold_timing.py dynamic``
from the checkout (or qdq, float).
"""
import os, sys, statistics, tempfile, time
sys.path.insert(0, '.')
from pathlib import Path
import numpy as np
from bench import models as bm
from bench.quantized import quantize
import minfer_core.tuning as T
from minfer_core import Engine
fmt = sys.argv[1]
m = bm.build("mobilenet_v2", 1); m.ir_version = bm.ORT_IR_VERSION
feeds = bm.random_feeds(m)
model = m if fmt == "float" else quantize(m, fmt, feeds, Path(tempfile.mkdtemp()) / fmt)
orig = T.seconds
junk = np.zeros(1 << 20, np.float32)
def cold(fn, *a, **k):
    np.add(junk, 1.0, out=junk)  # 4 MB written: the candidate's inputs leave L2
    return orig(fn, *a, **k)
E = {}
for label, timer in (("warm", orig), ("cold", cold)):
    os.environ["MINFER_CACHE"] = tempfile.mkdtemp()
    T.seconds = timer
    e = Engine(model); e.run(None, feeds); E[label] = e
T.seconds = orig
for e in E.values():
    for _ in range(5): e.run(None, feeds)
W = {k: [] for k in E}
for _ in range(300):
    for k, e in E.items():
        t = time.perf_counter(); e.run(None, feeds); W[k].append(time.perf_counter() - t)
print(fmt, {k: round(statistics.median(v) * 1e6) for k, v in W.items()})
