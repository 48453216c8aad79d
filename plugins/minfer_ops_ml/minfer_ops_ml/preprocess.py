"""ai.onnx.ml feature preprocessing: Scaler, Normalizer, Binarizer, Imputer, feature selection and joining."""

from __future__ import annotations

import numpy as np

from minfer_core import KernelError, kernel

ML = "ai.onnx.ml"


@kernel("Scaler", domain=ML)
def scaler(x, *, scale=None, offset=None):
    """Scaler-1: (x - offset) * scale along the last axis, as float32."""
    y = x.astype(np.float32)
    if offset is not None:
        y = y - np.asarray(offset, np.float32)
    if scale is not None:
        y = y * np.asarray(scale, np.float32)
    return np.ascontiguousarray(y, dtype=np.float32)


@kernel("Normalizer", domain=ML)
def normalizer(x, *, norm="MAX"):
    """Normalizer-1: each row divided by its MAX, L1 or L2 norm, as float32."""
    x = x.astype(np.float32)
    if norm == "MAX":
        d = x.max(axis=-1, keepdims=True)
    elif norm == "L1":
        d = np.abs(x).sum(axis=-1, keepdims=True)
    elif norm == "L2":
        d = np.sqrt((x * x).sum(axis=-1, keepdims=True))
    else:
        raise KernelError(f"Normalizer norm {norm!r} is not one of ['L1', 'L2', 'MAX']")
    return (x / d).astype(np.float32, copy=False)


@kernel("Binarizer", domain=ML)
def binarizer(x, *, threshold=0.0):
    """Binarizer-1: 1 where x > threshold else 0, in x's dtype."""
    return (x > threshold).astype(x.dtype)


@kernel("Imputer", domain=ML)
def imputer(x, *, imputed_value_floats=None, imputed_value_int64s=None, replaced_value_float=0.0,
            replaced_value_int64=0):
    """Imputer-1: replace the missing marker (NaN when replaced_value_float is NaN) by per-column values."""
    if x.dtype.kind == "f":
        fill = np.asarray(imputed_value_floats or [], x.dtype)
        missing = np.isnan(x) if np.isnan(replaced_value_float) else x == replaced_value_float
    else:
        fill = np.asarray(imputed_value_int64s or [], x.dtype)
        missing = x == replaced_value_int64
    if fill.size not in (1, x.shape[-1]):
        raise KernelError(f"Imputer has {fill.size} imputed values for {x.shape[-1]} columns (give 1 or one per column)")
    return np.where(missing, np.broadcast_to(fill, x.shape), x)


@kernel("ArrayFeatureExtractor", domain=ML, views=False)
def array_feature_extractor(x, indices):
    """ArrayFeatureExtractor-1: the columns ``indices`` of x's last axis (a 1-D x is one row)."""
    if x.ndim == 1:
        x = x.reshape(1, -1)
    idx = np.asarray(indices, np.int64).reshape(-1)
    if idx.size and (idx.min() < 0 or idx.max() >= x.shape[-1]):
        raise KernelError(f"ArrayFeatureExtractor index out of range: {idx.tolist()} for {x.shape[-1]} columns")
    return np.take(x, idx, axis=-1)


@kernel("FeatureVectorizer", domain=ML)
def feature_vectorizer(*xs, inputdimensions=None):
    """FeatureVectorizer-1: the inputs as rows, each cut or zero-padded to its dimension, joined as float32."""
    dims = list(inputdimensions or [x.shape[-1] if x.ndim > 1 else 1 for x in xs])
    rows = xs[0].shape[0] if xs[0].ndim > 1 else 1
    out = np.zeros((rows, sum(dims)), np.float32)
    start = 0
    for x, d in zip(xs, dims):
        x2 = x.reshape(rows, -1)
        n = min(d, x2.shape[1])
        out[:, start:start + n] = x2[:, :n]
        start += d
    return out
