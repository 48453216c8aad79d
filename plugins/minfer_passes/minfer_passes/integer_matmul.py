"""``integer_matmul_fusion``: a dynamically quantized linear layer as one ``ai.minfer::ScaledMatMulInteger``.

onnxruntime's quantize_dynamic writes each linear layer as DynamicQuantizeLinear(x) -> MatMulInteger(x_q, W_q,
x_zp, w_zp) -> Cast(float32) -> Mul(x_scale * w_scale) -> Add(bias): the int32 product, its float copy and the
scaled copy are each a pass over the output, and the quantized x one over the input (integer.py's ScaledConvInteger
is the conv analogue). Pattern, never through a graph output nor a value another node reads:

- a MatMulInteger read only by a Cast to float32, read only by a Mul by one float32 element (no broadcast beyond
  the output's rank): ``ScaledMatMulInteger(a, b, a_zero_point, b_zero_point, scale)`` (minfer-ops-basic's
  kernel rounds the exact integers to float32 as Cast does and multiplies them as the Mul does);
- its output read only by an Add of a float32 constant that broadcasts into it without growing it: the bias, the
  node's input 5, added in its epilogue;
- the DynamicQuantizeLinear whose outputs only it reads (the scale through a Mul by a float32 one-element
  constant): the node takes the float input (``dynamic_input``), its zero point input empty and its scale input
  that constant; the kernel quantizes x while centering it for the product. A DynamicQuantizeLinear several
  layers read (a transformer's Q, K, V) stays, each layer's node reading its outputs.

Exact: the same float32 operations in the same order (see minfer_ops_basic/qmatmul.py). ``--portable`` lowers
the node back to the standard ops (`lower_integer_matmul`).
"""

from __future__ import annotations

import numpy as np

from minfer_core import Graph, Node

from ._util import MINFER_DOMAIN, add_const, broadcasts_into, const, dims_of, fresh, has_kernel
from .integer_lower import lowered_scaled

SCALED = "ScaledMatMulInteger"


def integer_matmul_fusion(graph: Graph) -> bool:
    """MatMulInteger -> Cast to float32 -> Mul by one float32 value [-> Add of a constant bias] as one
    ScaledMatMulInteger, with the DynamicQuantizeLinear only it reads inside."""
    if not has_kernel(graph, MINFER_DOMAIN, SCALED):
        return False
    fused = _scaled(graph)
    fused = _biases(graph) or fused
    return _dynamic_inputs(graph) or fused


def _sole(graph: Graph, value: str, op_type: str) -> Node | None:
    """The standard ``op_type`` node alone reading ``value`` (once), ``value`` no graph output."""
    node = graph.sole_consumer(value)
    if node is None or node.domain or node.op_type != op_type or value in graph.outputs:
        return None
    return node if node.inputs.count(value) == 1 else None


def _one_float(graph: Graph, name: str, rank: int) -> bool:
    """Whether ``name`` is one float32 element that does not broadcast beyond ``rank`` dims."""
    t = graph.type_of(name)
    if t is None or t.dtype != np.float32 or t.shape is None or len(t.shape) > rank:
        return False
    return all(d == 1 for d in t.shape)


def _scaled(graph: Graph) -> bool:
    changed = False
    for mm in list(graph.nodes):
        if mm.domain or mm.op_type != "MatMulInteger" or len(mm.outputs) != 1:
            continue
        cast = _sole(graph, mm.outputs[0], "Cast")
        mul = _sole(graph, cast.outputs[0], "Mul") if cast is not None and cast.attrs.get("to") == 1 else None
        dims = dims_of(graph, mm.outputs[0])
        if mul is None or dims is None or len(mul.inputs) != 2:
            continue
        scale = mul.inputs[1] if mul.inputs[0] == cast.outputs[0] else mul.inputs[0]
        if not _one_float(graph, scale, len(dims)):
            continue
        inputs = (list(mm.inputs) + [""] * 4)[:4] + [scale]
        graph.opsets.setdefault(MINFER_DOMAIN, 1)
        graph.replace([mm, cast, mul], Node(SCALED, inputs, list(mul.outputs), {}, mm.name, MINFER_DOMAIN))
        changed = True
    return changed


def _biases(graph: Graph) -> bool:
    changed = False
    for node in list(graph.nodes):
        if node.domain != MINFER_DOMAIN or node.op_type != SCALED or len(node.inputs) != 5:
            continue
        add, dims = _sole(graph, node.outputs[0], "Add"), dims_of(graph, node.outputs[0])
        if add is None or dims is None or len(add.inputs) != 2:
            continue
        name = add.inputs[1] if add.inputs[0] == node.outputs[0] else add.inputs[0]
        bias = const(graph, name)
        if bias is None or bias.dtype != np.float32 or not broadcasts_into(bias.shape, dims):
            continue
        graph.replace([node, add], Node(SCALED, [*node.inputs, name], list(add.outputs), dict(node.attrs), node.name,
                                        MINFER_DOMAIN))
        changed = True
    return changed


def _dynamic_producer(graph: Graph, node: Node) -> tuple[Node, Node, str] | None:
    """The DynamicQuantizeLinear whose outputs only ``node`` reads (q, zero point; the scale through a Mul by a
    float32 one-element constant whose product only ``node`` reads, as its scale), that Mul and its constant."""
    dql = graph.producer(node.inputs[0])
    if dql is None or dql.domain or dql.op_type != "DynamicQuantizeLinear" or len(dql.outputs) != 3:
        return None
    xq, xs, xz = dql.outputs
    t = graph.type_of(dql.inputs[0])
    if t is None or t.dtype != np.float32 or any(v in graph.outputs for v in dql.outputs):
        return None
    if node.inputs[0] != xq or node.inputs[2] != xz:  # q as A, its zero point as A's
        return None
    if any(graph.sole_consumer(v) is not node or node.inputs.count(v) != 1 for v in (xq, xz)):
        return None
    mul = _sole(graph, xs, "Mul")
    if mul is None or len(mul.inputs) != 2 or mul.outputs[0] != node.inputs[4]:
        return None
    if graph.sole_consumer(mul.outputs[0]) is not node or node.inputs.count(mul.outputs[0]) != 1:
        return None
    if mul.outputs[0] in graph.outputs:
        return None
    factor = mul.inputs[1] if mul.inputs[0] == xs else mul.inputs[0]
    value = const(graph, factor)
    ok = value is not None and value.dtype == np.float32 and value.size == 1
    return (dql, mul, factor) if ok else None


def _dynamic_inputs(graph: Graph) -> bool:
    changed = False
    for node in list(graph.nodes):
        if node.domain != MINFER_DOMAIN or node.op_type != SCALED or node.attrs.get("dynamic_input"):
            continue
        found = _dynamic_producer(graph, node)
        if found is None:
            continue
        dql, mul, factor = found
        inputs = [dql.inputs[0], node.inputs[1], "", node.inputs[3], factor, *node.inputs[5:]]
        graph.replace([dql, mul, node], Node(SCALED, inputs, list(node.outputs), {**node.attrs, "dynamic_input": 1},
                                             node.name, MINFER_DOMAIN))
        changed = True
    return changed


def lower_integer_matmul(graph: Graph) -> bool:
    """--portable: each ScaledMatMulInteger back to [DynamicQuantizeLinear, Mul ->] MatMulInteger -> Cast -> Mul
    [-> Add]."""
    changed = False
    for node in list(graph.nodes):
        if node.domain == MINFER_DOMAIN and node.op_type == SCALED:
            graph.replace([node], _lowered(graph, node))
            changed = True
    return changed


def _lowered(graph: Graph, node: Node) -> list[Node]:
    name = node.name or "matmul_integer"
    bias = node.inputs[5] if len(node.inputs) > 5 and node.inputs[5] else None
    scaled = fresh(graph, f"{name}_scaled") if bias else node.outputs[0]
    new = lowered_scaled(graph, node, "MatMulInteger", {}, bool(node.attrs.get("dynamic_input")), scaled, name)
    if bias:
        new.append(Node("Add", [scaled, bias], list(node.outputs), {}, fresh(graph, f"{name}_bias")))
    return new


# the property suite's target strategy (declared as minfer_passes.integer_matmul:patterns)
from .integer_matmul_patterns import patterns  # noqa: E402,F401
