"""Kernels: control flow (If, Loop, Scan), each body run by an Engine built once at prepare time.

A body is a `Graph` attribute. `subgraph_engine` builds it as the enclosing
model was built (passes, inference, binding, a memory plan per input shape);
the outer-scope values it reads arrive after the node's own inputs, in
``ctx.outer`` order, and are fed to the body by name. `Engine.run` returns
arrays the caller owns (copies of any output that is a view of a feed), so
every kernel here allocates its outputs (``views=False``) and may keep a
body's results across iterations. The loops call `Engine.run` once per
iteration, so the Python around that call is kept to a few dict updates.
"""

from __future__ import annotations

import sys
from typing import Any, Sequence

import numpy as np

from minfer_core import Engine, KernelContext, TensorType, kernel, subgraph_engine


class _Body:
    """A body's Engine and how to feed it: its own input names, then which outer values it reads."""

    def __init__(self, ctx: KernelContext, graph: Any) -> None:
        self.engine: Engine = subgraph_engine(ctx, graph)
        self.own: list[str] = list(graph.inputs)
        self.outputs: list[str] = list(graph.outputs)
        reads = set(self.engine.graph.inputs)
        self._outer = [(name, i) for i, name in enumerate(ctx.outer) if name in reads]

    def outer_feeds(self, outer: Sequence[Any]) -> dict[str, Any]:
        """The feeds for the outer values this body reads, from the run callable's trailing arguments."""
        return {name: outer[i] for name, i in self._outer}

    def empty_stack(self, index: int, axis: int = 0) -> np.ndarray:
        """What stacking zero iterations of body output ``index`` along ``axis`` gives: its inferred
        dtype and static dims, 0 along ``axis`` (and where a dim is not known)."""
        t = self.engine.graph.type_of(self.outputs[index])
        if not isinstance(t, TensorType):
            return np.zeros((0,), np.float32)
        dims = [d if isinstance(d, int) else 0 for d in (t.shape or ())]
        dims.insert(axis % (len(dims) + 1), 0)
        return np.zeros(dims, t.dtype)


def _owned(value: Any) -> Any:
    """A value the kernel may return as its own output: arrays copied (an input passed through zero
    iterations), sequences as a new list, an empty optional as is."""
    if isinstance(value, np.ndarray):
        return value.copy()
    return list(value) if isinstance(value, list) else value


@kernel("If", since=1, prepare=True, views=False)
def if_(ctx, *, then_branch, else_branch):
    """If-1..21: run the branch the condition picks (both built once); its outputs are the node's."""
    then_body, else_body = _Body(ctx, then_branch), _Body(ctx, else_branch)

    def run(cond, *outer):
        body = then_body if cond else else_body
        return tuple(body.engine.run(None, body.outer_feeds(outer)))

    return run


@kernel("Loop", since=1, prepare=True, views=False)
def loop(ctx, *, body):
    """Loop-1..21: iterate while ``i < M`` and the condition holds (either omitted); carried values,
    scan outputs stacked along a new first axis (empty, of the body's type, after zero iterations)."""
    b = _Body(ctx, body)
    n = len(ctx.input_types) - 2
    k = len(b.outputs) - 1 - n
    iter_name, cond_name = b.own[0], b.own[1]
    carried_names = b.own[2:]
    int64, body_run = np.int64, b.engine.run

    def run(m=None, cond=None, *args):
        carried, feeds = args[:n], b.outer_feeds(args[n:])
        trip = sys.maxsize if m is None else int(m.item())  # item(): exporters also write M as int64[1]
        c = np.array(True) if cond is None else cond
        scans: list[list[np.ndarray]] = [[] for _ in range(k)]
        i = 0
        # ORT and onnx's reference both read the body's condition each round, even when the input is omitted
        while i < trip and c:
            feeds[iter_name] = np.array(i, int64)
            feeds[cond_name] = c
            feeds.update(zip(carried_names, carried))
            res = body_run(None, feeds)
            c, carried = res[0], res[1 : n + 1]
            for acc, value in zip(scans, res[n + 1 :]):
                acc.append(value)
            i += 1
        if i == 0:
            carried = [_owned(v) for v in carried]
        stacked = [np.stack(acc) if acc else b.empty_stack(n + 1 + j) for j, acc in enumerate(scans)]
        return (*carried, *stacked)

    return run


def _axes(values: Sequence[int] | None, count: int) -> list[int]:
    return list(values) if values else [0] * count


@kernel("Scan", since=9, prepare=True, views=False)
def scan(ctx, *, body, num_scan_inputs, scan_input_axes=None, scan_input_directions=None,
         scan_output_axes=None, scan_output_directions=None):
    """Scan-9..21: state carried over the slices of the scan inputs along their axes (each in its
    direction); scan outputs stacked along their axes, prepended where their direction is reverse."""
    b = _Body(ctx, body)
    m = num_scan_inputs
    n = len(ctx.input_types) - m
    k = len(b.outputs) - n
    in_axes, in_dirs = _axes(scan_input_axes, m), _axes(scan_input_directions, m)
    out_axes, out_dirs = _axes(scan_output_axes, k), _axes(scan_output_directions, k)
    state_names, slice_names = b.own[:n], b.own[n:]
    body_run = b.engine.run

    def run(*args):
        states, feeds = args[:n], b.outer_feeds(args[n + m :])
        # the scan axis first (a view), reversed where scanned backwards
        seqs = [np.moveaxis(x, a, 0)[:: -1 if d else 1] for x, a, d in zip(args[n : n + m], in_axes, in_dirs)]
        length = _length(seqs)
        scans: list[list[np.ndarray]] = [[] for _ in range(k)]
        for t in range(length):
            feeds.update(zip(state_names, states))
            feeds.update(zip(slice_names, [s[t] for s in seqs]))
            res = body_run(None, feeds)
            states = res[:n]
            for acc, value in zip(scans, res[n:]):
                acc.append(value)
        if length == 0:
            states = [_owned(v) for v in states]
        outs = [np.stack(acc[::-1] if d else acc, axis=a) if acc else b.empty_stack(n + j, a)
                for j, (acc, a, d) in enumerate(zip(scans, out_axes, out_dirs))]
        return (*states, *outs)

    return run


def _length(seqs: Sequence[np.ndarray]) -> int:
    lengths = {s.shape[0] for s in seqs}
    if len(lengths) > 1:
        raise ValueError(f"Scan: the scan inputs have different lengths along their scan axes: {sorted(lengths)}")
    return lengths.pop() if lengths else 0


@kernel("Scan", since=8, prepare=True, views=False)
def scan8(ctx, *, body, num_scan_inputs, directions=None):
    """Scan-8: per batch entry (axis 0), the state carried over the first sequence_lens[b] steps of
    axis 1 (each input in its direction); scan outputs [batch, max_len, ...], zero past each length."""
    b = _Body(ctx, body)
    m = num_scan_inputs
    n = len(ctx.input_types) - 1 - m
    k = len(b.outputs) - n
    dirs = _axes(directions, m)
    state_names, slice_names = b.own[:n], b.own[n:]
    body_run = b.engine.run

    def run(lens, *args):
        states0, xs, feeds = args[:n], args[n : n + m], b.outer_feeds(args[n + m :])
        batch, max_len = (xs[0].shape[0], xs[0].shape[1]) if xs else (states0[0].shape[0], 0)
        finals: list[list[Any]] = [[] for _ in range(n)]
        outs: list[np.ndarray | None] = [None] * k
        for e in range(batch):
            length = max_len if lens is None else int(lens[e])
            states = [s[e] for s in states0]
            for t in range(length):
                feeds.update(zip(state_names, states))
                feeds.update(zip(slice_names, [x[e, length - 1 - t if d else t] for x, d in zip(xs, dirs)]))
                res = body_run(None, feeds)
                states = res[:n]
                for j, value in enumerate(res[n:]):
                    if outs[j] is None:  # zeros: the padding past a shorter sequence stays zero
                        outs[j] = np.zeros((batch, max_len, *value.shape), value.dtype)
                    outs[j][e, t] = value
            for acc, s in zip(finals, states):
                acc.append(s)
        empty = [b.empty_stack(n + j) for j in range(k)]  # no iteration at all: the body's inferred types
        scanned = [o if o is not None else np.zeros((batch, max_len, *e.shape[1:]), e.dtype)
                   for o, e in zip(outs, empty)]
        return (*[np.stack(acc) if acc else _owned(s) for acc, s in zip(finals, states0)], *scanned)

    return run
