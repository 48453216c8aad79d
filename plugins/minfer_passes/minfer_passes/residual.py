"""Residual fusion: ``act(Conv(X, W, B) + Z)`` (a ResNet block's tail) as one ``ai.minfer::FusedConv``.

Pattern: a Conv (or a FusedConv with neither residual nor activation) whose
output's only reader is an ``Add`` or a two-input ``Sum`` with another value
``Z`` of exactly the Conv output's static shape and dtype, optionally
followed by an activation (Relu, LeakyRelu, Clip, Sigmoid, HardSigmoid,
HardSwish, Tanh: see `activation`) that is the Add's only reader. Neither the
Conv output nor the Add output may be a graph output or have another reader
(then the pattern stops before that value: Conv+Add fuse without the
activation when the sum is read elsewhere). A FusedConv that already has a
residual and no activation takes a following activation the same way.
Replacement: ``FusedConv(X, W, B, Z)`` with the Conv's attributes, plus
``activation``/``activation_params`` when an activation was fused; it is put
where the last fused node was, since Z may be computed after the Conv.

Broadcasting: Add and Sum broadcast (numpy rules); the fused kernel adds Z
into the Conv's output buffer, which only equals Add when Z has exactly the
output's shape, so any other shape (a per-channel bias is affine_fusion's
job; a larger Z would grow the output) and any unknown dim leave the graph
alone. A symbolic dim (``"N"``) matches only a dim of the same name.

Exact up to float rounding: the kernel adds Z to the same Conv result the
standalone Add would read (identical rounding), then applies the same
activation formula in place as activation_fusion does (rtol 1e-5 / atol 1e-6,
for activations other than Relu). Only float graphs, and only when kernels
for FusedConv and Conv exist.
"""

from __future__ import annotations

from minfer_core import Graph, Node

from ._util import FLOATS, MINFER_DOMAIN, dtype_of, has_kernel, same_shape
from .activation import ACTIVATIONS, _params


def _base(graph: Graph, node: Node) -> bool:
    """A Conv, or a FusedConv that has no activation yet (with or without a residual)."""
    if len(node.outputs) != 1 or dtype_of(graph, node.outputs[0]) not in FLOATS:
        return False
    if node.domain == "" and node.op_type == "Conv":
        return has_kernel(graph, "", "Conv")
    return node.domain == MINFER_DOMAIN and node.op_type == "FusedConv" and not node.attrs.get("activation")


def _residual(graph: Graph, y: str) -> tuple[Node, str] | None:
    """The Add/Sum reading ``y`` alone and the other operand Z, when Z surely has y's shape (`same_shape`) and dtype."""
    add = graph.sole_consumer(y)
    if add is None or add.domain or add.op_type not in ("Add", "Sum") or len(add.inputs) != 2:
        return None
    z = add.inputs[1] if add.inputs[0] == y else add.inputs[0]
    if not z or not same_shape(graph, y, z) or dtype_of(graph, z) != dtype_of(graph, y):
        return None
    return add, z


def _step(graph: Graph, node: Node) -> bool:
    inputs = list(node.inputs)
    has_z = len(inputs) > 3 and bool(inputs[3])
    fused: list[Node] = [node]
    end = node.outputs[0]
    if not has_z:
        found = _residual(graph, end)
        if found is None:
            return False
        add, z = found
        inputs = (inputs + ["", ""])[:3] + [z]
        fused.append(add)
        end = add.outputs[0]
    attrs = dict(node.attrs)
    act = graph.sole_consumer(end)
    params = _params(graph, act) if act is not None and not act.domain and act.op_type in ACTIVATIONS else None
    if act is not None and params is not None and act.inputs[0] == end:
        attrs.update(activation=act.op_type, activation_params=params)
        fused.append(act)
        end = act.outputs[0]
    elif has_z:
        return False  # already fused, and no activation to take
    new = Node("FusedConv", inputs, [end], attrs, node.name, MINFER_DOMAIN)
    graph.opsets.setdefault(MINFER_DOMAIN, 1)
    graph.replace(fused, new)  # where the last of them stood: after Z's producer
    return True


def conv_residual_fusion(graph: Graph) -> bool:
    """Fuse Conv + Add/Sum of a same-shape residual (+ an activation) into one ai.minfer::FusedConv."""
    if not has_kernel(graph, MINFER_DOMAIN, "FusedConv"):
        return False
    changed = False
    for node in list(graph.nodes):
        if node in graph.nodes and _base(graph, node) and _step(graph, node):
            changed = True
    return changed
