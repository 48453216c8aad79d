"""Kernels: onnxruntime's com.microsoft QLinear* ops, which quantize_static's QOperator format emits.

Each requantizes as onnxruntime's MLAS does: in float32, rounding half to even, saturating to the
output's integer type, so the integer outputs match bit for bit.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import helper

from minfer_core import TensorType, kernel, op, same_as_input, scratch

from . import _geometry as geo
from . import requantize

MS = "com.microsoft"


def _f32(v: np.ndarray | None) -> np.float32:
    """A scalar or 1-element scale as float32."""
    return np.float32(np.asarray(v).reshape(-1)[0])


def _zp(v: np.ndarray | None) -> np.float32:
    """A zero point as float32 (an omitted one is 0)."""
    return np.float32(0) if v is None else np.float32(np.asarray(v).reshape(-1)[0])


def _centered(x: np.ndarray, zero_point: np.ndarray | None) -> np.ndarray:
    """x - zero_point in float32 (exact: 8-bit values)."""
    return x.astype(np.float32) - _zp(zero_point)


def _saturate(v: np.ndarray, zero_point: np.ndarray | None, dtype: np.dtype, zp_first: bool = False) -> np.ndarray:
    """round-half-even(v) + zero_point, saturated to ``dtype`` (v is float32 and may be overwritten).

    ``zp_first`` rounds v + zero_point instead: a tie then goes to the even *output*, as onnxruntime's
    QLinearAdd, QLinearMul and QLinearAveragePool round (an odd zero point flips which neighbour is even).
    """
    info = np.iinfo(dtype)
    v = np.asarray(v, dtype=np.float32)  # 0-d operands give numpy scalars, which rint cannot write into
    if zp_first:
        v += _zp(zero_point)
        np.rint(v, out=v)
    else:
        np.rint(v, out=v)
        v += _zp(zero_point)
    np.clip(v, info.min, info.max, out=v)
    return v.astype(dtype)


def _out_dtype(zero_point: np.ndarray | None, x: np.ndarray) -> np.dtype:
    return x.dtype if zero_point is None else np.asarray(zero_point).dtype


@kernel("QLinearAdd", domain=MS, since=1, views=False)
def qlinear_add(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point=None):
    """QLinearAdd-1 (com.microsoft): quantized A + B with numpy broadcasting."""
    va = _centered(a, a_zero_point) * (_f32(a_scale) / _f32(c_scale))
    vb = _centered(b, b_zero_point) * (_f32(b_scale) / _f32(c_scale))
    return _saturate(np.add(va, vb), c_zero_point, _out_dtype(c_zero_point, a), zp_first=True)


@kernel("QLinearMul", domain=MS, since=1, views=False)
def qlinear_mul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point=None):
    """QLinearMul-1 (com.microsoft): quantized A * B with numpy broadcasting."""
    scale = _f32(a_scale) * _f32(b_scale) / _f32(c_scale)
    v = _centered(a, a_zero_point) * _centered(b, b_zero_point)
    v *= scale
    return _saturate(v, c_zero_point, _out_dtype(c_zero_point, a), zp_first=True)


@kernel("QLinearGlobalAveragePool", domain=MS, since=1, views=False)
def qlinear_global_average_pool(x, x_scale, x_zero_point, y_scale, y_zero_point, *, channels_last=0):
    """QLinearGlobalAveragePool-1 (com.microsoft): the mean over spatial dims, requantized."""
    axes = tuple(range(1, x.ndim - 1)) if channels_last else tuple(range(2, x.ndim))
    size = int(np.prod([x.shape[i] for i in axes]))
    # an exact int32 sum, then one float32 scale (x_scale / y_scale / size) as MLAS applies it
    acc = x.astype(np.int64).sum(axis=axes, keepdims=True) - int(_zp(x_zero_point)) * size
    scale = _f32(x_scale) / (_f32(y_scale) * np.float32(size))
    return _saturate(acc.astype(np.float32) * scale, y_zero_point, x.dtype)


@kernel("QLinearAveragePool", domain=MS, since=1, views=False)
def qlinear_average_pool(x, x_scale, x_zero_point, y_scale, y_zero_point=None, *, auto_pad="NOTSET", ceil_mode=0,
                         channels_last=0, count_include_pad=0, kernel_shape, pads=None, strides=None):
    """QLinearAveragePool-1 (com.microsoft): AveragePool of the dequantized x in float32, requantized."""
    xn = np.moveaxis(x, -1, 1) if channels_last else x
    win = geo.window(xn.shape[2:], kernel_shape, strides=strides, pads=pads, auto_pad=auto_pad, ceil_mode=ceil_mode)
    cols = geo.im2col_view(geo.pad(_centered(xn, x_zero_point) * _f32(x_scale), win), win)
    acc = np.zeros(xn.shape[:2] + win.out_shape, np.float32)
    for tap in np.ndindex(*win.kernel):  # onnxruntime sums each window's taps in this order, in float32
        acc += cols[(slice(None), slice(None)) + tap]
    # count_include_pad counts the whole kernel, even where ceil_mode runs it past the declared pads
    count = np.float32(np.prod(win.kernel)) if count_include_pad else geo.tap_counts(win, False).astype(np.float32)
    acc /= count
    y = _saturate(acc / _f32(y_scale), y_zero_point, x.dtype, zp_first=True)
    return np.ascontiguousarray(np.moveaxis(y, 1, -1)) if channels_last else y


def _table(x_scale, x_zero_point, y_scale, y_zero_point, dtype: np.dtype, fn) -> np.ndarray:
    """quantize(fn(dequantize(v))) for every 8-bit value v, indexed by v - min."""
    info = np.iinfo(dtype)
    values = np.arange(info.min, info.max + 1, dtype=np.float32)
    real = fn((values - _zp(x_zero_point)) * _f32(x_scale))
    return _saturate(real / _f32(y_scale), y_zero_point, dtype)


def _lookup(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    return table[x.astype(np.int64) - np.iinfo(x.dtype).min]


@kernel("QLinearLeakyRelu", domain=MS, since=1, views=False)
def qlinear_leaky_relu(x, x_scale, x_zero_point, y_scale, y_zero_point=None, *, alpha=0.01):
    """QLinearLeakyRelu-1 (com.microsoft): LeakyRelu of the dequantized x, requantized through a table."""
    a = np.float32(alpha)
    return _lookup(x, _table(x_scale, x_zero_point, y_scale, y_zero_point, x.dtype,
                             lambda v: np.where(v >= 0, v, v * a)))


def _sigmoid(v: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):  # exp(-v) -> inf gives the right limit, 0
        return np.float32(1.0) / (np.float32(1.0) + np.exp(-v))


@kernel("QLinearSigmoid", domain=MS, since=1, views=False)
def qlinear_sigmoid(x, x_scale, x_zero_point, y_scale, y_zero_point=None):
    """QLinearSigmoid-1 (com.microsoft): Sigmoid of the dequantized x, requantized through a table."""
    return _lookup(x, _table(x_scale, x_zero_point, y_scale, y_zero_point, x.dtype, _sigmoid))


@kernel("QLinearConcat", domain=MS, since=1, views=False)
def qlinear_concat(y_scale, y_zero_point, *tuples, axis):
    """QLinearConcat-1 (com.microsoft): inputs requantized to y's scale and zero point, then concatenated."""
    parts = []
    for i in range(0, len(tuples), 3):
        x, xs, xz = tuples[i : i + 3]
        if _f32(xs) == _f32(y_scale) and _zp(xz) == _zp(y_zero_point):
            parts.append(x)
        else:
            parts.append(_lookup(x, _table(xs, xz, y_scale, y_zero_point, x.dtype, lambda v: v)))
    return np.concatenate(parts, axis=axis)


def _exp_table(x_scale: np.ndarray, reduce_len: int) -> np.ndarray:
    """float32 exp((d + shift) * x_scale) for d = x - max(x) in -255..0, computed in float64 as onnxruntime does.

    The shift (log(FLT_MAX / reduce_len) - 5, in units of x) keeps the row sums of these exps finite.
    """
    xs = float(np.float32(np.asarray(x_scale).reshape(-1)[0]))
    shift = max(0.0, float(np.log(float(np.finfo(np.float32).max) / reduce_len)) - 5.0) / xs
    return np.exp((np.arange(-255, 1, dtype=np.float64) + shift) * xs).astype(np.float32)


def _softmax_rows(x: np.ndarray, table: np.ndarray, y_scale: np.ndarray, y_zero_point) -> np.ndarray:
    """Softmax over the last axis of 2-D ``x`` through the exp table, requantized as onnxruntime does."""
    d = x.astype(np.int64) - x.max(axis=-1, keepdims=True).astype(np.int64)
    e = table[d + 255]
    total = np.cumsum(e, axis=-1, dtype=np.float32)[:, -1:]  # a left-to-right float32 sum, as onnxruntime's loop
    inv = np.floor(np.float32(1.0) / _f32(y_scale))  # onnxruntime scales by floor(1 / y_scale), in float32
    with np.errstate(over="ignore", invalid="ignore"):  # short rows overflow e * inv to inf, saturating as in onnxruntime
        q = np.rint((e * inv) / total) + _zp(y_zero_point)
    info = np.iinfo(x.dtype)
    return np.clip(q, info.min, info.max).astype(x.dtype)


@kernel("QLinearSoftmax", domain=MS, since=1, views=False)
def qlinear_softmax(x, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None, *, axis=-1, opset):
    """QLinearSoftmax-1 (com.microsoft): Softmax (opset < 13: over the flattened axis.. dims) of quantized x."""
    axis %= x.ndim
    if opset < 13:
        rows = x.reshape(int(np.prod(x.shape[:axis])), -1)
        return _softmax_rows(rows, _exp_table(x_scale, rows.shape[1]), y_scale, y_zero_point).reshape(x.shape)
    moved = np.moveaxis(x, axis, -1)
    rows = moved.reshape(-1, x.shape[axis])
    y = _softmax_rows(rows, _exp_table(x_scale, rows.shape[1]), y_scale, y_zero_point)
    return np.ascontiguousarray(np.moveaxis(y.reshape(moved.shape), -1, axis))


# |a - a_zp| for 8-bit A and zero point
A_RANGE = 255


class HeldB:
    """QGemm's 8-bit B, held as given (declared packed); centered into float32 scratch on each run.

    ``chunk``: how many rows of B (the inner dimension) one float32 GEMM may sum: every partial sum of
    ``chunk`` products of 8-bit values is then an integer below 2**24, exact in float32 in any order; the
    chunks' exact results are added in float64.
    """

    def __init__(self, b: np.ndarray, zero_point: np.ndarray | None, trans: int) -> None:
        self.b, self.trans = b, trans  # as given: converted in its own layout (a contiguous read), transposed as a view
        zp = None if zero_point is None or not np.any(zero_point) else np.asarray(zero_point, np.float32).reshape(-1)
        # a per-column zero point lies along B's last axis, or its first when B is transposed
        self.zero = None if zp is None else zp.reshape(-1, 1) if trans and zp.size > 1 else zp
        widest = float(np.abs(b.astype(np.float32) - (0 if self.zero is None else self.zero)).max(initial=1.0))
        self.chunk = max(1, int((2**24 - 1) // (A_RANGE * max(widest, 1.0))))

    def centered(self) -> np.ndarray:
        """B - b_zp as float32 (K, N) (a transposed view when B is) in this thread's scratch."""
        bf = scratch("minfer_ops_conv-qgemm-b", self.b.shape, np.float32)
        np.copyto(bf, self.b, casting="unsafe")  # a converting copy, then a float subtract: faster than one mixed loop
        if self.zero is not None:
            np.subtract(bf, self.zero, out=bf)
        return bf.T if self.trans else bf

    def product(self, am: np.ndarray) -> np.ndarray:
        """(A - a_zp) @ (B - b_zp), exact, as float64 (``am``: the centered A, float32, (M, K))."""
        bf = self.centered()
        k = bf.shape[0]
        if k <= self.chunk:
            return (am @ bf).astype(np.float64)
        acc = np.zeros((am.shape[0], bf.shape[1]), np.float64)
        for k0 in range(0, k, self.chunk):
            acc += am[:, k0 : k0 + self.chunk] @ bf[k0 : k0 + self.chunk]
        return acc


@kernel("QGemm", domain=MS, since=1, prepare=True, packed=(3,), views=False)
def qgemm(ctx, *, alpha=1.0, transA=0, transB=0):
    """QGemm-1 (com.microsoft): alpha * (A - a_zp) (B - b_zp) + C, requantized, or as float32 without y_scale."""
    consts = tuple(ctx.constants) + (None,) * 9
    zp_fixed = consts[5] is not None or len(ctx.input_types) <= 5 or ctx.input_types[5] is None
    fixed = HeldB(consts[3], consts[5], transB) if consts[3] is not None and zp_fixed else None
    del ctx, consts  # packed=(3,): the closure must not keep the original B alive through ctx.constants

    def run(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c=None, y_scale=None, y_zero_point=None):
        held = fixed if fixed is not None else HeldB(b, b_zero_point, transB)
        am = (a.T if transA else a).astype(np.float32)
        am -= _zp(a_zero_point)  # exact: 8-bit values
        acc = held.product(am)
        if c is not None:
            acc += c.astype(np.float64)
        scale = np.float32(alpha) * _f32(a_scale) * np.asarray(b_scale, dtype=np.float32).reshape(-1)
        if y_scale is None:
            return acc.astype(np.float32) * scale
        v = acc.astype(np.float32) * (scale / _f32(y_scale))
        return _saturate(v, y_zero_point, _out_dtype(y_zero_point, a))

    return run


# ---- shape inference: the float op's, with the quantized output's dtype


def _type_proto(t: TensorType) -> onnx.TypeProto:
    shape: Any = None if t.shape is None else list(t.shape)
    return helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(t.dtype), shape)


def _float_infer(base: str, data: tuple[int, ...], dtype_of: int, drop: tuple[str, ...] = ()):
    """An infer= that runs onnx's shape inference of ``base`` on the data inputs ``data``."""

    def infer(*types: TensorType | None, **attrs: Any) -> list[TensorType | None]:
        src = types[dtype_of] if dtype_of < len(types) else None
        if src is None:
            src = types[data[0]]
        picked = [types[i] if i < len(types) else None for i in data]
        if src is None or any(t is None for t in picked):
            return [None]
        names = [f"i{i}" for i in range(len(picked))]
        as_float = {n: _type_proto(TensorType(np.float32, t.shape)) for n, t in zip(names, picked)}  # type: ignore[union-attr]
        node = helper.make_node(base, names, ["y"], **{k: v for k, v in attrs.items() if k not in drop})
        schema = onnx.defs.get_schema(base, 17)
        out = onnx.shape_inference.infer_node_outputs(schema, node, as_float, opset_imports=[helper.make_opsetid("", 17)])
        if "y" not in out:
            return [TensorType(src.dtype, None)]
        dims = out["y"].tensor_type.shape.dim
        shape = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in dims)
        return [TensorType(src.dtype, shape)]

    return infer


def _infer_global_pool(x: TensorType | None, *rest: TensorType | None, channels_last: int = 0) -> list:
    if x is None or x.shape is None:
        return [x]
    shape = (x.shape[0],) + (1,) * (len(x.shape) - 2) + (x.shape[-1],) if channels_last else \
        tuple(x.shape[:2]) + (1,) * (len(x.shape) - 2)
    return [TensorType(x.dtype, shape)]


def _infer_average_pool(x: TensorType | None, *rest: TensorType | None, channels_last: int = 0, **attrs: Any) -> list:
    if x is None or x.shape is None:
        return [x]
    if not channels_last:
        return _float_infer("AveragePool", (0,), 0)(x, **attrs)
    nchw = TensorType(x.dtype, (x.shape[0], x.shape[-1], *x.shape[1:-1]))
    out = _float_infer("AveragePool", (0,), 0)(nchw, **attrs)[0]
    if out is None or out.shape is None:
        return [TensorType(x.dtype, None)]
    return [TensorType(x.dtype, (out.shape[0], *out.shape[2:], out.shape[1]))]


def _infer_concat(y_scale: TensorType | None, y_zp: TensorType | None, *tuples: TensorType | None, axis: int) -> list:
    data = tuple(range(2, 2 + len(tuples), 3))
    return _float_infer("Concat", data, 1)(y_scale, y_zp, *tuples, axis=axis)


def _infer_qgemm(a: TensorType | None, *rest: TensorType | None, **attrs: Any) -> list:
    types = (a, *rest) + (None,) * 9
    out = _float_infer("Gemm", (0, 3), 8, ("alpha",))(*types[:9], **attrs)
    if out[0] is not None and types[7] is None:  # no y_scale: a float32 output
        return [TensorType(np.float32, out[0].shape)]
    return out


def _infer_float_qlinear_conv(*types: TensorType | None, float_input: int = 0, float_output: int = 0,
                              activation: str = "", activation_params: Any = None, output_quantization: Any = None,
                              output_rounding: Any = None, residual_rounding: Any = None,
                              **attrs: Any) -> list:
    out = _float_infer("Conv", (0, 3), 7)(*types[:9], **attrs)
    return [TensorType(np.float32, out[0].shape)] if float_output and out[0] is not None else out


def _infer_scaled_conv_integer(x: TensorType | None, w: TensorType | None = None, *rest: TensorType | None,
                               activation: str = "", activation_params: Any = None, dynamic_input: int = 0,
                               **attrs: Any) -> list:
    out = _float_infer("Conv", (0, 1), 0)(x, w, **attrs)
    return [None if out[0] is None else TensorType(np.float32, out[0].shape)]


OPS = [
    op("QLinearAdd", domain=MS, infer=_float_infer("Add", (0, 3), 7), doc="quantized Add (onnxruntime contrib)"),
    op("QLinearMul", domain=MS, infer=_float_infer("Mul", (0, 3), 7), doc="quantized Mul (onnxruntime contrib)"),
    op("QLinearGlobalAveragePool", domain=MS, infer=_infer_global_pool, doc="quantized GlobalAveragePool"),
    op("QLinearLeakyRelu", domain=MS, infer=_float_infer("LeakyRelu", (0,), 4, ("alpha",)), doc="quantized LeakyRelu"),
    op("QLinearSigmoid", domain=MS, infer=_float_infer("Sigmoid", (0,), 4), doc="quantized Sigmoid"),
    op("QLinearConcat", domain=MS, infer=_infer_concat, doc="quantized Concat (onnxruntime contrib)"),
    op("QLinearAveragePool", domain=MS, infer=_infer_average_pool, doc="quantized AveragePool (onnxruntime contrib)"),
    op("QLinearSoftmax", domain=MS, infer=same_as_input(0), doc="quantized Softmax (onnxruntime contrib)"),
    op("QGemm", domain=MS, infer=_infer_qgemm, doc="quantized Gemm (onnxruntime contrib)"),
    op("FloatQLinearConv", domain="ai.minfer", infer=_infer_float_qlinear_conv,
       doc="QuantizeLinear -> QLinearConv -> DequantizeLinear [-> ChannelAffine] in one node (either end "
           "optional, see quant.py)"),
    op("ScaledConvInteger", domain="ai.minfer", infer=_infer_scaled_conv_integer,
       doc="[DynamicQuantizeLinear ->] ConvInteger -> Cast to float32 -> Mul by a scalar [-> ChannelAffine] in one "
           "node (see quant.py)"),
    *requantize.OPS,
]
