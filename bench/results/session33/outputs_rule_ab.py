"""A quantized model with qconv.py's MICRO_OUTPUTS rule (igemm also leaves 1x1 convs of at most that many output
channels to qconv_blas.py's micro-kernel product) and without it (MICRO_OUTPUTS 0: session 32's MICRO_CHANNELS
rule only), each engine tuned in its own fresh choice store, runs interleaved with the float model's.

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session33/outputs_rule_ab.py FORMAT
[RUNS] [--preprocess] [--model=NAME]`` from the checkout (as session 32's micro_rule_ab.py, whose counts and
summary it prints).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session31"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "session32"))

from micro_rule_ab import compare  # noqa: E402  (session 32's: the engines, counts and interleaved medians)

if __name__ == "__main__":
    compare("MICRO_OUTPUTS", 0, ("before", "rule"))  # 0: session 32's MICRO_CHANNELS rule only
