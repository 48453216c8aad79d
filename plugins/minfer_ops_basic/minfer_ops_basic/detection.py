"""Kernels: selection ops used by detectors and decoders (TopK, NonMaxSuppression)."""

from __future__ import annotations

import numpy as np

from minfer_core import kernel

_INT64 = np.int64


def _first(v, default):
    """The single value of an optional scalar-like input (absent or empty means default)."""
    if v is None or np.asarray(v).size == 0:
        return default
    return np.asarray(v).reshape(-1)[0].item()


# --- TopK ----------------------------------------------------------------------------------


def _topk(x: np.ndarray, k: int, axis: int, largest: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The k largest (or smallest) entries along axis, sorted, ties broken by lower index."""
    axis = axis + x.ndim if axis < 0 else axis
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ValueError(f"TopK k={k} must lie in [0, {n}] for axis {axis} of shape {x.shape}")
    if largest:
        # Stable ascending sort of the reversed axis, read backwards: descending with
        # the lower original index first among equal values, without negating (uint-safe).
        order = np.flip(np.argsort(np.flip(x, axis), axis=axis, kind="stable"), axis)
        order = (n - 1) - order
    else:
        order = np.argsort(x, axis=axis, kind="stable")
    indices = np.take(order, np.arange(k), axis=axis).astype(_INT64, copy=False)
    return np.take_along_axis(x, indices, axis=axis), indices


@kernel("TopK", since=1, views=False)
def top_k_1(X, *, axis=-1, k):
    """TopK-1: k as an attribute."""
    return _topk(X, k, axis)


@kernel("TopK", since=10, views=False)
def top_k_10(X, K, *, axis=-1):
    """TopK-10: k as a one-element int64 input."""
    return _topk(X, int(_first(K, 0)), axis)


@kernel("TopK", since=11, views=False)
def top_k_11(X, K, *, sorted=1, largest=1, axis=-1):
    """TopK-11/24: largest or smallest; output is always sorted (allowed when sorted=0)."""
    return _topk(X, int(_first(K, 0)), axis, largest)


# --- NonMaxSuppression -------------------------------------------------------------------------


def _corners(boxes: np.ndarray, center_point_box: int) -> np.ndarray:
    """Boxes as float64 [xmin, ymin, xmax, ymax], whatever the input encoding."""
    b = boxes.astype(np.float64)
    if center_point_box:
        half_w, half_h = b[:, 2] / 2, b[:, 3] / 2
        return np.stack([b[:, 0] - half_w, b[:, 1] - half_h, b[:, 0] + half_w, b[:, 1] + half_h], axis=1)
    # Corner format [y1, x1, y2, x2] allows either diagonal, so order each pair.
    y_lo, y_hi = np.minimum(b[:, 0], b[:, 2]), np.maximum(b[:, 0], b[:, 2])
    x_lo, x_hi = np.minimum(b[:, 1], b[:, 3]), np.maximum(b[:, 1], b[:, 3])
    return np.stack([x_lo, y_lo, x_hi, y_hi], axis=1)


def _suppressed(top: np.ndarray, others: np.ndarray, iou_threshold: float) -> np.ndarray:
    """Which of others overlap top with IoU > threshold (degenerate boxes never suppress)."""
    w = np.minimum(top[2], others[:, 2]) - np.maximum(top[0], others[:, 0])
    h = np.minimum(top[3], others[:, 3]) - np.maximum(top[1], others[:, 1])
    inter = np.where((w > 0) & (h > 0), w * h, 0.0)
    area_top = (top[2] - top[0]) * (top[3] - top[1])
    area = (others[:, 2] - others[:, 0]) * (others[:, 3] - others[:, 1])
    union = area_top + area - inter
    valid = (inter > 0) & (area_top > 0) & (area > 0) & (union > 0)
    iou = np.divide(inter, union, out=np.zeros_like(inter), where=valid)
    return valid & (iou > iou_threshold)


def _nms_class(corners: np.ndarray, scores: np.ndarray, limit: int, iou: float, score_min) -> list[int]:
    """Greedy NMS of one (batch, class): highest score first, lower index first on ties."""
    order = np.argsort(-scores.astype(np.float64), kind="stable")
    if score_min is not None:
        order = order[scores[order] > score_min]
    kept: list[int] = []
    while order.size and len(kept) < limit:
        top, order = order[0], order[1:]
        kept.append(int(top))
        order = order[~_suppressed(corners[top], corners[order], iou)]
    return kept


@kernel("NonMaxSuppression", since=10, views=False)
def non_max_suppression(
    boxes,
    scores,
    max_output_boxes_per_class=None,
    iou_threshold=None,
    score_threshold=None,
    *,
    center_point_box=0,
):
    """NonMaxSuppression-10/11: int64 [selected, 3] rows of (batch, class, box)."""
    limit = max(int(_first(max_output_boxes_per_class, 0)), 0)
    iou = float(_first(iou_threshold, 0.0))
    score_min = _first(score_threshold, None)
    rows = []
    for b in range(boxes.shape[0]):
        corners = _corners(boxes[b], center_point_box)
        for c in range(scores.shape[1]):
            rows += [(b, c, i) for i in _nms_class(corners, scores[b, c], limit, iou, score_min)]
    return np.asarray(rows, dtype=_INT64).reshape(-1, 3)


KERNELS = [top_k_1, top_k_10, top_k_11, non_max_suppression]
