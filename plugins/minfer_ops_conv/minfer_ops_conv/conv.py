"""Kernels: Conv, by the method that suits each shape: pointwise GEMM, im2col slabs + GEMM, Winograd, depthwise taps."""

from __future__ import annotations

from typing import Callable

import attrs
import numpy as np

from minfer_core import kernel

from . import _geometry as geo
from . import winograd


@attrs.frozen
class Packed:
    """Conv weights laid out once for the GEMM: ``matrix`` is (G, M/G, C/G * prod(kernel))."""

    group: int
    out_channels: int
    kernel: tuple[int, ...]
    matrix: np.ndarray
    depthwise: np.ndarray | None  # (C, prod(kernel)) when group == C == M
    winograd: np.ndarray | None = None  # (16, M, C) for 3x3 single-group weights known at build time


def pack(w: np.ndarray, group: int, build_time: bool = False) -> Packed:
    """Reshape W[M, C/G, *k] into per-group GEMM matrices, plus taps for depthwise convs.

    Winograd weights are made only at build time: transforming per run would cost more than it saves.
    """
    m, cg = w.shape[:2]
    kernel = tuple(w.shape[2:])
    matrix = np.ascontiguousarray(w.reshape(group, m // group, -1))
    depthwise = None
    if group > 1 and cg == 1 and m == group:
        depthwise = np.ascontiguousarray(w.reshape(m, -1))
    wide = min(m, cg) >= winograd.MIN_CHANNELS
    wino = winograd.transform_weights(w) if build_time and group == 1 and kernel == (3, 3) and wide else None
    return Packed(group, m, kernel, matrix, depthwise, wino)


Plan = Callable[[np.ndarray, Packed, np.ndarray], None]
"""A conv method for one input geometry: writes conv(x) into y, a fresh (N, M, *out) array."""


def _gemm_into(p: Packed, cols: np.ndarray, dst: np.ndarray) -> None:
    """W @ cols for one image, per group: (G, Mg, K) @ (G, K, P) into dst (G, Mg, P).

    Plain 2-D matmuls when there is one group: numpy's stacked matmul can miss the BLAS fast path.
    """
    if p.group == 1:
        np.matmul(p.matrix[0], cols[0], out=dst[0])
    else:
        np.matmul(p.matrix, cols, out=dst)


def _pointwise(w: geo.Window) -> Plan:
    """1x1 kernel, no pad: the input is already the GEMM's right operand (strided when s > 1)."""
    sub = (slice(None), slice(None)) + tuple(slice(None, None, s) for s in w.strides)
    strided = any(s > 1 for s in w.strides)
    size = int(np.prod(w.out_shape))

    def run(x: np.ndarray, p: Packed, y: np.ndarray) -> None:
        xs = x[sub] if strided else x
        cols = xs.reshape(x.shape[0], p.group, -1, size)
        yg = y.reshape(x.shape[0], p.group, -1, size)
        for i in range(x.shape[0]):
            _gemm_into(p, cols[i], yg[i])

    return run


# im2col is copied in slabs of output rows of about this many bytes: a slab stays in
# cache between its copy and its GEMM, where a whole 224x224 im2col would not
CHUNK_BYTES = 4 << 20


def _im2col(w: geo.Window) -> Plan:
    """General conv: strided im2col view of the padded input, copied slab by slab, one GEMM per slab.

    W[M, C*k] @ cols[C*k, rows*W] lands directly in the NCHW output's row range: no transpose.
    """
    rows = w.out_shape[0]
    row_len = int(np.prod(w.out_shape[1:]))
    rest = (slice(None),) * (len(w.out_shape) - 1)

    def run(x: np.ndarray, p: Packed, y: np.ndarray) -> None:
        view = geo.im2col_view(geo.pad(x, w), w)
        g, mg, k = p.matrix.shape
        yg = y.reshape(x.shape[0], g, mg, rows * row_len)
        step = max(1, CHUNK_BYTES // (g * k * row_len * x.itemsize))
        for i in range(x.shape[0]):
            for r0 in range(0, rows, step):
                r1 = min(rows, r0 + step)
                cols = view[i][(Ellipsis, slice(r0, r1)) + rest].reshape(g, k, (r1 - r0) * row_len)
                _gemm_into(p, cols, yg[i, :, :, r0 * row_len : r1 * row_len])

    return run


def _depthwise(w: geo.Window) -> Plan:
    """group == C == M: a weighted sum of the kernel's strided taps, no GEMM."""

    def run(x: np.ndarray, p: Packed, y: np.ndarray) -> None:
        xp = geo.pad(x, w)
        c = x.shape[1]
        tmp = np.empty_like(y)
        bcast = (c,) + (1,) * len(w.out_shape)
        for t, taps in enumerate(w.taps()):
            tap = xp[(slice(None), slice(None)) + taps]
            weight = p.depthwise[:, t].reshape(bcast)
            if t == 0:
                np.multiply(tap, weight, out=y)
            else:
                np.multiply(tap, weight, out=tmp)
                y += tmp

    return run


def plan_for(w: geo.Window, p: Packed, channels: int) -> Plan:
    """Choose the cheapest method for this weight and input geometry, once per shape."""
    if p.depthwise is not None and channels == p.group:
        return _depthwise(w)
    if all(k == 1 for k in p.kernel) and not w.padded:
        return _pointwise(w)
    if winograd.applies(w, p):
        return winograd.plan(w)
    return _im2col(w)


def _bias_column(b: np.ndarray, rank: int, dtype: np.dtype) -> np.ndarray:
    """Bias shaped (M, 1, ..., 1) to broadcast over the spatial dims, in the output dtype."""
    return b.reshape((-1,) + (1,) * rank).astype(dtype, copy=False)


@kernel("Conv", since=1, prepare=True, out=True, views=False, packed=(1, 2))
def conv(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv-1/11/22: N-D grouped convolution; weights pre-packed, method chosen per input shape."""
    consts = tuple(ctx.constants) + (None,) * 3
    fixed = pack(consts[1], group, build_time=True) if consts[1] is not None else None
    # constants are kept here (packed=(1, 2)), so the engine may drop the initializers and pass None
    fixed_bias = consts[2]
    plans: dict[tuple[int, ...], tuple[Plan, tuple[int, ...]]] = {}

    def run(x, w, b=None, *, out=None):
        p = fixed if fixed is not None else pack(w, group)
        key = x.shape[1:]
        if key not in plans:
            win = geo.window(x.shape[2:], p.kernel, strides=strides, dilations=dilations, pads=pads, auto_pad=auto_pad,
                             clamp_same=True)
            plans[key] = (plan_for(win, p, x.shape[1]), win.out_shape)
        plan, out_shape = plans[key]
        y = out if out is not None else np.empty((x.shape[0], p.out_channels) + out_shape, dtype=x.dtype)
        plan(x, p, y)
        bias = fixed_bias if fixed_bias is not None else b
        if bias is not None:
            y += _bias_column(bias, y.ndim - 2, y.dtype)
        return y

    return run


KERNELS = [conv]
