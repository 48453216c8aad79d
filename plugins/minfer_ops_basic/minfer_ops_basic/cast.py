"""Kernels: Cast and CastLike (float16, bfloat16, float8/float4, int4 via ml_dtypes) and linear (de)quantization."""

from __future__ import annotations

from typing import Any

import numpy as np

import minfer_core
from minfer_core import kernel

from .elementwise import arr, into, is_exotic


def _target(to: Any) -> np.dtype:
    """Cast-1 names the type as a string ("FLOAT"); later opsets use the TensorProto enum."""
    if isinstance(to, str):
        import onnx

        to = onnx.TensorProto.DataType.Value(to.upper())
    return minfer_core.onnx_dtype(int(to))


def _is_small_float(dtype: np.dtype) -> bool:
    """The ml_dtypes floats with 8 bits or fewer, the only targets ``saturate`` applies to."""
    return is_exotic(dtype) and "float" in dtype.name and dtype.itemsize == 1


def _saturated(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Clamp finite and infinite values into the target range; NaN stays NaN."""
    import ml_dtypes

    top = float(ml_dtypes.finfo(dtype).max)
    v = x.astype(np.float32) if is_exotic(x.dtype) else x
    return np.clip(v, -top, top) if v.dtype.kind == "f" else v


def _to_e8m0(x: np.ndarray, dtype: np.dtype, saturate: int, round_mode: str) -> np.ndarray:
    """float8e8m0 holds only powers of two: pick the exponent as round_mode says."""
    v = np.abs(x.astype(np.float64))
    mant, exp = np.frexp(v)  # v = mant * 2**exp with mant in [0.5, 1)
    exact = mant == 0.5
    if round_mode == "up":
        e = np.where(exact, exp - 1, exp)
    elif round_mode == "down":
        e = exp - 1
    else:  # nearest: the linear midpoint between 2**(exp-1) and 2**exp, ties up
        e = np.where(mant >= 0.75, exp, exp - 1)
    e = np.where(v == 0, -1000, np.where(np.isinf(v), 1000, e))  # 0 and inf fall off the ends
    if saturate:
        out = np.ldexp(1.0, np.clip(e, -127, 127))
    else:
        out = np.where((e < -127) | (e > 127), np.nan, np.ldexp(1.0, np.clip(e, -127, 127)))
    out = np.where(np.isnan(v), np.nan, out)
    return out.astype(dtype)


_SPECIAL_TEXT = {"inf": "INF", "-inf": "-INF", "nan": "NaN"}  # the spellings onnxruntime writes


def _number_text(v) -> str:
    """One number as text: bools as 1/0, ints exactly, floats with 8 significant digits (onnxruntime's form)."""
    if isinstance(v, (bool, np.bool_)):
        return "1" if v else "0"
    if isinstance(v, (int, np.integer)):
        return str(int(v))
    text = format(float(v), ".8g")
    return _SPECIAL_TEXT.get(text, text)


def _to_strings(x: np.ndarray) -> np.ndarray:
    """Cast to STRING, element by element (ml_dtypes floats and ints widened first)."""
    if is_exotic(x.dtype):
        x = x.astype(np.float32 if "float" in x.dtype.name else np.int64)
    out = np.empty(x.shape, dtype=object)
    out.reshape(-1)[:] = [_number_text(v) for v in x.reshape(-1)]
    return out


def _from_strings(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Cast from STRING: decimal or scientific text, and INF/+INF/-INF/NaN in any case (Python's float reads them)."""
    texts = [v.decode() if isinstance(v, bytes) else str(v) for v in x.reshape(-1)]
    if dtype.kind in "iu":
        # integer text stays exact (int64 beyond 2**53); other text goes through float, as ONNX leaves it undefined
        values = np.array([int(t) if t.strip().lstrip("+-").isdigit() else int(float(t)) for t in texts], dtype=np.int64)
    else:
        values = np.array([float(t) for t in texts], dtype=np.float64)
    if dtype == np.bool_:
        return (values != 0).reshape(x.shape)
    return cast(values.astype(np.float32) if is_exotic(dtype) else values, dtype).reshape(x.shape)


def cast(x: np.ndarray, dtype: np.dtype, saturate: int = 1, round_mode: str = "up") -> np.ndarray:
    """x converted to dtype by the ONNX Cast rules, strings (object arrays) included."""
    if x.dtype == dtype:
        return x
    if dtype == object:
        return _to_strings(x)
    if x.dtype == object:
        return _from_strings(x, dtype)
    with np.errstate(all="ignore"):  # out-of-range float->int is undefined in ONNX, not an error
        if dtype.name.startswith("float8_e8m0"):
            return _to_e8m0(x, dtype, saturate, round_mode)
        if saturate and _is_small_float(dtype):
            x = _saturated(x, dtype)
        if is_exotic(x.dtype) and dtype.kind in "iub":
            x = x.astype(np.float32)  # ml_dtypes floats convert to ints via float32
        return arr(x.astype(dtype), dtype)


def _cast_into(x: np.ndarray, dtype: np.dtype, out: np.ndarray | None, saturate: int = 1, round_mode: str = "up") -> np.ndarray:
    """Cast into the planned buffer: a single converting copy for numpy's own types."""
    if out is not None and not is_exotic(x.dtype) and not is_exotic(dtype) and object not in (x.dtype, dtype):
        np.copyto(out, x, casting="unsafe")
        return out
    return into(out, cast(x, dtype, saturate, round_mode))


@kernel("Cast", since=24, out=True)
def cast_24(x, *, to, round_mode="up", saturate=1, out=None):
    """Cast-24: adds round_mode for float8e8m0 targets."""
    return _cast_into(x, _target(to), out, saturate, round_mode)


@kernel("Cast", since=19, out=True)
def cast_19(x, *, to, saturate=1, out=None):
    """Cast-19: saturate clamps out-of-range values into float8 targets."""
    return _cast_into(x, _target(to), out, saturate)


@kernel("Cast", since=1, out=True)
def cast_1(x, *, to, out=None):
    """Cast-1: to is a TensorProto type (a type name string in opset 1)."""
    return _cast_into(x, _target(to), out)


@kernel("CastLike", since=24)
def cast_like_24(x, target_type, *, round_mode="up", saturate=1):
    """CastLike-24: Cast-24 to the dtype of target_type."""
    return cast(x, target_type.dtype, saturate, round_mode)


@kernel("CastLike", since=19)
def cast_like_19(x, target_type, *, saturate=1):
    """CastLike-19: Cast-19 to the dtype of target_type."""
    return cast(x, target_type.dtype, saturate)


@kernel("CastLike", since=15)
def cast_like(x, target_type):
    """CastLike-15: Cast to the dtype of target_type."""
    return cast(x, target_type.dtype)


@kernel("BitCast", since=26)
def bit_cast(x, *, to):
    """BitCast-26: the same bytes read as another type of equal width (a zero-copy view)."""
    return x.view(_target(to))




# --- linear quantization -------------------------------------------------------


def spread(param: np.ndarray, x: np.ndarray, axis: int, block_size: int = 0) -> np.ndarray:
    """A scale or zero point laid out to broadcast against x: per tensor, per axis, or per block."""
    p = np.asarray(param)
    if p.ndim == 0 or x.ndim == 0:
        return p.reshape(()) if p.size == 1 else p
    axis = axis % x.ndim
    if block_size > 0 and p.ndim == x.ndim:
        return np.repeat(p, block_size, axis=axis).take(np.arange(x.shape[axis]), axis=axis)
    if p.ndim == 1:
        shape = [1] * x.ndim
        shape[axis] = p.shape[0]
        return p.reshape(shape)
    return p


def _int_range(dtype: np.dtype) -> tuple[int, int]:
    if is_exotic(dtype):
        import ml_dtypes

        info = ml_dtypes.iinfo(dtype)
    else:
        info = np.iinfo(dtype)
    return int(info.min), int(info.max)


def quantize(x, scale, zero_point, *, axis=1, block_size=0, output_dtype=0, saturate=1, precision=0):
    """saturate(round_half_even(x / scale) + zero_point) in the quantized type."""
    if output_dtype:
        target = minfer_core.onnx_dtype(output_dtype)
    else:
        target = np.dtype(np.uint8) if zero_point is None else zero_point.dtype
    if _per_tensor_8bit(x, scale, zero_point, target) and not precision:
        return _quantize_8bit(x, scale, zero_point, target)
    s = spread(scale, x, axis, block_size)
    # the division runs in the scale's precision unless `precision` says otherwise
    prec = minfer_core.onnx_dtype(precision) if precision else s.dtype
    if is_exotic(prec) and "e8m0" in prec.name:
        prec = np.dtype(np.float32)
    with np.errstate(all="ignore"):
        v = x.astype(prec) / s.astype(prec)
        v = v.astype(np.float64 if x.dtype == np.int32 else np.float32)
        zp = 0 if zero_point is None else spread(zero_point, x, axis, block_size).astype(v.dtype)
        if "float" in target.name:
            return cast(v + zp, target, saturate)
        lo, hi = _int_range(target)
        return arr(np.clip(np.rint(v) + zp, lo, hi), target)


def _per_tensor_8bit(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, target: np.dtype) -> bool:
    """float32 <-> 8-bit integers with one float32 scale and zero point: the common case, done in place."""
    floats, ints = (x.dtype, target) if x.dtype == np.float32 else (target, x.dtype)
    return (floats == np.float32 and ints in (np.int8, np.uint8) and scale.dtype == np.float32 and scale.size == 1
            and (zero_point is None or zero_point.size == 1))


def _quantize_8bit(x: np.ndarray, scale: np.ndarray, zero_point: np.ndarray | None, target: np.dtype) -> np.ndarray:
    """quantize() for `_per_tensor_8bit` operands: the same float32 steps, one allocation instead of six."""
    v = np.asarray(np.divide(x, scale.reshape(())))  # 0-d operands give a numpy scalar, which rint cannot write
    np.rint(v, out=v)
    zp = 0 if zero_point is None else int(zero_point.reshape(()))
    lo, hi = _int_range(target)
    # clip(rint(v), lo - zp, hi - zp) + zp is clip(rint(v) + zp, lo, hi) (integers), with the add converting
    # straight into the 8-bit output: one pass and one allocation fewer
    np.clip(v, lo - zp, hi - zp, out=v)
    out = np.empty(v.shape, target)
    np.add(v, np.float32(zp), out=out, casting="unsafe")  # integers in range: the conversion is exact
    return out


def dequantize(x, scale, zero_point, *, axis=1, block_size=0, output_dtype=0):
    """(x - zero_point) * scale in the scale's type (or output_dtype)."""
    target = minfer_core.onnx_dtype(output_dtype) if output_dtype else scale.dtype
    if _per_tensor_8bit(x, scale, zero_point, target):
        v = x.astype(np.float32)  # in place from here: the same float32 steps, one allocation
        if zero_point is not None:
            v -= np.float32(zero_point.reshape(()))
        v *= scale.reshape(())
        return v
    work = np.float64 if x.dtype == np.int32 else np.float32  # int32 accumulators exceed float32's 24 bits
    v = x.astype(work)
    if zero_point is not None:
        v = v - spread(zero_point, x, axis, block_size).astype(work)
    return arr(v * spread(scale, x, axis, block_size).astype(work), target)


@kernel("QuantizeLinear", since=23, views=False)
def quantize_linear_23(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=0, precision=0, saturate=1):
    """QuantizeLinear-23: adds `precision` for the division."""
    return quantize(x, y_scale, y_zero_point, axis=axis, block_size=block_size, output_dtype=output_dtype, saturate=saturate, precision=precision)


@kernel("QuantizeLinear", since=21, views=False)
def quantize_linear_21(x, y_scale, y_zero_point=None, *, axis=1, block_size=0, output_dtype=0, saturate=1):
    """QuantizeLinear-21: blocked quantization and an explicit output_dtype."""
    return quantize(x, y_scale, y_zero_point, axis=axis, block_size=block_size, output_dtype=output_dtype, saturate=saturate)


@kernel("QuantizeLinear", since=19, views=False)
def quantize_linear_19(x, y_scale, y_zero_point=None, *, axis=1, saturate=1):
    """QuantizeLinear-19: float8 targets, clamped when saturate=1."""
    return quantize(x, y_scale, y_zero_point, axis=axis, saturate=saturate)


@kernel("QuantizeLinear", since=13, views=False)
def quantize_linear_13(x, y_scale, y_zero_point=None, *, axis=1):
    """QuantizeLinear-13: per-tensor or per-axis scale."""
    return quantize(x, y_scale, y_zero_point, axis=axis)


@kernel("QuantizeLinear", since=10, views=False)
def quantize_linear_10(x, y_scale, y_zero_point=None):
    """QuantizeLinear-10: per-tensor scale into uint8/int8."""
    return quantize(x, y_scale, y_zero_point)


@kernel("DequantizeLinear", since=23, views=False)
def dequantize_linear_23(x, x_scale, x_zero_point=None, *, axis=1, block_size=0, output_dtype=0):
    """DequantizeLinear-23: adds an explicit output_dtype."""
    return dequantize(x, x_scale, x_zero_point, axis=axis, block_size=block_size, output_dtype=output_dtype)


@kernel("DequantizeLinear", since=21, views=False)
def dequantize_linear_21(x, x_scale, x_zero_point=None, *, axis=1, block_size=0):
    """DequantizeLinear-21: blocked dequantization."""
    return dequantize(x, x_scale, x_zero_point, axis=axis, block_size=block_size)


@kernel("DequantizeLinear", since=13, views=False)
def dequantize_linear_13(x, x_scale, x_zero_point=None, *, axis=1):
    """DequantizeLinear-13: per-tensor or per-axis scale."""
    return dequantize(x, x_scale, x_zero_point, axis=axis)


@kernel("DequantizeLinear", since=10, views=False)
def dequantize_linear_10(x, x_scale, x_zero_point=None):
    """DequantizeLinear-10: per-tensor scale."""
    return dequantize(x, x_scale, x_zero_point)


@kernel("DynamicQuantizeLinear", since=11, views=False)
def dynamic_quantize_linear(x):
    """DynamicQuantizeLinear-11: uint8 quantization whose range always includes 0; returns y, scale, zero point."""
    hi = np.float32(max(0.0, float(np.max(x)) if x.size else 0.0))
    lo = np.float32(min(0.0, float(np.min(x)) if x.size else 0.0))
    scale = np.float32(1.0 if hi == lo else hi - lo) / np.float32(255)
    zp = np.rint(np.clip(np.float32(0) - lo / scale, 0, 255))
    y = np.asarray(np.divide(x, scale, dtype=np.float32))  # in place from here: fresh large arrays cost page faults
    np.rint(y, out=y)
    np.clip(y, -zp, np.float32(255) - zp, out=y)  # then + zp, converting into the output (see `_quantize_8bit`)
    q = np.empty(y.shape, np.uint8)
    np.add(y, zp, out=q, casting="unsafe")
    return q, np.asarray(scale, dtype=x.dtype), np.asarray(zp, dtype=np.uint8)


