"""``expand_fused`` (role "portable"): lower every ai.minfer node back to standard ONNX ops.

``minfer optimize --portable`` runs it after the optimization pipeline, so
the written model uses only standard ops and runs in onnxruntime with the
same outputs. Each fused node becomes the nodes it was made from:

- ``FusedConv/FusedGemm/FusedMatMul`` -> the base op, then ``Add`` of the
  residual Z when FusedConv has one, then the activation when there is one
  (Clip with min/max inputs from opset 11, attributes before it);
- ``BinaryScalar`` -> Add/Sub/Mul/Div with a 0-d initializer;
- ``WeightedSum`` -> Mul, Mul, Add with 0-d initializers;
- ``ChannelAffine`` -> BatchNormalization with mean 0, var 1, epsilon 0 (see `affine`), then the activation;
- ``Gelu`` -> Div by sqrt 2, Erf, Add 1, Mul by X, Mul by 0.5 (see `gelu`);
- ``FusedMatMulBias`` -> MatMul, Add C, [Add Z], [the activation] (see `linear`);
- ``MaskedSoftmax`` -> [Mul/Div by the scalar], [Where], Softmax (see `softmax`).

Exact: it is the reverse of the fusions, computing the same operations.
"""

from __future__ import annotations

import numpy as np

from minfer_core import Graph, Node

from ._util import MINFER_DOMAIN, add_const, fresh
from .activation import activation_nodes
from .affine import expand_channel_affine
from .elementwise import expand_elementwise
from .gelu import expand_gelu
from .linear import expand_matmul_bias
from .lookup import expand_lookup
from .softmax import expand_masked_softmax
from .squeeze_excite import expand_squeeze_excite
from .ops import ARITY, BASE_OPS
from .integer_lower import lower_integer
from .integer_matmul import lower_integer_matmul
from .qdq_ops import lower_quantized


def _expand_fused(graph: Graph, node: Node) -> None:
    attrs = dict(node.attrs)
    act, params = attrs.pop("activation", ""), [float(p) for p in attrs.pop("activation_params", [])]
    base_op = BASE_OPS[node.op_type]
    arity = ARITY[base_op]
    inputs, z = list(node.inputs[:arity]), node.inputs[arity] if len(node.inputs) > arity else ""
    while inputs and not inputs[-1]:
        inputs.pop()
    t = graph.type_of(node.outputs[0])
    stages: list[tuple[str, list[str], dict, str]] = []  # (op, inputs after the running value, attrs, name)
    if z:
        stages.append(("Add", [z], {}, fresh(graph, f"{node.name or node.op_type}_add")))
    if act:
        stages.append(("act", [], {}, fresh(graph, f"{node.name}_act")))
    src = node.outputs[0] if not stages else fresh(graph, f"{node.name or node.op_type}_pre")
    if t is not None and src != node.outputs[0]:
        graph.types[src] = t
    new = [Node(base_op, inputs, [src], attrs, node.name, "")]
    for k, (op, extra, op_attrs, name) in enumerate(stages):
        last = k == len(stages) - 1
        dst = node.outputs[0] if last else fresh(graph, f"{node.name or node.op_type}_sum")
        if t is not None and not last:
            graph.types[dst] = t
        if op == "act":
            new.extend(activation_nodes(graph, act, params, src, dst, name))
        else:
            new.append(Node(op, [src, *extra], [dst], op_attrs, name, ""))
        src = dst
    graph.replace([node], new)


def _expand_scalar(graph: Graph, node: Node) -> None:
    c = add_const(graph, f"{node.name or 'scalar'}_c", np.asarray(node.attrs["scalar"]))
    inputs = [c, node.inputs[0]] if node.attrs.get("reverse", 0) else [node.inputs[0], c]
    graph.replace([node], Node(node.attrs["op"], inputs, node.outputs, {}, node.name, ""))


def _expand_weighted_sum(graph: Graph, node: Node) -> None:
    w = np.asarray(node.attrs["weights"])
    parts, new = [], []
    for i, src in enumerate(node.inputs):
        c = add_const(graph, f"{node.name or 'wsum'}_w{i}", w[i])
        parts.append(fresh(graph, f"{node.name or 'wsum'}_p{i}"))
        new.append(Node("Mul", [src, c], [parts[-1]], {}, fresh(graph, "mul"), ""))
    graph.replace([node], [*new, Node("Add", parts, node.outputs, {}, node.name, "")])


EXPANDERS = {
    "FusedConv": _expand_fused,
    "FusedGemm": _expand_fused,
    "FusedMatMul": _expand_fused,
    "BinaryScalar": _expand_scalar,
    "WeightedSum": _expand_weighted_sum,
    "ChannelAffine": expand_channel_affine,
    "Gelu": expand_gelu,
    "FusedElementwise": expand_elementwise,
    "FusedMatMulBias": expand_matmul_bias,
    "MaskedSoftmax": expand_masked_softmax,
    "Lookup": expand_lookup,
    "SqueezeExcite": expand_squeeze_excite,
}


def expand_fused(graph: Graph) -> bool:
    """Replace every ai.minfer node by the standard ops it stands for."""
    changed = lower_quantized(graph)  # first: the fused ops it leaves without their rounding are expanded below
    changed = lower_integer(graph) or changed
    changed = lower_integer_matmul(graph) or changed
    for node in list(graph.nodes):
        if node.domain == MINFER_DOMAIN and node.op_type in EXPANDERS:
            EXPANDERS[node.op_type](graph, node)
            changed = True
    if changed and not any(n.domain == MINFER_DOMAIN for n in graph.nodes):
        graph.opsets.pop(MINFER_DOMAIN, None)
    return changed
