"""ai.onnx.ml encoders: OneHotEncoder, LabelEncoder, CategoryMapper (numeric and string tensors)."""

from __future__ import annotations

import numpy as np

from minfer_core import KernelError, kernel

ML = "ai.onnx.ml"


def lookup(x: np.ndarray, keys: np.ndarray, values: np.ndarray, default) -> np.ndarray:
    """values[i] where x == keys[i], else default; NaN keys match NaN (LabelEncoder-4 maps NaN too)."""
    if x.dtype.kind in "OUS":
        table = dict(zip(keys.tolist(), values.tolist()))
        flat = [table.get(k, default) for k in x.reshape(-1).tolist()]
        return np.array(flat, dtype=values.dtype).reshape(x.shape)
    if not len(keys):
        return np.full(x.shape, default, dtype=values.dtype)
    order = np.argsort(keys, kind="stable")  # strings go through a dict; numbers through a sorted search
    sorted_keys, sorted_values = keys[order], values[order]
    pos = np.clip(np.searchsorted(sorted_keys, x), 0, len(keys) - 1)
    hit = sorted_keys[pos] == x
    if x.dtype.kind == "f" and np.isnan(sorted_keys).any():  # argsort puts NaN keys last; NaN never compares equal
        hit = hit | np.isnan(x)
        pos = np.where(np.isnan(x), np.flatnonzero(np.isnan(sorted_keys))[0], pos)
    return np.where(hit, sorted_values[pos], np.asarray(default, values.dtype)).astype(values.dtype)


@kernel("OneHotEncoder", domain=ML)
def one_hot_encoder(x, *, cats_int64s=None, cats_strings=None, zeros=1):
    """OneHotEncoder-1: a new last axis of float32 indicators of x's category (unknown: zeros, or an error)."""
    cats = cats_strings if cats_strings is not None else cats_int64s
    if cats is None:
        raise KernelError("OneHotEncoder needs cats_int64s or cats_strings")
    keys = np.array(cats, dtype=object if cats_strings is not None else np.int64)
    x = x if cats_strings is not None else x.astype(np.int64)
    pos = lookup(x, keys, np.arange(len(cats), dtype=np.int64), -1)
    if not zeros and (pos < 0).any():
        raise KernelError(f"OneHotEncoder with zeros=0 met a category not in its {len(cats)} categories")
    return (pos[..., None] == np.arange(len(cats))).astype(np.float32)


def _attr_array(tensor, *lists):
    """The first given of a TENSOR attribute and typed lists, as an array (with the list's dtype)."""
    if tensor is not None:
        return np.asarray(tensor).reshape(-1)
    for values, dtype in lists:
        if values is not None:
            return np.array(values, dtype=dtype)
    return None


@kernel("LabelEncoder", domain=ML, since=1)
def label_encoder(x, *, classes_strings=None, default_int64=-1, default_string="_Unused"):
    """LabelEncoder-1: string -> int64 index in classes_strings, int64 -> string."""
    classes = np.array(classes_strings or [], dtype=object)
    if x.dtype.kind in "OUS":
        return lookup(x, classes, np.arange(len(classes), dtype=np.int64), default_int64)
    return lookup(x.astype(np.int64), np.arange(len(classes), dtype=np.int64), classes, default_string)


@kernel("LabelEncoder", domain=ML, since=2)
def label_encoder2(x, *, keys_tensor=None, keys_floats=None, keys_int64s=None, keys_strings=None,
                   values_tensor=None, values_floats=None, values_int64s=None, values_strings=None,
                   default_tensor=None, default_float=-0.0, default_int64=-1, default_string="_Unused"):
    """LabelEncoder-2/4: keys -> values (int64, float, string or, from 4, any tensor type); others -> default."""
    keys = _attr_array(keys_tensor, (keys_int64s, np.int64), (keys_floats, np.float32), (keys_strings, object))
    values = _attr_array(values_tensor, (values_int64s, np.int64), (values_floats, np.float32), (values_strings, object))
    if keys is None or values is None or len(keys) != len(values):
        raise KernelError("LabelEncoder needs keys and values of the same length")
    if default_tensor is not None:
        default = np.asarray(default_tensor).reshape(-1)[0]
    else:
        default = {"i": default_int64, "f": default_float}.get(values.dtype.kind, default_string)
    if values.dtype.kind in "OUS":
        values = values.astype(object)
    if x.dtype.kind in "OUS":
        keys = keys.astype(object)
    else:
        keys = keys.astype(x.dtype)
    return lookup(x, keys, values, default)


@kernel("CategoryMapper", domain=ML)
def category_mapper(x, *, cats_int64s=None, cats_strings=None, default_int64=-1, default_string="_Unused"):
    """CategoryMapper-1: strings -> int64 via the cats pairs, or int64 -> strings."""
    ints = np.array(cats_int64s or [], np.int64)
    strings = np.array(cats_strings or [], dtype=object)
    if x.dtype.kind in "OUS":
        return lookup(x, strings, ints, default_int64)
    return lookup(x.astype(np.int64), ints, strings, default_string)
