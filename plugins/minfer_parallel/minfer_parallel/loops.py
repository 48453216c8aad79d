"""The executor plugin's run loops: timed, staged (concurrent branches: stages.py) and process-team ones.

They walk the core's steps, ``(callable, input slots, first output slot,
output slots, slots to drop)``, like the core's `execute`; a failing kernel
surfaces as the core's `StepFailure`, which the engine turns into a
KernelError naming the node.
"""

from __future__ import annotations

import functools
import time
from typing import Any, Sequence

import numpy as np

from minfer_core import MinferError, StepFailure

from .pool import ThreadPool
from .sharing import Team
from .stages import Item, StagedRun

Step = Any


def _fail(i: int, steps: Sequence[Step], vals: list[Any]) -> StepFailure:
    return StepFailure(i, [getattr(vals[s], "shape", None) for s in steps[i][1]])


def execute_team(vals: list[Any], steps: Sequence[Step], shared: Sequence[bool], team: Any,
                 times: list[float] | None = None) -> None:
    """`execute` with a process team (procs.py): steps marked in ``shared`` whose arrays all live in shared
    memory run in both processes, each computing its share of the output; the others run here alone.
    With ``times``, records each step's time in seconds."""
    from .procs import PeerFailed, encode

    clock = time.perf_counter
    i = 0
    try:
        for i, (fn, ins, out0, outs, free) in enumerate(steps):
            start = clock() if times is not None else 0.0
            args = [vals[s] for s in ins]
            encoded = encode(args) if shared[i] and team.usable() else None
            if encoded is None:
                res = fn(*args)
            else:
                try:
                    res = team.run_step(fn, args, encoded)
                except PeerFailed as exc:
                    out = getattr(fn, "keywords", {}).get("out")
                    if out is not None and any(type(a) is np.ndarray and np.may_share_memory(a, out) for a in args):
                        # in place: this process's share already overwrote its input, so it cannot start again
                        raise RuntimeError("the process team's worker failed during this in-place step, whose "
                                           "input is partly overwritten: it cannot be computed again") from exc
                    res = fn(*args)  # the worker failed or left: this process computes the whole step again
            _store(vals, res, out0, outs, free)
            if times is not None:
                times[i] = clock() - start
    except MinferError:
        raise
    except Exception as exc:
        raise _fail(i, steps, vals) from exc


def execute_timed(vals: list[Any], steps: Sequence[Step]) -> list[float]:
    """`execute` that returns each step's time in seconds."""
    clock = time.perf_counter
    times = [0.0] * len(steps)
    i = 0
    try:
        for i, (fn, ins, out0, outs, free) in enumerate(steps):
            start = clock()
            res = fn(*[vals[s] for s in ins])
            times[i] = clock() - start
            _store(vals, res, out0, outs, free)
    except MinferError:
        raise
    except Exception as exc:
        raise _fail(i, steps, vals) from exc
    return times


def _store(vals: list[Any], res: Any, out0: int, outs: tuple[int, ...], free: tuple[int, ...]) -> None:
    # never writes slot 0 (where omitted outputs land), which a concurrent branch may be reading as None
    if type(res) is tuple or type(res) is list:
        for slot, value in zip(outs, res):
            if slot:
                vals[slot] = value
    elif out0:
        vals[out0] = res
    for slot in free:
        vals[slot] = None


def execute_staged(vals: list[Any], items: Sequence[Item], index: Sequence[int], pool: ThreadPool | None,
                   walls: dict[int, float] | None = None) -> None:
    """Run a staged loop (`stages.compose`): plain steps in order, each `StagedRun`'s branches side by side.

    ``index[k]`` is item k's step index (for errors). With ``walls``, records
    each stage's time in seconds under its first step.
    """
    k = 0
    try:
        for k, item in enumerate(items):
            if type(item) is StagedRun:
                if walls is None:
                    run_stage(vals, item, pool)
                else:
                    start = time.perf_counter()
                    run_stage(vals, item, pool)
                    walls[item.stage.first] = time.perf_counter() - start
                continue
            fn, ins, out0, outs, free = item
            _store(vals, fn(*[vals[s] for s in ins]), out0, outs, free)
    except (MinferError, StepFailure):
        raise
    except Exception as exc:
        raise StepFailure(index[k], [getattr(vals[s], "shape", None) for s in items[k][1]]) from exc


def run_stage(vals: list[Any], staged: StagedRun, pool: ThreadPool | None) -> None:
    """Run the stage's branches side by side on the pool's threads, sharing their kernels' ranges (sharing.py)."""
    team = Team([functools.partial(_run_branch, vals, branch) for branch in staged.branches],
                pool.threads if pool is not None else 1)

    def part(lo: int, hi: int) -> None:
        for _ in range(lo, hi):
            team.work()

    if pool is None or pool.threads == 1:
        part(0, 1)
    else:
        pool.run(pool.threads, part, pool.threads)
    if team.error is not None:
        raise team.error
    for slot in staged.free:
        vals[slot] = None


def _run_branch(vals: list[Any], branch: Sequence[tuple[int, Step]]) -> None:
    for i, (fn, ins, out0, outs, free) in branch:
        try:
            res = fn(*[vals[s] for s in ins])
        except MinferError:
            raise
        except Exception as exc:
            raise StepFailure(i, [getattr(vals[s], "shape", None) for s in ins]) from exc
        _store(vals, res, out0, outs, free)
