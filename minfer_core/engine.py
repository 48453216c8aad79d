"""The Engine: build once (passes, function expansion, inference, kernel binding), then runs through an executor.

Build does the expensive work once and yields a `Program` (binding.py):
the prepared kernels in execution order over a list of value slots. How
the steps run is the executor's business (`Executor` records: the core's
"sequential", or an executor plugin's), chosen by ``parallel=``. The
engine checks feeds, hands the slot list to the executor, and makes sure
the arrays it returns are the caller's to keep.
"""

from __future__ import annotations

import warnings
from typing import Any, Iterable, Mapping, Sequence

import attrs
import numpy as np

from .binding import Program, alias_sources, bind
from .errors import BadFeedError
from .executor import check_threads, select
from .build import build_graph
from .graph import Graph, free_values
from .kernel import DEFAULT_PROVIDER, KernelContext
from .onnx_io import ModelSource, elem_type_of, load_model
from .pipeline import PassSelection
from .plugins import Registry, active_registry, get_registry
from .runloop import StepFailure
from .sequential import SEQUENTIAL, Signature
from .tensor import MapType, OptionalType, SequenceType, TensorType, _NonTensor

WARM_UP_BYTES = 64 << 20  # larger static inputs are planned at their first run (their zeros cost a run's memory)


@attrs.frozen
class NodeArg:
    """An input or output as onnxruntime describes it: name, "tensor(float)" type, shape."""

    name: str
    type: str
    shape: list[Any]
    dtype: Any = None


def _node_arg(name: str, t: Any) -> NodeArg:
    shape = list(t.shape) if isinstance(t, TensorType) and t.shape is not None else []
    return NodeArg(name, _type_name(t), shape, getattr(t, "dtype", None))


def _type_name(t: Any) -> str:
    """onnxruntime's name of a type: "tensor(float)", "seq(tensor(int64))", "optional(tensor(float))"."""
    if isinstance(t, (SequenceType, OptionalType)):
        return f"{'seq' if isinstance(t, SequenceType) else 'optional'}({_type_name(t.elem)})"
    if isinstance(t, MapType):
        return f"map({_type_name(TensorType(t.key))[7:-1]},{_type_name(t.value)})"
    if t is None:
        return "tensor(unknown)"
    from onnx import helper

    return f"tensor({helper.tensor_dtype_to_string(elem_type_of(t.dtype)).replace('TensorProto.', '').lower()})"


class Engine:
    """A built model: prepared kernels in execution order, run by an executor through a per-shape memory plan.

    The first run with a new input-shape signature re-infers shapes through
    the op schemas and executes with fresh allocations while observing which
    outputs are views of their inputs; from then on that signature runs
    through its plan: kernels that accept ``out=`` write into planned views
    of one shared arena. Arrays returned by `run` never live in the arena,
    so no later run overwrites them. Runs from several threads are safe.

    ``parallel`` names the executor: "sequential" (the core's, always
    there) or one a plugin registers (minfer-parallel: "threads", the
    default when installed, and "processes"); None takes
    ``MINFER_PARALLEL``, else the installed one with the highest priority.
    ``threads`` (a positive count, "auto" or None) and ``inter_op`` go to
    the executor; the sequential one runs kernels on one thread.
    ``warm_up``: when every input is a static-shape tensor, build ends with
    a run on zeros that plans that signature (and times kernels' choices),
    so the first real run is a steady one (`_warm_up` says when it skips).
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
        strict: bool = True,
        warm_up: bool = True,
    ) -> None:
        self.registry = registry or get_registry()
        self.threads = check_threads(threads)
        chosen = select([SEQUENTIAL, *self.registry.executors], parallel)
        graph = model.copy() if isinstance(model, Graph) else load_model(model)
        # passes and preparing kernels look kernels up through get_registry(): show them ours
        with active_registry(self.registry):
            # checks (unless strict=False), passes, inference, function expansion: build.py
            built = build_graph(graph, self.registry, passes, disabled_passes, provider=provider, strict=strict)
            self.pass_results, self.inference_failures = built.pass_results, built.inference_failures
            self.graph = graph
            self.provider = provider
            build = dict(passes=passes, disabled_passes=tuple(disabled_passes), registry=self.registry,
                         provider=provider, threads=threads, strict=strict,
                         parallel="sequential", warm_up=False)  # a body runs inside its node's step, on its pool
            self.program = bind(graph, self.registry, provider, build)
        self.parallel = chosen.name
        self.executor = chosen.factory(self.program, {"threads": self.threads, "inter_op": inter_op})
        self._output_sources = alias_sources(self.program)
        self._slot_names = {slot: name for name, slot in self.program.slots.items()}
        if warm_up:
            self._warm_up()

    def _warm_up(self) -> None:
        """A run on zeros, so build plans the one signature static inputs allow. Skipped with subgraphs (a Loop
        on zeros may never end) or over WARM_UP_BYTES of input; a model rejecting zeros plans at its first run."""
        types = [self.graph.types.get(n) for n in self.graph.inputs]
        if not all(isinstance(t, TensorType) and t.is_static and t.dtype.kind in "biuf" for t in types):
            return
        if sum(t.nbytes for t in types) > WARM_UP_BYTES or next(self.graph.subgraphs(), None) is not None:
            return
        feeds = {n: np.zeros(t.shape, t.dtype) for n, t in zip(self.graph.inputs, types)}
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            try:
                self._run(list(self.graph.outputs), feeds, False, ())  # no observer (a profiler) sees it
            except Exception:  # noqa: BLE001 - say, a Reshape target read from an input: zeros are no shape
                pass

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
            if n not in self.program.slots:
                raise BadFeedError(f"unknown output {n!r}; the model's outputs are {self.graph.outputs}")
        return self._run(names, feeds, intermediate, self.program.observers)

    def _run(self, names: list[str], feeds: Mapping[str, Any], intermediate: bool, observers: Sequence[Any]) -> Any:
        program = self.program
        vals = list(program.template)
        sig = self._check_feeds(feeds, vals)
        try:
            staged = self.executor.run(vals, sig, observers, intermediate)
        except StepFailure as failure:
            raise program.failure(failure) from failure.__cause__
        outputs = [self._owned(vals, program.slots[n], feeds, staged) for n in names]
        if intermediate:
            return outputs, {name: vals[slot] for name, slot in program.slots.items() if vals[slot] is not None}
        return outputs

    def _owned(self, vals: list[Any], slot: int, feeds: Mapping[str, Any],
               staged: Mapping[int, np.ndarray] | None = None) -> Any:
        """The output in ``slot``, copied if it shares memory with a feed or an initializer.

        Otherwise writing into a returned array would change the caller's
        input, or the model's weights for every later run. ``staged``: feeds
        the executor copied into memory of its own, which the next run overwrites.
        """
        value = vals[slot]
        if isinstance(value, list):  # a read-only element is a feed's (or a weight's) array: the caller gets a copy
            return [np.array(v) if isinstance(v, np.ndarray) and not v.flags.writeable else v for v in value]
        for source in self._output_sources.get(slot, ()) if isinstance(value, np.ndarray) else ():
            name = self._slot_names[source]
            owner = feeds[name] if name in feeds else self.program.template[source]
            if owner is not None and np.may_share_memory(value, owner):
                return np.array(value, copy=True)
            copy = staged.get(source) if staged else None
            if copy is not None and np.may_share_memory(value, copy):
                return np.array(value, copy=True)
        return value

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
            value, declared = feeds[name], graph.types.get(name)
            if isinstance(declared, _NonTensor):  # a list, a dict, or None for an empty optional
                vals[self.program.slots[name]] = _non_tensor_feed(name, value, declared)
                sig.append((None, declared))
                continue
            value = np.asarray(value)
            _check_feed(name, value, graph.types.get(name), bound)
            vals[self.program.slots[name]] = value = _read_only(value)
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
        return dict(self.executor.memory_report())

    def profile(self, feeds: Mapping[str, Any], path: str | None = None, *, repeat: int = 1) -> dict[str, Any]:
        """Run ``repeat`` times recording each node's time; returns (and writes to ``path``) a Chrome trace."""
        from .profile import profile_engine

        return profile_engine(self, feeds, path, repeat=repeat)

    def get_inputs(self) -> list[NodeArg]:
        return [_node_arg(n, self.graph.types.get(n)) for n in self.graph.inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [_node_arg(n, self.graph.type_of(n)) for n in self.graph.outputs]


def _check_feed(name: str, value: np.ndarray, declared: TensorType | None, bound: dict[str, tuple[str, int]]) -> None:
    if declared is None:
        return
    if value.dtype != declared.dtype:
        raise BadFeedError(f"input {name!r} expects dtype {declared.dtype.name}, got {value.dtype.name}")
    if declared.shape is None:
        return
    if value.ndim != len(declared.shape):
        raise BadFeedError(
            f"input {name!r} expects rank {len(declared.shape)} shape {_fmt(declared.shape)}, got shape {value.shape}")
    for axis, (want, got) in enumerate(zip(declared.shape, value.shape)):
        if isinstance(want, int) and want != got:
            raise BadFeedError(
                f"input {name!r} expects shape {_fmt(declared.shape)}, got {value.shape}: dim {axis} must be {want}")
        if isinstance(want, str):
            # a symbolic dim names one size shared by every input that uses it
            first = bound.setdefault(want, (name, got))
            if first[1] != got:
                raise BadFeedError(
                    f"input {name!r} dim {axis} is the symbolic dim {want!r} = {got}, but input {first[0]!r} "
                    f"set {want!r} = {first[1]}")


def _read_only(value: np.ndarray) -> np.ndarray:
    """Kernels get the caller's arrays read-only: one writing into a feed fails, named, and the feed is untouched."""
    if value.flags.writeable:
        value = value.view()
        value.flags.writeable = False
    return value


def _non_tensor_feed(name: str, value: Any, declared: Any) -> Any:
    """A sequence (a list), map (a dict) or optional (its value, or None) feed, checked against its declared type."""
    want = declared.elem if isinstance(declared, OptionalType) and value is not None else declared
    if isinstance(want, TensorType):
        return _read_only(np.asarray(value))
    kind = list if isinstance(want, SequenceType) else dict if isinstance(want, MapType) else object
    elem = getattr(getattr(want, "elem", None), "dtype", None)
    wrong = not isinstance(value, kind)
    if wrong or (kind is list and any(not isinstance(v, np.ndarray) or elem not in (None, v.dtype) for v in value)):
        got = type(value).__name__ if wrong else f"elements {[str(getattr(v, 'dtype', type(v).__name__)) for v in value]}"
        raise BadFeedError(f"input {name!r} is declared {declared}: got {got}")
    return [_read_only(v) for v in value] if kind is list else value


def _fmt(shape: Sequence[Any]) -> str:
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


def subgraph_engine(ctx: KernelContext, body: Graph) -> Engine:
    """An Engine for a control-flow node's subgraph ``body`` (an attribute value), built as its graph was.

    The outer-scope values ``body`` reads become inputs after its own: run it
    with feeds for both, ``engine.run(None, {**body_feeds, **outer_feeds})``.
    Passes, inference, binding and a memory plan per input shape happen once,
    as for the main graph.
    """
    graph = body.copy()
    reads = free_values(graph)
    for name, t in zip(ctx.outer, ctx.outer_types):
        if name in reads:
            graph.inputs.append(name)
            if t is not None:
                graph.types[name] = t
    return Engine(graph, **ctx.build)
