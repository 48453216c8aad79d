"""Kernels: ConvInteger and QLinearConv: integer convolution, accumulated exactly, requantized as onnxruntime does."""

from __future__ import annotations

import math

import numpy as np

from minfer_core import kernel

from . import _geometry as geo


def _centered(v: np.ndarray, zero_point: np.ndarray | None, dtype: np.dtype, per_channel: bool = False) -> np.ndarray:
    """v - zero_point as ``dtype``; a 1-D zero point of the weights is per output channel (axis 0)."""
    out = v.astype(dtype)
    if zero_point is None:
        return out
    zp = np.asarray(zero_point, dtype=dtype)
    per_channel = per_channel and zp.size > 1
    out -= zp.reshape((-1,) + (1,) * (v.ndim - 1) if per_channel else ())
    return out


# |x - x_zp| for 8-bit x and zero point
X_RANGE = 255


def _packed_weights(w: np.ndarray, w_zero_point: np.ndarray | None, group: int) -> np.ndarray:
    """(w - w_zp) as GEMM matrices (G, M/G, C/G * prod(kernel)), float32 when that is exact, else float64.

    Every partial sum of a row's products, in any order, is at most X_RANGE * (the row's L1 norm); below
    2**24 float32 holds all of them exactly (sgemm, half the bytes to copy), and float64 does below 2**53.
    """
    wc = _centered(w, w_zero_point, np.float64, per_channel=True).reshape(group, w.shape[0] // group, -1)
    bound = X_RANGE * float(np.abs(wc).sum(axis=-1).max(initial=0.0))
    return np.ascontiguousarray(wc, dtype=np.float32 if bound < 2**24 else np.float64)


def _accumulate(x: np.ndarray, x_zero_point: np.ndarray | None, weights: np.ndarray, kernel_shape: tuple[int, ...],
                attrs: dict) -> np.ndarray:
    """sum((x - x_zp) * (w - w_zp)) over each window (N, M, *out), exact integers in the weights' float type.

    Padding is zero after centering, i.e. pad cells hold x_zp, as onnxruntime pads.
    """
    g, mg, k = weights.shape
    win = geo.window(x.shape[2:], kernel_shape, clamp_same=True, **attrs)
    xc = geo.pad(_centered(x, x_zero_point, weights.dtype), win)
    cols = geo.im2col_view(xc, win)  # (N, C, *kernel, *out)
    n, p = x.shape[0], math.prod(win.out_shape)
    y = np.empty((n, g, mg, p), dtype=weights.dtype)
    for i in range(n):  # one image's columns at a time bounds the copy's size
        np.matmul(weights, cols[i].reshape(g, k, p), out=y[i])
    return y.reshape((n, g * mg) + win.out_shape)


def _window_attrs(auto_pad: str, dilations, pads, strides) -> dict:
    return dict(auto_pad=auto_pad, dilations=dilations, pads=pads, strides=strides)


def _build_weights(ctx, w_index: int, zp_index: int, group: int) -> np.ndarray | None:
    """The packed weights when the node's weights and their zero point (or its absence) are fixed at build."""
    consts = tuple(ctx.constants) + (None,) * (zp_index + 1)
    types = tuple(ctx.input_types) + (None,) * (zp_index + 1)
    zp_fixed = consts[zp_index] is not None or types[zp_index] is None
    if consts[w_index] is None or not zp_fixed:
        return None
    return _packed_weights(consts[w_index], consts[zp_index], group)


@kernel("ConvInteger", since=10, prepare=True)
def conv_integer(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """ConvInteger-10: int32 sum((x - x_zero_point) * (w - w_zero_point)) per window."""
    attrs = _window_attrs(auto_pad, dilations, pads, strides)
    fixed = _build_weights(ctx, 1, 3, group)

    def run(x, w, x_zero_point=None, w_zero_point=None):
        weights = fixed if fixed is not None else _packed_weights(w, w_zero_point, group)
        return _accumulate(x, x_zero_point, weights, w.shape[2:], attrs).astype(np.int32)  # exact integers

    return run


def _requantize(acc: np.ndarray, scale: np.ndarray, y_zero_point: np.ndarray) -> np.ndarray:
    """round-half-even(acc * scale) + y_zp, saturated: in float32, as onnxruntime's MLAS requantizes.

    onnxruntime converts the int32 accumulator to float32 and multiplies by the float32 output scale
    (x_scale * w_scale / y_scale, itself computed in float32); in float64 some products would round to
    the other side of a .5. ``acc`` holds exact integers, whose float32 rounding is the int32's.
    """
    info = np.iinfo(y_zero_point.dtype)
    zp = np.float32(np.asarray(y_zero_point).reshape(-1)[0])
    v = acc.astype(np.float32)
    v *= scale.reshape((1, -1) + (1,) * (acc.ndim - 2))
    np.clip(v, np.float32(info.min) - zp, np.float32(info.max) - zp, out=v)
    np.rint(v, out=v)
    v += zp
    return v.astype(y_zero_point.dtype)


def _output_scale(x_scale, w_scale, y_scale) -> np.ndarray:
    """x_scale * w_scale / y_scale in float32 (one per output channel when w_scale is 1-D)."""
    xs = np.float32(np.asarray(x_scale).reshape(-1)[0])
    ys = np.float32(np.asarray(y_scale).reshape(-1)[0])
    return (xs * np.asarray(w_scale, dtype=np.float32).reshape(-1)) / ys


@kernel("QLinearConv", since=10, prepare=True)
def qlinear_conv(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """QLinearConv-10: the integer conv of the centered operands plus int32 bias, requantized to y's type."""
    attrs = _window_attrs(auto_pad, dilations, pads, strides)
    fixed = _build_weights(ctx, 3, 5, group)

    def run(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None):
        weights = fixed if fixed is not None else _packed_weights(w, w_zero_point, group)
        acc = _accumulate(x, x_zero_point, weights, w.shape[2:], attrs)
        if b is not None:
            # exact in float64; in float32 only while acc and bias stay below 2**24
            acc = acc.astype(np.float64) + b.astype(np.float64).reshape((1, -1) + (1,) * (acc.ndim - 2))
        return _requantize(acc, _output_scale(x_scale, w_scale, y_scale), y_zero_point)

    return run
