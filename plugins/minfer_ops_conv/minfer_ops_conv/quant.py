"""Kernels: ConvInteger and QLinearConv: integer convolution, accumulated exactly, requantized as onnxruntime does.

The weights stay 8-bit (declared ``packed``: the engine frees the originals). Each run centers them into a
float scratch matrix and runs the float Conv's own methods (pointwise GEMM, im2col slabs, depthwise taps; never
Winograd, whose transforms are inexact on integers) on the centered input: every partial sum of 8-bit
products is an integer the float type holds exactly (float32 below 2**24; past that, the input channels are
cut into chunks whose float32 convs are exact, summed in float64: see `_held`), so the order in which a method
sums them does not matter. The conversion of each tile to the integer output runs in the conv's epilogue,
while the tile is still in cache. A depthwise conv instead holds its few centered weights as float32 and runs the
registered Conv kernel (any plugin's: minfer-ops-numba's compiled loops), as a float model's depthwise conv does.

minfer_passes' integer fusion makes two ai.minfer ops of the float conversions around these convs, run here:
``FloatQLinearConv`` (QuantizeLinear -> QLinearConv -> DequantizeLinear: x quantized while it is centered, each
output tile dequantized in the epilogue, then the ChannelAffine after it and the next conv's QuantizeLinear) and
``ScaledConvInteger`` (ConvInteger -> Cast -> Mul by a scalar, then the ChannelAffine; the DynamicQuantizeLinear
before it in its input conversion). The steps are requantize.py's: one call of ``ai.minfer::Requantize``'s
registered kernel per tile when a plugin installs a compiled one (minfer-ops-numba), else numpy's passes.
"""

from __future__ import annotations

from typing import Callable, Optional

import attrs
import numpy as np

from minfer_core import KernelContext, TensorType, get_registry, kernel, parallel_for, prepare_node, scratch

from . import _geometry as geo
from . import conv as float_conv
from . import requantize as rq
from .requantize import requantize  # noqa: F401 (its numpy kernel registers with this module's: kernels_in)

MINFER = "ai.minfer"
# |x - x_zp| for 8-bit x and zero point
X_RANGE = 255
# weights of at least this many elements are converted by the intra-op threads (~100 us of conversion: the
# hand-over costs ~50 us)
SPLIT_WEIGHTS = 1 << 18


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

    def centered(self, channels: tuple[int, int] | None = None) -> np.ndarray:
        """w - w_zp as ``dtype`` (only input ``channels`` [lo, hi) when given: a chunk, contiguous), in this thread's
        scratch (contents valid until its next call); large weights are converted by the intra-op threads, rows
        split between them."""
        w = self.w if channels is None else self.w[:, channels[0]:channels[1]]
        wf = scratch(f"minfer_ops_conv-int-w-{self.dtype.char}", w.shape, self.dtype)
        if w.size >= SPLIT_WEIGHTS and w.shape[0] > 1:
            parallel_for(w.shape[0], lambda lo, hi: self._center(w, wf, lo, hi))
        else:
            self._center(w, wf, 0, w.shape[0])
        return wf

    def _center(self, w: np.ndarray, wf: np.ndarray, lo: int, hi: int) -> None:
        np.copyto(wf[lo:hi], w[lo:hi], casting="unsafe")  # a converting copy, then a float subtract
        if self.zero is not None:
            zero = self.zero[lo:hi] if self.zero.ndim and self.zero.shape[0] > 1 else self.zero
            np.subtract(wf[lo:hi], zero, out=wf[lo:hi])


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


# (scale, low, high, compiled) of a QuantizeLinear in (`centered_input`); compiled: Requantize's registered kernel
Rounding = Optional[tuple[np.float32, float, float, "rq.Compiled | None"]]


def centered_input(x: np.ndarray, x_zero_point: np.ndarray | None, dtype: np.dtype, rounding: Rounding) -> np.ndarray:
    """x - x_zp as ``dtype`` in this thread's scratch (padding the conv then pads with x_zp, as onnxruntime does).

    ``rounding`` = (scale, low, high): x is float32 and this is QuantizeLinear(x) - x_zp, i.e.
    clip(rint(x / scale), low, high) with low/high the 8-bit range less x_zp, as QuantizeLinear rounds.
    """
    xc = scratch(f"minfer_ops_conv-int-x-{dtype.char}", x.shape, dtype)
    if rounding is not None:
        scale, low, high, compiled = rounding
        if compiled is not None and dtype == np.float32:  # divide, rint and clip in one compiled pass
            return compiled.fn(x, np.asarray([scale], np.float32), out=xc)
        q = xc if dtype == np.float32 else np.empty(x.shape, np.float32)  # the float32 division QuantizeLinear does
        np.divide(x, scale, out=q)
        np.rint(q, out=q)
        np.clip(q, low, high, out=q)
        if q is not xc:
            np.copyto(xc, q)
        return xc
    zp = 0 if x_zero_point is None else np.asarray(x_zero_point).reshape(-1)[0]
    np.copyto(xc, x, casting="unsafe")  # a converting copy, then a float subtract: faster than one mixed-type loop
    if zp:
        np.subtract(xc, dtype.type(zp), out=xc)
    return xc


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
                 finish: Callable[[np.ndarray, np.ndarray, tuple], None], rounding: Rounding = None,
                 centered: bool = False) -> np.ndarray:
        """The conv's result as ``dtype``: ``finish(y, out, region)`` turns each finished tile of the float
        accumulator ``y`` (exact integers) into ``out[region]``, possibly from several threads at once.
        ``rounding``: x is float32, quantized on the way in (`centered_input`); ``centered``: x is float32 x - x_zp
        already (taken as it is when it is the accumulation's type)."""
        reuse = centered and x.dtype == held.dtype
        xc = x if reuse else centered_input(x, x_zero_point, held.dtype, rounding)
        if len(held.chunks) > 1:
            return self._chunked(xc, held, dtype, finish)
        p = float_conv.pack(held.centered(), held.group)
        plan, out_shape = self._plan(xc, p)
        out = np.empty((x.shape[0], p.out_channels) + out_shape, dtype)
        if out.size:
            y = scratch(f"minfer_ops_conv-int-y-{held.dtype.char}", out.shape, held.dtype)
            plan(xc, p, y, None, lambda acc, region: finish(acc, out, region))
        return out

    def _chunked(self, xc: np.ndarray, held: Held, dtype: np.dtype,
                 finish: Callable[[np.ndarray, np.ndarray, tuple], None]) -> np.ndarray:
        """One exact float32 conv per input-channel chunk (its weights centered straight into a contiguous
        scratch), summed in float64, then ``finish`` on the whole."""
        acc = None
        for lo, hi in held.chunks:
            p = float_conv.pack(held.centered((lo, hi)), 1)
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


class DepthwiseConv:
    """A depthwise integer conv through the registered Conv kernel (minfer-ops-numba's loops when installed).

    Its centered weights (a few values a channel) are held as float32 from the build, like a float model's, so
    that the kernels for constant weights apply (taps packed once, compiled loops). Only when float32 sums the
    conv exactly (``Held.chunks`` one range, float32): any kernel, summing in any order, then gives the exact
    integers.
    """

    def __init__(self, ctx, held: Held, window_attrs: dict, x_index: int) -> None:
        self.weights = held.centered().copy()
        self.kernel = tuple(held.w.shape[2:])
        self.attrs = window_attrs
        x = ctx.input_types[x_index]
        types = (TensorType(np.float32, x.shape), TensorType(np.float32, self.weights.shape))
        inner_ctx = KernelContext(ctx.node_name, "Conv", 11, types, (TensorType(np.float32, None),),
                                  (None, self.weights), 1)
        attrs = {k: v for k, v in window_attrs.items() if v is not None}
        attrs.update(group=held.group, kernel_shape=list(self.kernel))
        found = prepare_node(get_registry(), inner_ctx, attrs)
        self.inner, self.fn = found if found is not None else (None, None)
        self.shapes: dict[tuple, tuple[int, ...]] = {}

    @staticmethod
    def applies(ctx, held: Held | None, x_index: int) -> bool:
        """Whether the node is a depthwise conv (group == C == M) of a known 4-D input that float32 sums exactly."""
        x = ctx.input_types[x_index] if len(ctx.input_types) > x_index else None
        if held is None or x is None or x.shape is None or len(x.shape) != 4 or len(held.chunks) != 1:
            return False
        w = held.w
        depthwise = held.group > 1 and w.shape[1] == 1 and x.shape[1] == held.group == w.shape[0]
        return depthwise and held.dtype == np.float32

    def __call__(self, x: np.ndarray, x_zero_point: np.ndarray | None, dtype: np.dtype,
                 finish: Callable[[np.ndarray, np.ndarray, tuple], None], rounding: Rounding = None,
                 centered: bool = False) -> np.ndarray:
        """As `IntegerConv.__call__`, with the held weights."""
        reuse = centered and x.dtype == np.float32
        xc = x if reuse else centered_input(x, x_zero_point, np.dtype(np.float32), rounding)
        if not (self.inner.out and self.inner.epilogue):
            y = np.asarray(self.fn(xc, self.weights), np.float32)
            out = np.empty(y.shape, dtype)
            if out.size:
                finish(y, out, (slice(None),) * y.ndim)
            return out
        if x.shape not in self.shapes:
            win = geo.window(x.shape[2:], self.kernel, clamp_same=True, **self.attrs)
            self.shapes[x.shape] = (x.shape[0], self.weights.shape[0]) + win.out_shape
        out = np.empty(self.shapes[x.shape], dtype)
        if out.size:
            y = scratch("minfer_ops_conv-int-y-f", out.shape, np.float32)
            self.fn(xc, self.weights, out=y, epilogue=lambda acc, region: finish(acc, out, region))
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


@kernel("ConvInteger", since=10, prepare=True, packed=(1, 3), views=False)
def conv_integer(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """ConvInteger-10: int32 sum((x - x_zero_point) * (w - w_zero_point)) per window."""
    return _conv_integer(ctx, False, _window_attrs(auto_pad, dilations, pads, strides), group)


@kernel("ScaledConvInteger", domain=MINFER, since=1, prepare=True, packed=(1, 3), views=False)
def scaled_conv_integer(ctx, *, activation="", activation_params=None, dynamic_input=0, auto_pad="NOTSET",
                        dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """ai.minfer::ScaledConvInteger-1: Cast(ConvInteger(x, w, x_zero_point, w_zero_point), float32) * scale (one
    float32 value), then ChannelAffine's act(y * S + B) when given S/B (inputs 5, 6) or an activation, all in the
    conv's epilogue; with ``dynamic_input``, x is float32 and DynamicQuantizeLinear(x) = (xq, xs, xz) runs in
    the input conversion: the conv of xq with xz, scaled by xs * scale (minfer_passes' integer fusion)."""
    post = rq.Post(activation or "", rq.bounds(activation or "", activation_params))
    types = tuple(ctx.input_types) + (None,) * 7
    compiled = rq.Compiled.find(ctx.node_name, ctx.output_types[0] if ctx.output_types else None,
                                (False, types[5] is not None, types[6] is not None), rounding=0,
                                activation=post.activation, activation_params=list(post.clip))
    dynamic = rq.DynamicInput(ctx.node_name, types[0]) if dynamic_input else None
    return _conv_integer(ctx, True, _window_attrs(auto_pad, dilations, pads, strides), group, post, compiled, dynamic)


def _conv_integer(ctx, scaled: bool, window_attrs: dict, group: int, post: rq.Post | None = None,
                  compiled: rq.Compiled | None = None, dynamic: rq.DynamicInput | None = None):
    integer = IntegerConv(window_attrs)
    fixed = _build_weights(ctx, 1, 3, group)
    depthwise = _depthwise(ctx, fixed, integer.attrs, 0)
    del ctx  # packed=(1, 3): the closure must not keep the originals alive through ctx.constants

    def run(x, w, x_zero_point=None, w_zero_point=None, scale=None, s=None, a=None):
        finish, dtype, rounding = _to_int32, np.dtype(np.int32), None
        if dynamic is not None:  # the scale the Mul made of DynamicQuantizeLinear's and the weight's
            x, x_zero_point, rounding, x_scale = dynamic(x)
            scale = np.multiply(x_scale, np.asarray(scale, np.float32).reshape(-1)[0])
        if scaled:
            finish, dtype = rq.scaled_by(rq.frozen(np.asarray(scale, np.float32).reshape(-1)[:1]), x.ndim, post, s, a,
                                       compiled), np.dtype(np.float32)
        if depthwise is not None:
            return depthwise(x, x_zero_point, dtype, finish, rounding)
        held = fixed if fixed is not None else _held(w, w_zero_point, group)
        return integer(x, x_zero_point, held, dtype, finish, rounding)

    return run


def _depthwise(ctx, held: Held | None, window_attrs: dict, x_index: int) -> DepthwiseConv | None:
    """The node's `DepthwiseConv` when it `applies` and a registered Conv kernel takes it, else None."""
    if not DepthwiseConv.applies(ctx, held, x_index):
        return None
    found = DepthwiseConv(ctx, held, window_attrs, x_index)  # type: ignore[arg-type]
    return found if found.fn is not None else None


def _to_int32(y: np.ndarray, out: np.ndarray, region: tuple) -> None:
    np.copyto(out[region], y[region], casting="unsafe")  # exact integers


def _bias_bound(ctx) -> float:
    """The largest |bias| when the bias is a constant (it joins the exactness bound of the accumulation)."""
    b = ctx.constants[8] if len(ctx.constants) > 8 else None
    return float(np.abs(b.astype(np.float64)).max(initial=0.0)) if b is not None else float(2**31)


@kernel("QLinearConv", since=10, prepare=True, packed=(3, 5), views=False)
def qlinear_conv(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """QLinearConv-10: the integer conv of the centered operands plus int32 bias, requantized to y's type."""
    return _qlinear_conv(ctx, False, False, _window_attrs(auto_pad, dilations, pads, strides), group)


@kernel("FloatQLinearConv", domain=MINFER, since=1, prepare=True, packed=(3, 5), views=False)
def float_qlinear_conv(ctx, *, float_input=0, float_output=0, activation="", activation_params=None,
                       output_quantization=None, output_rounding=None, residual_rounding=None, auto_pad="NOTSET",
                       dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """ai.minfer::FloatQLinearConv-1: QLinearConv of QuantizeLinear(X, x_scale, x_zero_point) (``float_input`` 1;
    2: X is already that, centered: QuantizeLinear(X) - x_zero_point as float32), then DequantizeLinear(Y, y_scale,
    y_zero_point) (``float_output``), then ChannelAffine's act(y * S + B) when given S/B (inputs 9, 10) or an
    activation, then with ``output_quantization`` [scale, low, high] clip(rint(y / scale), low, high) (the next
    conv's QuantizeLinear, centered), or with ``output_rounding`` [scale, low, high] clip(rint(y / scale), low, high)
    * scale (ai.minfer::QuantizeDequantize), then with ``residual_rounding`` [scale, low, high] + Z (input 11, of the
    output's shape) and that rounding, all in the conv's input conversion and epilogue: bit for bit the nodes it
    stands for (minfer_passes' integer fusion)."""
    if residual_rounding and not output_rounding:
        raise ValueError(f"{ctx.node_name}: FloatQLinearConv takes residual_rounding (+ Z, rounded) only after "
                         f"output_rounding; got output_rounding={output_rounding!r}")
    if (activation or len(ctx.input_types) > 9 or output_quantization or output_rounding) and not float_output:
        raise ValueError(f"{ctx.node_name}: FloatQLinearConv takes S, B, an activation, an output quantization or "
                         f"rounding only with float_output=1")
    if output_quantization and output_rounding:
        raise ValueError(f"{ctx.node_name}: FloatQLinearConv takes output_quantization (centered integers) or "
                         f"output_rounding (grid values), not both; keep one and round the other in its own node")
    grid = output_quantization or output_rounding
    post = rq.Post(activation or "", rq.bounds(activation or "", activation_params),
                   tuple(float(v) for v in grid) if grid else None, bool(output_rounding))
    residual = None
    if residual_rounding:
        scale, low, high = (float(v) for v in residual_rounding)
        residual = (scale, low, high, rq.registered_rounding(ctx, scale, low, high))
    return _qlinear_conv(ctx, int(float_input), bool(float_output), _window_attrs(auto_pad, dilations, pads, strides),
                         group, post, residual)


def _qlinear_conv(ctx, float_input: int, float_output: bool, window_attrs: dict, group: int,
                  post: rq.Post | None = None, residual: tuple | None = None):
    integer = IntegerConv(window_attrs)
    no_bias = len(ctx.input_types) <= 8 or ctx.input_types[8] is None
    fixed = _build_weights(ctx, 3, 5, group, 0.0 if no_bias else _bias_bound(ctx))
    depthwise = _depthwise(ctx, fixed, integer.attrs, 0)
    quantize, compiled = rq.compiled_steps(ctx, float_input, float_output, post)
    dtype = np.dtype(np.float32) if float_output else None
    fixed_steps = rq.fixed_steps(ctx, fixed, float_input, float_output, post, quantize, compiled)
    del ctx

    def run(x, x_scale, x_zero_point, w, w_scale, w_zero_point, y_scale, y_zero_point, b=None, s=None, a=None,
            z=None):
        steps = fixed_steps
        if steps is None:  # parameters computed in the graph: the steps made from this run's values
            held = fixed if fixed is not None else _held(w, w_zero_point, group, 0.0 if b is None else float(2**31))
            steps = rq.Steps.of(held, x.ndim, float_input, float_output, post, quantize, compiled,
                              (x_scale, x_zero_point, w_scale, y_scale, y_zero_point, b, s, a))
        out_dtype = dtype if dtype is not None else np.asarray(y_zero_point).dtype
        centered = float_input == 2  # x holds QuantizeLinear(x) - x_zero_point already
        finish = steps.finish if residual is None else rq.plus_residual(steps.finish, z, residual)
        if depthwise is not None:
            return depthwise(x, None if centered else x_zero_point, out_dtype, finish, steps.rounding, centered)
        return integer(x, None if centered else x_zero_point, steps.held, out_dtype, finish, steps.rounding, centered)

    return run
