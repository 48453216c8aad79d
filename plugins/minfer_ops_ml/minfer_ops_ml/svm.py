"""ai.onnx.ml support vector machines: SVMRegressor, SVMClassifier (one-vs-one votes, Platt pairwise coupling)."""

from __future__ import annotations

import numpy as np

from minfer_core import KernelError, kernel

from .linear import class_labels
from .transforms import binary_scores, logistic, post_transform as transform

ML = "ai.onnx.ml"


def gram(x: np.ndarray, sv: np.ndarray, kind: str, params) -> np.ndarray:
    """K(x_i, sv_j) for all samples and support vectors: (N, V), in float64."""
    gamma, coef0, degree = (list(params or []) + [0.0, 0.0, 0.0])[:3]
    if kind == "RBF":
        d2 = (x * x).sum(1)[:, None] - 2 * x @ sv.T + (sv * sv).sum(1)[None, :]
        return np.exp(-gamma * np.maximum(d2, 0.0))
    dot = x @ sv.T
    if kind == "LINEAR":
        return dot
    if kind == "POLY":
        return (gamma * dot + coef0) ** degree
    if kind == "SIGMOID":
        return np.tanh(gamma * dot + coef0)
    raise KernelError(f"SVM kernel_type {kind!r} is not one of ['LINEAR', 'POLY', 'RBF', 'SIGMOID']")


def rows_of(x: np.ndarray) -> np.ndarray:
    """x as (N, F) float64."""
    return (x.reshape(x.shape[0], -1) if x.ndim > 1 else x.reshape(1, -1)).astype(np.float64)


@kernel("SVMRegressor", domain=ML)
def svm_regressor(x, *, coefficients=None, kernel_params=None, kernel_type="LINEAR", n_supports=0, one_class=0,
                  post_transform="NONE", rho=None, support_vectors=None):
    """SVMRegressor-1: sum_j coef_j K(x, sv_j) + rho (or a linear model when n_supports is 0), as float32 (N, 1)."""
    x2 = rows_of(x)
    coef = np.asarray(coefficients, np.float64)
    if n_supports > 0:
        s = gram(x2, np.asarray(support_vectors, np.float64).reshape(n_supports, -1), kernel_type, kernel_params) @ coef
    else:
        s = x2 @ coef
    s = s + (rho[0] if rho else 0.0)
    if one_class:
        s = np.where(s > 0, 1.0, -1.0)
    return transform(post_transform)(s[:, None]).astype(np.float32)


def pair_scores(k: np.ndarray, coef: np.ndarray, rho: np.ndarray, counts: list[int]) -> np.ndarray:
    """libsvm's one-vs-one decision values, (N, C(C-1)/2), pairs (i, j) with i < j in row-major order."""
    start = np.concatenate([[0], np.cumsum(counts)]).astype(int)
    out = []
    for i in range(len(counts)):
        for j in range(i + 1, len(counts)):
            si, sj = slice(start[i], start[i + 1]), slice(start[j], start[j + 1])
            out.append(k[:, si] @ coef[j - 1, si] + k[:, sj] @ coef[i, sj])
    return np.stack(out, axis=1) + rho[None, : len(out)]


def couple(r: np.ndarray, max_iter: int) -> np.ndarray:
    """Class probabilities (N, C) from pairwise ones r (N, C, C): Wu, Lin and Weng's method, all samples at once."""
    n, c, _ = r.shape
    q = -r.transpose(0, 2, 1) * r  # q[t, j] = -r[j, t] r[t, j] off the diagonal
    diag = (r.transpose(0, 2, 1) ** 2).sum(2) - (np.diagonal(r, axis1=1, axis2=2) ** 2)
    idx = np.arange(c)
    q[:, idx, idx] = diag
    p = np.full((n, c), 1.0 / c)
    active = np.ones(n, bool)
    for _ in range(max_iter):
        qp = np.einsum("nij,nj->ni", q, p)
        pqp = (p * qp).sum(1)
        active &= np.abs(qp - pqp[:, None]).max(1) >= 0.005 / c
        if not active.any():
            break
        for t in range(c):  # the coordinate updates are sequential in t, as in libsvm
            diff = np.where(active, (pqp - qp[:, t]) / q[:, t, t], 0.0)
            p[:, t] += diff
            pqp = (pqp + diff * (diff * q[:, t, t] + 2 * qp[:, t])) / (1 + diff) ** 2
            p /= (1 + diff)[:, None]
            qp = (qp + diff[:, None] * q[:, t, :]) / (1 + diff)[:, None]
    return p


def probabilities(scores: np.ndarray, prob_a, prob_b, c: int) -> np.ndarray:
    """Platt-scaled pairwise probabilities coupled into class probabilities, (N, C)."""
    pair = 1 - logistic(scores * np.asarray(prob_a, np.float64) + np.asarray(prob_b, np.float64))
    pair = np.clip(pair, 1e-7, 1 - 1e-7)
    r = np.zeros((scores.shape[0], c, c))
    iu = np.triu_indices(c, 1)
    r[:, iu[0], iu[1]] = pair
    r[:, iu[1], iu[0]] = 1 - pair
    return couple(r, max(100, c))


@kernel("SVMClassifier", domain=ML, prepare=True)
def svm_classifier(ctx, *, classlabels_ints=None, classlabels_strings=None, coefficients=None, kernel_params=None,
                   kernel_type="LINEAR", post_transform="NONE", prob_a=None, prob_b=None, rho=None,
                   support_vectors=None, vectors_per_class=None):
    """SVMClassifier-1: (label, scores) by one-vs-one votes over support vectors, probabilities when prob_a is given."""
    labels = class_labels(classlabels_ints, classlabels_strings)
    counts = list(vectors_per_class or [])
    if not sum(counts):
        raise KernelError("SVMClassifier without support vectors (liblinear mode) is not supported by minfer-ops-ml; "
                          "export the model as a LinearClassifier")
    sv = np.asarray(support_vectors, np.float64).reshape(sum(counts), -1)
    coef = np.asarray(coefficients, np.float64).reshape(-1, sum(counts))
    rho_ = np.asarray(rho, np.float64)
    c = len(counts)
    iu = np.triu_indices(c, 1)

    def run(x):
        s = pair_scores(gram(rows_of(x), sv, kernel_type, kernel_params), coef, rho_, counts)
        votes = np.zeros((s.shape[0], c), np.int64)
        np.add.at(votes, (slice(None), iu[0]), (s > 0).astype(np.int64))
        np.add.at(votes, (slice(None), iu[1]), (s <= 0).astype(np.int64))
        label = labels[np.argmax(votes, axis=1)]
        if prob_a:
            z = transform(post_transform)(probabilities(s, prob_a, prob_b, c))
        elif s.shape[1] == 1:
            z = binary_scores(s, post_transform) if post_transform != "NONE" else np.concatenate([-s, s], axis=1)
        else:
            z = transform(post_transform)(s)
        return label, z.astype(np.float32)

    return run
