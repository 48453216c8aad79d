"""The Engine: build once (passes, function expansion, inference, kernel binding), run lean.

`InferenceSession` has onnxruntime's call shape, so code written for
onnxruntime runs by changing the import.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Callable, Iterable, Mapping, Sequence

import attrs
import numpy as np

from .errors import BadFeedError, KernelError, MinferError, UnsupportedOpError
from .expand import expand_functions
from .graph import Graph, Node
from .infer import infer_types
from .kernel import DEFAULT_PROVIDER, Kernel, KernelContext
from .onnx_io import ModelSource, elem_type_of, load_model
from .pipeline import PassSelection, optimize
from .plugins import Registry, get_registry, provider_hint
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


Step = tuple[Callable[..., Any], tuple[int, ...], tuple[int, ...]]


class Engine:
    """A built model: a flat list of (callable, input slots, output slots) and the slot table."""

    def __init__(
        self,
        model: ModelSource | Graph,
        *,
        passes: PassSelection = "all",
        disabled_passes: Iterable[str] = (),
        registry: Registry | None = None,
        provider: str = DEFAULT_PROVIDER,
    ) -> None:
        self.registry = registry or get_registry()
        graph = model.copy() if isinstance(model, Graph) else load_model(model)
        graph.validate()
        self.pass_results = optimize(graph, self.registry, passes, disabled_passes)
        expand_functions(graph, self.registry, provider)
        self.inference_failures = infer_types(graph, self.registry)
        self.graph = graph
        self.provider = provider
        self._bind()

    # ---- build -----------------------------------------------------------

    def _bind(self) -> None:
        graph, reg = self.graph, self.registry
        order = graph.topological_order()
        missing = [n for n in order if reg.select_kernel(n.domain, n.op_type, _opset(graph, n), self.provider) is None]
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
        steps: list[Step] = []
        self.step_nodes: list[Node] = []
        for node in order:
            for out in node.outputs:
                if out:
                    self.slots[out] = len(template)
                    template.append(None)
            steps.append(self._bind_node(node))
            self.step_nodes.append(node)
        self._template = template
        self.steps = steps
        self._free_after = self._liveness(order)

    def _bind_node(self, node: Node) -> Step:
        graph = self.graph
        kern = self.registry.select_kernel(node.domain, node.op_type, _opset(graph, node), self.provider)
        assert kern is not None
        inputs = list(node.inputs)
        while inputs and not inputs[-1]:
            inputs.pop()
        ins = tuple(self.slots[n] if n else 0 for n in inputs)
        outs = tuple(self.slots[n] if n else 0 for n in node.outputs)
        try:
            fn = _prepare(kern, node, graph)
        except MinferError:
            raise
        except Exception as exc:
            raise KernelError(f"{node.label}: kernel {kern.op_type}-{kern.since} from {kern.plugin} failed to prepare: {exc}") from exc
        return (fn, ins, outs)

    def _liveness(self, order: list[Node]) -> list[tuple[int, ...]]:
        """Per step, the slots whose value nothing reads afterwards (freed to bound memory)."""
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
        maps every value name computed in this run to its array.
        """
        names = list(self.graph.outputs) if output_names is None else list(output_names)
        for n in names:
            if n not in self.slots:
                raise BadFeedError(f"unknown output {n!r}; the model's outputs are {self.graph.outputs}")
        vals = list(self._template)
        self._check_feeds(feeds, vals)
        free = None if intermediate else self._free_after
        self._execute(vals, free)
        outputs = [vals[self.slots[n]] for n in names]
        if intermediate:
            return outputs, {name: vals[slot] for name, slot in self.slots.items() if vals[slot] is not None}
        return outputs

    def _execute(self, vals: list[Any], free: list[tuple[int, ...]] | None) -> None:
        i = 0
        try:
            for i, (fn, ins, outs) in enumerate(self.steps):
                res = fn(*[vals[s] for s in ins])
                if type(res) is tuple or type(res) is list:
                    for slot, value in zip(outs, res):
                        vals[slot] = value
                    vals[0] = None
                else:
                    vals[outs[0]] = res
                if free is not None:
                    for slot in free[i]:
                        vals[slot] = None
        except MinferError:
            raise
        except Exception as exc:
            node = self.step_nodes[i]
            shapes = [getattr(vals[s], "shape", None) for s in self.steps[i][1]]
            raise KernelError(f"{node.label} failed on input shapes {shapes}: {type(exc).__name__}: {exc}") from exc

    def _check_feeds(self, feeds: Mapping[str, Any], vals: list[Any]) -> None:
        graph = self.graph
        unknown = [n for n in feeds if n not in graph.inputs]
        if unknown:
            raise BadFeedError(f"unknown input name(s) {unknown}; the model's inputs are {graph.inputs}")
        missing = [n for n in graph.inputs if n not in feeds]
        if missing:
            raise BadFeedError(f"missing feed for input(s) {missing}; the model's inputs are {graph.inputs}")
        for name in graph.inputs:
            value = feeds[name]
            if not isinstance(value, np.ndarray):
                value = np.asarray(value)
            _check_feed(name, value, graph.types.get(name))
            vals[self.slots[name]] = value

    def get_inputs(self) -> list[NodeArg]:
        return [_node_arg(n, self.graph.types.get(n)) for n in self.graph.inputs]

    def get_outputs(self) -> list[NodeArg]:
        return [_node_arg(n, self.graph.type_of(n)) for n in self.graph.outputs]


class InferenceSession(Engine):
    """onnxruntime's ``InferenceSession`` call shape over minfer's Engine.

    ``sess_options`` and ``providers`` are accepted for compatibility and ignored.
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
        **_ignored: Any,
    ) -> None:
        super().__init__(path_or_model, passes=passes, disabled_passes=disabled_passes, registry=registry)

    def get_providers(self) -> list[str]:
        return ["CPUExecutionProvider"]


def _opset(graph: Graph, node: Node) -> int:
    return graph.opsets.get(node.domain, 1)


def _check_feed(name: str, value: np.ndarray, declared: TensorType | None) -> None:
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


