"""A/B in one process: a dynamically quantized stem by qstem.py (ScaledConv.stem) against igemm's path, on the
dynamically quantized MobileNetV2.

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session28/dynamic_stem_ab.py [ROUNDS]``
from the checkout: the model's median over the rounds (each round 20 runs with, 20 without, in turn) and the
outputs' agreement.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from stem_ab import alternate  # noqa: E402  (this folder's A/B harness)


def main() -> None:
    from minfer_ops_numba.qconv import ScaledConv

    saved: dict[int, Any] = {}

    def found(o: Any) -> bool:
        if isinstance(o, ScaledConv) and o.stem is not None:
            saved[id(o)] = o.stem
            return True
        return False

    def switch(conv: Any, on: bool) -> None:
        conv.stem = saved[id(conv)] if on else None

    alternate(found, switch, int(sys.argv[1]) if len(sys.argv) > 1 else 10, ("stem", "igemm"), ("dynamic",))


if __name__ == "__main__":
    main()
