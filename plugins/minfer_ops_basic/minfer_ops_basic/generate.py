"""Kernels: ops that make tensors from attributes or shapes (Constant, Range, EyeLike, OneHot, Trilu)."""

from __future__ import annotations

import math

import numpy as np

import minfer_core
from minfer_core import kernel


def _scalar(v) -> np.ndarray:
    """A scalar-like input (0-d or one-element 1-D) as a 0-d array."""
    return np.asarray(v).reshape(())


# --- Constant ------------------------------------------------------------------


@kernel("Constant", since=1, views=False)
def constant_1(*, value):
    """Constant-1/9: the value tensor attribute."""
    return np.asarray(value)


@kernel("Constant", since=11, views=False)
def constant_11(*, sparse_value=None, value=None):
    """Constant-11: a dense or sparse tensor attribute (the core densifies sparse ones)."""
    return np.asarray(value if value is not None else sparse_value)


@kernel("Constant", since=12, views=False)
def constant_12(
    *,
    value_strings=None,
    value_string=None,
    value_floats=None,
    value_float=None,
    value_ints=None,
    value_int=None,
    sparse_value=None,
    value=None,
):
    """Constant-12..25: exactly one of the value* attributes, typed as ONNX says."""
    if value is not None:
        return np.asarray(value)
    if sparse_value is not None:
        return np.asarray(sparse_value)
    if value_float is not None:
        return np.asarray(value_float, dtype=np.float32)
    if value_floats is not None:
        return np.asarray(value_floats, dtype=np.float32).reshape(-1)
    if value_int is not None:
        return np.asarray(value_int, dtype=np.int64)
    if value_ints is not None:
        return np.asarray(value_ints, dtype=np.int64).reshape(-1)
    if value_string is not None:
        return np.asarray(value_string, dtype=np.object_)
    if value_strings is not None:
        return np.asarray(value_strings, dtype=np.object_).reshape(-1)
    raise ValueError("Constant needs one of value, sparse_value, value_float(s), value_int(s), value_string(s)")


@kernel("ConstantOfShape", since=9, out=True, views=False)
def constant_of_shape(input, *, value=None, out=None):
    """ConstantOfShape-9..25: fill the given shape with value's single element (default float32 0)."""
    fill = np.zeros((), np.float32) if value is None else np.asarray(value).reshape(())
    if out is None:
        return np.full(np.asarray(input, dtype=np.int64).reshape(-1), fill, dtype=fill.dtype)
    out[...] = fill
    return out


# --- Range -----------------------------------------------------------------------


def _range(start, limit, delta, compute=np.float64) -> np.ndarray:
    """start + i*delta for i < max(ceil((limit-start)/delta), 0), in start's dtype."""
    dtype = np.asarray(start).dtype
    s, l, d = (_scalar(v).item() for v in (start, limit, delta))
    if dtype.kind in "iu":
        # Exact integer ceil division: floats would lose precision near 2**53.
        n = max(-((s - l) // d), 0)
        return (s + np.arange(n, dtype=np.int64) * d).astype(dtype)
    n = max(math.ceil((l - s) / d), 0)
    return (compute(s) + np.arange(n, dtype=compute) * compute(d)).astype(dtype)


@kernel("Range", since=11, views=False)
def range_11(start, limit, delta):
    """Range-11: start + i*delta up to limit (exclusive)."""
    return _range(start, limit, delta)


@kernel("Range", since=27, views=False)
def range_27(start, limit, delta, *, stash_type=1):
    """Range-27: as Range-11; stash_type picks the float16 compute precision."""
    low = np.asarray(start).dtype.name in ("float16", "bfloat16")
    return _range(start, limit, delta, minfer_core.onnx_dtype(stash_type).type if low else np.float64)


# --- EyeLike / OneHot / Trilu ---------------------------------------------------------


@kernel("EyeLike", since=9, views=False)
def eye_like(input, *, dtype=None, k=0):
    """EyeLike-9/22: ones on diagonal k of a matrix shaped like the 2-D input."""
    if input.ndim != 2:
        raise ValueError(f"EyeLike needs a 2-D input, got shape {input.shape}")
    out_dtype = input.dtype if dtype is None else minfer_core.onnx_dtype(dtype)
    return np.eye(input.shape[0], input.shape[1], k=k, dtype=out_dtype)


@kernel("OneHot", since=9, views=False)
def one_hot(indices, depth, values, *, axis=-1):
    """OneHot-9/11/28: on_value where the (wrapped) index hits, off_value elsewhere."""
    n = int(_scalar(depth))
    idx = np.asarray(indices).astype(np.int64)
    # Negative indices count from depth (11+); anything still out of range stays all-off.
    idx = np.where(idx < 0, idx + n, idx)
    hit = idx[..., None] == np.arange(n, dtype=np.int64)
    off, on = np.asarray(values).reshape(-1)[:2]
    out = np.where(hit, on, off).astype(values.dtype, copy=False)
    rank = out.ndim
    axis = axis + rank if axis < 0 else axis
    return np.moveaxis(out, -1, axis)


@kernel("Trilu", since=14, out=True, inplace=(0,), views=False)
def trilu(input, k=None, *, upper=1, out=None):
    """Trilu-14: keep the upper (or lower) triangle from diagonal k of the last two dims."""
    k = 0 if k is None else int(_scalar(k))
    rows, cols = input.shape[-2:]
    # Python-int k: extreme values (INT64_MAX) compare without overflow.
    offset = np.arange(cols) - np.arange(rows)[:, None]
    keep = offset >= k if upper else offset <= k
    zero = np.zeros((), input.dtype)
    if out is None:
        return np.where(keep, input, zero)
    if out is not input:
        np.copyto(out, input)
    np.copyto(out, zero, where=~keep)
    return out


