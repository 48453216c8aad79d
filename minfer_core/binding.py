"""Kernel binding: a built graph becomes a `Program`, the flat step list every executor runs.

Each node gets its kernel (the registry's choice for its opset and
provider), prepared once for that node; each value gets a slot in one list.
A step is ``(callable, input slots, first output slot, output slots, slots
to drop after it)``. Slot 0 stays None: omitted optional inputs read it.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import attrs
import numpy as np

from .errors import KernelError, MinferError, UnsupportedOpError
from .graph import Graph, Node, implicit_inputs
from .kernel import Kernel, KernelContext
from .plan import Step, Steps, StepSpec
from .plugins import Registry, provider_hint
from .runloop import StepFailure
from .tensor import MapType, OptionalType, SequenceType, TensorType
from .tuning import node_kernels, prepare, store


@attrs.define
class Program:
    """What build hands an executor: the steps in order, their nodes and kernels, and the value slots."""

    graph: Graph
    registry: Registry
    slots: dict[str, int]
    template: list[Any]  # the initial slot list: initializers in place, everything else None
    specs: list[StepSpec]
    step_nodes: list[Node]
    free_after: list[tuple[int, ...]]
    released: list[str]  # initializers dropped at build because every reader packed its own copy
    observers: list[Any]
    steps: list[Step] = attrs.field(init=False)  # with each step's dead slots dropped after it
    unfreed: list[Step] = attrs.field(init=False)  # keeping every value (``intermediate=True`` runs)
    intermediate: frozenset[int] = attrs.field(init=False)
    graph_outputs: frozenset[int] = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.steps = Steps((sp.fn, sp.ins, sp.outs[0] if sp.outs else 0, sp.outs, free)
                           for sp, free in zip(self.specs, self.free_after))
        self.unfreed = Steps((sp.fn, sp.ins, sp.outs[0] if sp.outs else 0, sp.outs, ()) for sp in self.specs)
        self.intermediate = frozenset(s for sp in self.specs for s in sp.outs if s)
        self.graph_outputs = frozenset(self.slots[n] for n in self.graph.outputs)

    def check_outputs(self, i: int, results: Sequence[Any], shared: frozenset, expect: dict[int, TensorType]) -> None:
        """Step ``i``'s results on a discovery run against the types inferred for them, and against its kernel's
        ``views=False`` (``shared``: the (output, input) pairs sharing memory): a mismatch names the kernel."""
        spec, k = self.specs[i], self.specs[i].kernel
        for j, slot in enumerate(spec.outs):
            why = _mismatch(results[j] if j < len(results) else None, expect.get(slot)) if slot else None
            if k.views is False and any(o == j for o, _ in shared):  # the plan would let the input be overwritten
                why = "memory of an input (it declares views=False)"
            if why:
                raise KernelError(f"{self.step_nodes[i].label}: kernel {k.op_type}-{k.since} from plugin {k.plugin!r} "
                                  f"returned {why} for output {self.step_nodes[i].outputs[j]!r}")

    def failure(self, failure: StepFailure) -> KernelError:
        """The KernelError naming the node of a failed step and its input shapes."""
        node, exc = self.step_nodes[failure.step], failure.__cause__
        return KernelError(f"{node.label} failed on input shapes {failure.shapes}: {type(exc).__name__}: {exc}")


def _mismatch(value: Any, want: Any) -> str | None:
    if isinstance(want, OptionalType):
        return None if value is None else _mismatch(value, want.elem)
    if isinstance(value, list) and (want is None or isinstance(want, SequenceType)):
        # elements' shapes may differ (onnx infers one merged shape for them, not always right): dtypes only
        elem = getattr(want, "elem", None)
        elem = TensorType(elem.dtype) if isinstance(elem, TensorType) else elem
        return next((f"a sequence holding {why}" for v in value for why in [_mismatch(v, elem)] if why), None)
    if isinstance(value, dict) and (want is None or isinstance(want, MapType)):
        return None
    if isinstance(want, (SequenceType, MapType)):
        return f"{type(value).__name__}, not a {'sequence (a list)' if isinstance(want, SequenceType) else 'map (a dict)'}"
    if not isinstance(value, (np.ndarray, np.generic)):
        return f"{type(value).__name__}, not an array"
    if want is None or (value.dtype == want.dtype and want.shape is None):
        return None
    shape_ok = want.shape is None or (len(want.shape) == value.ndim and all(
        not isinstance(d, int) or d == g for d, g in zip(want.shape, value.shape)))
    return None if value.dtype == want.dtype and shape_ok else f"{value.dtype}{list(value.shape)}, inferred {want}"


def bind(graph: Graph, registry: Registry, provider: str, build: dict[str, Any] | None = None) -> Program:
    """Select and prepare a kernel per node (in topological order) and lay the values out in slots.

    ``build``: the Engine options a control-flow kernel builds its subgraphs with (`subgraph_engine`).
    """
    store()  # the stored tuning choices, read now rather than in a first run (a few ms: the file grows with shapes)
    order = graph.topological_order()
    found = [node_kernels(registry, KernelContext.of(n, graph), n.attrs, n.domain, provider) for n in order]
    missing = [n for n, f in zip(order, found) if f is None]
    if missing:
        raise UnsupportedOpError(_missing_message(graph, missing, registry))
    kernels = [f[0] for f in found]  # type: ignore[index]
    slots: dict[str, int] = {}
    template: list[Any] = [None]
    for name, value in graph.initializers.items():
        slots[name] = len(template)
        template.append(value)
    for name in graph.inputs:
        slots.setdefault(name, len(template))
        template.append(None)
    release_after = _packed_release_points(graph, order, kernels)  # type: ignore[arg-type]
    released: list[str] = []
    specs: list[StepSpec] = []
    for i, (node, (kern, candidates)) in enumerate(zip(order, found)):  # type: ignore[misc]
        for out in node.outputs:
            if out:
                slots[out] = len(template)
                template.append(None)
        specs.append(_bind_node(graph, slots, node, kern, candidates, build or {}, registry))
        for name in release_after.get(i, ()):
            # every reader has packed its copy: drop the original now, so build never holds both in full
            value = graph.initializers.pop(name)
            graph.types[name] = TensorType(value.dtype, value.shape)
            template[slots[name]] = None
            released.append(name)
    return Program(graph, registry, slots, template, specs, order, _liveness(graph, slots, order), released,
                   list(registry.observers))


def _bind_node(graph: Graph, slots: dict[str, int], node: Node, kern: Kernel, candidates: list[Kernel],
               build: dict[str, Any], registry: Registry) -> StepSpec:
    ctx = KernelContext.of(node, graph, build)
    inputs = list(node.inputs)
    while inputs and not inputs[-1] and not ctx.outer:
        inputs.pop()
    ins = tuple(slots[n] if n else 0 for n in [*inputs, *ctx.outer])
    outs = tuple(slots[n] if n else 0 for n in node.outputs)
    try:
        fn = prepare(candidates, ctx, node.attrs, registry)
    except MinferError:
        raise
    except Exception as exc:
        raise KernelError(f"{node.label}: kernel {kern.op_type}-{kern.since} from {kern.plugin} failed to prepare: {exc}") from exc
    return StepSpec(kern, fn, ins, outs)


def _liveness(graph: Graph, slots: dict[str, int], order: list[Node]) -> list[tuple[int, ...]]:
    """Per step, the slots whose value nothing reads afterwards (dropped to bound memory)."""
    keep = {slots[n] for n in graph.outputs} | {0}
    keep |= {slots[n] for n in graph.initializers}
    last: dict[int, int] = {}
    for i, node in enumerate(order):
        outer = implicit_inputs(node) if graph.holds_subgraphs(node) else ()
        for name in [*node.inputs, *node.outputs, *outer]:
            if name:
                last[slots[name]] = i
    for name in graph.inputs:
        last.setdefault(slots[name], -1)
    free: list[list[int]] = [[] for _ in order]
    for slot, i in last.items():
        if slot not in keep and i >= 0:
            free[i].append(slot)
    return [tuple(f) for f in free]


def alias_sources(program: Program) -> dict[int, tuple[int, ...]]:
    """Per graph-output slot, the feed and initializer slots its value may be a view of.

    Follows every kernel that may return views (``views`` not False) back
    from the outputs, so the engine checks only the few outputs that can
    alias memory the caller or the model owns.
    """
    graph, slots = program.graph, program.slots
    reach: dict[str, frozenset[str]] = {n: frozenset([n]) for n in list(graph.inputs) + list(graph.initializers)}
    for node, spec in zip(program.step_nodes, program.specs):
        if spec.kernel.views is False:
            continue
        sources = frozenset().union(*(reach.get(i, frozenset()) for i in node.inputs if i))
        if sources:
            reach.update((o, sources) for o in node.outputs if o)
    return {slots[o]: tuple(slots[s] for s in sorted(reach[o])) for o in graph.outputs if o in reach}


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


def opset(graph: Graph, node: Node) -> int:
    """The opset the model imports for the node's domain."""
    return graph.opsets.get(node.domain, 1)


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
