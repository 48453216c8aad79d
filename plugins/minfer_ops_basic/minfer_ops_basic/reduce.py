"""Kernels: Reduce* (axes as attribute, then as input), ArgMax/ArgMin, and the two loss reductions."""

from __future__ import annotations

import functools
import math
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
    fast = _rows_plan(x.shape, x.dtype, axes, keep, False) if axes is not None and x.size else None
    return fast(x) if fast is not None else np.sum(x, axis=axes, keepdims=keep, dtype=_acc(x))


def _mean(x, axes, keep):
    fast = _rows_plan(x.shape, x.dtype, axes, keep, True) if axes is not None and x.size else None
    if fast is not None:  # axes given at run time: the product all the same (the planned kernels reuse theirs)
        return fast(x)
    acc = np.float64 if x.dtype.kind in "iu" else _acc(x)
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


# --- sums and means over trailing axes: one BLAS matrix-vector product ----------------------------------

# rows of at most this many cells: numpy's reduction costs ~0.2 us a row on short rows (mobilenet_v3_large's head,
# a 1x960x7x7 mean, took 66 us in a run, 14 with the product with a vector of 1/49), and BLAS's few running sums
# stay within float32 rounding of numpy's pairwise one over rows this short
ROW_CELLS = 4096
# a node meeting more input shapes than this (dynamic dims) starts its plans afresh: they hold a vector each
MAX_PLANS = 64


def _rows_plan(shape: tuple[int, ...], dtype: np.dtype, axes: tuple[int, ...], keep: bool, mean: bool):
    """``run(x)``: the sum (mean) of x over ``axes`` as x's rows against a vector of ones (1/count), or None
    unless the axes are x's trailing ones, short enough, of a BLAS float dtype, with rows to keep."""
    lead = len(shape) - len(axes)
    if dtype not in (np.float32, np.float64) or axes != tuple(range(lead, len(shape))) or lead == 0:
        return None
    rows, cols = math.prod(shape[:lead]), math.prod(shape[lead:])
    if not rows or not 0 < cols <= ROW_CELLS:
        return None
    weights = np.full(cols, 1 / cols if mean else 1, dtype)
    out_shape = shape[:lead] + ((1,) * len(axes) if keep else ())

    def run(x: np.ndarray) -> np.ndarray:
        return np.matmul(x.reshape(rows, cols), weights).reshape(out_shape)

    return run


def _normalized(axes: Any, rank: int) -> tuple[int, ...]:
    return tuple(sorted({int(a) % max(rank, 1) for a in axes}))


def _planned(fn: Reducer, mean: bool, keepdims: int, fixed_axes: tuple[int, ...]) -> Callable[..., np.ndarray]:
    """The run callable of a sum or mean whose axes are known at build (``fixed_axes``; () is every axis):
    a plan per input shape and dtype, the BLAS product where `_rows_plan` applies, else numpy's reduction."""
    plans: dict[tuple, Callable[[np.ndarray], np.ndarray]] = {}

    def run(data: np.ndarray, axes: Any = None) -> np.ndarray:
        plan = plans.get((data.shape, data.dtype))
        if plan is None:
            if len(plans) >= MAX_PLANS:
                plans.clear()
            plan = plans[(data.shape, data.dtype)] = _plan_for(fn, mean, data, keepdims, fixed_axes)
        return plan(data)

    return run


def _plan_for(fn: Reducer, mean: bool, x: np.ndarray, keepdims: int, fixed_axes: tuple[int, ...]):
    """x's shape's plan: `_rows_plan`'s product when it applies, else numpy's reduction as `_reduce` makes it."""
    axes = _normalized(fixed_axes, x.ndim) if fixed_axes else tuple(range(x.ndim))
    fast = _rows_plan(x.shape, x.dtype, axes, bool(keepdims), mean) if x.size else None
    if fast is not None:
        return fast
    return lambda data: _reduce(fn, data, axes if fixed_axes else None, keepdims)  # (finds no product either)


def _blas_kernels(op_type: str, fn: Reducer, input_since: int, mean: bool) -> list:
    """`_reduce_kernels` for ReduceSum and ReduceMean, planned per node and input shape when the axes are
    constant (as exporters write them), so that the trailing-axes case skips numpy's reduction."""
    generic = _reduce_kernels(op_type, fn, input_since)[0].fn

    def with_input(ctx, *, keepdims=1, noop_with_empty_axes=0):
        constant = ctx.constants[1] if len(ctx.constants) > 1 else None
        if constant is None:  # axes computed at run time, or omitted: numpy's reduction, as it comes
            return functools.partial(generic, keepdims=keepdims, noop_with_empty_axes=noop_with_empty_axes)
        axes = tuple(np.asarray(constant).ravel().tolist())
        if not axes and noop_with_empty_axes:
            return lambda data, axes=None: data
        return _planned(fn, mean, keepdims, axes)

    def with_attr(ctx, *, axes=None, keepdims=1):
        return _planned(fn, mean, keepdims, tuple(axes or ()))

    for f, since, doc in ((with_input, input_since, "axes as an optional input; empty means all, or none if "
                           "noop_with_empty_axes."), (with_attr, 1, "axes as an attribute; absent means all.")):
        f.__name__ = f.__qualname__ = f"{op_type}_{since}"
        f.__doc__ = f"{op_type}-{since}: {doc}"
    return [kernel(op_type, since=input_since, prepare=True)(with_input),
            kernel(op_type, since=1, prepare=True)(with_attr)]


KERNELS: list = []  # records made by factories below; kernels_in finds the decorated ones by themselves
KERNELS += _blas_kernels("ReduceSum", _sum, 13, mean=False)
KERNELS += _blas_kernels("ReduceMean", _mean, 18, mean=True)
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


