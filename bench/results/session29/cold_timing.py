"""Engines of MobileNetV2 (float or a quantized form) built with the core's timing as it is and with a cold-cache
timing (a 4 MB buffer written before each candidate's timed call), each with its own empty choice store, then
run alternately (medians of 300 runs).

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session29/cold_timing.py dynamic``
from the checkout (or qdq, float).
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import minfer_core.tuning as tuning  # noqa: E402

from bench import models as bench_models  # noqa: E402
from bench.quantized import quantize  # noqa: E402

JUNK = np.zeros(1 << 20, np.float32)
WARM = tuning.seconds


def cold(fn, *args, **kwargs):
    """`tuning.seconds` after writing 4 MB: the candidate's inputs and weights leave L2 first."""
    np.add(JUNK, 1.0, out=JUNK)
    return WARM(fn, *args, **kwargs)


def main() -> None:
    from minfer_core import Engine

    fmt = sys.argv[1]
    model = bench_models.build("mobilenet_v2", 1)
    model.ir_version = bench_models.ORT_IR_VERSION
    feeds = bench_models.random_feeds(model)
    if fmt != "float":
        model = quantize(model, fmt, feeds, Path(tempfile.mkdtemp()) / fmt)
    engines = {}
    for label, timer in (("warm", WARM), ("cold", cold)):
        os.environ["MINFER_CACHE"] = tempfile.mkdtemp()  # an empty store: every choice timed now, by ``timer``
        tuning.seconds = timer
        engines[label] = Engine(model)
        engines[label].run(None, feeds)
    tuning.seconds = WARM
    for engine in engines.values():
        for _ in range(5):
            engine.run(None, feeds)
    walls: dict[str, list[float]] = {label: [] for label in engines}
    for _ in range(300):
        for label, engine in engines.items():
            start = time.perf_counter()
            engine.run(None, feeds)
            walls[label].append(time.perf_counter() - start)
    print(fmt, {label: round(statistics.median(w) * 1e6) for label, w in walls.items()}, "us")


if __name__ == "__main__":
    main()
