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
from .plan import Step, Steps, _put, generate, shared_memory


class StepFailure(Exception):
    """Step ``step`` raised (the cause); ``shapes`` are its input shapes."""

    def __init__(self, step: int, shapes: list[Any]) -> None:
        super().__init__(step)
        self.step = step
        self.shapes = shapes


def _fail(i: int, steps: Sequence[Step], vals: list[Any]) -> StepFailure:
    return StepFailure(i, [getattr(vals[s], "shape", None) for s in steps[i][1]])


def execute(vals: list[Any], steps: Steps) -> None:
    """Run ``steps`` over the slot list ``vals`` (inputs and constants already in place), as one generated
    function with a line per step (kept on ``steps``): ~0.2 us a step less than a loop over the tuples."""
    run = steps.run = steps.run or generate(steps)
    try:
        run(vals)
    except MinferError:
        raise
    except Exception as exc:  # the failing step is the line of the generated function (the traceback's next frame)
        raise _fail(exc.__traceback__.tb_next.tb_lineno - 2, steps, vals) from exc  # type: ignore[union-attr]


def execute_watching(vals: list[Any], steps: Sequence[Step], nodes: Sequence[Node], observers: Sequence[Any],
                     observed: dict[int, tuple[tuple[int, ...], np.dtype]] | None,
                     check: Callable[..., None] | None = None) -> list[frozenset[tuple[int, int]]]:
    """The observed loop; with ``observed``, the discovery loop that also records each output's
    shape (into ``observed``) and which inputs it shares memory with (returned per step), after
    ``check(step, results, shared)`` (which raises for a result its kernel should not have returned)."""
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
                seen.append(shared := shared_memory(results, args))
                if check is not None:
                    check(i, results, shared)
                observed.update((slot, (v.shape, v.dtype)) for slot, v in zip(outs, results) if slot and isinstance(v, np.ndarray))
            _put(vals, outs, results)
            for slot in free:
                vals[slot] = None
    except MinferError:
        raise
    except Exception as exc:
        raise _fail(i, steps, vals) from exc
    return seen
