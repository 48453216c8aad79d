"""The run loops: a flat walk over (callable, input slots, output slots, slots to drop) steps.

Variants so that the common one pays for nothing it does not use:
`execute` (steady state) and `execute_watching` (observers such as the
profiler get called around each node; in the discovery run of a new input
shape it also records output shapes and views).
Executor plugins bring their own loops (timed, staged, process team).
A failing kernel surfaces as `StepFailure` carrying the step index and the
input shapes; the engine turns it into a KernelError naming the node.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from .errors import MinferError
from .graph import Node
from .plan import Step


class StepFailure(Exception):
    """Step ``step`` raised (the cause); ``shapes`` are its input shapes."""

    def __init__(self, step: int, shapes: list[Any]) -> None:
        super().__init__(step)
        self.step = step
        self.shapes = shapes


def _fail(i: int, steps: Sequence[Step], vals: list[Any]) -> StepFailure:
    return StepFailure(i, [getattr(vals[s], "shape", None) for s in steps[i][1]])


def execute(vals: list[Any], steps: Sequence[Step]) -> None:
    """Run ``steps`` over the slot list ``vals`` (inputs and constants already in place)."""
    i = 0
    try:
        for i, (fn, ins, out0, outs, free) in enumerate(steps):
            res = fn(*[vals[s] for s in ins])
            if type(res) is tuple or type(res) is list:
                for slot, value in zip(outs, res):
                    vals[slot] = value
                vals[0] = None  # omitted outputs land in slot 0, which must stay None
            else:
                vals[out0] = res
            for slot in free:
                vals[slot] = None
    except MinferError:
        raise
    except Exception as exc:
        raise _fail(i, steps, vals) from exc


def execute_watching(
    vals: list[Any],
    steps: Sequence[Step],
    nodes: Sequence[Node],
    observers: Sequence[Any],
    observed: dict[int, tuple[tuple[int, ...], np.dtype]] | None,
    check: Callable[[int, Sequence[Any]], None] | None = None,
) -> list[frozenset[tuple[int, int]]]:
    """The observed loop; with ``observed``, the discovery loop that also records each output's
    shape (into ``observed``) and which inputs it shares memory with (returned per step), after
    ``check(step, results)`` (which raises for a result its kernel should not have returned)."""
    seen: list[frozenset[tuple[int, int]]] = []
    i = 0
    try:
        for i, (fn, ins, out0, outs, free) in enumerate(steps):
            args = [vals[s] for s in ins]
            node = nodes[i]
            for ob in observers:
                ob.on_node_start(node)
            res = fn(*args)
            results = res if type(res) is tuple or type(res) is list else (res,)
            for ob in observers:
                ob.on_node_end(node, results)
            if observed is not None:
                if check is not None:
                    check(i, results)
                seen.append(shared_memory(results, args))
                for slot, value in zip(outs, results):
                    if slot and isinstance(value, np.ndarray):
                        observed[slot] = (value.shape, value.dtype)
            for slot, value in zip(outs, results):
                vals[slot] = value
            vals[0] = None
            for slot in free:
                vals[slot] = None
    except MinferError:
        raise
    except Exception as exc:
        raise _fail(i, steps, vals) from exc
    return seen


def shared_memory(results: Sequence[Any], args: Sequence[Any]) -> frozenset[tuple[int, int]]:
    """(output index, input index) pairs whose memory overlaps: the output is a view of that input."""
    pairs = []
    for j, r in enumerate(results):
        if not isinstance(r, np.ndarray):
            continue
        for n, a in enumerate(args):
            if isinstance(a, np.ndarray) and np.may_share_memory(r, a):
                pairs.append((j, n))
    return frozenset(pairs)
