"""Kernels: indexing ops (Slice, Gather*, Scatter*, TensorScatter, Where, NonZero, Compress, ReverseSequence, Unique)."""

from __future__ import annotations

import numpy as np

from minfer_core import kernel

_INT64 = np.int64


def _ints(v) -> list[int]:
    # tolist() yields Python ints in one C call (int() per element is several times slower).
    return [int(i) for i in np.asarray(v).reshape(-1).tolist()]


def _axis(axis: int, rank: int) -> int:
    if not -rank <= axis < rank:
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


# --- Slice ----------------------------------------------------------------------------


def _bounds(start: int, end: int, step: int, dim: int) -> slice:
    """One ONNX slice as a Python slice: negatives count from the back, then clamp."""
    if step == 0:
        raise ValueError("Slice step cannot be 0")
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return slice(min(max(start, 0), dim), min(max(end, 0), dim), step)
    start = min(max(start, 0), dim - 1)
    end = min(max(end, -1), dim - 1)
    # For a negative step, -1 means "past the front", which Python spells None.
    return slice(start, None if end < 0 else end, step)


_INDEXES: dict = {}  # (shape, starts, ends, axes, steps as bytes) -> the index tuple, for every Slice of the process
_MAX_INDEXES = 1024  # a process meeting more than this (dynamic shapes or bounds) starts the table afresh


def _key(v) -> object:
    """A hashable stand-in for a bounds argument (an int64 array as its bytes: one C call)."""
    if v is None:
        return None
    if isinstance(v, np.ndarray):
        return v.dtype.char, v.tobytes()
    return tuple(_ints(v))


def _slice(data: np.ndarray, starts, ends, axes=None, steps=None) -> np.ndarray:
    """data[index] for ONNX bounds, the index worked out once per shape and bounds (~3 us of Python a call)."""
    key = (data.shape, _key(starts), _key(ends), _key(axes), _key(steps))
    index = _INDEXES.get(key)
    if index is None:
        if len(_INDEXES) >= _MAX_INDEXES:
            _INDEXES.clear()
        index = _INDEXES[key] = _index(data, starts, ends, axes, steps)
    return data[index]  # a strided view: no copy


def _index(data: np.ndarray, starts, ends, axes=None, steps=None) -> tuple[slice, ...]:
    starts, ends = _ints(starts), _ints(ends)
    axes = list(range(len(starts))) if axes is None else [_axis(a, data.ndim) for a in _ints(axes)]
    steps = [1] * len(starts) if steps is None else _ints(steps)
    if len(set(axes)) != len(axes):
        raise ValueError(f"Slice axes {axes} repeat an axis")
    index = [slice(None)] * data.ndim
    for s, e, a, st in zip(starts, ends, axes, steps):
        index[a] = _bounds(s, e, st, data.shape[a])
    return tuple(index)


@kernel("Slice", since=1, views=True)
def slice_1(data, *, ends, starts, axes=None):
    """Slice-1: starts/ends/axes as attributes, step 1."""
    return _slice(data, starts, ends, axes)


@kernel("Slice", since=10, views=True)
def slice_10(data, starts, ends, axes=None, steps=None):
    """Slice-10..13: starts/ends/axes/steps as inputs; negative steps walk backwards."""
    return _slice(data, starts, ends, axes, steps)


# --- Gather family -----------------------------------------------------------------------


@kernel("Gather", since=1, out=True, views=False)
def gather(data, indices, *, axis=0, out=None):
    """Gather-1/11/13: take entries along axis; negative indices count from the back."""
    return np.asarray(np.take(data, np.asarray(indices), axis=_axis(axis, data.ndim), out=out))


def _element_offsets(shape: tuple[int, ...], indices, axis: int) -> np.ndarray:
    """Flat C-order offsets into a tensor of shape: indices[...] along axis, elsewhere indices' own position.

    One flat offset per element lets np.take / ufunc.at work on 1-D data, several
    times faster than indexing with one broadcast array per dim.
    """
    indices = np.asarray(indices, dtype=_INT64)
    dim = shape[axis]
    if indices.size and (indices.min() < -dim or indices.max() >= dim):
        raise IndexError(f"indices must lie in [{-dim}, {dim - 1}] for axis {axis} of shape {shape}")
    strides = np.cumprod((1,) + shape[:0:-1])[::-1]
    flat = np.where(indices < 0, indices + dim, indices) * strides[axis]
    for d, n in enumerate(indices.shape):
        if d != axis:
            flat = flat + (np.arange(n) * strides[d]).reshape((-1,) + (1,) * (indices.ndim - d - 1))
    return flat


@kernel("GatherElements", since=11, views=False)
def gather_elements(data, indices, *, axis=0):
    """GatherElements-11/13: out[i][j] = data[indices[i][j]][j] (for axis 0)."""
    return np.take(data.reshape(-1), _element_offsets(data.shape, indices, _axis(axis, data.ndim)))


def _gather_nd(data: np.ndarray, indices: np.ndarray, batch_dims: int) -> np.ndarray:
    batch, k = data.shape[:batch_dims], indices.shape[-1]
    inner = indices.shape[batch_dims:-1]
    nb, m = int(np.prod(batch, dtype=_INT64)), int(np.prod(inner, dtype=_INT64))
    flat_data = data.reshape((nb,) + data.shape[batch_dims:])
    flat_idx = indices.reshape(nb, m, k)
    # Pair every index tuple with its batch row; numpy wraps negative indices as ONNX does.
    rows = np.broadcast_to(np.arange(nb)[:, None], (nb, m))
    out = flat_data[(rows,) + tuple(flat_idx[..., j] for j in range(k))]
    return out.reshape(batch + inner + data.shape[batch_dims + k :])


@kernel("GatherND", since=11, views=False)
def gather_nd_11(data, indices):
    """GatherND-11: index tuples in the last dim of indices select slices of data."""
    return _gather_nd(data, np.asarray(indices), 0)


@kernel("GatherND", since=12, views=False)
def gather_nd_12(data, indices, *, batch_dims=0):
    """GatherND-12/13: the leading batch_dims dims of data and indices are paired."""
    return _gather_nd(data, np.asarray(indices), batch_dims)


# --- Scatter family -----------------------------------------------------------------------

# Duplicate indices accumulate through ufunc.at; plain assignment keeps the last write.
_REDUCE = {"add": np.add, "mul": np.multiply, "max": np.maximum, "min": np.minimum}


def _copy(data: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """data in a fresh array, or in out (a no-op when the engine runs the op in place on data)."""
    if out is None:
        return data.copy()
    if out is not data:
        np.copyto(out, data)
    return out


def _scatter_into(data, index, updates, reduction: str, out: np.ndarray | None, flat: bool = False) -> np.ndarray:
    """Write updates at index (flat offsets into out when flat) with the given reduction."""
    if reduction != "none" and reduction not in _REDUCE:
        raise ValueError(f"reduction {reduction!r} is not one of none, {', '.join(_REDUCE)}")
    out = _copy(data, out)
    target = out.reshape(-1) if flat else out  # out is C-contiguous, so this is a view
    if flat:
        index, updates = index.reshape(-1), np.asarray(updates).reshape(-1)
    if reduction == "none":
        target[index] = updates
    else:
        _REDUCE[reduction].at(target, index, updates)
    return out


def _scatter_elements(data, indices, updates, axis: int, reduction: str = "none", out=None) -> np.ndarray:
    offsets = _element_offsets(data.shape, indices, _axis(axis, data.ndim))
    return _scatter_into(data, offsets, updates, reduction, out, flat=True)


@kernel("Scatter", since=9, out=True, inplace=(0,), views=False)
def scatter(data, indices, updates, *, axis=0, out=None):
    """Scatter-9/11 (deprecated alias of ScatterElements): write updates at indices along axis."""
    return _scatter_elements(data, indices, updates, axis, out=out)


@kernel("ScatterElements", since=11, out=True, inplace=(0,), views=False)
def scatter_elements_11(data, indices, updates, *, axis=0, out=None):
    """ScatterElements-11/13: write updates at indices along axis."""
    return _scatter_elements(data, indices, updates, axis, out=out)


@kernel("ScatterElements", since=16, out=True, inplace=(0,), views=False)
def scatter_elements_16(data, indices, updates, *, reduction="none", axis=0, out=None):
    """ScatterElements-16/18: combine with none/add/mul (16) and max/min (18)."""
    return _scatter_elements(data, indices, updates, axis, reduction, out)


def _scatter_nd(data, indices, updates, reduction: str = "none", out=None) -> np.ndarray:
    indices = np.asarray(indices)
    index = tuple(indices[..., j] for j in range(indices.shape[-1]))
    return _scatter_into(data, index, updates, reduction, out)


@kernel("ScatterND", since=11, out=True, inplace=(0,), views=False)
def scatter_nd_11(data, indices, updates, *, out=None):
    """ScatterND-11/13: write update slices at the index tuples in indices' last dim."""
    return _scatter_nd(data, indices, updates, out=out)


@kernel("ScatterND", since=16, out=True, inplace=(0,), views=False)
def scatter_nd_16(data, indices, updates, *, reduction="none", out=None):
    """ScatterND-16/18: combine with none/add/mul (16) and max/min (18)."""
    return _scatter_nd(data, indices, updates, reduction, out)


@kernel("TensorScatter", since=24, out=True, inplace=(0,), views=False)
def tensor_scatter(past_cache, update, write_indices=None, *, mode="linear", axis=-2, out=None):
    """TensorScatter-24: write update into a copy of the cache at per-batch sequence offsets."""
    if mode not in ("linear", "circular"):
        raise ValueError(f"TensorScatter mode {mode!r} is not linear or circular")
    axis = _axis(axis, past_cache.ndim)
    if axis == 0:
        raise ValueError("TensorScatter axis cannot be the batch axis 0")
    batch, capacity, length = past_cache.shape[0], past_cache.shape[axis], update.shape[axis]
    starts = np.zeros(batch, _INT64) if write_indices is None else np.asarray(write_indices, _INT64).reshape(-1)
    out = _copy(past_cache, out)  # in place on the cache when the engine allows it
    for b in range(batch):  # batch is small; each step is one vectorized slab write
        pos = starts[b] + np.arange(length)
        if mode == "circular":
            pos %= capacity
        np.moveaxis(out[b], axis - 1, 0)[pos] = np.moveaxis(update[b], axis - 1, 0)
    return out


# --- Selection ------------------------------------------------------------------------------


@kernel("Where", since=9, out=True, inplace=(1, 2), views=False)
def where(condition, X, Y, *, out=None):
    """Where-9/16: elementwise choice with multidirectional broadcasting."""
    if out is None:
        return np.asarray(np.where(condition, X, Y))
    # Two masked copies write straight into the planned buffer, no temporary.
    if out is X:  # in place on X: only the positions that take Y change
        np.copyto(out, Y, where=np.logical_not(condition))
        return out
    np.copyto(out, Y)  # a no-op when out is Y itself
    np.copyto(out, X, where=condition)
    return out


@kernel("NonZero", since=9, views=False)
def non_zero(X):
    """NonZero-9/13: int64 [rank, count] coordinates of nonzero entries, row-major."""
    if X.ndim == 0:  # numpy refuses 0-d input; a scalar has rank 0 and 0 or 1 hits
        return np.zeros((0, int(bool(X))), _INT64)
    return np.asarray(np.nonzero(X), dtype=_INT64).reshape(X.ndim, -1)


@kernel("Compress", since=9, views=False)
def compress(input, condition, *, axis=None):
    """Compress-9/11/28: keep slices along axis (or flattened elements) where condition is true."""
    cond = np.asarray(condition).astype(bool).reshape(-1)
    return np.compress(cond, input, axis=None if axis is None else _axis(axis, input.ndim))


@kernel("ReverseSequence", since=10, views=False)
def reverse_sequence(input, sequence_lens, *, batch_axis=1, time_axis=0):
    """ReverseSequence-10/28: reverse the first sequence_lens[b] steps of each batch entry."""
    x = np.moveaxis(input, (batch_axis, time_axis), (0, 1))
    lens = np.asarray(sequence_lens, _INT64).reshape(-1, 1)
    t = np.arange(x.shape[1])
    source = np.where(t < lens, lens - 1 - t, t)
    out = x[np.arange(x.shape[0])[:, None], source]
    return np.ascontiguousarray(np.moveaxis(out, (0, 1), (batch_axis, time_axis)))


@kernel("Unique", since=11, views=False)
def unique(X, *, axis=None, sorted=1):
    """Unique-11/28: unique values (or slices along axis), first indices, inverse, counts."""
    ax = None if axis is None else _axis(axis, X.ndim)
    y, first, inverse, counts = np.unique(X, return_index=True, return_inverse=True, return_counts=True, axis=ax)
    inverse = inverse.reshape(-1)
    if not sorted:
        # Reorder by first occurrence and remap inverse onto the new positions.
        order = np.argsort(first, kind="stable")
        rank = np.empty_like(order)
        rank[order] = np.arange(order.size)
        y = np.take(y, order, axis=0 if ax is None else ax)
        first, counts, inverse = first[order], counts[order], rank[inverse]
    return y, first.astype(_INT64), inverse.astype(_INT64), counts.astype(_INT64)


