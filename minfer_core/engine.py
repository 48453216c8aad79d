"""The Engine: build once (passes, function expansion, inference, kernel binding), run lean.

`InferenceSession` has onnxruntime's call shape, so code written for
onnxruntime runs by changing the import.
"""

from __future__ import annotations

import functools
import inspect
import os
import threading
import time
from typing import Any, Callable, Iterable, Mapping, Sequence

import attrs
import numpy as np

from .errors import BadFeedError, KernelError, MinferError, UnsupportedOpError
from .expand import expand_functions
from .graph import Graph, Node
from .infer import infer_runtime, infer_types
from .kernel import DEFAULT_PROVIDER, Kernel, KernelContext
from .memory import align
from .onnx_io import ModelSource, elem_type_of, load_model
from .pipeline import PassSelection, optimize
from .plan import Plan, PlanInput, Step, StepSpec, bind_buffers, build_plan
from . import procs
from .runloop import (StepFailure, execute, execute_observed, execute_staged, execute_team, execute_timed,
                      execute_watching)
from .parallel import get_pool, using_pool, using_threads
from .stages import SEQUENTIAL_RUNS, Calibration, Item, Stage, choose, compose, producers
from .workspace import scratch_bytes
from .threads import AutoThreads, set_blas_threads
from .plugins import Registry, active_registry, get_registry, provider_hint
from .tensor import TensorType


@attrs.frozen
class NodeArg:
    """An input or output as onnxruntime describes it: name, "tensor(float)" type, shape."""

    name: str
    type: str
    shape: list[Any]
    dtype: Any = None


def _node_arg(name: str, t: TensorType | None) -> NodeArg:
    if t is None:
        return NodeArg(name, "tensor(unknown)", [], None)
    from onnx import helper

    type_name = helper.tensor_dtype_to_string(elem_type_of(t.dtype)).replace("TensorProto.", "").lower()
    type_name = {"float": "float", "double": "double"}.get(type_name, type_name)
    return NodeArg(name, f"tensor({type_name})", list(t.shape) if t.shape is not None else [], t.dtype)


MAX_PLANS = 64  # input-shape signatures whose plans stay cached
INTER_OP = ("auto", "always", "never")
PARALLEL = ("threads", "processes")


class Engine:
    """A built model: prepared kernels in execution order, run through a per-shape memory plan.

    Build does the expensive work once (passes, function expansion, shape
    inference, kernel preparation). The first run with a new input-shape
    signature re-infers shapes through the op schemas (cached per signature)
    and executes with fresh allocations while observing which outputs are
    views of their inputs; from then on that signature runs through its
    `Plan`: kernels that accept ``out=`` write into planned views of one
    shared arena, so repeated runs allocate no activation buffers. Arrays
    returned by `run` never live in the arena, so no later run overwrites them.
    Runs from several threads are safe: one at a time uses the arena, the
    others run with fresh memory rather than wait.

    With two threads or more, independent branches of the graph may run at
    the same time, one per thread (``inter_op``, stages.py): ``"auto"``
    times the next runs of each new input shape and keeps the concurrent
    stages that pay; ``"always"`` runs every run of independent steps
    concurrently; ``"never"`` keeps the sequential loop. The default comes
    from ``MINFER_INTER_OP``, else ``"never"``: on the 2-core VM this was
    measured on, no stage of the benchmark models paid (two kernels at once
    contend for the GIL), and ``"auto"`` spends runs 2-5 of each new shape
    timing them. Outputs do not depend on it.
    """

    def __init__(
        self,
        model: ModelSource | Graph,
        *,
        passes: PassSelection = "all",
        disabled_passes: Iterable[str] = (),
        registry: Registry | None = None,
        provider: str = DEFAULT_PROVIDER,
        threads: int | str | None = "auto",
        inter_op: str | None = None,
        parallel: str | None = None,
    ) -> None:
        self.registry = registry or get_registry()
        # how kernels split their work: over Python threads, or over this process and a forked worker
        # (procs.py). The default comes from MINFER_PARALLEL, else "threads".
        self.parallel = parallel or os.environ.get("MINFER_PARALLEL", "threads")
        if self.parallel not in PARALLEL:
            raise ValueError(f"parallel must be one of {PARALLEL}, not {self.parallel!r}")
        self.inter_op = inter_op or os.environ.get("MINFER_INTER_OP", "never")
        if self.inter_op not in INTER_OP:
            raise ValueError(f"inter_op must be one of {INTER_OP}, not {self.inter_op!r}")
        # intra-op threads during run(): a count, "auto" (all cores unless other processes keep one busy:
        # see threads.AutoThreads), or None to run kernels serially and leave numpy's BLAS setting alone.
        # Kernels split their work over these threads (parallel.py); BLAS then runs one thread per call.
        self.threads = threads
        self._auto = AutoThreads() if threads == "auto" else None
        graph = model.copy() if isinstance(model, Graph) else load_model(model)
        graph.validate()
        # passes and preparing kernels look kernels up through get_registry(): show them ours
        with active_registry(self.registry):
            self.pass_results = optimize(graph, self.registry, passes, disabled_passes)
            self.inference_failures = infer_types(graph, self.registry)
            if expand_functions(graph, self.registry, provider):
                # expanded bodies bring new values: annotate them too
                self.inference_failures = infer_types(graph, self.registry)
            self.graph = graph
            self.provider = provider
            self._bind()

    # ---- build -----------------------------------------------------------

    def _bind(self) -> None:
        graph, reg = self.graph, self.registry
        order = graph.topological_order()
        kernels = [reg.select_kernel(n.domain, n.op_type, _opset(graph, n), self.provider) for n in order]
        missing = [n for n, k in zip(order, kernels) if k is None]
        if missing:
            raise UnsupportedOpError(_missing_message(graph, missing, reg))
        self.slots: dict[str, int] = {}
        template: list[Any] = [None]  # slot 0 stays None: omitted optional inputs read it
        for name, value in graph.initializers.items():
            self.slots[name] = len(template)
            template.append(value)
        for name in graph.inputs:
            self.slots.setdefault(name, len(template))
            template.append(None)
        release_after = _packed_release_points(graph, order, kernels)  # type: ignore[arg-type]
        self.released: list[str] = []
        self.step_nodes: list[Node] = []
        self.specs: list[StepSpec] = []
        for i, (node, kern) in enumerate(zip(order, kernels)):
            for out in node.outputs:
                if out:
                    self.slots[out] = len(template)
                    template.append(None)
            assert kern is not None
            self.specs.append(self._bind_node(node, kern))
            self.step_nodes.append(node)
            for name in release_after.get(i, ()):
                # every reader has packed its copy: drop the original now, so build never holds both in full
                value = graph.initializers.pop(name)
                graph.types[name] = TensorType(value.dtype, value.shape)
                template[self.slots[name]] = None
                self.released.append(name)
        self._template = template
        for value in template:
            if isinstance(value, np.ndarray):
                procs.freeze(value)  # initializers: a process team's worker has them as they are
        procs.state_changed()
        self._free_after = self._liveness(order)
        self.steps: list[Step] = [
            (sp.fn, sp.ins, sp.outs[0] if sp.outs else 0, sp.outs, free) for sp, free in zip(self.specs, self._free_after)
        ]
        self._unfreed: list[Step] = [(sp.fn, sp.ins, sp.outs[0] if sp.outs else 0, sp.outs, ()) for sp in self.specs]
        self._intermediate = frozenset(s for sp in self.specs for s in sp.outs if s)
        self._graph_outputs = frozenset(self.slots[n] for n in graph.outputs)
        self._output_sources = self._alias_sources(order, kernels)  # type: ignore[arg-type]
        self._slot_names = {slot: name for name, slot in self.slots.items()}
        self._aliases: list[frozenset[tuple[int, int]]] = [frozenset() for _ in self.specs]
        self._plans: dict[Signature, Plan] = {}
        self._types: dict[Signature, dict[str, TensorType]] = {}
        self._bound: dict[Signature, list[Step]] = {}
        self._deps = producers([sp.ins for sp in self.specs], [sp.outs for sp in self.specs])
        self._branchy = _branchy(self._deps)
        self._stages: dict[Signature, tuple[list[Stage], list[float] | None]] = {}  # stages, branch costs
        self._staged: dict[Signature, tuple[list[Item], list[int]]] = {}  # the staged loop (stages.compose)
        self._pending: dict[Signature, PlanInput] = {}  # signatures still timing their stages: how to re-plan
        self._calibrations: dict[Signature, Calibration] = {}
        self._shared: dict[Signature, procs.Dispatch] = {}  # per bound step: does a process team share it
        self._feed_stage: dict[int, np.ndarray] = {}  # per input slot: shared memory its feed is copied to
        self._modes: dict[Signature, procs.ModeChoice] = {}  # per shape: team or threads, once timed
        self._arena = np.empty(0, dtype=np.uint8)
        self._arena_lock = threading.Lock()
        self._last: Signature | None = None
        self.runtime_inference_failures: dict[str, str] = {}
        self.observers: list[Any] = list(reg.observers)

    def _bind_node(self, node: Node, kern: Kernel) -> StepSpec:
        inputs = list(node.inputs)
        while inputs and not inputs[-1]:
            inputs.pop()
        ins = tuple(self.slots[n] if n else 0 for n in inputs)
        outs = tuple(self.slots[n] if n else 0 for n in node.outputs)
        try:
            fn = _prepare(kern, node, self.graph)
        except MinferError:
            raise
        except Exception as exc:
            raise KernelError(f"{node.label}: kernel {kern.op_type}-{kern.since} from {kern.plugin} failed to prepare: {exc}") from exc
        return StepSpec(kern, fn, ins, outs)

    def _liveness(self, order: list[Node]) -> list[tuple[int, ...]]:
        """Per step, the slots whose value nothing reads afterwards (dropped to bound memory)."""
        keep = {self.slots[n] for n in self.graph.outputs} | {0}
        keep |= {self.slots[n] for n in self.graph.initializers}
        last: dict[int, int] = {}
        for i, node in enumerate(order):
            for name in list(node.inputs) + list(node.outputs):
                if name:
                    last[self.slots[name]] = i
        for name in self.graph.inputs:
            last.setdefault(self.slots[name], -1)
        free: list[list[int]] = [[] for _ in order]
        for slot, i in last.items():
            if slot not in keep and i >= 0:
                free[i].append(slot)
        return [tuple(f) for f in free]

    # ---- run -------------------------------------------------------------

    def run(
        self, output_names: Sequence[str] | None, feeds: Mapping[str, Any], *, intermediate: bool = False
    ) -> Any:
        """Compute ``output_names`` (all graph outputs when None) from ``feeds``.

        With ``intermediate=True`` returns ``(outputs, values)`` where ``values``
        maps every value name computed in this run to its array (such a run
        uses fresh memory for every value, never the arena).
        """
        names = list(self.graph.outputs) if output_names is None else list(output_names)
        for n in names:
            if n not in self.slots:
                raise BadFeedError(f"unknown output {n!r}; the model's outputs are {self.graph.outputs}")
        return self._run(names, feeds, intermediate, self.observers)

    def _run(self, names: list[str], feeds: Mapping[str, Any], intermediate: bool, observers: Sequence[Any]) -> Any:
        vals = list(self._template)
        sig = self._check_feeds(feeds, vals)
        want = self._auto.choose() if self._auto is not None else self.threads if isinstance(self.threads, int) else None
        # kernels split their own work over ``want`` threads (parallel.py); numpy's BLAS runs one thread per call
        previous = set_blas_threads(1) if want else None
        team = None
        mode = None
        if self.parallel == "processes" and want and want >= 2 and not intermediate and not observers:
            mode = self._modes.get(sig)
            if mode is None or mode.want_team():
                team = procs.team()
                if team is not None and not team.begin():
                    team = None
        start = time.perf_counter()
        try:
            if team is not None:
                # steps the worker does not share run here alone, seeing the team's thread count (see SoloPool)
                with using_pool(team.solo):
                    return self._run_threaded(names, feeds, intermediate, observers, vals, sig, 2, team)
            with using_threads(want or 1):
                return self._run_threaded(names, feeds, intermediate, observers, vals, sig, want or 1)
        finally:
            if team is not None:
                team.end()
            # a run in which the worker failed (its share recomputed here) times the failure, not the team
            failed = team is not None and team.broken
            if mode is not None and mode.team is None and (team is not None) == mode.want_team() and not failed:
                mode.record(team is not None, time.perf_counter() - start)
            if previous is not None and previous != 1:
                set_blas_threads(previous)

    def _run_threaded(self, names: list[str], feeds: Mapping[str, Any], intermediate: bool, observers: Sequence[Any],
                      vals: list[Any], sig: Signature, threads: int, team: procs.Team | None = None) -> Any:
        if intermediate:
            self._execute(vals, self._unfreed, observers)
            outputs = [self._owned(vals, self.slots[n], feeds) for n in names]
            return outputs, {name: vals[slot] for name, slot in self.slots.items() if vals[slot] is not None}
        staged: dict[int, np.ndarray] = {}
        self._run_signature(sig, vals, observers, threads, team, staged)
        return [self._owned(vals, self.slots[n], feeds, staged) for n in names]

    def _alias_sources(self, order: list[Node], kernels: list[Kernel]) -> dict[int, tuple[int, ...]]:
        """Per graph-output slot, the feed and initializer slots its value may be a view of.

        Follows every kernel that may return views (``views`` not False) back
        from the outputs, so `_owned` checks only the few outputs that can
        alias memory the caller or the model owns.
        """
        graph = self.graph
        reach: dict[str, frozenset[str]] = {n: frozenset([n]) for n in list(graph.inputs) + list(graph.initializers)}
        for node, kern in zip(order, kernels):
            if kern.views is False:
                continue
            sources = frozenset().union(*(reach.get(i, frozenset()) for i in node.inputs if i))
            if sources:
                reach.update((o, sources) for o in node.outputs if o)
        return {self.slots[o]: tuple(self.slots[s] for s in sorted(reach[o])) for o in graph.outputs if o in reach}

    def _owned(self, vals: list[Any], slot: int, feeds: Mapping[str, Any],
               staged: Mapping[int, np.ndarray] | None = None) -> Any:
        """The output in ``slot``, copied if it shares memory with a feed or an initializer.

        Otherwise writing into a returned array would change the caller's
        input, or the model's weights for every later run. ``staged``: feeds
        this run read from shared memory (procs.py), which the next run overwrites.
        """
        value = vals[slot]
        for source in self._output_sources.get(slot, ()):
            name = self._slot_names[source]
            owner = feeds[name] if name in feeds else self._template[source]
            if owner is not None and np.may_share_memory(value, owner):
                return np.array(value, copy=True)
            copy = staged.get(source) if staged else None
            if copy is not None and np.may_share_memory(value, copy):
                return np.array(value, copy=True)
        return value

    def _run_signature(self, sig: Signature, vals: list[Any], observers: Sequence[Any], threads: int,
                       team: procs.Team | None = None, staged: dict[int, np.ndarray] | None = None) -> None:
        if not self._arena_lock.acquire(blocking=False):
            # another thread is running through the arena: this run takes fresh memory instead of waiting
            self._execute(vals, self.steps, observers)
            return
        try:
            steps = self._bound.get(sig)
            if steps is None:
                self._discover(sig, vals, observers)
            elif team is not None:
                self._execute_team(sig, vals, steps, team, staged if staged is not None else {})
            elif observers or threads < 2:  # observers see the nodes one at a time, in order
                self._execute(vals, steps, observers)
            elif sig in self._pending:
                self._calibrate(sig, vals, threads)
            elif sig in self._staged:
                self._execute_staged(vals, self._staged[sig], threads)
            else:
                self._execute(vals, steps)
            self._last = sig
        finally:
            self._arena_lock.release()

    def _discover(self, sig: Signature, vals: list[Any], observers: Sequence[Any]) -> None:
        """First run of a signature: fresh allocations, observe shapes and views, then plan."""
        observed: dict[int, tuple[tuple[int, ...], np.dtype]] = {}
        seen = self._execute_watching(vals, observed, observers)
        stale = any(new - old for new, old in zip(seen, self._aliases))
        self._aliases = [old | new for new, old in zip(seen, self._aliases)]
        if stale:  # a kernel returned a view no earlier plan knew of: those plans are unsafe
            for cache in self._signature_caches():
                if cache is not self._types:
                    cache.clear()
        types = self.shape_types(sig)
        inp = PlanInput(
            self.specs,
            {self.slots[n]: t for n, t in types.items() if n in self.slots},
            observed,
            self._aliases,
            self._intermediate,
            self._graph_outputs,
            self._free_after,
        )
        if self.inter_op == "always":
            # every run of independent steps as a stage (tests, and graphs known to pay)
            inp.stages = choose(self._deps, [1.0] * len(self.specs), overhead=0.0, min_gain=0.0, min_share=0.0)
        elif self.inter_op == "auto" and self._branchy and self.threads not in (1, None):
            self._pending[sig] = inp
        self._install(sig, build_plan(inp), list(inp.stages), None)
        procs.state_changed()  # kernels made their first-call choices (the conv tuner's) in this run
        while len(self._plans) > MAX_PLANS:  # evict the oldest signature; its types go with it
            old = next(iter(self._plans))
            for cache in self._signature_caches():
                cache.pop(old, None)

    def _signature_caches(self) -> tuple[dict[Signature, Any], ...]:
        return (self._plans, self._bound, self._types, self._stages, self._staged, self._pending, self._calibrations,
                self._shared, self._modes)

    def _install(self, sig: Signature, plan: Plan, stages: list[Stage], cost: list[float] | None) -> None:
        """Make ``plan`` the signature's plan, with ``stages`` run concurrently (branches ordered by ``cost``)."""
        self._plans[sig] = plan
        self._stages[sig] = (stages, cost)
        if plan.arena_bytes > self._arena.nbytes:
            # the first run's arrays are freed, but glibc keeps much of that heap: hand it back before the
            # arena comes on top of it (peak: squeezenet b8 83 -> 58 MB, densenet121 b8 190 -> 125)
            _trim_heap()
            # grow-only: every cached plan indexes the same arena, so alternating shapes allocate nothing.
            # A process team's worker must see it: then it is shared memory.
            size = align(plan.arena_bytes)
            self._arena = procs.shared_empty(size) if self.parallel == "processes" else np.empty(size, dtype=np.uint8)
            self._bound = {s: bind_buffers(p, self._arena) for s, p in self._plans.items()}
            if self.parallel == "processes":
                self._shared = {s: procs.Dispatch(_shareable(b)) for s, b in self._bound.items()}
            self._staged.clear()
            for s, (st, c) in self._stages.items():
                if st:
                    self._staged[s] = compose(self._bound[s], st, c)
        else:
            self._bound[sig] = bind_buffers(plan, self._arena)
            if self.parallel == "processes":  # (only a process team reads these)
                self._shared[sig] = procs.Dispatch(_shareable(self._bound[sig]))
            self._staged.pop(sig, None)
            if stages:
                self._staged[sig] = compose(self._bound[sig], stages, cost)

    def _calibrate(self, sig: Signature, vals: list[Any], threads: int) -> None:
        """One timed run of a signature still choosing its stages (stages.Calibration); re-plans when decided."""
        cal = self._calibrations.get(sig)
        if cal is None or cal.workers != threads:  # the thread count changed (auto): start over
            cal = self._calibrations[sig] = Calibration(self._deps, threads)
            if self._stages[sig][0]:
                self._replan(sig, [], None)
        if cal.serial_runs < SEQUENTIAL_RUNS:
            trial = cal.add_serial(self._timed(vals, self._bound[sig]))
            if trial:
                self._replan(sig, trial, cal.serial)
            elif trial is not None:
                self._settle(sig)
            return
        walls: dict[int, float] = {}
        self._execute_staged(vals, self._staged[sig], threads, walls)
        final = cal.add_trial(walls)
        if final is not None:
            if final != cal.trial:
                self._replan(sig, final, cal.serial)
            self._settle(sig)

    def _replan(self, sig: Signature, stages: list[Stage], cost: list[float] | None) -> None:
        inp = self._pending[sig]
        inp.stages = stages
        self._install(sig, build_plan(inp), stages, cost)

    def _settle(self, sig: Signature) -> None:
        self._pending.pop(sig, None)
        self._calibrations.pop(sig, None)

    def shape_types(self, sig: Signature) -> dict[str, TensorType]:
        """Value types for an input-shape signature, from the op schemas; cached per signature."""
        types = self._types.get(sig)
        if types is None:
            graph = self.graph
            inputs = {n: TensorType(dt, shape) for n, (shape, dt) in zip(graph.inputs, sig)}
            types, self.runtime_inference_failures = infer_runtime(graph, self.registry, self.step_nodes, inputs)
            self._types[sig] = types
        return types

    def _execute(self, vals: list[Any], steps: list[Step], observers: Sequence[Any] = ()) -> None:
        try:
            if observers:
                execute_observed(vals, steps, self.step_nodes, observers)
            else:
                execute(vals, steps)
        except StepFailure as failure:
            raise self._failure(failure) from failure.__cause__

    def _execute_team(self, sig: Signature, vals: list[Any], steps: list[Step], team: procs.Team,
                      staged: dict[int, np.ndarray]) -> None:
        """A run with the process team: feeds that shared steps read are copied into shared memory first."""
        dispatch = self._shared[sig]
        flags = dispatch.trial() if team.usable() else None
        for slot in self._feed_slots(dispatch):
            value = vals[slot]
            if value is not None and value.nbytes:
                vals[slot] = staged[slot] = self._stage(slot, value)
        try:
            if flags is None:
                execute_team(vals, steps, dispatch.flags or dispatch.candidates, team)
            else:
                times = [0.0] * len(steps)
                execute_team(vals, steps, flags, team, times)
                dispatch.record(flags, times)
                if dispatch.flags is not None:  # decided: now the team against the threads, run for run
                    self._modes[sig] = procs.ModeChoice(None if any(dispatch.flags) else False)
        except StepFailure as failure:
            raise self._failure(failure) from failure.__cause__

    def _feed_slots(self, dispatch: procs.Dispatch) -> list[int]:
        """The input slots that the steps ``dispatch`` shares read (computed once per set of flags)."""
        flags = dispatch.flags or dispatch.candidates
        if dispatch.feeds is None or dispatch.feeds[0] is not flags:
            inputs = {self.slots[n] for n in self.graph.inputs}
            dispatch.feeds = (flags, sorted({s for st, f in zip(self.steps, flags) if f for s in st[1]} & inputs))
        return dispatch.feeds[1]

    def _stage(self, slot: int, value: np.ndarray) -> np.ndarray:
        """``value`` copied into this engine's shared staging memory for feed ``slot`` (grown when needed)."""
        buf = self._feed_stage.get(slot)
        if buf is None or buf.nbytes < value.nbytes:
            buf = self._feed_stage[slot] = procs.shared_empty(align(value.nbytes))  # a re-fork follows
        staged = buf[: value.nbytes].view(value.dtype).reshape(value.shape)
        np.copyto(staged, value)
        return staged

    def _timed(self, vals: list[Any], steps: list[Step]) -> list[float]:
        try:
            return execute_timed(vals, steps)
        except StepFailure as failure:
            raise self._failure(failure) from failure.__cause__

    def _execute_staged(self, vals: list[Any], staged: tuple[list[Item], list[int]], threads: int,
                        walls: dict[int, float] | None = None) -> None:
        try:
            execute_staged(vals, staged[0], staged[1], get_pool(threads), walls)
        except StepFailure as failure:
            raise self._failure(failure) from failure.__cause__

    def _execute_watching(
        self, vals: list[Any], observed: dict[int, tuple[tuple[int, ...], np.dtype]], observers: Sequence[Any]
    ) -> list[frozenset[tuple[int, int]]]:
        try:
            return execute_watching(vals, self.steps, self.step_nodes, observers, observed)
        except StepFailure as failure:
            raise self._failure(failure) from failure.__cause__

    def _failure(self, failure: StepFailure) -> KernelError:
        node, exc = self.step_nodes[failure.step], failure.__cause__
        return KernelError(f"{node.label} failed on input shapes {failure.shapes}: {type(exc).__name__}: {exc}")

    def _check_feeds(self, feeds: Mapping[str, Any], vals: list[Any]) -> Signature:
        graph = self.graph
        unknown = [n for n in feeds if n not in graph.inputs]
        if unknown:
            raise BadFeedError(f"unknown input name(s) {unknown}; the model's inputs are {graph.inputs}")
        missing = [n for n in graph.inputs if n not in feeds]
        if missing:
            raise BadFeedError(f"missing feed for input(s) {missing}; the model's inputs are {graph.inputs}")
        sig = []
        bound: dict[str, tuple[str, int]] = {}
        for name in graph.inputs:
            value = feeds[name]
            if not isinstance(value, np.ndarray):
                value = np.asarray(value)
            _check_feed(name, value, graph.types.get(name), bound)
            vals[self.slots[name]] = value
            sig.append((value.shape, value.dtype))
        return tuple(sig)

    # ---- introspection -----------------------------------------------------

    def memory_report(self, feeds: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """The memory plan's numbers for the last run's input shapes (or for ``feeds``, after one run).

        ``arena_bytes``: one arena holding every planned buffer (as if every
        kernel wrote into its planned buffer); ``naive_bytes``: the sum of all
        intermediates with no reuse; ``live_set_bytes``: the largest total of
        simultaneously live intermediates (a lower bound for any plan);
        ``allocated_arena_bytes``: the arena really allocated, for the values
        whose kernels accept ``out=``; ``arena_backed_buffers`` of ``buffers``;
        ``scratch_bytes``: the kernels' per-thread scratch (`minfer_core.scratch`)
        this process holds now, over all its sessions, which peak memory adds to
        the arena.
        """
        if feeds is not None:
            self.run(None, feeds)
        if self._last is None:
            raise MinferError("memory_report needs a plan: call run() once (or pass feeds) first")
        return dict(self._plans[self._last].report, steps=len(self.specs), scratch_bytes=scratch_bytes())

    def profile(self, feeds: Mapping[str, Any], path: str | None = None, *, repeat: int = 1) -> dict[str, Any]:
        """Run ``repeat`` times recording each node's time; returns (and writes to ``path``) a Chrome trace."""
        from .profile import profile_engine

        return profile_engine(self, feeds, path, repeat=repeat)

    def get_inputs(self) -> list[NodeArg]:
        return [_node_arg(n, self.graph.types.get(n)) for n in self.graph.inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [_node_arg(n, self.graph.type_of(n)) for n in self.graph.outputs]


class InferenceSession(Engine):
    """onnxruntime's ``InferenceSession`` call shape over minfer's Engine.

    ``sess_options`` and ``providers`` are accepted for compatibility; of the
    options only ``intra_op_num_threads`` is honoured (as numpy's BLAS thread
    count during runs, like ``threads=``; the default "auto" uses every core
    unless other processes keep one busy).
    """

    def __init__(
        self,
        path_or_model: ModelSource | Graph,
        sess_options: Any = None,
        providers: Any = None,
        *,
        passes: PassSelection = "all",
        disabled_passes: Iterable[str] = (),
        registry: Registry | None = None,
        threads: int | str | None = "auto",
        inter_op: str | None = None,
        parallel: str | None = None,
        **_ignored: Any,
    ) -> None:
        if getattr(sess_options, "intra_op_num_threads", 0):
            threads = int(sess_options.intra_op_num_threads)
        super().__init__(path_or_model, passes=passes, disabled_passes=disabled_passes, registry=registry, threads=threads,
                         inter_op=inter_op, parallel=parallel)

    def get_providers(self) -> list[str]:
        return ["CPUExecutionProvider"]


def _branchy(deps: Sequence[Sequence[int]]) -> bool:
    """Whether some steps are independent: a step read by two others, or two steps reading no step."""
    readers = [0] * len(deps)
    for d in deps:
        for p in d:
            readers[p] += 1
    return max(readers, default=0) > 1 or sum(1 for d in deps if not d) > 1


def _packed_release_points(graph: Graph, order: Sequence[Node], kernels: Sequence[Kernel]) -> dict[int, list[str]]:
    """Initializers every reader declared ``packed``, keyed by the step after whose preparation they can go."""
    last: dict[str, int] = {}
    packed_everywhere: dict[str, bool] = {}
    for i, (node, kern) in enumerate(zip(order, kernels)):
        for n, name in enumerate(node.inputs):
            if name in graph.initializers:
                last[name] = i
                ok = kern.prepare and n in kern.packed
                packed_everywhere[name] = packed_everywhere.get(name, True) and ok
    outputs = set(graph.outputs)
    points: dict[int, list[str]] = {}
    for name, i in last.items():
        if packed_everywhere[name] and name not in outputs:
            points.setdefault(i, []).append(name)
    return points


@functools.lru_cache(maxsize=1)
def _malloc_trim() -> Callable[[int], int] | None:
    import ctypes

    try:
        return getattr(ctypes.CDLL(None), "malloc_trim", None)  # glibc only
    except (OSError, TypeError):  # no C library handle to ask (Windows)
        return None


def _shareable(steps: list[Step]) -> list[bool]:
    """Per step: does its kernel write its output only in ranges a process team may share (``spmd``)?"""
    flags = []
    for fn, ins, out0, outs, free in steps:
        base = fn.func if isinstance(fn, functools.partial) else fn
        shared = bool(getattr(base, "spmd", False)) and isinstance(fn, functools.partial) and "out" in fn.keywords
        if shared:
            procs.register(fn)  # the forked worker finds the step's callable by this key
        flags.append(shared)
    return flags


def _trim_heap() -> None:
    """Return the C heap's free pages to the OS (glibc; a no-op elsewhere)."""
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


def _opset(graph: Graph, node: Node) -> int:
    return graph.opsets.get(node.domain, 1)


Signature = tuple[tuple[tuple[int, ...], np.dtype], ...]
"""Per graph input, its (shape, dtype): the key of the shape and plan caches."""


def _check_feed(name: str, value: np.ndarray, declared: TensorType | None, bound: dict[str, tuple[str, int]]) -> None:
    if declared is None:
        return
    if value.dtype != declared.dtype:
        raise BadFeedError(f"input {name!r} expects dtype {declared.dtype.name}, got {value.dtype.name}")
    if declared.shape is None:
        return
    if value.ndim != len(declared.shape):
        raise BadFeedError(
            f"input {name!r} expects rank {len(declared.shape)} shape {_fmt(declared.shape)}, got shape {value.shape}"
        )
    for axis, (want, got) in enumerate(zip(declared.shape, value.shape)):
        if isinstance(want, int) and want != got:
            raise BadFeedError(
                f"input {name!r} expects shape {_fmt(declared.shape)}, got {value.shape}: dim {axis} must be {want}"
            )
        if isinstance(want, str):
            # a symbolic dim names one size shared by every input that uses it
            first = bound.setdefault(want, (name, got))
            if first[1] != got:
                raise BadFeedError(
                    f"input {name!r} dim {axis} is the symbolic dim {want!r} = {got}, but input {first[0]!r} "
                    f"set {want!r} = {first[1]}"
                )


def _fmt(shape: Sequence[Any]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def _prepare(kern: Kernel, node: Node, graph: Graph) -> Callable[..., Any]:
    attrs_ = _check_attributes(kern, node)
    if kern.prepare:
        ctx = KernelContext(
            node_name=node.name,
            op_type=node.op_type,
            opset=_opset(graph, node),
            input_types=tuple(graph.type_of(n) if n else None for n in node.inputs),
            output_types=tuple(graph.type_of(n) if n else None for n in node.outputs),
            constants=tuple(graph.initializers.get(n) if n else None for n in node.inputs),
            num_outputs=len(node.outputs),
        )
        return kern.fn(ctx, **attrs_)
    return functools.partial(kern.fn, **attrs_) if attrs_ else kern.fn


@functools.lru_cache(maxsize=None)
def _signature(fn: Callable[..., Any]) -> tuple[frozenset[str], frozenset[str], bool]:
    params = inspect.signature(fn).parameters.values()
    accepted = frozenset(p.name for p in params if p.kind is p.KEYWORD_ONLY)
    required = frozenset(p.name for p in params if p.kind is p.KEYWORD_ONLY and p.default is p.empty)
    return accepted, required, any(p.kind is p.VAR_KEYWORD for p in params)


def _check_attributes(kern: Kernel, node: Node) -> dict[str, Any]:
    accepted, required, var_kw = _signature(kern.fn)
    unknown = [a for a in node.attrs if a not in accepted]
    if unknown and not var_kw:
        raise KernelError(
            f"{node.label} has attribute(s) {unknown} that kernel {kern.op_type}-{kern.since} from "
            f"{kern.plugin} does not accept (it accepts {sorted(accepted)})"
        )
    absent = sorted(required - set(node.attrs))
    if absent:
        raise KernelError(f"{node.label} lacks required attribute(s) {absent}")
    return dict(node.attrs)


def _missing_message(graph: Graph, missing: list[Node], reg: Registry) -> str:
    by_op: dict[tuple[str, str], list[Node]] = {}
    for node in missing:
        by_op.setdefault((node.domain, node.op_type), []).append(node)
    lines = [f"{len(missing)} node(s) use operators no installed plugin implements:"]
    for (domain, op_type), nodes in sorted(by_op.items()):
        where = f"domain {domain!r}" if domain else "the default domain"
        names = ", ".join(repr(n.name or "<unnamed>") for n in nodes[:5]) + (" ..." if len(nodes) > 5 else "")
        hint = provider_hint(domain, op_type)
        fix = f"install {hint}" if hint else "install a plugin that provides it, or write one (README: Writing a plugin)"
        have = sorted(k.since for k in reg.kernels.get((domain, op_type), []))
        extra = f"; kernels exist only for opset >= {have[0]}" if have else ""
        lines.append(
            f"  {op_type} ({where}, opset {graph.opsets.get(domain, '?')}) at {len(nodes)} node(s): {names} -> {fix}{extra}"
        )
    return "\n".join(lines)


