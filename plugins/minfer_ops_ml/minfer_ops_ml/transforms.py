"""post_transform of the ai.onnx.ml classifiers and regressors, on (N, C) float64 scores."""

from __future__ import annotations

import numpy as np

from minfer_core import KernelError

# TreeEnsemble-5 spells post_transform as an int, the older ops as a string
BY_CODE = ("NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO", "PROBIT")


def logistic(s: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-s)), without overflow warnings for large |s|."""
    e = np.exp(-np.abs(s))
    return np.where(s >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def softmax(s: np.ndarray) -> np.ndarray:
    """Softmax over the last axis."""
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def softmax_zero(s: np.ndarray) -> np.ndarray:
    """Softmax that keeps exact zeros at zero (onnxruntime: |s| <= 1e-7 counts as zero); all-zero rows give 0.5."""
    top = s.max(axis=-1, keepdims=True)
    e = np.where(np.abs(s) > 1e-7, np.exp(s - top), s * np.exp(-top))
    total = e.sum(axis=-1, keepdims=True)
    return np.where(total == 0, 0.5, e / np.where(total == 0, 1, total))


def probit(s: np.ndarray) -> np.ndarray:
    """sqrt(2) * erfinv(2s - 1), with the closed-form erfinv approximation (a = 0.147) onnxruntime uses."""
    x = 2 * s - 1
    sign = np.where(x < 0, -1.0, 1.0)
    ln = np.log(np.maximum((1 - x) * (1 + x), 1e-300))
    v = 2 / (np.pi * 0.147) + 0.5 * ln
    inv = sign * np.sqrt(-v + np.sqrt(v * v - ln / 0.147))
    return np.sqrt(2.0) * np.where((1 - x) * (1 + x) == 0, 0.0, inv)


FUNCTIONS = {"NONE": lambda s: s, "SOFTMAX": softmax, "LOGISTIC": logistic, "SOFTMAX_ZERO": softmax_zero, "PROBIT": probit}


def post_transform(name: str | int):
    """The function for a post_transform attribute (name or TreeEnsemble-5 code); unknown ones are a KernelError."""
    if isinstance(name, int):
        name = BY_CODE[name] if 0 <= name < len(BY_CODE) else str(name)
    if name not in FUNCTIONS:
        raise KernelError(f"post_transform {name!r} is not one of {sorted(FUNCTIONS)}")
    return FUNCTIONS[name]


def binary_scores(score: np.ndarray, name: str) -> np.ndarray:
    """Two columns from one score column: [1 - s, s] for NONE and PROBIT, else [-s, s], then the transform."""
    first = 1 - score if name in ("NONE", "PROBIT") else -score
    return post_transform(name)(np.concatenate([first, score], axis=1))
