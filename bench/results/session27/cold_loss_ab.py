"""Session 27: the core's timed kernel choices with a second round for every candidate within COLD_LOSS of the
best (A, as installed) against the rule before, CLEAR_LOSS after the first round (B), in one process: each engine
builds with its own empty choice store, then their runs alternate (two threads). Prints the run medians, the
build (first run included) times, and the nodes whose kernel the two rules chose differently.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session27/cold_loss_ab.py MODEL ...

Compiled kernels come from numba's cache as usual (NUMBA_CACHE_DIR, or MINFER_CACHE's numba folder as it is set
when this starts); only the choice stores are fresh.
"""
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
os.environ.setdefault("NUMBA_CACHE_DIR", str(Path(os.environ.get("MINFER_CACHE") or Path.home() / ".cache" / "minfer")
                                              / "numba"))

import minfer_core.tuning as tuning  # noqa: E402
from bench import models as bm  # noqa: E402
from minfer_core import Engine  # noqa: E402


def build(model, cold_loss):
    os.environ["MINFER_CACHE"] = tempfile.mkdtemp(prefix="minfer-choices-")
    saved, tuning.COLD_LOSS = tuning.COLD_LOSS, cold_loss
    try:
        start = time.perf_counter()
        engine = Engine(model, threads=2)
        took = time.perf_counter() - start
    finally:
        tuning.COLD_LOSS = saved
    return engine, took, dict(tuning.store().data)


def compare(name, rounds=8, repeat=10):
    model = bm.build(name, 1)
    feeds = bm.random_feeds(model)
    built = {"A": build(model, tuning.COLD_LOSS), "B": build(model, tuning.CLEAR_LOSS)}
    engines = {k: v[0] for k, v in built.items()}
    runs = {k: [] for k in engines}
    for e in engines.values():
        for _ in range(5):
            e.run(None, feeds)
    for _ in range(rounds):
        for k, e in engines.items():
            time.sleep(0.05)
            for _ in range(repeat):
                t = time.perf_counter()
                e.run(None, feeds)
                runs[k].append(time.perf_counter() - t)
    print(f"{name}: run ms", {k: round(statistics.median(v) * 1e3, 3) for k, v in runs.items()},
          "build s", {k: round(v[1], 2) for k, v in built.items()})
    a, b = built["A"][2], built["B"][2]
    for key in sorted(set(a) & set(b)):
        if a[key] != b[key]:
            print(f"   {key.split('|')[0]} {key.split('|')[3][:40]}: A {a[key].split(':')[-1]}  B {b[key].split(':')[-1]}")


if __name__ == "__main__":
    for model_name in sys.argv[1:] or ["resnet50"]:
        compare(model_name)
