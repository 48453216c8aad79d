"""Session 27: smallconv.py's compiled units on a small map, its output channels split over the threads only where
the conv reads its input as it lies or has as many output channels as output cells (A, as installed), against the
rule before, channels on every map of at most SMALL_MAP cells (B): there each thread copied the whole im2col. One
process, two threads, the runs alternating; the run medians and smallconv's team calls' medians by output shape.

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session27/im2col_split_ab.py MODEL ...
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


def old_compiled_plan(self, x):
    """Node.compiled_plan as it was before session 27 (the channel split on every small map)."""
    _, _, _, shape, made, parts = self.plan(x, smallconv.PLAN_PARTS, smallconv.TEAM_SPLIT_MACS,
                                            smallconv.COMPILED_UNIT_BYTES)
    m, cells = shape[1], shape[2] * shape[3]
    blocks = [(0, m)]
    if parts > 1 and shape[0] < parts and cells <= smallconv.SMALL_MAP:
        _, _, _, _, made, _ = self.plan(x, 1, unit=smallconv.COMPILED_UNIT_BYTES)
        step = -(-m // (parts * 16)) * 16
        blocks = [(m0, min(m, m0 + step)) for m0 in range(0, m, step)]
    found = np.array([[r[0].start, r[0].stop, r[2].start, r[2].stop, m0, m1] for *_, r in made
                      for m0, m1 in blocks], np.int64)
    geos = np.array([[*(geo if geo is not None else (0,) * 11), shape[3]] for geo, *_ in made
                     for _ in blocks], np.int64)
    direct = made[0][0] is None
    size = 1 if direct else max(int(np.prod(cols_shape)) for _, cols_shape, _, _ in made)
    return found, geos, size, direct, shape


def compare(name, rounds=8, repeat=10):
    model = bm.build(name, 1)
    feeds = bm.random_feeds(model)
    engines = {"A": Engine(model, threads=2)}
    new = smallconv.Node.compiled_plan
    smallconv.Node.compiled_plan = old_compiled_plan
    try:
        engines["B"] = Engine(model, threads=2)
        engines["B"].run(None, feeds)  # its plans made now, the old way
    finally:
        smallconv.Node.compiled_plan = new
    alternate(name, engines, feeds, rounds, repeat)


def alternate(name, engines, feeds, rounds, repeat, least=0.0):
    """Engines A and B's runs in turns (blocks of ``repeat``, ``rounds`` times), smallconv's team calls timed: prints
    the run medians, and the calls' medians by (output channels, output cells, im2col rows) where A's and B's
    differ by more than ``least`` (a share)."""
    outs = [e.run(None, feeds)[0] for e in engines.values()]
    real = smallconv.team_units

    def timed(*args):
        start = time.perf_counter_ns()
        result = real(*args)
        CALLS[(LABEL[0], (args[4].shape[1], args[4].shape[2], args[2].shape[1]))].append(time.perf_counter_ns() - start)
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
    for s in sorted({s for _, s in CALLS}):
        a, b = CALLS.get(("A", s)), CALLS.get(("B", s))
        if a and b and abs(statistics.median(a) / statistics.median(b) - 1) > least:
            print(f"   (M, cells, K+1) {s}: A {statistics.median(a) / 1e3:.1f} us, B {statistics.median(b) / 1e3:.1f} us")
    CALLS.clear()


if __name__ == "__main__":
    for model_name in sys.argv[1:] or ["resnet50"]:
        compare(model_name)
