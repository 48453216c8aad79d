"""Kernels: shape ops (views and re-layouts that move no arithmetic).

Reshape, Flatten, Squeeze, Unsqueeze, Identity and inference-mode Dropout
return views of their input (zero-copy); callers must treat outputs as
read-only aliases, which the contract already demands of every input.
"""

from __future__ import annotations

import math

import numpy as np

from minfer_core import kernel

_INT64 = np.int64


def _ints(v) -> list[int]:
    """A shape-like input (1-D int64 tensor, scalar, or list) as Python ints."""
    # tolist() yields Python ints in one C call (int() per element is several times slower).
    return [int(i) for i in np.asarray(v).reshape(-1).tolist()]


def _axis(axis: int, rank: int) -> int:
    """Normalize a possibly negative axis; ONNX rejects out-of-range ones."""
    if not -rank <= axis < max(rank, 1):
        raise ValueError(f"axis {axis} out of range for rank {rank}")
    return axis + rank if axis < 0 else axis


def _reshape(x: np.ndarray, shape: list[int], allowzero: int = 0) -> np.ndarray:
    """ONNX reshape rules: 0 copies the input dim (unless allowzero), -1 is inferred."""
    if not allowzero:
        shape = [x.shape[i] if d == 0 else d for i, d in enumerate(shape)]
    # np.reshape returns a view whenever the layout allows (always for contiguous input).
    return x.reshape(shape)


# --- Reshape -----------------------------------------------------------------


@kernel("Reshape", since=1, views=True)
def reshape_1(data, *, shape=None, consumed_inputs=None):
    """Reshape-1: target shape as an attribute."""
    return _reshape(data, list(shape or []))


@kernel("Reshape", since=5, views=True)
def reshape_5(data, shape):
    """Reshape-5: target shape as an int64 input."""
    return _reshape(data, _ints(shape))


@kernel("Reshape", since=14, views=True)
def reshape_14(data, shape, *, allowzero=0):
    """Reshape-14: allowzero=1 makes a 0 in shape a real zero-size dim."""
    return _reshape(data, _ints(shape), allowzero)


@kernel("Flatten", since=1, views=True)
def flatten(input, *, axis=1):
    """Flatten-1..25: to 2-D, splitting dims at axis (negative counts from the back)."""
    rank = input.ndim
    axis = axis + rank if axis < 0 else axis
    if not 0 <= axis <= rank:
        raise ValueError(f"Flatten axis {axis} out of range for rank {rank}")
    # Explicit products (a -1 could not be inferred when a dim is zero), of Python ints: np.prod cost ~1.5 us each
    return input.reshape(math.prod(input.shape[:axis]), math.prod(input.shape[axis:]))


# --- Squeeze / Unsqueeze -------------------------------------------------------


def _squeeze(data: np.ndarray, axes) -> np.ndarray:
    axes = [] if axes is None else _ints(axes)
    # An empty axes tensor means "not given", as in onnx's reference and onnxruntime.
    if not axes:
        return data.reshape([d for d in data.shape if d != 1])
    drop = {_axis(a, data.ndim) for a in axes}
    if any(data.shape[a] != 1 for a in drop):
        raise ValueError(f"Squeeze axes {sorted(drop)} must all have size 1, shape is {data.shape}")
    return data.reshape([d for i, d in enumerate(data.shape) if i not in drop])


def _unsqueeze(data: np.ndarray, axes) -> np.ndarray:
    axes = _ints(axes)
    rank = data.ndim + len(axes)
    insert = {_axis(a, rank) for a in axes}
    if len(insert) != len(axes):
        raise ValueError(f"Unsqueeze axes {axes} repeat an axis")
    dims = iter(data.shape)
    return data.reshape([1 if i in insert else next(dims) for i in range(rank)])


@kernel("Squeeze", since=1, views=True)
def squeeze_1(data, *, axes=None):
    """Squeeze-1/11: axes as an attribute; no axes drops every size-1 dim."""
    return _squeeze(data, axes)


@kernel("Squeeze", since=13, views=True)
def squeeze_13(data, axes=None):
    """Squeeze-13: axes as an optional int64 input."""
    return _squeeze(data, axes)


@kernel("Unsqueeze", since=1, views=True)
def unsqueeze_1(data, *, axes):
    """Unsqueeze-1/11: axes (of the output) as an attribute."""
    return _unsqueeze(data, axes)


@kernel("Unsqueeze", since=13, views=True)
def unsqueeze_13(data, axes):
    """Unsqueeze-13: axes (of the output) as an int64 input."""
    return _unsqueeze(data, axes)


# --- Identity / Dropout ----------------------------------------------------------


@kernel("Identity", since=1, views=True)
def identity(input):
    """Identity-1..25: a view of a tensor; sequences and optionals pass through."""
    return input.view() if isinstance(input, np.ndarray) else (input,)  # a bare list would read as several outputs


# Dropout kernels prepare themselves to learn whether the node has a mask output:
# most inference graphs do not, and an all-true mask would cost a full-size array.


def _inference(mask_dtype, with_mask: bool):
    """The inference-mode Dropout callable: a view, plus an all-true mask only when the node has one."""
    if not with_mask:
        return lambda data: data.view()
    return lambda data: (data.view(), np.ones(data.shape, mask_dtype or data.dtype))


@kernel("Dropout", since=1, prepare=True, views=True)
def dropout_1(ctx, *, is_test=0, ratio=0.5, consumed_inputs=None):
    """Dropout-1: inference only; the mask (data's dtype) keeps everything."""
    return _inference(None, ctx.num_outputs > 1)


@kernel("Dropout", since=6, prepare=True, views=True)
def dropout_6(ctx, *, is_test=0, ratio=0.5):
    """Dropout-6: inference only; the mask (data's dtype) keeps everything."""
    return _inference(None, ctx.num_outputs > 1)


@kernel("Dropout", since=7, prepare=True, views=True)
def dropout_7(ctx, *, ratio=0.5):
    """Dropout-7: always inference; mask in data's dtype."""
    return _inference(None, ctx.num_outputs > 1)


@kernel("Dropout", since=10, prepare=True, views=True)
def dropout_10(ctx, *, ratio=0.5):
    """Dropout-10: always inference; mask is bool."""
    return _inference(np.bool_, ctx.num_outputs > 1)


@kernel("Dropout", since=12, prepare=True, views=True)
def dropout_12(ctx, *, seed=None):
    """Dropout-12/13/22: identity unless training_mode is true, then scaled random drop."""
    with_mask = ctx.num_outputs > 1
    inference = _inference(np.bool_, with_mask)
    # One generator per node: a seeded node repeats its sequence per engine, later runs
    # draw afresh (as onnxruntime does); RandomState is what onnx's own cases expect.
    rng = np.random.default_rng() if seed is None else np.random.RandomState(int(seed))

    def run(data, ratio=None, training_mode=None):
        p = 0.5 if ratio is None else float(np.asarray(ratio))
        if training_mode is None or not bool(np.asarray(training_mode)) or p == 0:
            return inference(data)
        mask = rng.uniform(0.0, 1.0, data.shape) >= p
        out = (data * mask * np.asarray(1.0 / (1.0 - p), data.dtype)).astype(data.dtype, copy=False)
        return (out, mask) if with_mask else out

    return run


# --- Transpose / Concat / Split ----------------------------------------------------


@kernel("Transpose", since=1, views=True)
def transpose(data, *, perm=None):
    """Transpose-1..25: permute axes, reversing them when perm is absent."""
    # A strided view: consumers that need contiguity copy once, most do not.
    return np.transpose(data, perm)


# rows joined along an axis whose per-row pieces are this many bytes or fewer are copied as one wide item each
# (an unsigned int or complex of the piece's width): numpy's copy of a [768, 4] float32 piece into a [768, 9] row
# block took 8 us with its inner loop 4 long, and 0.6 us as 768 items of 16 bytes
_PIECE_ITEMS = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64, 16: np.complex128}
_WIDEST = max(_PIECE_ITEMS)
_WIDE_ROWS = 32  # from this many rows


def _pieces(shapes: tuple[tuple[int, ...], ...], dtype: np.dtype, axis: int):
    """(rows, row width, [(lo, hi, item dtype)], output shape) when every input's piece of a row has a width in
    _PIECE_ITEMS, else None (np.concatenate then)."""
    rank = len(shapes[0])
    axis = _axis(axis, rank)
    others = shapes[0][:axis] + shapes[0][axis + 1:]
    if dtype.kind not in "biufc" or any(len(s) != rank or s[:axis] + s[axis + 1:] != others for s in shapes):
        return None  # object and string items are not bits to copy; mismatched shapes get numpy's error
    rows = int(np.prod(shapes[0][:axis], dtype=_INT64))
    widths = [int(np.prod(s[axis:], dtype=_INT64)) for s in shapes]
    if rows < _WIDE_ROWS or any(w * dtype.itemsize not in _PIECE_ITEMS for w in widths):
        return None
    bounds = np.cumsum([0, *widths]).tolist()
    items = [np.dtype(_PIECE_ITEMS[w * dtype.itemsize]) for w in widths]
    joined = shapes[0][:axis] + (sum(s[axis] for s in shapes),) + shapes[0][axis + 1:]
    return rows, bounds[-1], list(zip(bounds, bounds[1:], items)), joined


_PLANS: dict = {}  # (shapes, dtype, axis) -> _pieces' plan or False, for every Concat of the process
_MAX_PLANS = 512  # a process meeting more shapes than this (dynamic ones) starts the table afresh


def _concat(inputs: tuple[np.ndarray, ...], axis: int, out: np.ndarray | None) -> np.ndarray:
    """np.concatenate, or the pieces' wide-item copies (`_pieces`) for many rows of narrow pieces."""
    if not inputs or not inputs[0].ndim or inputs[0].shape[-1] * inputs[0].itemsize > _WIDEST:
        return np.concatenate(inputs, axis=axis, out=out)  # pieces at least a last axis wide: never narrow
    dtype = inputs[0].dtype
    key = (tuple([x.shape for x in inputs]), dtype, axis)
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = _pieces(key[0], dtype, axis) or False
    if not plan or any(not x.flags.c_contiguous or x.dtype != dtype for x in inputs):
        return np.concatenate(inputs, axis=axis, out=out)
    rows, width, pieces, shape = plan
    y = out if out is not None and out.flags.c_contiguous else np.empty(shape, dtype)
    y2 = y.reshape(rows, width)  # C-contiguous: a view
    for x, (lo, hi, item) in zip(inputs, pieces):
        np.copyto(y2[:, lo:hi].view(item)[:, 0], x.reshape(rows, hi - lo).view(item)[:, 0])
    if out is not None and y is not out:
        np.copyto(out, y)
        return out
    return y


@kernel("Concat", since=1, out=True, views=False)
def concat_1(*inputs, axis=None, out=None):
    """Concat-1: axis defaulted to 1 in this version."""
    return _concat(inputs, 1 if axis is None else axis, out)


@kernel("Concat", since=4, out=True, views=False)
def concat_4(*inputs, axis, out=None):
    """Concat-4/11/13: join along axis (negative allowed from 11)."""
    return _concat(inputs, axis, out)


def _split_sizes(dim: int, split, n: int | None) -> list[int]:
    """Chunk sizes: explicit, or n equal chunks (the last smaller when uneven, as in Split-18)."""
    if split is not None and len(_ints(split)):
        sizes = _ints(split)
        if sum(sizes) != dim:
            raise ValueError(f"Split sizes {sizes} do not add up to the axis length {dim}")
        return sizes
    if not n:
        raise ValueError("Split needs split sizes or a number of outputs")
    chunk = -(-dim // n)
    return [min(chunk, max(dim - i * chunk, 0)) for i in range(n)]


def _splitter(ctx, axis: int, parts: int | None, fixed=None):
    """Split's run callable: per input shape (and split sizes, when they come as a runtime input) the outputs'
    index tuples are worked out once; each call is then one basic-indexing view per output (np.split's Python
    took ~6 us a call on a detector's [1, 768, 9] -> 4, 1, 4). ``fixed``: sizes known at build (attribute or
    initializer)."""
    if fixed is None and len(ctx.constants) > 1 and ctx.constants[1] is not None:
        fixed = ctx.constants[1]
    cache: dict = {}

    def run(input, split=None):
        if split is None or fixed is not None:
            key = input.shape
        else:
            sizes_in = np.asarray(split)
            key = (input.shape, sizes_in.dtype.char, sizes_in.tobytes())
        index = cache.get(key)
        if index is None:
            a = _axis(axis, input.ndim)
            sizes = _split_sizes(input.shape[a], fixed if fixed is not None else split, parts)
            lead = (slice(None),) * a
            bounds = np.cumsum([0, *sizes]).tolist()
            index = cache[key] = [lead + (slice(lo, hi),) for lo, hi in zip(bounds, bounds[1:])]
        # views: outputs do not alias one another
        return tuple([input[i] for i in index])

    return run


@kernel("Split", since=1, prepare=True, views=True)
def split_1(ctx, *, axis=None, split=None):
    """Split-1: sizes from the split attribute or the optional second input."""
    return _splitter(ctx, axis or 0, ctx.num_outputs, split)


@kernel("Split", since=2, prepare=True, views=True)
def split_2(ctx, *, axis=0, split=None):
    """Split-2/11: sizes from the split attribute, else equal parts per output."""
    return _splitter(ctx, axis, ctx.num_outputs, split if split is not None and len(split) else None)


@kernel("Split", since=13, prepare=True, views=True)
def split_13(ctx, *, axis=0):
    """Split-13: sizes from the optional split input, else equal parts per output."""
    return _splitter(ctx, axis, ctx.num_outputs)


@kernel("Split", since=18, prepare=True, views=True)
def split_18(ctx, *, axis=0, num_outputs=None):
    """Split-18: split input, or num_outputs chunks of ceil(dim/n) with a smaller last one."""
    return _splitter(ctx, axis, num_outputs or ctx.num_outputs)


# --- Shape / Size / Expand / Tile ---------------------------------------------------


@kernel("Shape", since=1, views=False)
def shape_1(data):
    """Shape-1/13: the input's shape as int64."""
    return np.asarray(data.shape, dtype=_INT64)


@kernel("Shape", since=15, views=False)
def shape_15(data, *, end=None, start=0):
    """Shape-15..25: dims [start, end) with negative and out-of-range bounds clamped."""
    # Python slicing already clamps exactly as ONNX specifies.
    return np.asarray(data.shape[start:end], dtype=_INT64)


@kernel("Size", since=1, views=False)
def size(data):
    """Size-1..25: element count as a 0-d int64 tensor."""
    return np.asarray(data.size, dtype=_INT64)


@kernel("Expand", since=8, out=True, views=False)
def expand(input, shape, *, out=None):
    """Expand-8/13: bidirectional broadcast of input to shape."""
    target = np.broadcast_shapes(input.shape, tuple(_ints(shape)))
    # Materialize: a zero-stride broadcast view is read-only and would surprise consumers.
    out = np.empty(target, input.dtype) if out is None else out
    np.copyto(out, input)
    return out


def _tile(x: np.ndarray, reps: list[int], out: np.ndarray | None) -> np.ndarray:
    """Tile by one broadcast copy: view the output as (rep0, d0, rep1, d1, ...)."""
    if len(reps) != x.ndim:
        raise ValueError(f"Tile repeats {reps} must have one entry per axis of shape {x.shape}")
    if out is None:
        out = np.empty([r * d for r, d in zip(reps, x.shape)], x.dtype)
    pairs = [v for r, d in zip(reps, x.shape) for v in (r, d)]
    np.copyto(out.reshape(pairs), x.reshape([v for d in x.shape for v in (1, d)]))
    return out


@kernel("Tile", since=1, out=True, views=False)
def tile_1(input, tiles, axis, *, out=None):
    """Tile-1: repeat input `tiles` times along one axis."""
    reps = [1] * input.ndim
    reps[_axis(int(np.asarray(axis).reshape(-1)[0]), input.ndim)] = int(np.asarray(tiles).reshape(-1)[0])
    return _tile(input, reps, out)


@kernel("Tile", since=6, out=True, views=False)
def tile_6(input, repeats, *, out=None):
    """Tile-6/13: repeat input repeats[i] times along each axis i."""
    return _tile(input, _ints(repeats), out)


