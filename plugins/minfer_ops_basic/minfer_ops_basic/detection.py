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


def _stable_order(values: np.ndarray, largest: int) -> np.ndarray:
    """Per row, positions sorted by value (descending if largest), equal values in position order."""
    if not largest:
        return np.argsort(values, axis=1, kind="stable")
    # Stable ascending sort of the reversed rows, read backwards: descending with the
    # lower position first among equal values, without negating (safe for unsigned ints).
    return (values.shape[1] - 1) - np.flip(np.argsort(np.flip(values, 1), axis=1, kind="stable"), 1)


def _candidates(rows: np.ndarray, k: int, largest: int) -> np.ndarray:
    """Per row, ascending indices of exactly k entries: the top k, ties at the cut taken lowest index first."""
    n = rows.shape[1]
    kth = n - k if largest else k - 1
    # argpartition is O(n): only the k survivors get sorted afterwards.
    part = np.argpartition(rows, kth, axis=1)
    cand = np.sort(part[:, kth:] if largest else part[:, :k], axis=1)
    cut = np.take_along_axis(rows, part[:, kth : kth + 1], axis=1)
    # argpartition picks arbitrarily among values equal to the cut; redo the rare
    # rows where such ties straddle the cut, taking the lowest indices as ONNX wants.
    inside = (np.take_along_axis(rows, cand, axis=1) == cut).sum(axis=1)
    for r in np.flatnonzero((rows == cut).sum(axis=1) != inside):
        row, c = rows[r], cut[r, 0]
        beyond = row > c if largest else row < c
        tie = row == c
        cand[r] = np.flatnonzero(beyond | (tie & (np.cumsum(tie) <= k - beyond.sum())))
    return cand


def _topk(x: np.ndarray, k: int, axis: int, largest: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """The k largest (or smallest) entries along axis, sorted, ties broken by lower index."""
    axis = axis + x.ndim if axis < 0 else axis
    n = x.shape[axis]
    if not 0 <= k <= n:
        raise ValueError(f"TopK k={k} must lie in [0, {n}] for axis {axis} of shape {x.shape}")
    rows = np.moveaxis(x, axis, -1).reshape(-1, n)
    has_nan = x.dtype.kind == "f" and bool(np.isnan(rows).any())
    if 0 < k and 4 * k < n and not has_nan:  # NaN defeats the partition cut; sort everything then
        cand = _candidates(rows, k, largest)
    else:
        cand = np.broadcast_to(np.arange(n), rows.shape)
    order = _stable_order(np.take_along_axis(rows, cand, axis=1), largest)[:, :k]
    indices = np.take_along_axis(cand, order, axis=1).astype(_INT64, copy=False)
    values = np.take_along_axis(rows, indices, axis=1)
    shape = np.moveaxis(x, axis, -1).shape[:-1] + (k,)
    return np.moveaxis(values.reshape(shape), -1, axis), np.moveaxis(indices.reshape(shape), -1, axis)


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


def _suppresses(boxes: np.ndarray, areas: np.ndarray, a: np.ndarray, b: np.ndarray, iou_threshold: float) -> np.ndarray:
    """[len(a), len(b)]: whether box a[i] suppresses box b[j] (IoU > threshold; degenerate boxes never do)."""
    ba, bb = boxes[a][:, None, :], boxes[b][None, :, :]
    w = np.minimum(ba[..., 2], bb[..., 2]) - np.maximum(ba[..., 0], bb[..., 0])
    h = np.minimum(ba[..., 3], bb[..., 3]) - np.maximum(ba[..., 1], bb[..., 1])
    inter = np.maximum(w, 0.0) * np.maximum(h, 0.0)
    area_a, area_b = areas[a][:, None], areas[b][None, :]
    union = area_a + area_b - inter
    valid = (inter > 0) & (area_a > 0) & (area_b > 0) & (union > 0)
    iou = np.divide(inter, union, out=np.zeros_like(inter), where=valid)
    return valid & (iou > iou_threshold)


def _nms_class(boxes: np.ndarray, areas: np.ndarray, scores: np.ndarray, limit: int, iou: float, score_min) -> list[int]:
    """Greedy NMS of one (batch, class): highest score first, lower index first on ties."""
    # Threshold before sorting: real detectors leave few boxes above the score floor.
    cand = np.arange(scores.size) if score_min is None else np.flatnonzero(scores > score_min)
    order = cand[np.argsort(-scores[cand], kind="stable")]
    kept: list[int] = []
    start, chunk = 0, 64
    # Score-ordered chunks with one pairwise matrix each: the Python loop runs once per kept box.
    while start < order.size and len(kept) < limit:
        part = order[start : start + chunk]
        alive = np.ones(part.size, bool)
        if kept:
            alive &= ~_suppresses(boxes, areas, np.asarray(kept), part, iou).any(axis=0)
        pairs = _suppresses(boxes, areas, part, part, iou)
        i = 0
        while len(kept) < limit:
            rest = np.flatnonzero(alive[i:])
            if not rest.size:
                break
            j = i + int(rest[0])
            kept.append(int(part[j]))
            alive &= ~pairs[j]
            i = j + 1
        start, chunk = start + part.size, min(chunk * 2, 256)
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
    rows: list[tuple[int, int, int]] = []
    for b in range(boxes.shape[0] if limit else 0):
        corners = _corners(boxes[b], center_point_box)
        areas = (corners[:, 2] - corners[:, 0]) * (corners[:, 3] - corners[:, 1])
        for c in range(scores.shape[1]):
            rows += [(b, c, i) for i in _nms_class(corners, areas, scores[b, c], limit, iou, score_min)]
    return np.asarray(rows, dtype=_INT64).reshape(-1, 3)


