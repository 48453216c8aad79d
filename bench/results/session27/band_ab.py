"""Session 27: smallconv.py's compiled units with L2-sized bands where the packed weights are small (A, as installed)
against 4 MB units for every conv (B: SMALL_WEIGHT_BYTES set below any weight while B plans its shapes). One process,
two threads, the runs alternating; the run medians and, where they differ by over 5%, smallconv's team calls'
medians by (output channels, output cells, im2col rows).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session27/band_ab.py MODEL ...
"""
import collections
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
import numpy as np  # noqa: E402

from bench import models as bm  # noqa: E402
from minfer_core import Engine  # noqa: E402
from minfer_ops_numba import smallconv  # noqa: E402

CALLS: dict = collections.defaultdict(list)
LABEL = ["A"]


def compare(name, rounds=8, repeat=10):
    model = bm.build(name, 1)
    feeds = bm.random_feeds(model)
    engines = {"A": Engine(model, threads=2)}
    saved, smallconv.SMALL_WEIGHT_BYTES = smallconv.SMALL_WEIGHT_BYTES, -1
    try:
        engines["B"] = Engine(model, threads=2)
        engines["B"].run(None, feeds)  # its plans made now, with 4 MB units
    finally:
        smallconv.SMALL_WEIGHT_BYTES = saved
    outs = [e.run(None, feeds)[0] for e in engines.values()]
    real = smallconv.team_units

    def timed(*args):
        start = time.perf_counter_ns()
        result = real(*args)
        CALLS[(LABEL[0], args[4].shape[1], args[4].shape[2], args[2].shape[1])].append(time.perf_counter_ns() - start)
        return result

    smallconv.team_units = timed
    runs = {k: [] for k in engines}
    try:
        for e in engines.values():
            for _ in range(5):
                e.run(None, feeds)
        for _ in range(rounds):
            for k, e in engines.items():
                LABEL[0] = k
                time.sleep(0.05)
                for _ in range(repeat):
                    t = time.perf_counter()
                    e.run(None, feeds)
                    runs[k].append(time.perf_counter() - t)
    finally:
        smallconv.team_units = real
    print(f"{name}: |A - B| max {np.abs(outs[0] - outs[1]).max():.1e}; run ms",
          {k: round(statistics.median(v) * 1e3, 3) for k, v in runs.items()}, flush=True)
    for s in sorted({key[1:] for key in CALLS}):
        a, b = CALLS.get(("A",) + s), CALLS.get(("B",) + s)
        if a and b and abs(statistics.median(a) / statistics.median(b) - 1) > 0.05:
            print(f"   (M, cells, K+1) {s}: A {statistics.median(a) / 1e3:.1f} us, B {statistics.median(b) / 1e3:.1f} us")
    CALLS.clear()


if __name__ == "__main__":
    for model_name in sys.argv[1:] or ["resnet50"]:
        compare(model_name)
