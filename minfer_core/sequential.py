"""The core's executor: the steps in order on the calling thread, through a memory plan per input shape.

`PlanCache` is the per-signature state every executor shares: on the first
run of an input-shape signature a discovery run (fresh allocations, output
shapes and views observed), runtime shape inference, then a `Plan` bound to
one grow-only arena. `SequentialExecutor` runs the bound loop; executor
plugins subclass it and override `run`, `run_bound`, `plan_input`,
`rebound` and `forget` (see minfer-parallel).
"""

from __future__ import annotations

import ctypes
import functools
import threading
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from .binding import Program
from .errors import MinferError
from .executor import Executor
from .infer import infer_runtime
from .memory import align
from .plan import Plan, PlanInput, Step, bind_buffers, build_plan
from .runloop import execute, execute_watching
from .tensor import TensorType
from .tuning import STEADY
from .workspace import scratch_bytes

MAX_PLANS = 64  # input-shape signatures whose plans stay cached

Signature = tuple[tuple[tuple[int, ...], np.dtype], ...]
"""Per graph input, its (shape, dtype): the key of the shape and plan caches."""


class PlanCache:
    """Per input-shape signature: inferred types, the memory plan, and its run loop bound to one arena.

    The arena only grows: every cached plan indexes the same one, so
    alternating shapes allocate nothing. ``allocate(nbytes)`` makes it (an
    executor sharing it with another process passes shared memory). ``lock``
    is held by the run using the arena; a concurrent run uses fresh memory.
    """

    def __init__(self, program: Program, allocate: Callable[[int], np.ndarray] | None = None) -> None:
        self.program = program
        self.allocate = allocate or (lambda n: np.empty(n, dtype=np.uint8))
        self.arena = np.empty(0, dtype=np.uint8)
        self.plans: dict[Signature, Plan] = {}
        self.types: dict[Signature, dict[str, TensorType]] = {}
        self.bound: dict[Signature, list[Step]] = {}
        self.inputs: dict[Signature, PlanInput] = {}  # what each plan was built from: executors re-plan with stages
        self.aliases: list[frozenset[tuple[int, int]]] = [frozenset() for _ in program.specs]
        self.lock = threading.Lock()
        self.last: Signature | None = None
        self.inference_failures: dict[str, str] = {}
        self.protos: dict[int, Any] = {}  # the step nodes as onnx's inference takes them, exported once

    def shape_types(self, sig: Signature) -> dict[str, TensorType]:
        """Value types for an input-shape signature, from the op schemas; cached per signature."""
        types = self.types.get(sig)
        if types is None:
            p = self.program
            inputs = {n: dt if shape is None else TensorType(dt, shape) for n, (shape, dt) in zip(p.graph.inputs, sig)}
            types, self.inference_failures = infer_runtime(p.graph, p.registry, p.step_nodes, inputs, self.protos)
            self.types[sig] = types
        return types

    def discover(self, sig: Signature, vals: list[Any], observers: Sequence[Any]) -> tuple[PlanInput, bool]:
        """The discovery run of a new signature; returns what its plan is built from, and whether the
        run saw a view no earlier plan knew of (then every other plan was dropped as unsafe)."""
        p = self.program
        observed: dict[int, tuple[tuple[int, ...], np.dtype]] = {}
        types = self.shape_types(sig)  # first: each kernel's results are checked against them as it returns
        expect = {p.slots[n]: t for n, t in types.items() if n in p.slots}
        seen = execute_watching(vals, p.steps, p.step_nodes, observers, observed,
                                functools.partial(p.check_outputs, expect=expect))
        stale = any(new - old for new, old in zip(seen, self.aliases))
        self.aliases = [old | new for new, old in zip(seen, self.aliases)]
        if stale:
            for cache in (self.plans, self.bound, self.inputs):
                cache.clear()
        inp = PlanInput(p.specs, {p.slots[n]: t for n, t in types.items() if n in p.slots}, observed, self.aliases,
                        p.intermediate, p.graph_outputs, p.free_after)
        return inp, stale

    def install(self, sig: Signature, inp: PlanInput) -> list[Signature]:
        """Plan ``sig`` from ``inp`` and bind it; returns the signatures whose bound loops changed."""
        plan = self.plans[sig] = build_plan(inp)
        self.inputs[sig] = inp
        if plan.arena_bytes <= self.arena.nbytes:
            self.bound[sig] = bind_buffers(plan, self.arena)
            return [sig]
        # the first run's arrays are freed, but glibc keeps much of that heap: hand it back before the
        # arena comes on top of it (peak: squeezenet b8 83 -> 58 MB, densenet121 b8 190 -> 125); below a few
        # MB the walk over the heap (~0.7 ms) costs a small model's first run more than it returns
        if plan.arena_bytes >= 4 << 20:
            _trim_heap()
        self.arena = self.allocate(align(plan.arena_bytes))
        self.bound = {s: bind_buffers(p, self.arena) for s, p in self.plans.items()}
        return list(self.bound)

    def evict(self) -> list[Signature]:
        """Drop the oldest signatures beyond `MAX_PLANS`; returns them."""
        gone = []
        while len(self.plans) > MAX_PLANS:
            old = next(iter(self.plans))
            for cache in (self.plans, self.bound, self.types, self.inputs):
                cache.pop(old, None)
            gone.append(old)
        return gone

    def report(self) -> dict[str, Any]:
        """The last run's plan numbers (`Engine.memory_report`)."""
        if self.last is None:
            raise MinferError("memory_report needs a plan: call run() once (or pass feeds) first")
        return dict(self.plans[self.last].report(), steps=len(self.program.specs), scratch_bytes=scratch_bytes())


class SequentialExecutor:
    """Runs the steps in order on the calling thread; kernels see one intra-op thread.

    ``threads`` is accepted and has no effect here (install minfer-parallel
    for threads); ``inter_op`` other than "never" needs the threads executor.
    """

    def __init__(self, program: Program, options: Mapping[str, Any],
                 allocate: Callable[[int], np.ndarray] | None = None) -> None:
        inter_op = options.get("inter_op")
        if inter_op not in (None, "never") and type(self) is SequentialExecutor:
            raise ValueError(f"inter_op={inter_op!r} needs the 'threads' executor (pip install minfer-parallel)")
        self.program = program
        self.plans = PlanCache(program, allocate)

    def run(self, vals: list[Any], sig: Signature, observers: Sequence[Any], fresh: bool = False) -> Mapping[int, np.ndarray] | None:
        """Run every step over ``vals``; ``fresh``: keep every value, in fresh memory. Returns staged feeds (none)."""
        if fresh:
            execute_watching(vals, self.program.unfreed, self.program.step_nodes, observers, None)
            return None
        plans = self.plans
        if not plans.lock.acquire(blocking=False):
            # another thread is running through the arena: this run takes fresh memory instead of waiting
            self.run_steps(vals, self.program.steps, observers)
            return None
        try:
            steps = plans.bound.get(sig)
            if steps is None:
                self.discover(sig, vals, observers)
            else:
                steady = STEADY.set(True)  # no kernel times its candidates now: that is the first run's job
                try:
                    self.run_bound(sig, vals, steps, observers)
                finally:
                    STEADY.reset(steady)
            plans.last = sig
        finally:
            plans.lock.release()
        return None

    def run_steps(self, vals: list[Any], steps: list[Step], observers: Sequence[Any]) -> None:
        if observers:
            execute_watching(vals, steps, self.program.step_nodes, observers, None)
        else:
            execute(vals, steps)

    def run_bound(self, sig: Signature, vals: list[Any], steps: list[Step], observers: Sequence[Any]) -> None:
        """A run of a planned signature (the arena is this run's)."""
        self.run_steps(vals, steps, observers)

    def discover(self, sig: Signature, vals: list[Any], observers: Sequence[Any]) -> None:
        inp, stale = self.plans.discover(sig, vals, observers)
        if stale:
            self.forget(None)
        self.plan_input(sig, inp)
        self.rebound(self.plans.install(sig, inp))
        for old in self.plans.evict():
            self.forget(old)

    def plan_input(self, sig: Signature, inp: PlanInput) -> None:
        """A new signature's plan input, before planning (an executor may set its stages)."""

    def rebound(self, sigs: list[Signature]) -> None:
        """These signatures' bound loops changed (a new plan, or a grown arena)."""

    def forget(self, sig: Signature | None) -> None:
        """Drop what this executor keeps for ``sig`` (None: for every signature)."""

    def memory_report(self) -> dict[str, Any]:
        return self.plans.report()


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc only
    except (OSError, TypeError):  # no C library handle to ask (Windows)
        return None


def _trim_heap() -> None:
    """Return the C heap's free pages to the OS (glibc; a no-op elsewhere)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


SEQUENTIAL = Executor("sequential", SequentialExecutor, priority=0, description="the steps in order on the calling thread",
                      plugin="minfer-core")
