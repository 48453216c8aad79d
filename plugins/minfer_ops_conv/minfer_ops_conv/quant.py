"""Kernels: ConvInteger and QLinearConv: integer convolution, accumulated exactly, requantized as onnxruntime does.

The weights stay 8-bit (declared ``packed``: the engine frees the originals). Each run centers them into a
float scratch matrix and runs the float Conv's own methods (pointwise GEMM, im2col slabs, depthwise taps; never
Winograd, whose transforms are inexact on integers) on the centered input: every partial sum of 8-bit
products is an integer the float type holds exactly (float32 below 2**24; past that, the input channels are
cut into chunks whose float32 convs are exact, summed in float64: see `_held`), so the order in which a method
sums them does not matter. The conversion of each tile to the integer output runs in the conv's epilogue,
while the tile is still in cache.
"""

from __future__ import annotations

from typing import Callable

import attrs
import numpy as np

from minfer_core import kernel, scratch

from . import _geometry as geo
from . import conv as float_conv

# |x - x_zp| for 8-bit x and zero point
X_RANGE = 255


@attrs.frozen
class Held:
    """A node's 8-bit weights, and how to center them: ``zero`` (None when all zero) broadcasts along axis 0.

    ``chunks``: input-channel ranges whose partial convolutions float32 sums exactly (one range: the whole conv
    is exact in ``dtype``); their results are added in float64.
    """

    w: np.ndarray
    zero: np.ndarray | None
    dtype: np.dtype
    group: int
    chunks: tuple[tuple[int, int], ...]

    def centered(self) -> np.ndarray:
        """w - w_zp as ``dtype``, in this thread's scratch (contents valid until its next call)."""
        wf = scratch(f"minfer_ops_conv-int-w-{self.dtype.char}", self.w.shape, self.dtype)
        np.copyto(wf, self.w, casting="unsafe")
        if self.zero is not None:
            np.subtract(wf, self.zero, out=wf)
        return wf


EXACT = 2**24  # float32 holds every integer below this exactly


def _chunks(rows: np.ndarray, channels: int) -> tuple[tuple[int, int], ...] | None:
    """Equal input-channel ranges each of whose partial sums stay below 2**24 (rows: |w - w_zp|, (M, C, taps))."""
    for parts in range(2, channels + 1):
        bounds = [channels * k // parts for k in range(parts + 1)]
        ranges = tuple(zip(bounds, bounds[1:]))
        if all(X_RANGE * float(rows[:, lo:hi].sum(axis=(1, 2)).max(initial=0.0)) < EXACT for lo, hi in ranges):
            return ranges
    return None


def _held(w: np.ndarray, w_zero_point: np.ndarray | None, group: int, extra: float = 0.0) -> Held:
    """The weights as held, accumulating in float32 when that is exact, else float32 by input-channel chunks
    (a single group), else float64.

    Every partial sum of a row's products, in any order, is at most X_RANGE * (the row's L1 norm) (plus
    ``extra``, a bias added to it); below 2**24 float32 holds all of them exactly (sgemm, half the bytes to
    copy), and float64 does below 2**53. Random int8 weights pass 2**24 from ~1000 taps a row (resnet50's
    128-channel 3x3 convs); a chunk's exact float32 result then goes into a float64 sum.
    """
    zp = None if w_zero_point is None else np.asarray(w_zero_point, dtype=np.float64)
    zero = None
    if zp is not None and np.any(zp):
        zero = zp.reshape((-1,) + (1,) * (w.ndim - 1)) if zp.size > 1 else zp.reshape(())
    rows = np.abs(w.astype(np.float64) - (0.0 if zero is None else zero)).reshape(w.shape[0], w.shape[1], -1)
    whole = ((0, w.shape[1] * group),)
    if X_RANGE * float(rows.sum(axis=(1, 2)).max(initial=0.0)) + extra < EXACT:
        chunks: tuple[tuple[int, int], ...] | None = whole
    else:
        chunks = _chunks(rows, w.shape[1]) if group == 1 else None
    dtype = np.dtype(np.float32 if chunks is not None else np.float64)
    return Held(w, None if zero is None else zero.astype(dtype), dtype, group, chunks or whole)


class IntegerConv:
    """sum((x - x_zp) * (w - w_zp)) per window through the float Conv's methods, one plan per input shape.

    Padding is zero after centering, i.e. pad cells hold x_zp, as onnxruntime pads.
    """

    def __init__(self, window_attrs: dict) -> None:
        self.attrs = window_attrs
        self.plans: dict[tuple, tuple] = {}

    def _plan(self, x: np.ndarray, p: float_conv.Packed) -> tuple:
        key = (x.shape[1:], p.kernel, p.group)
        if key not in self.plans:
            win = geo.window(x.shape[2:], p.kernel, clamp_same=True, **self.attrs)
            self.plans[key] = (float_conv.plan_for(win, p, x.shape[1]), win.out_shape)
        return self.plans[key]

    def __call__(self, x: np.ndarray, x_zero_point: np.ndarray | None, held: Held, dtype: np.dtype,
                 finish: Callable[[np.ndarray, np.ndarray, tuple], None]) -> np.ndarray:
        """The conv's result as ``dtype``: ``finish(y, out, region)`` turns each finished tile of the float
        accumulator ``y`` (exact integers) into ``out[region]``, possibly from several threads at once."""
        wf = held.centered()
        xc = scratch(f"minfer_ops_conv-int-x-{held.dtype.char}", x.shape, held.dtype)
        zp = 0 if x_zero_point is None else np.asarray(x_zero_point).reshape(-1)[0]
        np.copyto(xc, x, casting="unsafe")  # a converting copy, then a float subtract: faster than one mixed-type loop
        if zp:
            np.subtract(xc, held.dtype.type(zp), out=xc)
        if len(held.chunks) > 1:
            return self._chunked(xc, wf, held, dtype, finish)
        p = float_conv.pack(wf, held.group)
        plan, out_shape = self._plan(xc, p)
        out = np.empty((x.shape[0], p.out_channels) + out_shape, dtype)
        if out.size:
            y = scratch(f"minfer_ops_conv-int-y-{held.dtype.char}", out.shape, held.dtype)
            plan(xc, p, y, None, lambda acc, region: finish(acc, out, region))
        return out

    def _chunked(self, xc: np.ndarray, wf: np.ndarray, held: Held, dtype: np.dtype,
                 finish: Callable[[np.ndarray, np.ndarray, tuple], None]) -> np.ndarray:
        """One exact float32 conv per input-channel chunk, summed in float64, then ``finish`` on the whole."""
        acc = None
        for lo, hi in held.chunks:
            p = float_conv.pack(np.ascontiguousarray(wf[:, lo:hi]), 1)
            part = np.ascontiguousarray(xc[:, lo:hi])
            plan, out_shape = self._plan(part, p)
            y = scratch("minfer_ops_conv-int-y-f", (xc.shape[0], p.out_channels) + out_shape, np.float32)
            if y.size:
                plan(part, p, y, None, None)
            if acc is None:
                acc = y.astype(np.float64)
            else:
                acc += y
        out = np.empty(acc.shape, dtype)
        if out.size:
            finish(acc, out, (slice(None),) * acc.ndim)
        return out


def _window_attrs(auto_pad: str, dilations, pads, strides) -> dict:
    return dict(auto_pad=auto_pad, dilations=dilations, pads=pads, strides=strides)


def _build_weights(ctx, w_index: int, zp_index: int, group: int, extra: float = 0.0) -> Held | None:
    """The held weights when the node's weights and their zero point (or its absence) are fixed at build."""
    consts = tuple(ctx.constants) + (None,) * (zp_index + 1)
    types = tuple(ctx.input_types) + (None,) * (zp_index + 1)
    zp_fixed = consts[zp_index] is not None or types[zp_index] is None
    if consts[w_index] is None or not zp_fixed:
        return None
    return _held(consts[w_index], consts[zp_index], group, extra)


@kernel("ConvInteger", since=10, prepare=True, packed=(1, 3))
def conv_integer(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """ConvInteger-10: int32 sum((x - x_zero_point) * (w - w_zero_point)) per window."""
    integer = IntegerConv(_window_attrs(auto_pad, dilations, pads, strides))
    fixed = _build_weights(ctx, 1, 3, group)
    del ctx  # packed=(1, 3): the closure must not keep the originals alive through ctx.constants

    def run(x, w, x_zero_point=None, w_zero_point=None):
        held = fixed if fixed is not None else _held(w, w_zero_point, group)
        return integer(x, x_zero_point, held, np.dtype(np.int32), _to_int32)

    return run


def _to_int32(y: np.ndarray, out: np.ndarray, region: tuple) -> None:
    np.copyto(out[region], y[region], casting="unsafe")  # exact integers


def _requantize_into(dst: np.ndarray, v: np.ndarray, scale: np.ndarray, zp: np.float32) -> None:
    """dst = saturate(round-half-even(v * scale) + zp): in float32, as onnxruntime's MLAS requantizes.

    onnxruntime converts the int32 accumulator to float32 and multiplies by the float32 output scale
    (x_scale * w_scale / y_scale, itself computed in float32); in float64 some products would round to
    the other side of a .5. ``v`` holds exact integers (float32 rounding them is the int32's); it is
    overwritten.
    """
    info = np.iinfo(dst.dtype)
    if v.dtype != np.float32:
        v = v.astype(np.float32)
    v *= scale
    np.clip(v, np.float32(info.min) - zp, np.float32(info.max) - zp, out=v)
    np.rint(v, out=v)
    np.add(v, zp, out=dst, casting="unsafe")  # integers in range: the conversion is exact


def _output_scale(x_scale, w_scale, y_scale) -> np.ndarray:
    """x_scale * w_scale / y_scale in float32 (one per output channel when w_scale is 1-D)."""
    xs = np.float32(np.asarray(x_scale).reshape(-1)[0])
    ys = np.float32(np.asarray(y_scale).reshape(-1)[0])
    return (xs * np.asarray(w_scale, dtype=np.float32).reshape(-1)) / ys


def _bias_bound(ctx) -> float:
    """The largest |bias| when the bias is a constant (it joins the exactness bound of the accumulation)."""
    b = ctx.constants[8] if len(ctx.constants) > 8 else None
    return float(np.abs(b.astype(np.float64)).max(initial=0.0)) if b is not None else float(2**31)


@kernel("QLinearConv", since=10, prepare=True, packed=(3, 5))
def qlinear_conv(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """QLinearConv-10: the integer conv of the centered operands plus int32 bias, requantized to y's type."""
    integer = IntegerConv(_window_attrs(auto_pad, dilations, pads, strides))
    no_bias = len(ctx.input_types) <= 8 or ctx.input_types[8] is None
    fixed = _build_weights(ctx, 3, 5, group, 0.0 if no_bias else _bias_bound(ctx))
    del ctx

    def run(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None):
        held = fixed if fixed is not None else _held(w, w_zero_point, group, 0.0 if b is None else float(2**31))
        per_channel = _output_scale(x_scale, w_scale, y_scale)
        zp = np.float32(np.asarray(y_zero_point).reshape(-1)[0])
        rank = x.ndim - 2
        bias = None if b is None else b.astype(held.dtype).reshape((-1,) + (1,) * rank)
        scale = per_channel.reshape((-1,) + (1,) * rank) if per_channel.size > 1 else per_channel.reshape(())

        def finish(y: np.ndarray, out: np.ndarray, region: tuple) -> None:
            part = y[region]
            ch = region[1] if len(region) > 1 else slice(None)
            if bias is not None:
                part += bias[ch]  # exact: the bound at build counted the bias
            _requantize_into(out[region], part, scale[ch] if scale.ndim else scale, zp)

        return integer(x, x_zero_point, held, np.asarray(y_zero_point).dtype, finish)

    return run
