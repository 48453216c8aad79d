"""Sequence and optional ops: Sequence*, SplitToSequence, ConcatFromSequence, SequenceMap, Optional*.

At run time a sequence is a Python list of arrays and an optional is its
value, or None when empty. A kernel never changes a list it was given (a
caller's feed or another node's result): it builds a new one. Every tensor
that enters a sequence is copied, because the memory planner hands an
intermediate's buffer to a later node once its last reader has run, and a
list is not a reader the planner can see. An optional holding a tensor is the
array itself, which the planner does see: Optional declares it a view.
A kernel whose one output is a sequence returns it in a 1-tuple, since the
run loop reads a returned list as several outputs. ``views=False`` on a
kernel returning a list: the planner tracks arrays, and the list is none.
"""

from __future__ import annotations

import numpy as np

from minfer_core import kernel, subgraph_engine


def _owned(x: np.ndarray) -> np.ndarray:
    return np.array(x, copy=True)


def _position(position, n: int, *, upper: int, op: str) -> int:
    """``position`` (a scalar tensor, negative counting from the back) as an index in [0, upper]."""
    p = int(np.asarray(position).reshape(()))
    q = p + n if p < 0 else p
    if not 0 <= q <= upper:
        raise IndexError(f"{op}: position {p} is out of range for a sequence of {n} tensors (accepted: {-n}..{upper})")
    return q


# --- building and reading sequences -------------------------------------------------


@kernel("SequenceEmpty", since=11, views=False)
def sequence_empty(*, dtype=1):
    """SequenceEmpty-11: an empty sequence (``dtype`` only types it)."""
    return ([],)


@kernel("SequenceConstruct", since=11, views=False)
def sequence_construct(*inputs):
    """SequenceConstruct-11: the inputs, in order, as a sequence."""
    return ([_owned(x) for x in inputs],)


@kernel("SequenceInsert", since=11, views=False)
def sequence_insert(seq, tensor, position=None):
    """SequenceInsert-11: a new sequence with ``tensor`` before ``position`` (default: at the end)."""
    n = len(seq)
    at = n if position is None else _position(position, n, upper=n, op="SequenceInsert")
    return ([*seq[:at], _owned(tensor), *seq[at:]],)


@kernel("SequenceErase", since=11, views=False)
def sequence_erase(seq, position=None):
    """SequenceErase-11: a new sequence without the tensor at ``position`` (default: the last)."""
    n = len(seq)
    if n == 0:
        raise IndexError("SequenceErase: the sequence is empty, there is nothing to erase")
    at = n - 1 if position is None else _position(position, n, upper=n - 1, op="SequenceErase")
    return ([*seq[:at], *seq[at + 1:]],)


@kernel("SequenceAt", since=11, views=False)
def sequence_at(seq, position):
    """SequenceAt-11: a copy of the tensor at ``position``."""
    # a copy: the caller may write into an output, and the list's tensors may be its own feeds
    return _owned(seq[_position(position, len(seq), upper=len(seq) - 1, op="SequenceAt")])


@kernel("SequenceLength", since=11, views=False)
def sequence_length(seq):
    """SequenceLength-11: the number of tensors, as an int64 scalar."""
    return np.asarray(len(seq), dtype=np.int64)


# --- tensors to sequences and back ----------------------------------------------------


def _chunk_sizes(dim: int, split) -> list[int]:
    """SplitToSequence's chunk lengths: one per element, equal chunks of a scalar (the last shorter), or explicit."""
    if split is None:
        return [1] * dim
    split = np.asarray(split)
    if split.ndim == 0:
        size = int(split)
        if size <= 0:
            raise ValueError(f"SplitToSequence: a scalar split must be positive, got {size}")
        return [min(size, dim - lo) for lo in range(0, dim, size)]
    sizes = [int(s) for s in split.reshape(-1)]
    if sum(sizes) != dim or min(sizes, default=0) < 0:
        raise ValueError(f"SplitToSequence: split {sizes} must be non-negative and add up to the axis length {dim}")
    return sizes


@kernel("SplitToSequence", since=11, views=False)
def split_to_sequence(input, split=None, *, axis=0, keepdims=1):
    """SplitToSequence-11/24: chunks along ``axis``; without ``split``, ``keepdims=0`` drops that axis."""
    axis = axis + input.ndim if axis < 0 else axis
    if not 0 <= axis < input.ndim:
        raise ValueError(f"SplitToSequence: axis out of range for an input of rank {input.ndim}")
    sizes = _chunk_sizes(input.shape[axis], split)
    parts = np.split(input, np.cumsum(sizes)[:-1], axis=axis) if sizes else []
    if split is None and not keepdims:
        return ([np.squeeze(p, axis).copy() for p in parts],)
    return ([_owned(p) for p in parts],)


@kernel("ConcatFromSequence", since=11, views=False)
def concat_from_sequence(seq, *, axis, new_axis=0):
    """ConcatFromSequence-11: the tensors joined along ``axis`` (a new axis there when ``new_axis=1``)."""
    if not seq:
        raise ValueError("ConcatFromSequence: the sequence is empty; there is nothing to concatenate")
    return np.stack(seq, axis=axis) if new_axis else np.concatenate(seq, axis=axis)


# --- SequenceMap -------------------------------------------------------------------------


@kernel("SequenceMap", since=17, prepare=True, views=False)
def sequence_map(ctx, *, body):
    """SequenceMap-17: ``body`` run per position of the input sequences (tensor inputs passed whole)."""
    eng = subgraph_engine(ctx, body)
    n_own = len(ctx.input_types)
    own_names = eng.graph.inputs[:n_own]

    def run(*args):
        own, outer = args[:n_own], args[n_own:]
        count = len(own[0])
        if any(isinstance(a, list) and len(a) != count for a in own):
            raise ValueError(f"SequenceMap: the input sequences differ in length: "
                             f"{[len(a) for a in own if isinstance(a, list)]}")
        feeds = {k: v for k, v in zip(ctx.outer, outer) if k in eng.graph.inputs}
        results: list[list[np.ndarray]] = [[] for _ in range(ctx.num_outputs)]
        for i in range(count):
            feeds.update((name, a[i] if isinstance(a, list) else a) for name, a in zip(own_names, own))
            for seq, value in zip(results, eng.run(None, feeds)):
                seq.append(value)
        return tuple(results)

    return run


# --- optionals ------------------------------------------------------------------------------


@kernel("Optional", since=15, views=True)
def optional(input=None, *, type=None):
    """Optional-15/28: an optional holding ``input``, or an empty one (``type`` types it)."""
    # no copy: a tensor optional is the array itself, a view the planner keeps its buffer reserved for
    return (input,)


@kernel("OptionalHasElement", since=15, views=False)
def optional_has_element(input=None):
    """OptionalHasElement-15/18: whether the optional (or a tensor or sequence, from 18) holds a value."""
    return np.asarray(input is not None)


@kernel("OptionalGetElement", since=15, views=True)
def optional_get_element(input):
    """OptionalGetElement-15/18: the optional's value (from 18 a tensor or sequence passes through)."""
    if input is None:
        raise ValueError("OptionalGetElement: the optional is empty; test it with OptionalHasElement first")
    return (input,)
