"""A/B in one process: qconv_blas.py's 1x1 convs by pointwise.py's micro-kernel (`MICRO`) against BLAS (the path
before), on each static quantized MobileNetV2.

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session28/micro_ab.py [ROUNDS]`` from
the checkout: per format the model's median over the rounds (each round 20 runs with, 20 without, in turn) and
the outputs' agreement.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

sys.path.insert(0, str(Path(__file__).resolve().parent))

from stem_ab import alternate  # noqa: E402  (this folder's A/B harness)


def main() -> None:
    from minfer_ops_numba.qconv_blas import Product

    def switch(conv: Any, on: bool) -> None:
        conv.micro = on
        conv.plans.clear()  # planned again: a 1x1 unit's path is chosen with its plan

    alternate(lambda o: isinstance(o, Product) and o.micro, switch, int(sys.argv[1]) if len(sys.argv) > 1 else 10,
              ("micro", "blas"))


if __name__ == "__main__":
    main()
