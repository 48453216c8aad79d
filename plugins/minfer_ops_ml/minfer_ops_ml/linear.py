"""ai.onnx.ml linear models: LinearClassifier, LinearRegressor."""

from __future__ import annotations

import numpy as np

from minfer_core import KernelError, kernel

from .transforms import binary_scores, post_transform as transform

ML = "ai.onnx.ml"


def class_labels(ints, strings) -> np.ndarray:
    """The classifier's labels as an array: int64, or object for strings."""
    if strings is not None:
        return np.array(strings, dtype=object)
    return np.array(ints if ints is not None else [], dtype=np.int64)


def linear_scores(x: np.ndarray, coefficients, intercepts, rows: int) -> np.ndarray:
    """x (N, F) @ coefficients (rows, F).T + intercepts, in float64 (onnxruntime accumulates in double too)."""
    x = x.reshape(x.shape[0], -1) if x.ndim > 1 else x.reshape(1, -1)
    w = np.asarray(coefficients, np.float64).reshape(rows, -1)
    if w.shape[1] != x.shape[1]:
        raise KernelError(f"linear model has {w.shape[1]} coefficients per row, the input {x.shape[1]} features")
    s = x.astype(np.float64) @ w.T
    return s + np.asarray(intercepts, np.float64) if intercepts is not None else s


@kernel("LinearClassifier", domain=ML)
def linear_classifier(x, *, coefficients, classlabels_ints=None, classlabels_strings=None, intercepts=None,
                      multi_class=0, post_transform="NONE"):
    """LinearClassifier-1: (label, scores) of x @ W.T + b; one score row with two labels is a binary model."""
    labels = class_labels(classlabels_ints, classlabels_strings)
    rows = len(intercepts) if intercepts is not None else max(len(labels), 1)
    s = linear_scores(x, coefficients, intercepts, rows)
    if rows == 1 and len(labels) == 2:
        z = binary_scores(s, post_transform) if post_transform != "NONE" else np.concatenate([-s, s], axis=1)
        label = labels[(s[:, 0] > 0).astype(np.int64)]
        return label, z.astype(np.float32)
    z = transform(post_transform)(s)
    if rows == 1:  # one class and its complement: the label is the class when its score clears the threshold
        hit = z[:, 0] >= (0 if post_transform == "NONE" else 0.5)
        label = np.where(hit, labels[0] if len(labels) else 1, 0 if labels.dtype != object else "")
        return label.astype(labels.dtype), z.astype(np.float32)
    return labels[np.argmax(z, axis=1)], z.astype(np.float32)


@kernel("LinearRegressor", domain=ML)
def linear_regressor(x, *, coefficients=None, intercepts=None, post_transform="NONE", targets=1):
    """LinearRegressor-1: x @ W.T + b for ``targets`` outputs, as float32."""
    s = linear_scores(x, coefficients if coefficients is not None else [0.0] * targets, intercepts, targets)
    return transform(post_transform)(s).astype(np.float32)
