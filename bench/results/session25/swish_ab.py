"""Session 25's Swish A/B: a model with activation_fusion's Swish form and without it (the pass's `_swish` matcher
replaced by one that declines, while the second engine builds), in one process, alternating rounds.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session25/swish_ab.py detector 1 swish 20
"""
import sys, time, statistics
sys.path.insert(0, str(__import__("pathlib").Path(__file__).resolve().parents[3]))
import numpy as np
from bench import models as bm
from minfer_core import Engine
name, batch, pname = sys.argv[1], int(sys.argv[2]), sys.argv[3]
rounds = int(sys.argv[4]) if len(sys.argv) > 4 else 16
model = bm.build(name, batch); feeds = bm.random_feeds(model)
import minfer_passes.activation as act
es = {"with": Engine(model, threads=2)}
keep, act._swish = act._swish, lambda g, x: None
es["without"] = Engine(model, threads=2)
act._swish = keep
for e in es.values():
    for _ in range(10): e.run(None, feeds)
o = [e.run(None, feeds)[0] for e in es.values()]
print("max abs diff", float(np.max(np.abs(o[0] - o[1]))), "max", float(np.max(np.abs(o[1]))))
t = {k: [] for k in es}
for r in range(rounds):
    for k in (list(es) if r % 2 == 0 else list(es)[::-1]):
        time.sleep(0.05)
        for _ in range(10):
            a = time.perf_counter(); es[k].run(None, feeds); t[k].append(time.perf_counter() - a)
for k in es: print(f"{name} b{batch} {k} {pname}: median {statistics.median(t[k])*1e3:.3f} ms")
