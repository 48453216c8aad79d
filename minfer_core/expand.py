"""ONNX function expansion: a node with no kernel whose op has a function body runs as that body.

Bodies come from the model's local functions or from ``onnx.defs`` (plain or
context-dependent bodies, which need the node's input types). Expansion
continues into the inlined nodes, so a body may use ops that are themselves
functions, nested to any depth; a function that calls itself is refused as
recursion. A kernel, when one exists, always wins over expansion.
"""

from __future__ import annotations

from typing import Any

import onnx
from onnx import helper

from .errors import InvalidGraphError
from .graph import Graph, Node
from .onnx_io import _export_node, _import_node, elem_type_of
from .plugins import Registry

def expand_functions(graph: Graph, registry: Registry, provider: str) -> int:
    """Inline function bodies for kernel-less nodes, to any depth (subgraphs too); returns how many expanded.

    Each inlined node remembers the chain of functions it came from; a node
    whose function is already on its own chain is a recursive function,
    refused as such (an InvalidGraphError naming the chain). A context-
    dependent body needs its inputs' types: a node whose types are not yet
    known is left for the next call, after inference (see `build.build_graph`).
    """
    total = 0
    chains: dict[int, tuple[str, ...]] = {}
    pending = list(graph.nodes)
    while pending:
        node = pending.pop()
        opset = graph.opsets.get(node.domain, 1)
        if registry.select_kernel(node.domain, node.op_type, opset, provider) is not None:
            continue
        body = function_body(graph, node)
        if body is None:
            continue
        key = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
        chain = chains.pop(id(node), ())
        if key in chain:
            raise InvalidGraphError(
                f"{node.label}: function {key} calls itself ({' -> '.join(chain[chain.index(key):] + (key,))}); "
                "a recursive function cannot be inlined, and ONNX functions may not recurse")
        added = inline(graph, node, body)
        chains.update((id(n), chain + (key,)) for n in added)
        pending.extend(added)
        total += 1
    for sub in graph.subgraphs():
        total += expand_functions(sub, registry, provider)
    return total


def function_body(graph: Graph, node: Node) -> onnx.FunctionProto | None:
    """The FunctionProto node's op expands to, or None when it has none."""
    for fn in graph.meta.get("functions", ()):
        if fn.name == node.op_type and (fn.domain or "") == node.domain:
            return fn
    opset = graph.opsets.get(node.domain)
    if opset is None or not onnx.defs.has(node.op_type, node.domain):
        return None
    schema: Any = onnx.defs.get_schema(node.op_type, opset, node.domain)  # onnx's stubs lack the function APIs
    plain = [v for v in schema.function_opset_versions if v <= opset]
    contextual = [v for v in schema.context_dependent_function_opset_versions if v <= opset]
    if contextual and (not plain or max(contextual) >= max(plain)):
        return _contextual_body(graph, node, schema, max(contextual))
    if plain:
        return onnx.FunctionProto.FromString(schema.get_function_with_opset_version(max(plain)))
    return None


def _contextual_body(graph: Graph, node: Node, schema: Any, version: int) -> onnx.FunctionProto | None:
    types = []
    for name in node.inputs:
        t = graph.type_of(name) if name else None
        if name and t is None:
            return None  # the body depends on input types we do not know yet
        shape = None if t is None or t.shape is None else list(t.shape)
        types.append(helper.make_tensor_type_proto(elem_type_of(t.dtype), shape) if t else onnx.TypeProto())
    proto = _export_node(node, graph.opsets)
    raw = schema.get_context_dependent_function_with_opset_version(
        version, proto.SerializeToString(), [t.SerializeToString() for t in types]
    )
    return onnx.FunctionProto.FromString(raw) if raw else None


def inline(graph: Graph, node: Node, body: onnx.FunctionProto) -> list[Node]:
    """Replace ``node`` by the nodes of ``body``, renaming the body's values apart; returns the new nodes."""
    rename: dict[str, str] = {"": ""}
    for formal, actual in zip(body.input, node.inputs):
        rename[formal] = actual
    for formal in body.input[len(node.inputs) :]:
        rename[formal] = ""
    for formal, actual in zip(body.output, node.outputs):
        rename[formal] = actual
    attrs = _attribute_values(graph, node, body)
    prefix = f"{node.name or node.op_type}/"
    index = graph.nodes.index(node)
    graph.remove_node(node)
    added = []
    for inner in body.node:
        for out in inner.output:
            if out not in rename:
                rename[out] = graph.unique_name(prefix + out)
        new = _instantiate(inner, rename, attrs, graph)
        new.name = graph.unique_name(prefix + (inner.name or inner.op_type))
        added.append(graph.add_node(new, index))
        index += 1
    return added


def _attribute_values(graph: Graph, node: Node, body: onnx.FunctionProto) -> dict[str, onnx.AttributeProto]:
    """Attribute protos that ``ref_attr_name`` references resolve to: the node's, else defaults."""
    values: dict[str, onnx.AttributeProto] = {a.name: a for a in body.attribute_proto}
    if onnx.defs.has(node.op_type, node.domain):
        schema = onnx.defs.get_schema(node.op_type, graph.opsets.get(node.domain, 1), node.domain)
        for name, attr in schema.attributes.items():
            if attr.default_value is not None and attr.default_value.type != 0:
                values[name] = attr.default_value
    for attr in _export_node(node, graph.opsets).attribute:
        values[attr.name] = attr
    return values


def _instantiate(inner: onnx.NodeProto, rename: dict[str, str], attrs: dict[str, onnx.AttributeProto], graph: Graph) -> Node:
    proto = onnx.NodeProto()
    proto.CopyFrom(inner)
    del proto.attribute[:]
    for attr in inner.attribute:
        if attr.ref_attr_name:
            if attr.ref_attr_name not in attrs:
                continue  # an optional attribute the caller did not set
            resolved = onnx.AttributeProto()
            resolved.CopyFrom(attrs[attr.ref_attr_name])
            resolved.name = attr.name
            proto.attribute.append(resolved)
        else:
            proto.attribute.append(attr)
    proto.input[:] = [rename.get(n, n) for n in inner.input]
    proto.output[:] = [rename[n] for n in inner.output]
    return _import_node(proto, graph.opsets, None)
