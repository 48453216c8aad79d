"""A quantized model with qconv.py's MICRO_OUTPUTS rule (igemm also leaves 1x1 convs of at most that many output
channels to qconv_blas.py's micro-kernel product) and without it (MICRO_OUTPUTS 0: session 32's MICRO_CHANNELS
rule only), each engine tuned in its own fresh choice store, runs interleaved with the float model's.

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session33/outputs_rule_ab.py FORMAT
[RUNS] [--preprocess] [--model=NAME]`` from the checkout (as session 32's micro_rule_ab.py, whose counts and
summary it prints).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session31"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session32"))

from micro_rule_ab import _kernels  # noqa: E402  (session 32's: which module made each step)
from steps_pair import mobilenet_forms  # noqa: E402  (session 31's: the command line, the two models)
from team_ab import summary  # noqa: E402  (session 32's)


def main() -> None:
    from minfer_core import Engine
    from minfer_ops_numba import qconv

    name = next((a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("--model=")), "mobilenet_v2")
    fmt, runs, model, qmodel, feeds = mobilenet_forms(40, name)
    os.environ["MINFER_CACHE"] = tempfile.mkdtemp()
    engines = {"float": Engine(model)}
    rule = qconv.MICRO_OUTPUTS
    for label, outputs in (("before", 0), ("rule", rule)):
        qconv.MICRO_OUTPUTS = outputs
        os.environ["MINFER_CACHE"] = tempfile.mkdtemp()
        engines[label] = Engine(qmodel)
        engines[label].run(None, feeds)  # the first run times the candidates under this setting
    qconv.MICRO_OUTPUTS = rule
    same = engines["before"].run(None, feeds)[0].tobytes() == engines["rule"].run(None, feeds)[0].tobytes()
    print(f"same output bits: {same}")
    for label in ("before", "rule"):
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
    print(name, summary(fmt, runs, times, "before", "rule"))


if __name__ == "__main__":
    main()
