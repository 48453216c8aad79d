"""HardSigmoid and HardSwish (float32): one compiled pass instead of numpy's three or four.

The formulas are the numpy kernels', in float32 and in the same order
(``alpha * x + beta``, clipped to [0, 1], NaN kept; HardSwish multiplies x
by that with alpha 1/6 and beta 1/2), so the results are the same bits.

Not here, because compiled code does not pay for them: Softmax and Gelu-20
spend their time in exp and erf, which numba calls one element at a time
(libm; no vector math library ships with it), while numpy's float32 exp is
vectorized: a compiled Softmax over 4096 rows of 128 floats took 1.9 ms
against 0.18 ms for np.exp alone (README.md).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import intra_op_threads, kernel, parallel_for

from ._jit import PRIORITY, is_float32, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)

# elements per parallel_for range: a few hundred microseconds of work, so that a split pays for its hand-over
BLOCK = 1 << 16
SPLIT_ELEMENTS = 1 << 20  # from this size (~150 us of work) the blocks go over the intra-op threads


@jit
def _hard_sigmoid(x, y, alpha, beta, swish, lo, hi):  # pragma: no cover - compiled
    """y = clip(alpha * x + beta, 0, 1) (times x when ``swish``) over flat elements lo..hi; NaN stays NaN."""
    for i in range(lo, hi):
        v = x[uintp(i)]
        t = alpha * v + beta
        t = np.float32(0) if t < 0 else t
        t = np.float32(1) if t > 1 else t
        y[uintp(i)] = v * t if swish else t


@jit
def _in_place(y, alpha, beta, swish):  # pragma: no cover - compiled
    """`_hard_sigmoid` with y as its input and output (flat)."""
    for i in range(y.size):
        v = y[uintp(i)]
        t = alpha * v + beta
        t = np.float32(0) if t < 0 else t
        t = np.float32(1) if t > 1 else t
        y[uintp(i)] = v * t if swish else t


def _elementwise(alpha: float, beta: float, swish: bool) -> Any:
    """The run callable: whole tensor in blocks of BLOCK, over the threads from SPLIT_ELEMENTS on."""
    a, b = np.float32(alpha), np.float32(beta)
    _hard_sigmoid(readonly(np.zeros(1, np.float32)), np.zeros(1, np.float32), a, b, swish, 0, 1)  # compile at build
    _in_place(np.zeros(1, np.float32), a, b, swish)

    def run(x, *, out=None):
        if out is x and x.size < SPLIT_ELEMENTS and x.flags.c_contiguous:
            # in place and not worth splitting (a fused op's activation on its output tile): one compiled call,
            # without the block machinery's Python, which cost as much as the pass on a squeeze-excite gate
            _in_place(x.reshape(-1), a, b, swish)
            return x
        y = out if out is not None else np.empty(x.shape, np.float32)
        src, dst = readonly(np.ascontiguousarray(x)).reshape(-1), y.reshape(-1)
        n = src.size
        blocks = -(-n // BLOCK)
        parts = None if n >= SPLIT_ELEMENTS and intra_op_threads() > 1 else 1

        def span(lo: int, hi: int) -> None:
            _hard_sigmoid(src, dst, a, b, swish, lo * BLOCK, min(n, hi * BLOCK))

        parallel_for(blocks, span, parts=parts)
        return y

    return run


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 input."""
    return is_float32(ctx)


# inplace: each element is read before it is written
@kernel("HardSigmoid", since=6, priority=PRIORITY, prepare=True, out=True, inplace=(0,), views=False,
        applies=_applies)
def hard_sigmoid(ctx, *, alpha=0.2, beta=0.5):
    """HardSigmoid-6: max(0, min(1, alpha * x + beta))."""
    return _elementwise(alpha, beta, swish=False)


@kernel("HardSwish", since=14, priority=PRIORITY, prepare=True, out=True, inplace=(0,), views=False,
        applies=_applies)
def hard_swish(ctx):
    """HardSwish-14: x * max(0, min(1, x / 6 + 1 / 2))."""
    return _elementwise(1 / 6, 0.5, swish=True)
