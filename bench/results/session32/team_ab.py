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
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session31"))

from steps_pair import mobilenet_forms  # noqa: E402  (session 31's: the command line, the two models)


def summary(fmt: str, runs: int, times: dict[str, list[float]], first: str, second: str) -> str:
    """A line of each engine's median (``times``: seconds a run, a "float" engine's among them) and the ``first`` and
    ``second`` engines' against the float model's."""
    medians = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    return (f"{fmt}{' pre-processed' if '--preprocess' in sys.argv else ''}, {runs} rounds: " +
            ", ".join(f"{k} {v:.2f} ms" for k, v in medians.items()) +
            "".join(f"{'; ' if k == first else ', '}{k} / float {medians[k] / medians['float']:.3f}"
                    for k in (first, second)))


def main() -> None:
    from minfer_core import Engine
    from minfer_ops_numba import dynamic_quant, qconv_blas

    fmt, runs, model, qmodel, feeds = mobilenet_forms(60)
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
    print(summary(fmt, runs, times, "off", "on"))
    np.testing.assert_array_equal(outputs["on"], outputs["off"])


if __name__ == "__main__":
    main()
