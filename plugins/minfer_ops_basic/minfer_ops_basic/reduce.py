"""Kernels: Reduce* (axes as attribute, then as input), ArgMax/ArgMin, and the two loss reductions."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from minfer_core import kernel

from .activation import log_softmax
from .elementwise import arr, declare, is_exotic

Reducer = Callable[[np.ndarray, Any, bool], np.ndarray]


def _acc(x: np.ndarray) -> np.dtype:
    """Accumulation dtype: half floats and ml_dtypes floats sum in float32, others in their own dtype."""
    if is_exotic(x.dtype) or (x.dtype.kind == "f" and x.dtype.itemsize < 4):
        return np.dtype(np.float32)
    return x.dtype


def _extreme(dtype: np.dtype, lowest: bool) -> Any:
    """The identity of max (lowest) or min (highest) for an empty reduction."""
    if dtype.kind == "b":
        return not lowest
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        return info.min if lowest else info.max
    return -np.inf if lowest else np.inf


def _sum(x, axes, keep):
    return np.sum(x, axis=axes, keepdims=keep, dtype=_acc(x))


def _mean(x, axes, keep):
    acc = np.float64 if x.dtype.kind in "iu" else _acc(x)
    n = x.ndim - len(axes) if axes is not None else 0
    if x.dtype in (np.float32, np.float64) and axes == tuple(range(n, x.ndim)) and 0 < n and x.size and x.flags.c_contiguous:
        # the trailing axes (a global average pool's H, W): one matrix-vector product, where numpy's reduction
        # over short rows is ~7x slower (1x960x7x7: 46 against 6 us)
        rows = x.reshape(-1, int(np.prod(x.shape[n:])))
        y = rows @ np.full(rows.shape[1], 1 / rows.shape[1], x.dtype)
        return y.reshape(x.shape[:n] + ((1,) * (x.ndim - n) if keep else ()))
    return np.mean(x, axis=axes, keepdims=keep, dtype=acc)


def _max(x, axes, keep):
    extra = {"initial": _extreme(x.dtype, True)} if x.size == 0 else {}
    return np.max(x, axis=axes, keepdims=keep, **extra)


def _min(x, axes, keep):
    extra = {"initial": _extreme(x.dtype, False)} if x.size == 0 else {}
    return np.min(x, axis=axes, keepdims=keep, **extra)


def _prod(x, axes, keep):
    return np.prod(x, axis=axes, keepdims=keep, dtype=_acc(x))


def _l1(x, axes, keep):
    return _sum(np.abs(x), axes, keep)


def _sum_square(x, axes, keep):
    v = x.astype(_acc(x), copy=False)
    return np.sum(v * v, axis=axes, keepdims=keep)


def _l2(x, axes, keep):
    s = _sum_square(x, axes, keep)
    return np.sqrt(s.astype(np.float64)) if s.dtype.kind in "iu" else np.sqrt(s)


def _log_sum(x, axes, keep):
    return np.log(_sum(x, axes, keep))


def _log_sum_exp(x, axes, keep):
    """max + log(sum(exp(x - max))), with a finite shift so all -inf (or empty) gives -inf."""
    v = x.astype(_acc(x), copy=False)
    if v.size == 0:
        return np.log(np.sum(np.exp(v), axis=axes, keepdims=keep))
    m = np.max(v, axis=axes, keepdims=True)
    m = np.where(np.isfinite(m), m, 0)
    s = np.log(np.sum(np.exp(v - m), axis=axes, keepdims=True)) + m
    return s if keep else np.squeeze(s, axis=axes)


def _reduce(fn: Reducer, x: np.ndarray, axes: Any, keepdims: int) -> np.ndarray:
    """Reduce x over axes (None = all), returning x's dtype and a real array."""
    if axes is not None:
        axes = tuple(sorted({int(a) % max(x.ndim, 1) for a in axes}))
    with np.errstate(all="ignore"):  # log(0) = -inf and friends are the specified results
        return arr(fn(x, axes, bool(keepdims)), x.dtype)


def _reduce_kernels(op_type: str, fn: Reducer, input_since: int) -> list:
    """Two kernels: ``axes`` as an attribute before ``input_since``, as an input from it on."""

    def with_input(data, axes=None, *, keepdims=1, noop_with_empty_axes=0):
        if axes is None or np.size(axes) == 0:
            if noop_with_empty_axes:
                return data
            return _reduce(fn, data, None, keepdims)
        return _reduce(fn, data, np.asarray(axes).ravel().tolist(), keepdims)

    def with_attr(data, *, axes=None, keepdims=1):
        return _reduce(fn, data, axes or None, keepdims)

    return [
        declare(op_type, input_since, with_input, "axes as an optional input; empty means all, or none if noop_with_empty_axes."),
        declare(op_type, 1, with_attr, "axes as an attribute; absent means all."),
    ]


KERNELS: list = []  # records made by factories below; kernels_in finds the decorated ones by themselves
KERNELS += _reduce_kernels("ReduceSum", _sum, 13)
KERNELS += _reduce_kernels("ReduceMean", _mean, 18)
KERNELS += _reduce_kernels("ReduceMax", _max, 18)
KERNELS += _reduce_kernels("ReduceMin", _min, 18)
KERNELS += _reduce_kernels("ReduceProd", _prod, 18)
KERNELS += _reduce_kernels("ReduceL1", _l1, 18)
KERNELS += _reduce_kernels("ReduceL2", _l2, 18)
KERNELS += _reduce_kernels("ReduceSumSquare", _sum_square, 18)
KERNELS += _reduce_kernels("ReduceLogSum", _log_sum, 18)
KERNELS += _reduce_kernels("ReduceLogSumExp", _log_sum_exp, 18)


# --- ArgMax / ArgMin ---------------------------------------------------------


def _arg(find: Callable[..., np.ndarray], x: np.ndarray, axis: int, keepdims: int, last: int) -> np.ndarray:
    """Index of the first (or, with ``last``, the final) extreme along axis, as int64."""
    axis = axis % max(x.ndim, 1)
    if last:
        # search the reversed axis, then map the index back
        idx = x.shape[axis] - 1 - find(np.flip(x, axis), axis=axis)
    else:
        idx = find(x, axis=axis)
    idx = np.asarray(idx, dtype=np.int64)
    return np.expand_dims(idx, axis) if keepdims else idx


@kernel("ArgMax", since=12)
def argmax(data, *, axis=0, keepdims=1, select_last_index=0):
    """ArgMax-12: index of the maximum along axis, first or last occurrence."""
    return _arg(np.argmax, data, axis, keepdims, select_last_index)


@kernel("ArgMax", since=1)
def argmax_1(data, *, axis=0, keepdims=1):
    """ArgMax-1: index of the first maximum along axis."""
    return _arg(np.argmax, data, axis, keepdims, 0)


@kernel("ArgMin", since=12)
def argmin(data, *, axis=0, keepdims=1, select_last_index=0):
    """ArgMin-12: index of the minimum along axis, first or last occurrence."""
    return _arg(np.argmin, data, axis, keepdims, select_last_index)


@kernel("ArgMin", since=1)
def argmin_1(data, *, axis=0, keepdims=1):
    """ArgMin-1: index of the first minimum along axis."""
    return _arg(np.argmin, data, axis, keepdims, 0)




# --- losses ------------------------------------------------------------------------


def _nll(x: np.ndarray, target: np.ndarray, weight: np.ndarray | None, ignore_index: int | None, reduction: str) -> np.ndarray:
    """-x[n, target[n, ...], ...] * weight[target], reduced; ignored targets weigh 0 and do not count in the mean."""
    t = target.astype(np.int64)
    ignored = t == ignore_index if ignore_index is not None else np.zeros(t.shape, dtype=bool)
    safe = np.where(ignored, 0, t)
    picked = np.take_along_axis(x, safe[:, None], axis=1)[:, 0]
    w = np.ones(t.shape, x.dtype) if weight is None else weight[safe].astype(x.dtype)
    w = np.where(ignored, np.zeros((), x.dtype), w)
    loss = -picked * w
    if reduction == "none":
        return arr(loss, x.dtype)
    if reduction == "sum":
        return arr(loss.sum(), x.dtype)
    with np.errstate(all="ignore"):  # everything ignored: 0/0, as onnxruntime gives
        return arr(loss.sum() / w.sum(), x.dtype)


@kernel("NegativeLogLikelihoodLoss", since=12)
def negative_log_likelihood_loss(x, target, weight=None, *, ignore_index=None, reduction="mean"):
    """NegativeLogLikelihoodLoss-12: picks -x at each target class (axis 1), optionally weighted, then reduces."""
    return _nll(x, target, weight, ignore_index, reduction)


@kernel("SoftmaxCrossEntropyLoss", since=12)
def softmax_cross_entropy_loss(scores, labels, weights=None, *, ignore_index=None, reduction="mean"):
    """SoftmaxCrossEntropyLoss-12: NLL of LogSoftmax over the class axis 1; also returns the log-probabilities."""
    with np.errstate(all="ignore"):
        log_prob = arr(log_softmax(scores, 1), scores.dtype)
    return _nll(log_prob, labels, weights, ignore_index, reduction), log_prob


