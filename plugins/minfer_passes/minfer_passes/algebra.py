"""Algebraic rewrites of elementwise arithmetic with constants.

- ``scalar_binary``: ``Add/Sub/Mul/Div(x, c)`` or ``(c, x)`` where ``c`` is a
  one-element float constant of x's dtype whose rank does not exceed x's
  (so broadcasting cannot change the output shape) becomes
  ``ai.minfer::BinaryScalar(x; op, scalar=c, reverse)``. Exact: the same
  numpy operation on the same values.
- ``weighted_sum_fusion``: ``Add(Mul(A, c0), Mul(B, c1))`` with one-element
  float constants c0, c1 (either operand order), each Mul read only by the
  Add, becomes ``ai.minfer::WeightedSum(A, B; weights=[c0, c1])``. Exact: the
  kernel rounds both products to the dtype before adding, as the three
  nodes did. A and B must have c's dtype and a known rank at least c's.
"""

from __future__ import annotations

import numpy as np

from minfer_core import Graph, Node

from ._util import FLOATS, MINFER_DOMAIN, const, is_op

BINARY = ("Add", "Sub", "Mul", "Div")


def _scalar_operand(graph: Graph, node: Node, value_index: int) -> np.ndarray | None:
    """The one-element constant at the other input of ``node``, when it is safe to treat as a scalar."""
    c = const(graph, node.inputs[1 - value_index])
    t = graph.type_of(node.inputs[value_index])
    if c is None or c.size != 1 or t is None or t.rank is None or c.ndim > t.rank:
        return None
    if c.dtype != t.dtype or c.dtype not in FLOATS:
        return None
    return np.asarray(c.reshape(()))


def scalar_binary(graph: Graph) -> bool:
    """Turn Add/Sub/Mul/Div by a scalar constant into ai.minfer::BinaryScalar."""
    changed = False
    for node in list(graph.nodes):
        if not is_op(node, *BINARY) or len(node.inputs) != 2:
            continue
        for index in (0, 1):
            if const(graph, node.inputs[index]) is not None:
                continue
            c = _scalar_operand(graph, node, index)
            if c is None:
                continue
            attrs = {"op": node.op_type, "scalar": c, "reverse": int(index == 1)}
            fused = Node("BinaryScalar", [node.inputs[index]], node.outputs, attrs, node.name, MINFER_DOMAIN)
            graph.opsets.setdefault(MINFER_DOMAIN, 1)
            graph.replace([node], fused)
            changed = True
            break
    return changed


def _scaled(graph: Graph, value: str, add: Node) -> tuple[Node, str, np.ndarray] | None:
    mul = graph.producer(value)
    if not is_op(mul, "Mul") or graph.sole_consumer(value) is not add:
        return None
    for index in (0, 1):
        if const(graph, mul.inputs[index]) is None:
            c = _scalar_operand(graph, mul, index)
            if c is not None:
                return mul, mul.inputs[index], c
    return None


def weighted_sum_fusion(graph: Graph) -> bool:
    """Fuse A*c0 + B*c1 (scalar constants) into ai.minfer::WeightedSum."""
    changed = False
    for add in list(graph.nodes):
        if not is_op(add, "Add") or add not in graph.nodes or len(add.inputs) != 2 or add.inputs[0] == add.inputs[1]:
            continue
        left, right = _scaled(graph, add.inputs[0], add), _scaled(graph, add.inputs[1], add)
        if left is None or right is None or left[2].dtype != right[2].dtype:
            continue
        weights = np.array([left[2], right[2]], dtype=left[2].dtype)
        fused = Node("WeightedSum", [left[1], right[1]], add.outputs, {"weights": weights}, add.name, MINFER_DOMAIN)
        graph.opsets.setdefault(MINFER_DOMAIN, 1)
        graph.replace([left[0], right[0], add], fused)
        changed = True
    return changed
