"""Static shape and dtype inference over a Graph, from the op schemas.

Standard ops use onnx's own per-node inference; custom ops use the ``infer``
of their OpDef. Values known at build time (initializers, Constant outputs,
Shape of a static shape) are fed to onnx's inference so shape arithmetic
resolves. Symbolic dims stay symbolic; what cannot be inferred stays unknown
(None) and is worked out at run time.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .errors import ShapeInferenceError
from .graph import Graph, Node
from .kernel import OpDef
from .onnx_io import _export_node, type_from_proto, type_to_proto
from .plugins import Registry
from .tensor import TensorType


def infer_types(graph: Graph, registry: Registry, *, strict: bool = False) -> dict[str, str]:
    """Annotate ``graph.types`` for every node output; returns {node label: reason} where inference failed.

    With ``strict`` a node whose inputs contradict its op schema (onnx's
    inference refuses it) is a ShapeInferenceError naming the node, and so is
    a plugin's ``infer=`` that raises (naming the op and the plugin).
    Otherwise, and for anything else that stops inference, the failure is
    recorded: the run then computes the real shapes.
    """
    known = dict(graph.initializers)
    failures: dict[str, str] = {}
    for node in graph.topological_order():
        try:
            types = _infer_node(graph, node, registry, known, graph.type_of)
        except (ShapeInferenceError, onnx.shape_inference.InferenceError, onnx.checker.ValidationError) as exc:
            if strict and isinstance(exc, ShapeInferenceError):
                raise
            if strict:
                raise ShapeInferenceError(f"{node.label} (opset {graph.opsets.get(node.domain, '?')}): {exc}") from exc
            failures[node.label] = f"{type(exc).__name__}: {exc}"
            continue
        except Exception as exc:  # inference is advisory: the run still computes real shapes
            failures[node.label] = f"{type(exc).__name__}: {exc}"
            continue
        for name, t in zip(node.outputs, types):
            if name and t is not None:
                graph.types[name] = _merge(graph.types.get(name), t)
        _propagate_constant(graph, node, known, graph.type_of)
    return failures


def infer_runtime(
    graph: Graph, registry: Registry, order: Sequence[Node], inputs: Mapping[str, TensorType],
    protos: dict[int, onnx.NodeProto] | None = None,
) -> tuple[dict[str, TensorType], dict[str, str]]:
    """Types of every value when the graph inputs have the concrete types ``inputs``.

    Only nodes downstream of an input whose type differs from its build-time
    type are re-inferred: through a standard op's ``infer=`` when its plugin
    declares one, else the op schemas. Returns (types, {node label: reason}
    for failures); a value whose type could not be inferred is absent.
    ``protos``: the nodes exported for onnx, kept by the caller between calls
    (the nodes of ``order`` must not change meanwhile).
    """
    types: dict[str, TensorType] = {}
    changed = {n for n, t in inputs.items() if graph.types.get(n) != t}
    types.update(inputs)

    def type_of(name: str) -> TensorType | None:
        t = types.get(name)
        return t if t is not None else graph.type_of(name)

    known = dict(graph.initializers)
    failures: dict[str, str] = {}
    for node in order:
        if any(n in changed for n in node.inputs if n):
            changed.update(o for o in node.outputs if o)
            try:  # fast: a standard op's infer= first
                out = _infer_node(graph, node, registry, known, type_of, protos, True)
            except Exception as exc:  # advisory: the value is then allocated by its kernel at run time
                failures[node.label] = f"{type(exc).__name__}: {exc}"
                out = []
            types.update((name, t) for name, t in zip(node.outputs, out) if name and t is not None)
        else:
            types.update((o, graph.types[o]) for o in node.outputs if o and o in graph.types)
        _propagate_constant(graph, node, known, type_of)
    return types, failures


def _merge(declared: TensorType | None, inferred: TensorType) -> TensorType:
    if not isinstance(declared, TensorType) or not isinstance(inferred, TensorType) or declared.shape is None:
        return inferred
    if inferred.shape is None or len(declared.shape) != len(inferred.shape):
        return declared if inferred.shape is None else inferred
    dims = tuple(i if isinstance(i, int) else (d if d is not None else i) for d, i in zip(declared.shape, inferred.shape))
    return TensorType(inferred.dtype, dims)


def _infer_node(
    graph: Graph,
    node: Node,
    registry: Registry,
    known: dict[str, np.ndarray],
    type_of: Callable[[str], TensorType | None],
    protos: dict[int, onnx.NodeProto] | None = None,
    fast: bool = False,
) -> list[TensorType | None]:
    in_types = [type_of(n) if n else None for n in node.inputs]
    opdef = registry.op_def(node.domain, node.op_type)
    if opdef is not None and opdef.infer is not None and (fast or not opdef.standard):
        out = _custom_infer(node, opdef, in_types)
        if out is not None:  # a standard op's infer= is a fast path: None leaves the node to its schema
            return out
    opset = graph.opsets.get(node.domain)
    if opset is None or not onnx.defs.has(node.op_type, node.domain):
        return [None] * len(node.outputs)
    schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    protos = {} if protos is None else protos
    proto = protos.get(id(node))
    if proto is None:  # exporting is a third of a node's inference: a new input shape re-infers the same nodes
        proto = protos[id(node)] = _export_node(node, graph.opsets)
    types = {n: type_to_proto(t) for n, t in zip(node.inputs, in_types) if n and t is not None}
    data = {n: _small_proto(known[n], n) for n in node.inputs if n in known and known[n].size <= 1024}
    opsets = _opset_ids(tuple(sorted(graph.opsets.items())))
    out = onnx.shape_inference.infer_node_outputs(schema, proto, types, data, opset_imports=opsets)
    return [type_from_proto(out[n]) if n in out else None for n in node.outputs]


_PROTOS: dict[tuple[int, str], tuple[np.ndarray, onnx.TensorProto]] = {}


def _small_proto(value: np.ndarray, name: str) -> onnx.TensorProto:
    """``value`` as a TensorProto, converted once per array (a constant feeds every node that reads it)."""
    key = (id(value), name)
    hit = _PROTOS.get(key)
    if hit is None or hit[0] is not value:  # the array is kept in the entry, so its id is not reused meanwhile
        if len(_PROTOS) >= 256:  # small arrays only (<= 1024 elements): at most ~2 MB held
            _PROTOS.clear()
        hit = _PROTOS[key] = (value, numpy_helper.from_array(value, name))
    return hit[1]


@functools.lru_cache(maxsize=64)
def _opset_ids(opsets: tuple[tuple[str, int], ...]) -> list[onnx.OperatorSetIdProto]:
    return [helper.make_opsetid(d, v) for d, v in opsets]


def _custom_infer(node: Node, opdef: OpDef, in_types: list[TensorType | None]) -> list[TensorType | None] | None:
    """A plugin's ``infer=``: what it raises is the plugin's bug or the node's fault, named either way."""
    assert opdef.infer is not None
    try:
        out = opdef.infer(*in_types, **node.attrs)
        return None if out is None and opdef.standard else list(out)
    except Exception as exc:
        raise ShapeInferenceError(
            f"{node.label}: the infer= of op {opdef.op_type} from plugin {opdef.plugin!r} raised "
            f"{type(exc).__name__}: {exc} (input types {[str(t) if t else None for t in in_types]})"
        ) from exc


def _propagate_constant(
    graph: Graph, node: Node, known: dict[str, np.ndarray], type_of: Callable[[str], TensorType | None]
) -> None:
    if node.op_type == "Constant" and node.domain == "" and "value" in node.attrs:
        known[node.outputs[0]] = np.asarray(node.attrs["value"])
    elif node.op_type == "Shape" and node.domain == "":
        t = type_of(node.inputs[0])
        if t is not None and t.is_static:
            shape = np.array(t.shape, dtype=np.int64)
            start, end = node.attrs.get("start", 0), node.attrs.get("end", None)
            known[node.outputs[0]] = shape[start:end]
