"""ai.minfer::FloatQLinearConv and ScaledConvInteger on `igemm`'s exact 8-bit GEMM (AVX-512 VNNI).

minfer-ops-conv's kernels center the 8-bit operands into float32 and run the float conv's sgemm on them (exact
below 2**24; past it by input-channel chunks summed in float64), then an epilogue on each tile. Here the input
becomes 8 bits (QuantizeLinear's float32 division, clip and rint as the numpy kernel's compiled input step, or
DynamicQuantizeLinear's, then + x's zero point; an 8-bit input as it is) and the conv is igemm's integer product
(qconv_gemm.py: the weight as given is A, held once; the image or its 8-bit im2col is B). Its exact sums go to
the epilogue the numpy kernel would run, with the same operands: the compiled ``Requantize`` (minfer-ops-numba's
quant.py) on float32 sums, or, where the numpy kernel sums in float64 chunks, its numpy steps (`Steps`), then
FloatQLinearConv's residual Add and rounding: the numpy kernel's bits. A NaN input (no 8-bit value) gives NaN
where a window holds it, as the float conv does.

Measured on one thread of this machine (loaded): resnet50's convs 1.3-3x the numpy kernels (the 3x3 ones ~2x,
the chunked 512-channel ones 2.5-7x), MobileNetV2's small 1x1 convs (K of 16-32 rows, wide images) 0.7-1x,
where igemm's write-out of each sum costs more than sgemm's product: the core's per-node timing keeps the
numpy kernel there. A stem (at most 4 input channels, 3x3) takes qstem.py's direct loop instead:
FloatQLinearConv's, and since session 28 a dynamic ScaledConvInteger's (its input's range found first, then
quantized and centered by the stem: MobileNetV2's dynamic model 11.03 -> 10.77 ms in one process,
bench/results/session28/dynamic-stem-ab.txt). ``applies``: group 1 (depthwise convs are not GEMMs), a 4-D input
of known channels, a constant 8-bit 4-D weight and zero point whose sums int32 holds, FloatQLinearConv's constant
quantization parameters and float32 output, ScaledConvInteger's compiled epilogue, and VNNI (igemm's portable
kernel is slower than sgemm); not a small 1x1 conv that qconv_blas.py's micro-kernel product takes (MICRO_CHANNELS,
MICRO_OUTPUTS).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import KernelContext, TensorType, get_registry, kernel, prepare_node, scratch

from . import igemm
from . import qconv_gemm as qg
from . import qstem
from ._jit import PRIORITY, input_type, readonly
from .dynamic_quant import dynamic_grid, scale_and_zero_point, value_range, warm_range

MINFER = "ai.minfer"
EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
EXACT = 2**24  # float32 holds every integer below this: the numpy kernel's single-chunk float32 accumulation
INT32 = 2**31
X_RANGE = 255  # |x - x_zp| for 8-bit x and zero point


def _constant(ctx: Any, index: int) -> np.ndarray | None:
    consts = tuple(ctx.constants) + (None,) * (index + 1)
    return consts[index]


def _given(ctx: Any, index: int) -> bool:
    return input_type(ctx, index) is not None


def _bound(w: np.ndarray, zp: np.ndarray | None, bias: np.ndarray | None) -> float:
    """The largest |partial sum| (the numpy kernel's bound): 255 * the largest row's L1 norm of w - w_zp, plus the
    largest |bias|."""
    zero = 0.0 if zp is None else np.asarray(zp, np.float64).reshape((-1,) + (1,) * (w.ndim - 1))
    rows = np.abs(w.astype(np.float64) - zero).reshape(w.shape[0], -1).sum(axis=1).max(initial=0.0)
    extra = 0.0 if bias is None else float(np.abs(bias.astype(np.float64)).max(initial=0.0))
    return X_RANGE * float(rows) + extra


def _fits(ctx: Any, attrs: dict) -> bool:
    """What this kernel computes (see the module docstring)."""
    x, w = input_type(ctx, 0), _constant(ctx, 3)
    if not attrs.get("float_output") or attrs.get("float_input", 0) not in (0, 1, 2) or attrs.get("group", 1) != 1:
        return False
    if x is None or x.shape is None or len(x.shape) != 4 or not all(isinstance(d, int) for d in x.shape[1:]):
        return False
    if w is None or w.ndim != 4 or w.dtype not in EIGHT_BIT or w.size == 0 or x.shape[1] != w.shape[1]:
        return False
    wz = _constant(ctx, 5)
    if wz is None and _given(ctx, 5) or wz is not None and wz.size not in (1, w.shape[0]):
        return False
    needed = (1, 2, 4, 6, 7) + tuple(i for i in (8, 9, 10) if _given(ctx, i))
    if any(_constant(ctx, i) is None for i in needed) or _given(ctx, 11) and not attrs.get("residual_rounding"):
        return False
    xz, yz = _constant(ctx, 2), _constant(ctx, 7)
    if xz.size != 1 or yz.size != 1 or xz.dtype not in EIGHT_BIT or (not attrs.get("float_input") and
                                                                        x.dtype != xz.dtype):
        return False
    out = ctx.output_types[0] if ctx.output_types else None
    if out is None or out.dtype != np.float32 or not igemm.vnni():
        return False
    # the product's exact integers fit igemm's int32; a small 1x1 conv is the micro-kernel's (`_left_to_micro`)
    return _bound(w, wz, _constant(ctx, 8)) < INT32 and not _left_to_micro(ctx, attrs, w, scaled=False)


# 1x1 stride-1 convs of at most this many input channels are left to qconv_blas.py's product on pointwise.py's
# micro-kernel where it applies. In a run it was 30-55% faster than igemm there (MobileNetV2 QDQ, per node, the
# two engines' runs interleaved: 24->144 at 56x56 200 against 316 us, 32->192 at 28x28 110/185, 64->384 at 14x14
# 106/148, bench/results/session31/choice-ab-qdq-pre.txt; 16->96 at 112x112 410/953), but the first run's timing
# (three calls back to back, all in cache) often kept igemm: its call after other kernels took ~30% over its call
# repeated. MobileNetV2, each engine tuned in its own fresh choice store, runs interleaved, without the rule and with
# it, of the float model's time (bench/results/session32/micro-rule-ab.txt): QDQ 0.99 -> 0.97, per channel 1.10 ->
# 1.04, QOperator 0.98 -> 0.95, dynamic 1.33 -> 1.31; pre-processed 1.04 -> 1.03, 0.97 -> 0.92, 1.25 -> 1.23. It
# costs resnet50 its 64-channel 1x1 convs at 56x56, where igemm was faster: QDQ 0.72 -> 0.73-0.75, QOperator 0.57
# -> 0.58, dynamic 0.83 -> 0.80 (bench/results/session32/micro-rule-ab-resnet50.txt; a rule by map size or K < 64
# would keep them, unmeasured).
MICRO_CHANNELS = 64
# and at most this many output channels, of any input channels: MobileNetV2's projections to 16-32 channels. In a
# run the micro-kernel product was faster there (dynamic MobileNetV2's 192->32 at 28x28: 128 against igemm's 198
# us, and 122/136; 192->64 at 14x14 82/105), where the first run's timing still kept igemm for some; the static
# forms' timing already gave them the product. From 64 outputs igemm held its own (384->64 at 14x14: 119/122)
MICRO_OUTPUTS = 32


def _left_to_micro(ctx: Any, attrs: dict, w: np.ndarray, scaled: bool) -> bool:
    """Whether qconv_blas.py's kernel takes this node on pointwise.py's micro-kernel: a 1x1 conv at stride 1, no
    pads, of at most MICRO_CHANNELS input channels or MICRO_OUTPUTS output channels, that kernel applying and the
    micro-kernel built here."""
    from . import pointwise, qconv_blas  # (qconv_blas imports this module)

    small = w.shape[1] <= MICRO_CHANNELS or w.shape[0] <= MICRO_OUTPUTS
    if not small or w.shape[2:] != (1, 1) or any(v != 1 for v in attrs.get("strides") or [1]):
        return False
    if any(attrs.get("pads") or [0]):
        return False
    fits = qconv_blas._scaled_fits if scaled else qconv_blas._fits
    return pointwise.available() and fits(ctx, attrs)


def _requantize_attrs(ctx: Any, attrs: dict) -> dict:
    """The epilogue's Requantize attributes, as minfer-ops-conv's kernel makes them (requantize.compiled_steps)."""
    yz, ys = _constant(ctx, 7), _constant(ctx, 6)
    info, zp = np.iinfo(yz.dtype), np.float32(yz.reshape(-1)[0])
    activation = attrs.get("activation") or ""
    lo, hi = ([float(v) for v in attrs.get("activation_params") or []] + [-np.inf, np.inf])[:2] \
        if activation == "Clip" else (-np.inf, np.inf)
    found = {"low": float(np.float32(info.min) - zp), "high": float(np.float32(info.max) - zp),
             "out_scale": float(np.float32(ys.reshape(-1)[0])), "activation": activation,
             "activation_params": [float(np.float32(lo)), float(np.float32(hi))]}
    grid = attrs.get("output_quantization") or attrs.get("output_rounding")
    if grid:
        found.update(post_scale=float(grid[0]), post_low=float(grid[1]), post_high=float(grid[2]),
                     post_dequantize=int(bool(attrs.get("output_rounding"))))
    return found


def _epilogue(ctx: Any, attrs: dict) -> Any:
    """The registered Requantize kernel the numpy kernel's epilogue calls, when it is this plugin's compiled one
    (else None: the numpy kernel's own steps would run, which this kernel does not reproduce)."""
    out = ctx.output_types[0] if ctx.output_types else None
    if out is None or out.dtype != np.float32 or out.shape is None or len(out.shape) < 2:
        return None
    vector = TensorType(np.float32, (None,))
    types = (out, vector, *(vector if _given(ctx, i) else None for i in (8, 9, 10)))
    inner = KernelContext(ctx.node_name, "Requantize", 1, types, (out,), (None,) * 5, 1)
    op_attrs = _requantize_attrs(ctx, attrs)
    found = get_registry().select_kernel(MINFER, "Requantize", 1, "numpy", inner, op_attrs)
    if found is None or not found.fn.__module__.startswith(__name__.rsplit(".", 1)[0]):
        return None
    return found.prepared(inner, op_attrs)


def _rounding(ctx: Any, grid: list[float]) -> Any:
    """The residual's QuantizeDequantize: the registered kernel, as the numpy kernel finds it, or None (numpy's
    steps)."""
    out = ctx.output_types[0]
    scale, low, high = (float(v) for v in grid)
    op_attrs = {"scale": scale, "low": low, "high": high, "post_scale": 0.0, "post_low": 0.0, "post_high": 0.0}
    inner = KernelContext(ctx.node_name, "QuantizeDequantize", 1, (out, None, None), (out,), (None, None, None), 1)
    found = get_registry().select_kernel(MINFER, "QuantizeDequantize", 1, "numpy", inner, op_attrs)
    return None if found is None else found.prepared(inner, op_attrs)


def _frozen(v: Any) -> np.ndarray | None:
    """A read-only flat float32 array (the epilogue's per-channel operands, sliced per range without new types)."""
    return None if v is None else readonly(np.ascontiguousarray(np.asarray(v, np.float32).reshape(-1)))


class Steps:
    """The numpy kernel's own epilogue steps (minfer-ops-conv's requantize.Steps without the compiled kernel: sums
    that float32 holds only in chunks, or no compiled Requantize), on the exact integers, in its order: + bias,
    float32, * the scale, clip, rint, * y's scale; act(. * S + B); the output grid."""

    def __init__(self, ctx: Any, attrs: dict, per_channel: np.ndarray) -> None:
        rank = (-1, 1, 1)
        yz, ys, bias = _constant(ctx, 7), _constant(ctx, 6), _constant(ctx, 8)
        info, zp = np.iinfo(yz.dtype), np.float32(yz.reshape(-1)[0])
        self.bounds = (np.float32(info.min) - zp, np.float32(info.max) - zp)
        self.y_scale = np.float32(ys.reshape(-1)[0])
        self.scale = per_channel.reshape(rank) if per_channel.size > 1 else per_channel.reshape(())
        self.bias = None if bias is None else bias.astype(np.float32).astype(np.float64).reshape(rank)
        self.s, self.a = (None if _constant(ctx, i) is None else np.asarray(_constant(ctx, i), np.float32).reshape(rank)
                          for i in (9, 10))
        self.activation = attrs.get("activation") or ""
        lo, hi = ([float(v) for v in attrs.get("activation_params") or []] + [-np.inf, np.inf])[:2]
        self.clip = (np.float32(lo), np.float32(hi))
        grid = attrs.get("output_quantization") or attrs.get("output_rounding")
        self.grid = None if not grid else (np.float32(grid[0]), np.float32(grid[1]), np.float32(grid[2]))
        self.dequantize = bool(attrs.get("output_rounding"))

    def __call__(self, acc: np.ndarray, dst: np.ndarray, ch: slice) -> None:
        """dst = the steps of ``acc`` (exact integers, int32 or float64) for output channels ``ch``."""
        pick = lambda v: v if v is None or v.ndim == 0 or v.shape[0] == 1 else v[ch]  # noqa: E731
        v = (acc.astype(np.float64) if self.bias is None else np.add(acc, pick(self.bias), dtype=np.float64))
        v = v.astype(np.float32)
        v *= pick(self.scale)
        np.clip(v, *self.bounds, out=v)
        np.rint(v, out=v)
        np.multiply(v, self.y_scale, out=dst)
        if self.s is not None:
            np.multiply(dst, pick(self.s), out=dst)
        if self.a is not None:
            np.add(dst, pick(self.a), out=dst)
        if self.activation == "Relu":
            np.maximum(dst, np.float32(0), out=dst)
        elif self.activation == "Clip":
            np.clip(dst, *self.clip, out=dst)
        if self.grid is not None:
            scale, low, high = self.grid
            np.divide(dst, scale, out=dst)
            np.rint(dst, out=dst)
            np.clip(dst, low, high, out=dst)
            if self.dequantize:
                np.multiply(dst, scale, out=dst)


class QConv:
    """One FloatQLinearConv, prepared: the input's quantization, the integer conv, the numpy kernel's epilogue."""

    def __init__(self, ctx: Any, attrs: dict) -> None:
        w, wz = _constant(ctx, 3), _constant(ctx, 5)
        self.conv, self.attrs = qg.IntegerConv(w, wz, attrs), attrs
        xs, xz, ws, ys = (_constant(ctx, i) for i in (1, 2, 4, 6))
        self.x_dtype, self.x_zero = xz.dtype, int(xz.reshape(-1)[0])
        info, self.quantize = np.iinfo(self.x_dtype), None
        if attrs.get("float_input") == 1:  # the numpy kernel's input Requantize: the 8-bit range less the zp
            self.quantize = (np.float32(xs.reshape(-1)[0]), np.float32(info.min - self.x_zero),
                             np.float32(info.max - self.x_zero))
        elif attrs.get("float_input") == 2:  # x is QuantizeLinear(x) - x_zp already (integers): rint, + x_zp exact
            self.quantize = (qg.ONE, np.float32(-np.inf), np.float32(np.inf))
        per_channel = (np.float32(xs.reshape(-1)[0]) * np.asarray(ws, np.float32).reshape(-1)) / np.float32(
            ys.reshape(-1)[0])  # x_scale * w_scale / y_scale, as the numpy kernel computes it
        bias = _constant(ctx, 8)
        self.operands = [_frozen(per_channel), None if bias is None else _frozen(bias.astype(np.float32)),
                         *(_frozen(_constant(ctx, i)) for i in (9, 10))]
        # the numpy kernel's choice: its compiled Requantize on float32 sums, else its numpy steps
        self.fast = _epilogue(ctx, attrs) if _bound(w, wz, bias) < EXACT else None
        self.steps = None if self.fast is not None else Steps(ctx, attrs, per_channel)
        self.residual = attrs.get("residual_rounding")
        self.rounding = _rounding(ctx, self.residual) if self.residual else None
        self.chain = _chain(self.fast, self.operands, w.shape[0])
        # a stem (at most 4 input channels, 3x3) whose float32 sums are exact: qstem.py's direct loop, same sums
        self.stem = qstem.QStem(w, wz, attrs) if self.fast is not None and qstem.fits(w, attrs) else None
        # where the epilogue is a chain and nothing follows it, the stem applies it to each band in cache
        self.banded = self.stem is not None and self.chain is not None and not self.residual
        if self.banded:
            self.stem.warm(self.chain.operands)
        qg.compile_for(self.x_dtype)

    def finish(self, y: np.ndarray, out: np.ndarray, region: tuple, z: np.ndarray | None) -> None:
        """The numpy kernel's epilogue on a region of the exact sums ``y``, then + Z and its rounding."""
        ch = region[1]
        if self.fast is not None:
            self.fast(y[region], *(v if v is None or v.size == 1 else v[ch] for v in self.operands), out=out[region])
        else:
            self.steps(y[region], out[region], ch)
        if self.residual:
            self.add_residual(out, region, z)

    def add_residual(self, out: np.ndarray, region: tuple, z: np.ndarray) -> None:
        """+ Z on a finished region of the output, then Z's rounding."""
        part = out[region]
        np.add(part, z[region], out=part)
        if self.rounding is not None:
            self.rounding(part, None, None, out=part)
        else:
            _quantize_stage(part, np.float32(self.residual[0]), self.residual[1], self.residual[2])

    def __call__(self, x, x_scale=None, x_zero_point=None, w=None, w_scale=None, w_zero_point=None, y_scale=None,
                 y_zero_point=None, b=None, s=None, a=None, z=None):
        out = np.empty((x.shape[0], self.conv.m) + self.conv.geometry(x.shape).out_hw, np.float32)
        if not out.size:
            return out
        if self.banded and self.stem.into(x, self.quantize, self.x_zero, out, self.chain.operands):
            return out  # else x holds NaN, which igemm's path below handles
        sums = None if self.stem is None or self.banded else self.stem(x, self.quantize, self.x_zero)
        if sums is not None:  # None: x holds NaN, which igemm's path below handles
            self.finish(sums, out, (slice(None), slice(None)), z)
            return out
        size = self.conv.team(x.shape) if self.chain is not None else 0  # asked once: 1.4-3 us a time in a run
        q, nan = qg.quantized(x, self.quantize, self.x_dtype, self.x_zero, size if size > 1 else 0)
        if self.chain is not None and not nan:  # the epilogue in igemm's write-out: no sums written and read back
            self.conv(q, self.x_zero, out, out, (lambda acc, dst, region: self.add_residual(dst, region, z))
                      if self.residual else None, chain=self.chain, size=size)
            return out
        y = scratch("minfer_ops_numba-qconv-y", out.shape, np.float32 if self.fast is not None else np.int32)
        self.conv(q, self.x_zero, y, out, lambda acc, dst, region: self.finish(acc, dst, region, z))
        if nan:  # the float conv's sums are NaN where a window holds a NaN: those outputs are the epilogue of NaN
            touched = qg.touched(np.isnan(x).any(axis=1), self.conv.geometry(x.shape), self.conv.kernel_hw, self.attrs)
            acc = y.astype(np.float32 if self.fast is not None else np.float64)
            acc[np.broadcast_to(touched[:, None], acc.shape)] = np.nan
            self.finish(acc, out, (slice(None), slice(None)), z)
        return out


def _chain(epilogue: Any, operands: list, channels: int = 0) -> igemm.Chain | None:
    """The compiled Requantize ``epilogue`` (quant.py's, with its operands m, c, s, b) as an `igemm.Chain`, or None
    when it is not one (numpy's steps) or divides; given the ``channels``, shortened by `igemm.fitted` where that
    keeps its bits."""
    steps = getattr(epilogue, "steps", None)
    if steps is None:
        return None
    params, (divide, rounding, act) = steps
    if divide:
        return None
    m, c, s, b = (np.zeros(0, np.float32) if v is None else v for v in operands)
    chain = igemm.Chain(m, c, s, b, params, int(act), bool(rounding))
    if channels:
        values, row_operands = igemm.fitted(chain.operands[4], chain.operands[:4], channels)
        chain.operands = (*row_operands, values)
    return chain


def _quantize_stage(part: np.ndarray, scale: np.float32, low: float, high: float) -> None:
    """QuantizeDequantize's numpy steps in place (minfer-ops-conv's fallback when no compiled one is installed)."""
    np.divide(part, scale, out=part)
    np.rint(part, out=part)
    np.clip(part, np.float32(low), np.float32(high), out=part)
    np.multiply(part, scale, out=part)


@kernel("FloatQLinearConv", domain=MINFER, since=1, priority=PRIORITY, prepare=True, packed=(3, 5), views=False,
        applies=_fits)
def float_qlinear_conv(ctx, *, float_input=0, float_output=0, activation="", activation_params=None,
                       output_quantization=None, output_rounding=None, residual_rounding=None, auto_pad="NOTSET",
                       dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """ai.minfer::FloatQLinearConv-1 (group 1, float32 output) on VNNI: the exact 8-bit product by igemm, then the
    numpy kernel's compiled epilogue (Requantize, + Z and its rounding): its bits."""
    attrs = dict(float_input=float_input, float_output=float_output, activation=activation,
                 activation_params=activation_params, output_quantization=output_quantization,
                 output_rounding=output_rounding, residual_rounding=residual_rounding, auto_pad=auto_pad,
                 dilations=dilations, group=group, pads=pads, strides=strides)
    return QConv(ctx, attrs)


def _scaled_epilogue(ctx: Any, attrs: dict) -> Any:
    """The compiled Requantize the numpy ScaledConvInteger kernel ends with (Cast's float32 of the sums * scale,
    then ChannelAffine's act(. * S + A)), when it is this plugin's, else None."""
    out = ctx.output_types[0] if ctx.output_types else None
    if out is None or out.dtype != np.float32 or out.shape is None or len(out.shape) < 2:
        return None
    activation = attrs.get("activation") or ""
    lo, hi = ([float(v) for v in attrs.get("activation_params") or []] + [-np.inf, np.inf])[:2] \
        if activation == "Clip" else (-np.inf, np.inf)
    op_attrs = {"rounding": 0, "activation": activation, "activation_params": [np.float32(lo), np.float32(hi)]}
    vector = TensorType(np.float32, (None,))
    types = (out, vector, None, *(vector if _given(ctx, i) else None for i in (5, 6)))
    inner = KernelContext(ctx.node_name, "Requantize", 1, types, (out,), (None,) * 5, 1)
    found = get_registry().select_kernel(MINFER, "Requantize", 1, "numpy", inner, op_attrs)
    if found is None or not found.fn.__module__.startswith(__name__.rsplit(".", 1)[0]):
        return None
    return found.prepared(inner, op_attrs)


# the DynamicQuantizeLinear kernels whose scale and zero point are dynamic_quant.scale_and_zero_point's
SAME_RANGE_PARAMS = ("minfer_ops_numba.dynamic_quant", "minfer_ops_basic.cast")


def _range_params(ctx: Any) -> Any:
    """``(min, max) -> (scale, zero point)`` as the registered DynamicQuantizeLinear kernel makes them of the
    two-element [min, max] (finite): dynamic_quant's formula itself where every candidate kernel is one that
    computes it (~2 us), else a call of the kernel on the two values (~26 us); None without a kernel."""
    f32, u8 = TensorType(np.float32, None), TensorType(np.uint8, None)
    inner = KernelContext(ctx.node_name, "DynamicQuantizeLinear", 11, (f32,), (u8, f32, u8), (None,), 1)
    found = get_registry().kernel_candidates("", "DynamicQuantizeLinear", 11, "numpy", inner, {})
    if found and all(k.fn.__module__ in SAME_RANGE_PARAMS for k in found):
        from .dynamic_quant import scale_and_zero_point

        return scale_and_zero_point
    kernel = _dynamic_quantizer(ctx)
    return None if kernel is None else (lambda mn, mx: kernel(np.asarray([mn, mx], np.float32))[1:])


def _dynamic_quantizer(ctx: Any) -> Any:
    """The registered DynamicQuantizeLinear kernel for float32 (the numpy kernel's, to the bit), or None."""
    f32, u8 = TensorType(np.float32, None), TensorType(np.uint8, None)
    inner = KernelContext(ctx.node_name, "DynamicQuantizeLinear", 11, (f32,), (u8, f32, u8), (None,), 1)
    found = prepare_node(get_registry(), inner, {})
    return None if found is None else found[1]


def _scaled_fits(ctx: Any, attrs: dict) -> bool:
    """A 4-D input (float32 with ``dynamic_input``, else 8-bit), group 1, a constant 2-D 8-bit weight and zero
    point whose sums int32 holds, the compiled epilogue and VNNI."""
    x, w, wz = input_type(ctx, 0), _constant(ctx, 1), _constant(ctx, 3)
    dtypes = (np.dtype(np.float32),) if attrs.get("dynamic_input") else EIGHT_BIT
    if attrs.get("group", 1) != 1 or x is None or x.dtype not in dtypes or x.shape is None or len(x.shape) != 4:
        return False
    if w is None or w.ndim != 4 or w.dtype not in EIGHT_BIT or w.size == 0 or x.shape[1] != w.shape[1]:
        return False
    if wz is None and _given(ctx, 3) or wz is not None and wz.size not in (1, w.shape[0]) or not igemm.vnni():
        return False
    if attrs.get("dynamic_input") and _dynamic_quantizer(ctx) is None:
        return False
    return _bound(w, wz, None) < INT32 and _scaled_epilogue(ctx, attrs) is not None and \
        not _left_to_micro(ctx, attrs, w, scaled=True)


def _factor(x_scale: Any, scale: Any) -> np.ndarray:
    """The sums' float32 scale, x's times the node's, as the numpy kernel's Mul computes it (one element)."""
    return np.asarray(np.multiply(x_scale, np.asarray(scale, np.float32).reshape(-1)[0]), np.float32).reshape(-1)[:1]


class ScaledConv:
    """One ScaledConvInteger, prepared: [DynamicQuantizeLinear of x,] the integer conv, the compiled epilogue."""

    def __init__(self, ctx: Any, attrs: dict) -> None:
        w, wz = _constant(ctx, 1), _constant(ctx, 3)
        self.conv = qg.IntegerConv(w, wz, attrs)
        self.epilogue = _scaled_epilogue(ctx, attrs)
        self.dynamic = _dynamic_quantizer(ctx) if attrs.get("dynamic_input") else None
        self.range_params = _range_params(ctx) if attrs.get("dynamic_input") else None
        qg.compile_for(np.dtype(np.uint8) if self.dynamic else input_type(ctx, 0).dtype)
        # a dynamic stem whose float32 sums are exact: qstem.py's direct loop, the chain applied band by band
        one = readonly(np.ones(1, np.float32))
        chain = _chain(self.epilogue, [one, None, None, None])
        self.stem = None
        if self.dynamic and self.range_params is not None and chain is not None and qstem.fits(w, attrs) and \
                _bound(w, wz, None) < EXACT:
            self.stem = qstem.QStem(w, wz, attrs)
            self.stem.warm(chain.operands)
        if self.dynamic:
            warm_range()  # compiled at build, not in the first run
            qg.warm_dynamic()
        # S and A constant (or absent), and the weight's scale: the chain's arrays made once, each run only its
        # factor m in place of `one` (building them each run took ~17 us a node, 0.2-0.3 ms of dynamic MobileNetV2)
        scale, s, a = (_constant(ctx, i) for i in (4, 5, 6))
        at_run = any(_given(ctx, i) and v is None for i, v in zip((4, 5, 6), (scale, s, a)))
        sv, av = (None if v is None else readonly(np.ascontiguousarray(np.asarray(v, np.float32).reshape(-1)))
                  for v in (s, a))
        template = None if at_run or scale is None else _chain(self.epilogue, [one, None, sv, av])
        weight_scale = None if scale is None else np.float32(np.asarray(scale, np.float32).reshape(-1)[0])
        self.fixed = None if template is None else (template.times, weight_scale)
        self.out_shapes: dict[tuple[int, ...], tuple[int, ...]] = {}

    def _input(self, x: np.ndarray, x_zero_point: Any, scale: Any, size: int = 0) -> tuple[np.ndarray, int, np.ndarray]:
        """(8-bit x, its zero point, the float32 scale of the sums): DynamicQuantizeLinear's of a float32 x, made
        as the numpy kernel makes it (the kernel on [min, max], then x / scale clipped and rounded); ``size``: the
        product's native team, when asked already."""
        if self.dynamic is None:
            zero = 0 if x_zero_point is None else int(np.asarray(x_zero_point).reshape(-1)[0])
            return readonly(np.ascontiguousarray(x)), zero, np.asarray(scale, np.float32).reshape(-1)[:1]
        team = size if size > 1 else 0  # 0: the passes ask for themselves
        if self.range_params is scale_and_zero_point and x.size:  # the range, its grid and x on it in one call
            weight_scale = scale if isinstance(scale, np.float32) else np.float32(
                np.asarray(scale, np.float32).reshape(-1)[0])
            found = qg.dynamic_quantized(x, weight_scale, team)
            if found is not None:
                return found
        found = self._grid(x)
        if found is not None:
            x_scale, zero = found
            q, _ = qg.quantized(x, self._quantize(x_scale, zero), np.dtype(np.uint8), zero, team)
        else:  # NaN or an infinity: the kernel quantizes x itself, as the numpy kernel does
            q, x_scale, zp = self.dynamic(x)
            zero = int(np.asarray(zp).reshape(-1)[0])
        return q, zero, _factor(x_scale, scale)

    def _grid(self, x: np.ndarray) -> tuple[Any, int] | None:
        """DynamicQuantizeLinear's (scale, zero point) of x as the numpy kernel finds them (the kernel on [min, max]),
        or None where x holds NaN or an infinity (or nothing)."""
        mn, mx = value_range(x) if x.size else (np.float32(np.nan),) * 2  # one pass (dynamic_quant.py)
        if not (-np.inf < mn and mx < np.inf):  # NaN compares false
            return None
        x_scale, zp = self.range_params(mn, mx)
        return x_scale, int(zp) if isinstance(zp, np.float32) else int(np.asarray(zp).reshape(-1)[0])

    @staticmethod
    def _quantize(x_scale: Any, zero: int) -> tuple[np.float32, np.float32, np.float32]:
        """The (scale, low, high) qconv_gemm.py's quantization takes for uint8 with this zero point."""
        return np.float32(x_scale), np.float32(-zero), np.float32(255 - zero)

    def __call__(self, x, w=None, x_zero_point=None, w_zero_point=None, scale=None, s=None, a=None):
        shape = self.out_shapes.get(x.shape)
        if shape is None:
            shape = self.out_shapes[x.shape] = (x.shape[0], self.conv.m) + self.conv.geometry(x.shape).out_hw
        out = np.empty(shape, np.float32)
        if not out.size:
            return out
        if self.fixed is not None:
            chain, scale = self.fixed  # the template's `times`, the weight's scale (np.float32)
        else:
            sv, av = (None if v is None else readonly(np.ascontiguousarray(np.asarray(v, np.float32).reshape(-1)))
                      for v in (s, a))
            chain = lambda m: _chain(self.epilogue, [m, None, sv, av])  # noqa: E731
        if self.stem is not None and self._stem(x, scale, chain, out):
            return out
        size = self.conv.team(x.shape)
        q, zero, factor = self._input(x, x_zero_point, scale, size)
        self.conv(q, zero, out, out, None, chain=chain(readonly(np.ascontiguousarray(factor))),  # igemm's write-out
                  size=size)
        return out

    def _stem(self, x: np.ndarray, scale: Any, chain: Any, out: np.ndarray) -> bool:
        """A dynamic stem by qstem.py: x's range, DynamicQuantizeLinear's scale and zero point from it as `_input`
        makes them, x quantized and centered on that grid by the stem, its exact sums and the chain (``chain``: of
        the factor m) band by band (the same operations as igemm's write-out: the same bits). False where x is not
        finite (igemm's path then, with the kernel's own quantization) or holds NaN."""
        found = self._grid(x)
        if found is None:
            return False
        x_scale, zero = found
        m = readonly(_factor(x_scale, scale))
        return self.stem.into(x, self._quantize(x_scale, zero), zero, out, chain(m).operands)


@kernel("ScaledConvInteger", domain=MINFER, since=1, priority=PRIORITY, prepare=True, packed=(1, 3), views=False,
        applies=_scaled_fits)
def scaled_conv_integer(ctx, *, activation="", activation_params=None, dynamic_input=0, auto_pad="NOTSET",
                        dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """ai.minfer::ScaledConvInteger-1 (group 1) on VNNI: [DynamicQuantizeLinear of x,] the exact 8-bit product by
    igemm as float32 (Cast's), then the numpy kernel's compiled epilogue (* scale, act(. * S + A)): its bits."""
    attrs = dict(activation=activation, activation_params=activation_params, dynamic_input=dynamic_input,
                 auto_pad=auto_pad, dilations=dilations, group=group, pads=pads, strides=strides)
    return ScaledConv(ctx, attrs)
