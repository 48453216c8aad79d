"""Static shape and dtype inference over a Graph, from the op schemas.

Standard ops use onnx's own per-node inference; custom ops use the ``infer``
of their OpDef. Values known at build time (initializers, Constant outputs,
Shape of a static shape) are fed to onnx's inference so shape arithmetic
resolves. Symbolic dims stay symbolic; what cannot be inferred stays unknown
(None) and is worked out at run time.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np
import onnx
from onnx import helper, numpy_helper

from .graph import Graph, Node
from .onnx_io import _export_node, elem_type_of, type_from_proto
from .plugins import Registry
from .tensor import TensorType


def infer_types(graph: Graph, registry: Registry) -> dict[str, str]:
    """Annotate ``graph.types`` for every node output; returns {node label: reason} where inference failed."""
    known = dict(graph.initializers)
    failures: dict[str, str] = {}
    for node in graph.topological_order():
        try:
            types = _infer_node(graph, node, registry, known, graph.type_of)
        except Exception as exc:  # inference is advisory: the run still computes real shapes
            failures[node.label] = f"{type(exc).__name__}: {exc}"
            continue
        for name, t in zip(node.outputs, types):
            if name and t is not None:
                graph.types[name] = _merge(graph.types.get(name), t)
        _propagate_constant(graph, node, known, graph.type_of)
    return failures


def infer_runtime(
    graph: Graph, registry: Registry, order: Sequence[Node], inputs: Mapping[str, TensorType]
) -> tuple[dict[str, TensorType], dict[str, str]]:
    """Types of every value when the graph inputs have the concrete types ``inputs``.

    Only nodes downstream of an input whose type differs from its build-time
    type are re-inferred through the op schemas; the rest keep their
    build-time types. Returns (types, {node label: reason} for failures);
    a value whose type could not be inferred is absent.
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
            _reinfer(graph, node, registry, known, type_of, types, failures)
            changed.update(o for o in node.outputs if o)
        else:
            types.update((o, graph.types[o]) for o in node.outputs if o and o in graph.types)
        _propagate_constant(graph, node, known, type_of)
    return types, failures


def _reinfer(
    graph: Graph,
    node: Node,
    registry: Registry,
    known: dict[str, np.ndarray],
    type_of: Callable[[str], TensorType | None],
    types: dict[str, TensorType],
    failures: dict[str, str],
) -> None:
    try:
        out = _infer_node(graph, node, registry, known, type_of)
    except Exception as exc:  # advisory: the value is then allocated by its kernel at run time
        failures[node.label] = f"{type(exc).__name__}: {exc}"
        return
    for name, t in zip(node.outputs, out):
        if name and t is not None:
            types[name] = t


def _merge(declared: TensorType | None, inferred: TensorType) -> TensorType:
    if declared is None or declared.shape is None or inferred.shape is None:
        return inferred if declared is None or declared.shape is None else declared
    if len(declared.shape) != len(inferred.shape):
        return inferred
    dims = tuple(i if isinstance(i, int) else (d if d is not None else i) for d, i in zip(declared.shape, inferred.shape))
    return TensorType(inferred.dtype, dims)


def _infer_node(
    graph: Graph,
    node: Node,
    registry: Registry,
    known: dict[str, np.ndarray],
    type_of: Callable[[str], TensorType | None],
) -> list[TensorType | None]:
    in_types = [type_of(n) if n else None for n in node.inputs]
    opdef = registry.op_def(node.domain, node.op_type)
    if opdef is not None and opdef.infer is not None:
        return list(opdef.infer(*in_types, **node.attrs))
    opset = graph.opsets.get(node.domain)
    if opset is None or not onnx.defs.has(node.op_type, node.domain):
        return [None] * len(node.outputs)
    schema = onnx.defs.get_schema(node.op_type, opset, node.domain)
    proto = _export_node(node, graph.opsets)
    types = {n: _type_proto(t) for n, t in zip(node.inputs, in_types) if n and t is not None}
    data = {n: numpy_helper.from_array(known[n], n) for n in node.inputs if n in known and known[n].size <= 1024}
    out = onnx.shape_inference.infer_node_outputs(
        schema, proto, types, data, opset_imports=[helper.make_opsetid(d, v) for d, v in graph.opsets.items()]
    )
    return [type_from_proto(out[n]) if n in out else None for n in node.outputs]


def _type_proto(t: TensorType) -> onnx.TypeProto:
    shape: Any = None if t.shape is None else list(t.shape)
    return helper.make_tensor_type_proto(elem_type_of(t.dtype), shape)


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
