"""DequantizeLinear of an 8-bit tensor into float32 in one compiled pass (numpy: a converting copy, then one or two
float passes over the result).

minfer-passes' Dequant{Conv,Gemm,MatMul} dequantize their int8 weight into scratch on every run through the
registered DequantizeLinear kernel when it writes into ``out`` (this one): the transformer block's six weights,
0.8 M values a run, in ~1 pass instead of 3. Computed as the numpy kernel does, ``(float32(x) - float32(zp)) *
scale`` in float32 (the difference of two integers is exact): the same bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import intra_op_threads, kernel

from . import team
from ._jit import PRIORITY, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)
from .team import prange  # noqa: F401 (rebound to numba's at compile)

EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))


@jit
def _dequantize(x, scale, zero, y):  # pragma: no cover - compiled
    """y[a, c, b] = (x[a, c, b] - zero[c]) * scale[c] for x, y of shape (outer, channels, inner)."""
    for a in range(x.shape[0]):
        for c in range(x.shape[1]):
            s, z = scale[uintp(c)], zero[uintp(c)]
            for b in range(x.shape[2]):
                y[uintp(a), uintp(c), uintp(b)] = (np.float32(x[uintp(a), uintp(c), uintp(b)]) - z) * s


@jit
def _dequantize_last(x, scale, zero, y):  # pragma: no cover - compiled
    """y[a, c] = (x[a, c] - zero[c]) * scale[c] for x, y of shape (outer, channels): the channels innermost (a
    MatMul weight's columns), where the loop above would run one element at a time."""
    for a in range(x.shape[0]):
        for c in range(x.shape[1]):
            y[uintp(a), uintp(c)] = (np.float32(x[uintp(a), uintp(c)]) - zero[uintp(c)]) * scale[uintp(c)]


@jit(parallel=True)
def _dequantize_team(x, scale, zero, y, parts):  # pragma: no cover - compiled
    """`_dequantize` over a native team (team.py) for C-contiguous x, y (outer, channels, inner): ``parts`` ranges of
    the flat elements, each a team thread's, walked by flat index (a slice of an inner axis would be a strided
    array, whose loop does not vectorize). The same operations: the same bits."""
    a, c, b = x.shape
    xf, yf = x.reshape(-1), y.reshape(-1)
    rows = a * c  # runs of b elements, one scale each
    for t in prange(parts):
        if c == 1 and scale.size == 1:  # one scale for all: even ranges of the elements
            lo, hi = xf.size * t // parts, xf.size * (t + 1) // parts
            sv, zv = scale[0], zero[0]
            for i in range(lo, hi):
                yf[uintp(i)] = (np.float32(xf[uintp(i)]) - zv) * sv
        else:  # ranges of the rows (outer, channel)
            for r in range(rows * t // parts, rows * (t + 1) // parts):
                ch = r % c
                sv, zv = scale[uintp(ch)], zero[uintp(ch)]
                base = r * b
                for k in range(b):
                    yf[uintp(base + k)] = (np.float32(xf[uintp(base + k)]) - zv) * sv


# values from which a native team shares a dequantization (a weight of 64k values: ~15 us of one thread's work)
TEAM_VALUES = 1 << 16


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """8-bit x, a float32 scale (per tensor or per axis), an 8-bit zero point or none, float32 out, no blocks."""
    types = tuple(ctx.input_types) + (None, None, None)
    x, s, z = types[:3]
    if x is None or s is None or x.dtype not in EIGHT_BIT or s.dtype != np.float32:
        return False
    if z is not None and z.dtype != x.dtype:
        return False
    if z is not None and z.shape is not None and s.shape is not None and 1 < np.prod(z.shape) != np.prod(s.shape):
        return False
    return not attrs.get("block_size") and attrs.get("output_dtype", 0) in (0, 1) and (s.rank is None or s.rank <= 1)


def _layout(x_shape: tuple[int, ...], scale: np.ndarray, zero_point: np.ndarray | None,
            axis: int) -> tuple[np.ndarray, np.ndarray, tuple[int, ...], bool]:
    """(scale and zero point as float32 rows, x's shape as the loops walk it, whether the channels are innermost)."""
    s = readonly(np.ascontiguousarray(scale, np.float32).reshape(-1))
    z = np.zeros(1, np.float32) if zero_point is None else np.asarray(zero_point).reshape(-1).astype(np.float32)
    z = readonly(np.broadcast_to(z, s.shape).astype(np.float32) if z.size != s.size else z)  # one zero point for all
    if s.size > 1 and len(x_shape):
        axis %= len(x_shape)
        shape = (int(np.prod(x_shape[:axis])), x_shape[axis], int(np.prod(x_shape[axis + 1 :])))
    else:
        shape = (1, 1, int(np.prod(x_shape)))
    last = shape[2] == 1 and shape[1] > 1
    return s, z, shape[:2] if last else shape, last


def dequantize(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, axis: int,
               out: np.ndarray | None, layout: tuple | None = None) -> np.ndarray:
    """(x - zero_point) * scale into out (float32), scale and zero point per tensor or along ``axis`` (``layout``:
    `_layout`'s for these operands, when the caller kept it)."""
    y = out if out is not None else np.empty(x.shape, np.float32)
    s, z, shape, last = layout or _layout(x.shape, scale, zero_point, axis)
    src = readonly(np.ascontiguousarray(x)).reshape(shape)
    loop = _dequantize_last if last else _dequantize
    if y.flags.c_contiguous:
        size = team.size() if x.size >= TEAM_VALUES and not last and intra_op_threads() > 1 else 1
        if size > 1:  # a large weight at once (DequantGemm's, DequantConv's each run): shared over the team
            _dequantize_team(src, s, z, y.reshape(shape), size)
        else:
            loop(src, s, z, y.reshape(shape))
        return y
    tmp = np.empty(shape, np.float32)  # a strided out: through a contiguous copy
    loop(src, s, z, tmp)
    np.copyto(y, tmp.reshape(y.shape))
    return y


def _prepared(ctx: Any, axis: int) -> Any:
    """The run callable, compiled (or loaded from numba's cache) now, at build, for this node's x dtype."""
    x_dtype = ctx.input_types[0].dtype
    one = readonly(np.zeros(1, np.float32))
    _dequantize(readonly(np.zeros((1, 1, 1), x_dtype)), one, one, np.zeros((1, 1, 1), np.float32))
    _dequantize_last(readonly(np.zeros((1, 1), x_dtype)), one, one, np.zeros((1, 1), np.float32))
    if team.available():  # the team's driver too: compiled in a timed run, it would lose the core's timing
        _dequantize_team(readonly(np.zeros((1, 1, 1), x_dtype)), one, one, np.zeros((1, 1, 1), np.float32), 1)

    consts = tuple(ctx.constants) + (None, None, None)
    given_zero = len(ctx.input_types) > 2 and ctx.input_types[2] is not None
    constant = consts[1] is not None and (consts[2] is not None or not given_zero)
    layouts: dict[tuple[int, ...], tuple] = {}  # per x shape, when the scale and zero point given are the node's
    # constants themselves: a weight's DequantizeLinear runs again each run (minfer-passes' Dequant* kernels), where
    # working the layout out again cost 5-15 us of a 7-18 us call (a slice of them, a part of a split weight's rows,
    # or a computed one is worked out each call)

    def run(x, x_scale, x_zero_point=None, *, out=None):
        if not constant or x_scale is not consts[1] or x_zero_point is not consts[2]:
            return dequantize(x, x_scale, x_zero_point, axis, out)
        layout = layouts.get(x.shape)
        if layout is None:
            layout = layouts[x.shape] = _layout(x.shape, consts[1], consts[2], axis)
        return dequantize(x, x_scale, x_zero_point, axis, out, layout)

    return run


@kernel("DequantizeLinear", since=23, priority=PRIORITY, prepare=True, out=True, views=False, applies=_applies)
def dequantize_linear_23(ctx, *, axis=1, block_size=0, output_dtype=0):
    """DequantizeLinear-23 (8-bit x, float32 out, no blocks): one compiled pass."""
    return _prepared(ctx, axis)


@kernel("DequantizeLinear", since=21, priority=PRIORITY, prepare=True, out=True, views=False, applies=_applies)
def dequantize_linear_21(ctx, *, axis=1, block_size=0):
    """DequantizeLinear-21 (8-bit x, float32 out, no blocks): one compiled pass."""
    return _prepared(ctx, axis)


@kernel("DequantizeLinear", since=13, priority=PRIORITY, prepare=True, out=True, views=False, applies=_applies)
def dequantize_linear_13(ctx, *, axis=1):
    """DequantizeLinear-13 (8-bit x, float32 scale): one compiled pass."""
    return _prepared(ctx, axis)


@kernel("DequantizeLinear", since=10, priority=PRIORITY, prepare=True, out=True, views=False, applies=_applies)
def dequantize_linear_10(ctx):
    """DequantizeLinear-10 (8-bit x, float32 scale): one compiled pass."""
    return _prepared(ctx, 1)
