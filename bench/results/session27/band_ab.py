"""Session 27: smallconv.py's compiled units with L2-sized bands where the packed weights are small (A, as installed)
against 4 MB units for every conv (B: SMALL_WEIGHT_BYTES set below any weight while B plans its shapes). One process,
two threads, the runs alternating; the run medians and, where they differ by over 5%, smallconv's team calls'
medians by (output channels, output cells, im2col rows).

    env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session27/band_ab.py MODEL ...
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))  # the checkout
sys.path.insert(0, str(Path(__file__).resolve().parent))  # im2col_split_ab's `alternate`

from im2col_split_ab import alternate  # noqa: E402

from bench import models as bm  # noqa: E402
from minfer_core import Engine  # noqa: E402
from minfer_ops_numba import smallconv  # noqa: E402


def compare(name, rounds=8, repeat=10):
    model = bm.build(name, 1)
    feeds = bm.random_feeds(model)
    engines = {"A": Engine(model, threads=2)}
    saved, smallconv.SMALL_WEIGHT_BYTES = smallconv.SMALL_WEIGHT_BYTES, -1
    try:
        engines["B"] = Engine(model, threads=2)
        engines["B"].run(None, feeds)  # its plans made now, with 4 MB units
    finally:
        smallconv.SMALL_WEIGHT_BYTES = saved
    alternate(name, engines, feeds, rounds, repeat, least=0.05)


if __name__ == "__main__":
    for model_name in sys.argv[1:] or ["resnet50"]:
        compare(model_name)
