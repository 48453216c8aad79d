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

    @property
    def gemm(self) -> np.ndarray:
        # a single group needs no batch axis: one plain 2-D GEMM per image
        return self.matrix[0] if self.group == 1 else self.matrix


def pack(w: np.ndarray, group: int) -> Packed:
    """Reshape W[M, C/G, *k] into per-group GEMM matrices, plus taps for depthwise convs."""
    m, cg = w.shape[:2]
    kernel = tuple(w.shape[2:])
    matrix = np.ascontiguousarray(w.reshape(group, m // group, -1))
    depthwise = None
    if group > 1 and cg == 1 and m == group:
        depthwise = np.ascontiguousarray(w.reshape(m, -1))
    return Packed(group, m, kernel, matrix, depthwise)


Plan = Callable[[np.ndarray, Packed], np.ndarray]


def _pointwise(w: geo.Window) -> Plan:
    """1x1 kernel, no pad: the input is already the GEMM's right operand (strided when s > 1)."""
    sub = (slice(None), slice(None)) + tuple(slice(None, None, s) for s in w.strides)

    def run(x: np.ndarray, p: Packed) -> np.ndarray:
        xs = x[sub] if any(s > 1 for s in w.strides) else x
        n = x.shape[0]
        cols = xs.reshape(n, -1, int(np.prod(w.out_shape))) if p.group == 1 else xs.reshape(n, p.group, -1, int(np.prod(w.out_shape)))
        return np.matmul(p.gemm, cols).reshape((n, p.out_channels) + w.out_shape)

    return run


def _im2col(w: geo.Window) -> Plan:
    """General conv: strided im2col view of the padded input, copied once, then one GEMM.

    W[M, C*k] @ cols[C*k, H*W] yields NCHW directly, so no transpose follows.
    """
    size = int(np.prod(w.out_shape))

    def run(x: np.ndarray, p: Packed) -> np.ndarray:
        n = x.shape[0]
        view = geo.im2col_view(geo.pad(x, w), w)
        lead = (n, -1) if p.group == 1 else (n, p.group, -1)
        cols = view.reshape(lead + (size,))  # the one im2col copy
        return np.matmul(p.gemm, cols).reshape((n, p.out_channels) + w.out_shape)

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
    if p.group == 1 and winograd.applies(w, p):
        return winograd.plan(w)
    return _im2col(w)


@kernel("Conv", since=1, prepare=True)
def conv(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv-1/11/22: N-D grouped convolution; weights pre-packed, method chosen per input shape."""
    consts = ctx.constants
    fixed = pack(consts[1], group) if len(consts) > 1 and consts[1] is not None else None
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
