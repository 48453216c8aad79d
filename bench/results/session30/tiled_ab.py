"""linear.py's MatMul by a constant B on pointwise.py's micro-kernel (`_tiled`) against its BLAS blocks, one
kernel each, alone (BLAS on one thread, as in a run), on one thread and two: best of 7 repeats, in us.

``env -u OPENBLAS_CORETYPE -u OPENBLAS_L2_SIZE .venv/bin/python bench/results/session30/tiled_ab.py`` from the
checkout.
"""

from __future__ import annotations

import timeit

import numpy as np

from minfer_core import KernelContext, TensorType
from minfer_core.parallel import using_threads
from minfer_ops_numba import linear
from minfer_parallel import set_blas_threads

SHAPES = [(1, 1024, 1000), (1, 544, 1000), (8, 512, 300), (128, 64, 64), (128, 64, 128), (128, 256, 256),
          (128, 256, 1024), (128, 1024, 256), (1024, 256, 256), (64, 96, 200), (3136, 64, 64),
          # deeper than TILED_DEPTH: BERT-base's and MiniLM's second FFN layers at 128 tokens, a batch-64 head
          (128, 3072, 768), (128, 1536, 384), (64, 2048, 1000)]


def main() -> None:
    set_blas_threads(1)
    depth = linear.TILED_DEPTH
    for m, k, n in SHAPES:
        rng = np.random.default_rng(0)
        a, b = rng.standard_normal((m, k), dtype=np.float32), rng.standard_normal((k, n), dtype=np.float32)
        ctx = KernelContext("mm", "MatMul", 13, (TensorType(a.dtype, a.shape), TensorType(b.dtype, b.shape)),
                            (None,), (None, b), 1)
        linear.TILED_DEPTH = depth
        tiled = linear.matmul.prepared(ctx, {})
        linear.TILED_DEPTH = 0
        blas = linear.matmul.prepared(ctx, {})
        linear.TILED_DEPTH = depth
        number = max(1, 20000 // max(1, m * k * n // 100000))
        cells = []
        for threads in (1, 2):
            with using_threads(threads):
                np.testing.assert_allclose(tiled(a), blas(a), rtol=1e-3, atol=1e-3)
                for name, fn in (("tiled", tiled), ("blas", blas)):
                    best = min(timeit.repeat(lambda: fn(a), number=number, repeat=7)) / number
                    cells.append(f"{name}/{threads} {best * 1e6:.1f}")
        print(f"{m}x{k} @ {k}x{n}: " + "  ".join(cells), flush=True)


if __name__ == "__main__":
    main()
