"""Choosing a conv method per input shape by timing the candidates on the first call.

The choice goes through the core's `minfer_core.choose`, keyed by the conv's geometry and input shape (not by
model), so it persists in the user's cache: a later process, or another model with a conv of that shape, skips
the timing. ``MINFER_TUNE=0`` (or ``MINFER_CONV_TUNE=0``) takes the first candidate.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from minfer_core import choose, intra_op_threads

Plan = Callable[..., None]  # conv.Plan: run(x, p, y, bias, epilogue)
PAGE = 4096
# a candidate whose first timing took more than this many times the best first timing is not timed again (the
# core's `choose` times round by round): its setup and the output's page faults are paid before the first timing,
# so what is left of a first call's extra cost (its scratch growing) is well under that
CLEAR_LOSS = 2.0

def distinct(plans: list[Plan], x: np.ndarray, p: Any) -> list[Plan]:
    """The plans less those that would cut this input into the same tiles as an earlier plan of their method.

    A plan may say how it tiles an input (``plan.tiling(x, p)``); at batch 1 both tile budgets give the
    same tiles for most layers, and from batch 2 (2 threads) so do the row and channel preferences of a
    pointwise conv: timing one of them is enough.
    """
    seen: set[tuple[object, ...]] = set()
    kept = []
    for plan in plans:
        tiling = getattr(plan, "tiling", None)
        key = (getattr(plan, "__qualname__", ""), tuple(tiling(x, p))) if tiling is not None else (id(plan),)
        if key not in seen:
            seen.add(key)
            kept.append(plan)
    return kept


class Tuned:
    """A plan that times its candidate methods on this input shape and keeps the fastest, per thread count.

    The first call with a thread count runs every distinct candidate (`choose`'s rounds; a clear loser of the
    first round, `CLEAR_LOSS`, only once) into the output
    (with the bias, which each run adds to its own fresh result, but no epilogue: that must be applied once)
    and keeps the quickest by its best time, then computes the real result with it, unless it was the last
    one timed: its conv + bias is in the output then, and only the epilogue is left. One-time work (the
    output's page faults, a plan's ``setup``: Winograd's weight transform) is done before the first timing,
    so that it counts against no candidate. Which method wins depends on the shape, the BLAS and the cores:
    Winograd's 2.25x fewer multiplies lost to im2col on resnet50's batch-1 7x7 layers here (its GEMMs are too
    narrow) and won on vgg19's 28x28 ones by 2x.
    ``settled`` is called after each choice. ``prior`` is shared by the node's shapes: the method the last one
    chose, which a new shape takes untimed (`minfer_core.choose`).
    """

    def __init__(self, plans: list[Plan], settled: Callable[[], None] | None = None, key: str = "conv",
                 prior: dict[str, str] | None = None) -> None:
        self.plans, self.prior = plans, {} if prior is None else prior
        self.key = key  # the conv's geometry: with the input shape and thread count, what a stored choice is for
        self.choice: dict[int, Plan] = {}
        self.settled = settled
        self.last_timed: Plan | None = None  # the plan whose timing run wrote y last

    def __call__(self, x: np.ndarray, p: Any, y: np.ndarray, bias: np.ndarray | None, epilogue: Any) -> None:
        threads = intra_op_threads()
        plan = self.choice.get(threads)
        if plan is None:
            plan = self.choice[threads] = self._fastest(x, p, y, bias)
            if self.settled is not None:
                self.settled()
            if self.last_timed is plan:  # y holds its conv + bias already: only the epilogue is left to apply
                if epilogue is not None:
                    epilogue(y, (slice(0, y.shape[0]), slice(0, y.shape[1]), slice(0, y.shape[2])))
                return
        plan(x, p, y, bias, epilogue)

    def _fastest(self, x: np.ndarray, p: Any, y: np.ndarray, bias: np.ndarray | None = None) -> Plan:
        """The fastest plan; `last_timed` says which one wrote y last (None: none was timed)."""
        plans = distinct(self.plans, x, p)
        names = [f"{self.plans.index(plan)}:{getattr(plan, '__qualname__', '?')}" for plan in plans]
        key = f"{self.key}|x={x.shape}|{x.dtype}|threads={intra_op_threads()}"
        self.last_timed = None
        first: dict[int, float] = {}

        def time_one(i: int) -> float:
            if self.last_timed is None:  # one-time work outside the timings: y's page faults, a method's setup
                y.reshape(-1)[:: max(1, PAGE // y.itemsize)] = 0
                for plan in plans:
                    getattr(plan, "setup", lambda p: None)(p)
            if i in first and first[i] > CLEAR_LOSS * min(first.values()):
                return first[i]  # a later round: a clear loser is not run again
            self.last_timed = plans[i]
            seconds = _seconds(plans[i], x, p, y, bias)
            first.setdefault(i, seconds)
            return seconds

        won = choose(key, names, time_one, self.prior.get("name"))
        self.prior["name"] = names[won]
        return plans[won]

    @property
    def chosen(self) -> list[Plan]:
        return list(self.choice.values())


def _seconds(plan: Plan, x: np.ndarray, p: Any, y: np.ndarray, bias: np.ndarray | None) -> float:
    start = time.perf_counter()
    plan(x, p, y, bias, None)
    return time.perf_counter() - start
