"""ai.minfer::QuantizeDequantize (float32): the rounding, ``* M``, ``+ A`` and the second rounding in one pass.

minfer-passes' QDQ kernels end each Dequant{Conv,Gemm,MatMul} tile with this op's registered kernel (see its
qdq_ops module): numpy spends ten passes over the tile there (divide, rint, clip, multiply; multiply; add; the
same four again), this loop one. The arithmetic is numpy's, in float32 and in the same order (a division by
the scale, not a multiplication by its inverse; rint rounds half to even; NaN passes the clip), so the
results are the same bits.

A tile is a strided view of the output (some channels and rows of one image): the loop walks it as
(outer, channel, inner) with each channel's inner run contiguous, through a flat window over the memory
from the tile's first element to its last, so the inner loop vectorizes (an array of numba's strided
layout would not). M and A are scalars or vary along one axis (the channel's), which `applies` checks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import KernelError, kernel

from ._jit import PRIORITY, F32, input_type, is_float32, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)

DOMAIN = "ai.minfer"


@jit
def _value(v, mc, ac, mul, add, scale, low, high, post, plow, phigh):  # pragma: no cover - compiled
    """R(v) [* mc] [+ ac] [then R on the post grid when post is not 0]."""
    v = np.rint(v / scale)
    v = low if v < low else v
    v = high if v > high else v
    v = v * scale
    if mul:
        v = v * mc
    if add:
        v = v + ac
    if post != 0:
        v = np.rint(v / post)
        v = plow if v < plow else v
        v = phigh if v > phigh else v
        v = v * post
    return v


@jit
def _requantize(src, dst, walk, m, a, params):  # pragma: no cover - compiled
    """dst[i] = `_value`(src[i]) for i = o*s0 + c*s1 + j, with m[c] and a[c] (``walk``: n0, s0, nc, s1, nl, then
    whether to multiply and to add; ``params``: scale, low, high, then the post grid's, scale 0 for none). In place
    when ``src`` is ``dst``: a loop of its own, as the two-array one's overlap check fails then and it runs unvectorized.
    Few arguments: numba's dispatch costs ~0.3 us an argument, on every call."""
    n0, s0, nc, s1, nl, mul, add = walk[0], walk[1], walk[2], walk[3], walk[4], walk[5], walk[6]
    scale, low, high, post, plow, phigh = params[0], params[1], params[2], params[3], params[4], params[5]
    mstep = 1 if m.size > 1 else 0
    astep = 1 if a.size > 1 else 0
    same = src.ctypes.data == dst.ctypes.data
    if nl == 1 and s1 == 1 and mstep == 1 and astep == 1:  # the channels are the contiguous run (a MatMul's bias)
        for o in range(n0):
            out = dst[uintp(o * s0):uintp(o * s0 + nc)]
            if same:
                for c in range(nc):
                    out[uintp(c)] = _value(out[uintp(c)], m[uintp(c)], a[uintp(c)], mul, add, scale, low, high, post,
                                           plow, phigh)
            else:
                row = src[uintp(o * s0):uintp(o * s0 + nc)]
                for c in range(nc):
                    out[uintp(c)] = _value(row[uintp(c)], m[uintp(c)], a[uintp(c)], mul, add, scale, low, high, post,
                                           plow, phigh)
        return
    for o in range(n0):
        for c in range(nc):
            base = o * s0 + c * s1
            mc = m[uintp(c * mstep)]
            ac = a[uintp(c * astep)]
            if same:
                row = dst[uintp(base):uintp(base + nl)]
                for j in range(nl):
                    row[uintp(j)] = _value(row[uintp(j)], mc, ac, mul, add, scale, low, high, post, plow, phigh)
            else:
                out = dst[uintp(base):uintp(base + nl)]
                row = src[uintp(base):uintp(base + nl)]
                for j in range(nl):
                    out[uintp(j)] = _value(row[uintp(j)], mc, ac, mul, add, scale, low, high, post, plow, phigh)


def _channel_axis(shape: tuple[int, ...] | None, rank: int) -> int | None:
    """The axis of an operand broadcasting into a tensor of ``rank`` along which it varies: -1 for a scalar, None
    when it varies along more than one (or its shape is unknown)."""
    if shape is None or any(not isinstance(d, int) for d in shape) or len(shape) > rank:
        return None
    varying = [rank - len(shape) + i for i, d in enumerate(shape) if d != 1]
    return -1 if not varying else varying[0] if len(varying) == 1 else None


def _walk(shape: tuple[int, ...], strides: tuple[int, ...], axis: int) -> tuple[int, int, int, int, int] | None:
    """(n0, s0, nc, s1, nl) in elements: the array as (outer, ``axis``, inner), inner contiguous; None when its
    dims do not merge so (then the caller copies)."""
    item = F32.itemsize
    if any(s % item or s < 0 for s in strides):
        return None
    dims = [(n, s // item) for n, s in zip(shape, strides)]
    nl = 1
    for n, s in reversed(dims[axis + 1:]):
        if n != 1 and s != nl:
            return None
        nl *= n
    n0, s0 = 1, 0
    for n, s in reversed(dims[:axis]):
        if n == 1:
            continue
        if n0 == 1:
            s0 = s
        elif s != s0 * n0:
            return None
        n0 *= n
    return (n0, s0, *dims[axis], nl)


def _per_axis(v: np.ndarray, channels: int) -> np.ndarray:
    """An operand as a flat read-only float32 array: one value for every channel, or one for each."""
    if v.size != 1 and v.size != channels:
        raise KernelError(f"ai.minfer::QuantizeDequantize (minfer-ops-numba): an operand of shape {v.shape} for "
                          f"{channels} channels; its node's types said it varies along the channel axis only")
    return readonly(v.reshape(-1) if v.dtype == F32 else v.astype(F32).reshape(-1))


def _spread(v: np.ndarray, channels: int) -> np.ndarray:
    """A one-value operand as one value per channel."""
    return v if v.size == channels else readonly(np.full(channels, v[0], np.float32))


def _window(y: np.ndarray, extent: int) -> np.ndarray:
    """A flat view of y's memory from its first element to its last (``extent`` elements)."""
    if y.flags.c_contiguous:
        return y.reshape(-1)
    return np.lib.stride_tricks.as_strided(y, shape=(extent,), strides=(F32.itemsize,))


Walk = tuple[int, np.ndarray, int]  # the channels, the walk as `_requantize` takes it, the window's extent


def _runner(axis: int | None, scale: float, low: float, high: float, post: float, plow: float, phigh: float) -> Any:
    """The run callable; ``axis``: the channel axis M and A vary along (None: none does, the rank decides)."""
    params = readonly(np.asarray([scale, low, high, post, plow, phigh], np.float32))
    one, zero = readonly(np.ones(1, np.float32)), readonly(np.zeros(1, np.float32))
    walk, y = np.asarray([1, 0, 1, 0, 1, 1, 1], np.int64), np.ones(1, np.float32)
    for src in (one, y):  # compiles now, at build: into another array, and in place
        _requantize(src, y, walk, one, one, params)
    # per (shape, strides, whether M and A are given): a tile's walk (a conv's tiles repeat run after run)
    walks: dict[tuple[Any, ...], Walk | None] = {}

    def walk_of(y: np.ndarray, mul: bool, add: bool) -> Walk | None:
        key = (y.shape, y.strides, mul, add)
        found = walks.get(key, False)
        if found is False:
            if (axis is None or y.ndim == 0) and y.flags.c_contiguous:  # one run: no channel to follow
                dims: tuple[int, ...] | None = (1, 0, 1, 0, y.size)
            else:  # a tile: by channels (axis 1 when M and A vary along none), each channel's rows one run
                dims = _walk(y.shape, y.strides, min(1, y.ndim - 1) if axis is None else axis)
            found = None if dims is None else (dims[2], np.asarray((*dims, mul, add), np.int64),
                                               (dims[0] - 1) * dims[1] + (dims[2] - 1) * dims[3] + dims[4])
            walks[key] = found  # a racing thread may make it too: the same value
        return found  # type: ignore[return-value]

    def apply(x: np.ndarray, y: np.ndarray, m: Any, a: Any) -> None:
        """y = the chain of x: x is y, or both are C-contiguous (the same walk serves both)."""
        found = walk_of(y, m is not None, a is not None)
        if found is None:  # dims that do not merge (never a conv's tile): work on a contiguous copy
            tmp = np.ascontiguousarray(x)
            apply(tmp, tmp, m, a)
            np.copyto(y, tmp)
            return
        channels, walk, extent = found
        mv = one if m is None else _per_axis(m, channels)
        av = zero if a is None else _per_axis(a, channels)
        if walk[4] == 1 and channels > 1:  # the channels are innermost: per-channel operands keep the loop vectorized
            mv, av = (_spread(v, channels) for v in (mv, av))
        dst = _window(y, extent)
        _requantize(dst if x is y else readonly(_window(x, extent)), dst, walk, mv, av, params)

    def run(x, m=None, a=None, *, out=None):
        y = out if out is not None else np.empty(x.shape, np.float32)
        if y is not x and not (x.flags.c_contiguous and y.flags.c_contiguous):
            np.copyto(y, x)
            x = y
        if y.size:
            apply(x, y, m, a)
        return y

    return run


def applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 X of known rank, M and A (when given) float32 scalars or varying along the same one axis."""
    x = input_type(ctx, 0)
    if not is_float32(ctx) or x.rank is None:
        return False
    axes = set()
    for i in (1, 2):
        t = input_type(ctx, i)
        if t is None:
            continue
        if t.dtype != F32 or (axis := _channel_axis(t.shape, x.rank)) is None:
            return False
        axes.add(axis)
    return len(axes - {-1}) <= 1


# inplace: each element is read before it is written
@kernel("QuantizeDequantize", domain=DOMAIN, priority=PRIORITY, prepare=True, out=True, inplace=(0,), views=False,
        applies=applies)
def quantize_dequantize(ctx, *, scale, low, high, post_scale=0.0, post_low=0.0, post_high=0.0):
    """ai.minfer::QuantizeDequantize-1: clip(rint(x / scale), low, high) * scale [* m] [+ a] [rounded again]."""
    rank = input_type(ctx, 0).rank
    axes = {_channel_axis(t.shape, rank) for t in (input_type(ctx, 1), input_type(ctx, 2)) if t is not None} - {-1}
    return _runner(axes.pop() if axes else None, scale, low, high, post_scale, post_low, post_high)
