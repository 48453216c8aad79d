"""Build-time validity checks: a model onnxruntime would refuse is refused here, naming the node.

`check_model` runs on the graph as imported, before any pass, so an error
blames the model and not a pass. It checks what the op schemas of
``onnx.defs`` say about standard-domain nodes (the op exists at the model's
opset, input and output counts, attribute names and types, required
attributes) and the model's opset imports. Types and shapes are checked by
strict shape inference (`infer.infer_types` with ``strict=True``) right
after. Custom-domain nodes are the business of their plugin's ``infer=``.

``InferenceSession(model, strict=False)`` skips all of this (the lenient
build of earlier versions: failures are recorded in ``inference_failures``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import onnx
from onnx import AttributeProto, helper

from .errors import InvalidGraphError
from .graph import Graph, Node

STANDARD_DOMAINS = ("", "ai.onnx.ml", "ai.onnx.preview.training")

# Python values an attribute of each schema type may hold after import (onnx_io.attribute_value).
# An int is accepted for a float attribute: graphs built in Python write alpha=1 and export it as a float.
_ACCEPTS: dict[int, tuple[type, ...]] = {
    int(AttributeProto.INT): (int, np.integer),
    int(AttributeProto.FLOAT): (float, int, np.floating, np.integer),
    int(AttributeProto.STRING): (str, bytes),
    int(AttributeProto.TENSOR): (np.ndarray,),
    int(AttributeProto.GRAPH): (Graph,),
    int(AttributeProto.SPARSE_TENSOR): (np.ndarray,),
}
_LISTS: dict[int, int] = {
    int(AttributeProto.INTS): int(AttributeProto.INT),
    int(AttributeProto.FLOATS): int(AttributeProto.FLOAT),
    int(AttributeProto.STRINGS): int(AttributeProto.STRING),
    int(AttributeProto.TENSORS): int(AttributeProto.TENSOR),
    int(AttributeProto.GRAPHS): int(AttributeProto.GRAPH),
    int(AttributeProto.SPARSE_TENSORS): int(AttributeProto.SPARSE_TENSOR),
}


def check_model(graph: Graph) -> None:
    """Raise InvalidGraphError for what onnxruntime refuses at load: bad opset imports, nodes that break their schema."""
    graph.validate()
    _check_opsets(graph)
    _check_nodes(graph)


def newest_opset(domain: str) -> int:
    """The newest opset of a standard domain that the installed onnx defines."""
    column = {"": 2, "ai.onnx.ml": 3}.get(domain)
    if column is None:
        return max(s.since_version for s in onnx.defs.get_all_schemas_with_history() if s.domain == domain)
    return max(int(row[column]) for row in helper.VERSION_TABLE)


def _check_opsets(graph: Graph) -> None:
    declared = graph.meta.get("opset_import")
    if declared is not None:  # imported from a ModelProto: the Graph itself defaults an empty opset_import
        for node in graph.nodes:
            if node.domain in STANDARD_DOMAINS and node.domain not in declared:
                where = f"domain {node.domain!r}" if node.domain else "the default ONNX domain"
                raise InvalidGraphError(
                    f"{node.label} uses {where}, which the model's opset_import does not import "
                    f"(it imports {declared or 'nothing'}); add an opset_import entry for it")
    for domain, version in graph.opsets.items():
        if domain in STANDARD_DOMAINS and version > newest_opset(domain):
            name = domain or "ai.onnx"
            raise InvalidGraphError(
                f"the model imports opset {version} of {name}, but the newest that exists (onnx {onnx.__version__}) "
                f"is {newest_opset(domain)}; fix the model's opset_import or upgrade onnx")


def _check_nodes(graph: Graph) -> None:
    for node in graph.nodes:
        if node.domain in STANDARD_DOMAINS and onnx.defs.has(node.op_type, node.domain):
            check_node(node, graph.opsets.get(node.domain, 1))
        for value in node.attrs.values():
            for sub in value if isinstance(value, list) else [value]:
                if isinstance(sub, Graph):
                    _check_nodes(sub)


def check_node(node: Node, opset: int) -> None:
    """Check one standard node against its schema at ``opset``: existence, arity, attributes."""
    try:
        schema: Any = onnx.defs.get_schema(node.op_type, opset, node.domain)
    except onnx.defs.SchemaError:
        first = min(s.since_version for s in onnx.defs.get_all_schemas_with_history()
                    if s.name == node.op_type and s.domain == node.domain)
        raise InvalidGraphError(
            f"{node.label}: {node.op_type} exists only from opset {first}, and the model imports opset {opset}"
        ) from None
    _check_count(node, "input", len(node.inputs), schema.min_input, schema.max_input)
    _check_count(node, "output", len(node.outputs), schema.min_output, schema.max_output)
    for name, value in node.attrs.items():
        if name not in schema.attributes:
            raise InvalidGraphError(
                f"{node.label} has attribute {name!r}, which {node.op_type}-{schema.since_version} does not define "
                f"(it defines {sorted(schema.attributes) or 'none'})")
        _check_attribute(node, name, value, int(schema.attributes[name].type))
    absent = sorted(n for n, a in schema.attributes.items() if a.required and n not in node.attrs)
    if absent:
        raise InvalidGraphError(f"{node.label} lacks the required attribute(s) {absent} of {node.op_type}-{schema.since_version}")


def _check_count(node: Node, what: str, count: int, low: int, high: int) -> None:
    if not low <= count <= high:
        allowed = f"{low}" if low == high else f"{low} to {high}" if high < 2**31 - 1 else f"at least {low}"
        raise InvalidGraphError(f"{node.label} has {count} {what}(s); {node.op_type} takes {allowed}")


def _check_attribute(node: Node, name: str, value: Any, kind: int) -> None:
    if kind in _LISTS:
        ok = isinstance(value, (list, tuple)) and all(isinstance(v, _ACCEPTS[_LISTS[kind]]) for v in value)
    else:
        ok = isinstance(value, _ACCEPTS.get(kind, (object,))) and not isinstance(value, (list, tuple))
    if not ok:
        want = AttributeProto.AttributeType.Name(kind)  # type: ignore[arg-type]
        raise InvalidGraphError(
            f"{node.label}: attribute {name!r} must be of type {want}, got {type(value).__name__} {value!r:.60}")
