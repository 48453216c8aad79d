"""A quantized MobileNetV2's run with minfer-ops-numba's team passes for dynamic inputs on and off, runs interleaved.

``MINFER_CACHE=<new folder> env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python
bench/results/session32/team_ab.py FORMAT [RUNS] [--preprocess]`` from the checkout (FORMAT qdq|qdq_pc|qoperator|
dynamic): one engine of the float model and one of the quantized, whose runs alternate with the team range
(dynamic_quant.TEAM_RANGE) and centering (qconv_blas.TEAM_CENTER) thresholds at their values ("on") and out of reach
("off": one thread's passes, as before session 32). Prints whether both settings give the same output bits, and each
one's median against the float model's.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from bench import models as bench_models  # noqa: E402
from bench.quantized import quantize  # noqa: E402


def main() -> None:
    from minfer_core import Engine
    from minfer_ops_numba import dynamic_quant, qconv_blas

    args = [a for a in sys.argv[1:] if a != "--preprocess"]
    fmt, runs = args[0], int(args[1]) if len(args) > 1 else 60
    model = bench_models.build("mobilenet_v2", 1)
    model.ir_version = bench_models.ORT_IR_VERSION
    feeds = bench_models.random_feeds(model)
    qmodel = quantize(model, fmt, feeds, Path(tempfile.mkdtemp()) / fmt, "--preprocess" in sys.argv)
    float_engine, engine = Engine(model), Engine(qmodel)
    on = (dynamic_quant.TEAM_RANGE, qconv_blas.TEAM_CENTER)

    def setting(label: str) -> None:
        dynamic_quant.TEAM_RANGE, qconv_blas.TEAM_CENTER = on if label == "on" else (1 << 62, 1 << 62)

    outputs = {}
    for label in ("off", "on"):
        setting(label)
        outputs[label] = engine.run(None, feeds)[0]
    print("same output bits on and off:", outputs["on"].tobytes() == outputs["off"].tobytes())
    for _ in range(5):
        float_engine.run(None, feeds)
        engine.run(None, feeds)
    times: dict[str, list[float]] = {"float": [], "off": [], "on": []}
    for _ in range(runs):
        start = time.perf_counter()
        float_engine.run(None, feeds)
        times["float"].append(time.perf_counter() - start)
        for label in ("off", "on"):
            setting(label)
            start = time.perf_counter()
            engine.run(None, feeds)
            times[label].append(time.perf_counter() - start)
    medians = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    print(f"{fmt}{' pre-processed' if '--preprocess' in sys.argv else ''}, {runs} rounds: " +
          ", ".join(f"{k} {v:.2f} ms" for k, v in medians.items()) +
          f"; off / float {medians['off'] / medians['float']:.2f}, on / float {medians['on'] / medians['float']:.2f}")
    np.testing.assert_array_equal(outputs["on"], outputs["off"])


if __name__ == "__main__":
    main()
