"""A quantized MobileNetV2 with qconv.py's MICRO_CHANNELS rule (igemm leaves small 1x1 convs to qconv_blas.py's
micro-kernel product) and without it, each engine tuned in its own fresh choice store, runs interleaved.

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session32/micro_rule_ab.py FORMAT
[RUNS] [--preprocess] [--model=NAME]`` from the checkout (FORMAT qdq|qdq_pc|qoperator|dynamic; NAME a bench.models
name, default mobilenet_v2): the float model, the quantized one
built with MICRO_CHANNELS 0 (igemm a candidate everywhere, as before session 32: "tuned") and with its value
("rule"); how many steps run a callable made in qconv_blas.py and in qconv.py (a ScaledConvInteger's on
qconv_blas.py runs through qdepthwise.py's `scaled_run`, counted in neither), whether both engines give the same
bits, and each median against the float model's. A fresh choice store for each engine: the first run's timing
decides for both.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session31"))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from steps_pair import mobilenet_forms  # noqa: E402  (session 31's: the command line, the two models)
from team_ab import summary  # noqa: E402  (this folder's)


def _kernels(engine) -> list[str]:
    plans = engine.executor.plans
    return [getattr(step[0], "__module__", "") for step in plans.bound[plans.last]]


def compare(setting: str, off: int, labels: tuple[str, str] = ("tuned", "rule")) -> None:
    """The command line's model and form, tuned with qconv.py's ``setting`` at ``off`` and at its value, each
    engine in its own fresh choice store: the counts, whether the bits agree, and the interleaved medians."""
    from minfer_core import Engine
    from minfer_ops_numba import qconv

    name = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--model=")), "mobilenet_v2")
    fmt, runs, model, qmodel, feeds = mobilenet_forms(40, name)
    os.environ["MINFER_CACHE"] = tempfile.mkdtemp()
    engines = {"float": Engine(model)}
    rule = getattr(qconv, setting)
    for label, value in zip(labels, (off, rule)):
        setattr(qconv, setting, value)
        os.environ["MINFER_CACHE"] = tempfile.mkdtemp()
        engines[label] = Engine(qmodel)
        engines[label].run(None, feeds)  # the first run times the candidates under this setting
    setattr(qconv, setting, rule)
    same = engines[labels[0]].run(None, feeds)[0].tobytes() == engines[labels[1]].run(None, feeds)[0].tobytes()
    print(f"same output bits: {same}")
    for label in labels:
        steps = _kernels(engines[label])
        print(f"{label}: {sum(m.endswith('.qconv_blas') for m in steps)} steps on qconv_blas.py, "
              f"{sum(m.endswith('.qconv') for m in steps)} on qconv.py (igemm)")
    for _ in range(5):
        for engine in engines.values():
            engine.run(None, feeds)
    times: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(runs):
        for label, engine in engines.items():
            start = time.perf_counter()
            engine.run(None, feeds)
            times[label].append(time.perf_counter() - start)
    print(name, summary(fmt, runs, times, *labels))


def main() -> None:
    compare("MICRO_CHANNELS", 0)  # 0: igemm a candidate everywhere, as before session 32


if __name__ == "__main__":
    main()
