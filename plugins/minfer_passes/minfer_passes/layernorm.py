"""``layer_norm_fusion``: LayerNorm spelt with ReduceMean, as older exporters write it, as one ``LayerNormalization``.

Pattern (float32 X whose last dim D is a known size, opset 17 or later,
every intermediate read only inside the pattern and no graph output):

    M = ReduceMean(X, axes=[-1], keepdims=1)       (axes [rank-1] too; an input from opset 18)
    E = X - M
    V = ReduceMean(E ** 2 | E * E, axes=[-1], keepdims=1)
    N = E / Sqrt(V + eps)                          (eps a one-element constant, either order)
    Y = N * gamma + beta                           (both optional, constants that broadcast to [D], either order)

Replacement: the standard ``LayerNormalization(X, gamma, beta, axis=-1,
epsilon=eps)`` (gamma ones when absent), so no ``--portable`` lowering is
needed. Not exact: the kernel sums rows in another order (matrix-vector
products) and multiplies by the inverse deviation instead of dividing, so
results move by a few float32 ulps of E / sqrt(V + eps), which a row of
nearly equal values amplifies (declared rtol 1e-4 / atol 1e-5, as the weight
folds). Nine nodes and their passes over the tensor become one kernel
(the real-model encoder's second LayerNorm).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minfer_core import Graph, Node

from ._util import add_const, const, dims_of, dtype_of, has_kernel, is_op, opset, other_input

# ---- the pass ------------------------------------------------------------------------------------


def _scalar(graph: Graph, name: str) -> float | None:
    v = const(graph, name)
    return None if v is None or v.size != 1 else float(v.reshape(()))


def _only(graph: Graph, value: str, *op_types: str) -> Node | None:
    """The sole reader of ``value`` when it is one of ``op_types`` and value is no graph output."""
    node = None if value in graph.outputs else graph.sole_consumer(value)
    return node if is_op(node, *op_types) else None


def _last_axis_mean(graph: Graph, node: Node | None, rank: int) -> bool:
    """``node`` is a ReduceMean over the last axis only, keeping it."""
    if not is_op(node, "ReduceMean") or node.attrs.get("keepdims", 1) != 1:  # type: ignore[union-attr]
        return False
    axes = node.attrs.get("axes") if len(node.inputs) < 2 else const(graph, node.inputs[1])  # type: ignore[union-attr]
    return axes is not None and [int(a) % rank for a in np.asarray(axes).reshape(-1)] == [rank - 1]


def _variance(graph: Graph, e: str, rank: int) -> tuple[list[Node], Node] | None:
    """(the square and ReduceMean nodes, the Div by the deviation) reading E, when E's readers are exactly those."""
    readers = list({id(n): n for n in graph.consumers(e)}.values())  # E * E lists its Mul once per input
    if e in graph.outputs or len(readers) != 2:
        return None
    square = next((n for n in readers if is_op(n, "Pow", "Mul")), None)
    div = next((n for n in readers if is_op(n, "Div") and n.inputs[0] == e and n is not square), None)
    if square is None or div is None:
        return None
    if square.op_type == "Pow" and (square.inputs[0] != e or _scalar(graph, square.inputs[1]) != 2.0):
        return None
    if square.op_type == "Mul" and list(square.inputs) != [e, e]:
        return None
    mean = _only(graph, square.outputs[0], "ReduceMean")
    return ([square, mean], div) if _last_axis_mean(graph, mean, rank) else None  # type: ignore[list-item]


def _deviation(graph: Graph, var: Node, div: Node) -> tuple[list[Node], float] | None:
    """(the Add eps and Sqrt nodes, eps) when ``div`` divides by Sqrt(var + eps)."""
    add = _only(graph, var.outputs[0], "Add")
    eps = _scalar(graph, other_input(add, var.outputs[0]) or "") if add is not None else None
    sqrt = _only(graph, add.outputs[0], "Sqrt") if add is not None else None
    if eps is None or sqrt is None or div.inputs[1] != sqrt.outputs[0] or _only(graph, sqrt.outputs[0], "Div") is not div:
        return None
    return [add, sqrt], eps  # type: ignore[list-item]


def _affine(graph: Graph, value: str, op_type: str, d: int) -> tuple[Node, np.ndarray] | None:
    """(the node, its constant as a [D] vector) when ``value``'s sole reader is ``op_type`` by such a constant."""
    node = _only(graph, value, op_type)
    c = const(graph, other_input(node, value) or "") if node is not None else None
    rank = len(dims_of(graph, value) or ())
    if c is None or c.dtype != np.float32 or c.size not in (1, d) or c.ndim > rank or any(s != 1 for s in c.shape[:-1]):
        return None
    return node, np.broadcast_to(c.reshape(-1), (d,)).copy()  # type: ignore[return-value]


def _match(graph: Graph, mean: Node) -> tuple[list[Node], list[np.ndarray | None], float, str] | None:
    """(the nodes, [gamma, beta], eps, Y) when ``mean`` is the first ReduceMean of the pattern."""
    x = mean.inputs[0] if mean.inputs else ""
    dims = dims_of(graph, x)
    if dims is None or not dims or dims[-1] is None or dtype_of(graph, x) != np.float32:
        return None
    rank, d = len(dims), dims[-1]
    sub = _only(graph, mean.outputs[0], "Sub")
    if not _last_axis_mean(graph, mean, rank) or sub is None or list(sub.inputs) != [x, mean.outputs[0]]:
        return None
    var = _variance(graph, sub.outputs[0], rank)
    dev = _deviation(graph, var[0][1], var[1]) if var is not None else None
    if var is None or dev is None or not math.isfinite(dev[1]) or dev[1] < 0:
        return None
    nodes, y = [mean, sub, *var[0], *dev[0], var[1]], var[1].outputs[0]
    params: list[np.ndarray | None] = [None, None]
    for i, op_type in enumerate(("Mul", "Add")):
        found = _affine(graph, y, op_type, d)
        if found is not None:
            nodes.append(found[0])
            params[i], y = found[1], found[0].outputs[0]
    return nodes, params, dev[1], y


def layer_norm_fusion(graph: Graph) -> bool:
    """Fuse LayerNorm spelt with ReduceMean/Sub/Pow/Sqrt/Div (and scale, shift) into LayerNormalization."""
    if opset(graph) < 17 or not has_kernel(graph, "", "LayerNormalization"):
        return False
    changed = False
    for node in list(graph.nodes):
        if node not in graph.nodes or not is_op(node, "ReduceMean"):
            continue
        found = _match(graph, node)
        if found is None:
            continue
        nodes, (gamma, beta), eps, y = found
        d = dims_of(graph, node.inputs[0])[-1]  # type: ignore[index]
        name = node.name or "layer_norm"
        inputs = [node.inputs[0], add_const(graph, f"{name}_scale", gamma if gamma is not None else np.ones(d, np.float32))]
        if beta is not None:
            inputs.append(add_const(graph, f"{name}_bias", beta))
        graph.replace(nodes, Node("LayerNormalization", inputs, [y], {"axis": -1, "epsilon": eps}, node.name, ""))
        changed = True
    return changed


# ---- property-suite patterns ---------------------------------------------------------------------


def patterns() -> Any:
    """The pass's target strategy: the decomposed LayerNorm in random context.

    Pow or Mul for the square, eps on either side, with or without scale and shift (some of a shape that
    touches another axis), axes as -1 or rank-1, and sometimes an intermediate exposed (nothing fuses).
    """
    from hypothesis import strategies as st

    from minfer_core.testing import GraphBuilder
    from minfer_core.testing.strategies import expose, floats_array, has_kernels

    @st.composite
    def graphs(draw: Any) -> Any:
        b = GraphBuilder(opset=17)
        shape = (*(draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 2)))), draw(st.integers(2, 8)))
        x = b.input(shape)
        rank, d = len(shape), shape[-1]
        axes = [draw(st.sampled_from([-1, rank - 1]))]
        mean = b.op("ReduceMean", x, axes=axes, keepdims=1)
        expose(draw, b, mean)
        e = b.op("Sub", x, mean)
        sq = b.op("Pow", e, b.const(np.float32(2.0))) if draw(st.booleans()) else b.op("Mul", e, e)
        var = b.op("ReduceMean", sq, axes=axes, keepdims=1)
        eps = b.const(np.float32(draw(st.sampled_from([1e-5, 1e-12, 0.1]))))
        std = b.op("Sqrt", b.op("Add", *((var, eps) if draw(st.booleans()) else (eps, var))))
        expose(draw, b, std)
        y = b.op("Div", e, std)
        if draw(st.booleans()):
            gshape = draw(st.sampled_from([(d,), (1, d), (1,), (shape[0], 1)]))
            g = b.const(draw(floats_array(gshape, 0.5, 1.5)))
            y = b.op("Mul", *((y, g) if draw(st.booleans()) else (g, y)))
        if draw(st.booleans()):
            y = b.op("Add", y, b.const(draw(floats_array((d,)))))
        b.output(b.op("Neg", y) if has_kernels("Neg") else y)
        return b.build()

    return graphs()
