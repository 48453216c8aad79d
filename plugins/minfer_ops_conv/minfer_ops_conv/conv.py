"""Kernels: Conv (im2col + one GEMM per call, depthwise taps, pointwise matmul)."""

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
    wino = winograd.transform_weights(w) if build_time and group == 1 and kernel == (3, 3) else None
    return Packed(group, m, kernel, matrix, depthwise, wino)


Plan = Callable[[np.ndarray, Packed], np.ndarray]


def _gemm(p: Packed, cols: np.ndarray, out_shape: tuple[int, ...]) -> np.ndarray:
    """W @ cols for each image (and group), written straight into the NCHW output.

    Plain 2-D matmuls per image: numpy's stacked matmul can miss the BLAS fast path.
    """
    n = cols.shape[0]
    y = np.empty((n, p.group, p.matrix.shape[1], cols.shape[-1]), dtype=np.result_type(cols, p.matrix))
    for i in range(n):
        if p.group == 1:
            np.matmul(p.matrix[0], cols[i], out=y[i, 0])
        else:
            np.matmul(p.matrix, cols[i], out=y[i])
    return y.reshape((n, p.out_channels) + out_shape)


def _pointwise(w: geo.Window) -> Plan:
    """1x1 kernel, no pad: the input is already the GEMM's right operand (strided when s > 1)."""
    sub = (slice(None), slice(None)) + tuple(slice(None, None, s) for s in w.strides)
    strided = any(s > 1 for s in w.strides)
    size = int(np.prod(w.out_shape))

    def run(x: np.ndarray, p: Packed) -> np.ndarray:
        xs = x[sub] if strided else x
        cols = xs.reshape(x.shape[0], p.group, -1, size)
        return _gemm(p, cols, w.out_shape)

    return run


def _im2col(w: geo.Window) -> Plan:
    """General conv: strided im2col view of the padded input, copied once, then one GEMM.

    W[M, C*k] @ cols[C*k, H*W] yields NCHW directly, so no transpose follows.
    """
    size = int(np.prod(w.out_shape))

    def run(x: np.ndarray, p: Packed) -> np.ndarray:
        view = geo.im2col_view(geo.pad(x, w), w)
        cols = view.reshape(x.shape[0], p.group, -1, size)  # the one im2col copy
        return _gemm(p, cols, w.out_shape)

    return run


def _depthwise(w: geo.Window) -> Plan:
    """group == C == M: a weighted sum of the kernel's strided taps, no GEMM."""

    def run(x: np.ndarray, p: Packed) -> np.ndarray:
        xp = geo.pad(x, w)
        n, c = x.shape[:2]
        out = np.zeros((n, c) + w.out_shape, dtype=x.dtype)
        tmp = np.empty_like(out)
        bcast = (c,) + (1,) * len(w.out_shape)
        for t, taps in enumerate(w.taps()):
            np.multiply(xp[(slice(None), slice(None)) + taps], p.depthwise[:, t].reshape(bcast), out=tmp)
            out += tmp
        return out

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


@kernel("Conv", since=1, prepare=True)
def conv(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv-1/11/22: N-D grouped convolution; weights pre-packed, method chosen per input shape."""
    consts = ctx.constants
    fixed = pack(consts[1], group, build_time=True) if len(consts) > 1 and consts[1] is not None else None
    plans: dict[tuple[int, ...], Plan] = {}

    def run(x, w, b=None):
        p = fixed if fixed is not None else pack(w, group)
        key = x.shape[1:]
        plan = plans.get(key)
        if plan is None:
            win = geo.window(x.shape[2:], p.kernel, strides=strides, dilations=dilations, pads=pads, auto_pad=auto_pad,
                             clamp_same=True)
            plan = plans[key] = plan_for(win, p, x.shape[1])
        y = plan(x, p)
        if b is not None:
            y += b.reshape((-1,) + (1,) * (y.ndim - 2)).astype(y.dtype, copy=False)
        return y

    return run


KERNELS = [conv]
