"""A model's MatMul/Gemm layers of a constant B (linear.py) on pointwise.py's micro-kernel against BLAS (the path
before): two engines of the model in one process, one built with `TILED_DEPTH` as it is, one with it 0 (the path is
chosen at build), run in turn in blocks of 20 runs.

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session30/linear_ab.py [MODEL [BATCH
[ROUNDS]]]`` from the checkout: the run's median either way and how far the outputs differ.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench import models as bench_models  # noqa: E402
from minfer_core import Engine  # noqa: E402
from minfer_ops_numba import linear  # noqa: E402


def main() -> None:
    name = sys.argv[1] if len(sys.argv) > 1 else "transformer"
    batch = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 15
    model = bench_models.build(name, batch)
    feeds = bench_models.random_feeds(model)
    depth = linear.TILED_DEPTH
    engines = {"tiled": Engine(model)}
    linear.TILED_DEPTH = 0
    engines["blas"] = Engine(model)
    linear.TILED_DEPTH = depth
    times: dict[str, list[float]] = {label: [] for label in engines}
    outs = {}
    for _ in range(rounds):
        for label, engine in engines.items():
            outs[label] = engine.run(None, feeds)[0]
            for _ in range(20):
                start = time.perf_counter()
                engine.run(None, feeds)
                times[label].append(time.perf_counter() - start)
    diff = float(abs(outs["tiled"] - outs["blas"]).max())
    print(f"{name} b{batch}: " + ", ".join(f"{k} {statistics.median(v) * 1e6:.0f} us" for k, v in times.items())
          + f" (medians of {rounds * 20} runs each; outputs differ by at most {diff:.2e})", flush=True)


if __name__ == "__main__":
    main()
