"""Kernels: Cast and CastLike, including float16, bfloat16, float8/float4 and int4 via ml_dtypes."""

from __future__ import annotations

from typing import Any

import numpy as np

import minfer_core
from minfer_core import kernel

from .elementwise import arr, is_exotic


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


def cast(x: np.ndarray, dtype: np.dtype, saturate: int = 1, round_mode: str = "up") -> np.ndarray:
    """x converted to dtype by the ONNX Cast rules (numbers only, no strings)."""
    if x.dtype == dtype:
        return x
    with np.errstate(all="ignore"):  # out-of-range float->int is undefined in ONNX, not an error
        if dtype.name.startswith("float8_e8m0"):
            return _to_e8m0(x, dtype, saturate, round_mode)
        if saturate and _is_small_float(dtype):
            x = _saturated(x, dtype)
        if is_exotic(x.dtype) and dtype.kind in "iub":
            x = x.astype(np.float32)  # ml_dtypes floats convert to ints via float32
        return arr(x.astype(dtype), dtype)


@kernel("Cast", since=24)
def cast_24(x, *, to, round_mode="up", saturate=1):
    """Cast-24: adds round_mode for float8e8m0 targets."""
    return cast(x, _target(to), saturate, round_mode)


@kernel("Cast", since=19)
def cast_19(x, *, to, saturate=1):
    """Cast-19: saturate clamps out-of-range values into float8 targets."""
    return cast(x, _target(to), saturate)


@kernel("Cast", since=1)
def cast_1(x, *, to):
    """Cast-1: to is a TensorProto type (a type name string in opset 1)."""
    return cast(x, _target(to))


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


KERNELS: list = [cast_24, cast_19, cast_1, cast_like_24, cast_like_19, cast_like]
