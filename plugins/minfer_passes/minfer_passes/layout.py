"""Layout passes: chains of data-movement ops collapsed.

- ``transpose_merge``: ``Transpose(p2)(Transpose(p1)(x))`` becomes one
  ``Transpose(p)(x)`` with ``p[i] = p1[p2[i]]``, or nothing when ``p`` is the
  identity. Exact: it moves the same elements. The inner Transpose must have
  explicit perms and the outer must be its only reader.
- ``reshape_merge``: a Reshape with a constant target shape reading another
  view op (Reshape, Flatten, Squeeze, Unsqueeze) reads that op's input
  instead. Exact when the target has no 0 entries (0 copies a dim from its
  input, which would change meaning): the result of a Reshape then depends
  only on the element count and order, which views preserve. The bypassed
  view is left for dead code elimination if nothing else reads it.
- ``global_pool_flatten``: ``GlobalAveragePool``/``GlobalMaxPool`` followed by
  ``Flatten(axis=1)`` or a Reshape to ``[N, C]`` becomes one
  ``ReduceMean``/``ReduceMax`` over the spatial axes with ``keepdims=0``: the
  Flatten is a no-op for the consumer once the reduction drops the 1x1 axes.
  Exact for Max; for Mean the reduction order may differ (float rounding).
"""

from __future__ import annotations

import numpy as np

from minfer_core import Graph, Node

from ._util import const, has_kernel, is_op, opset, replace, shape_of, sole_consumer

VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def transpose_merge(graph: Graph) -> bool:
    """Merge or cancel consecutive Transposes."""
    changed = False
    for outer in list(graph.nodes):
        if not is_op(outer, "Transpose") or outer not in graph.nodes:
            continue
        inner = graph.producer(outer.inputs[0])
        if not is_op(inner, "Transpose") or sole_consumer(graph, inner.outputs[0]) is not outer:
            continue
        p1, p2 = inner.attrs.get("perm"), outer.attrs.get("perm")
        if p1 is None or p2 is None or len(p1) != len(p2):
            continue
        perm = [int(p1[i]) for i in p2]
        merged = Node("Transpose", [inner.inputs[0]], outer.outputs, {"perm": perm}, outer.name, "")
        replace(graph, [inner, outer], merged)
        if perm == list(range(len(perm))):
            _drop_identity(graph, merged)
        changed = True
    return changed


def _drop_identity(graph: Graph, node: Node) -> None:
    from ._util import bypass

    if not bypass(graph, node, node.inputs[0]):
        graph.remove_node(node)  # an interface value must keep a producer: keep a plain Identity
        graph.add_node(Node("Identity", node.inputs, node.outputs, {}, node.name, ""))


def reshape_merge(graph: Graph) -> bool:
    """Let a Reshape with a constant zero-free shape read through preceding view ops."""
    changed = False
    for node in list(graph.nodes):
        if not is_op(node, "Reshape") or len(node.inputs) < 2:
            continue
        target = const(graph, node.inputs[1])
        if target is None or np.any(np.asarray(target) == 0) or node.attrs.get("allowzero", 0):
            continue
        src = graph.producer(node.inputs[0])
        if not is_op(src, *VIEWS) or not src.inputs[0]:
            continue
        graph.set_input(node, 0, src.inputs[0])
        if not graph.consumers(src.outputs[0]) and src.outputs[0] not in graph.outputs:
            graph.remove_node(src)
        changed = True
    return changed


def _flattens_to_2d(graph: Graph, node: Node, pooled: str) -> bool:
    if is_op(node, "Flatten"):
        return node.attrs.get("axis", 1) == 1
    if is_op(node, "Reshape"):
        src, out = shape_of(graph, pooled), shape_of(graph, node.outputs[0])
        return src is not None and out is not None and out == src[:2]
    return False


def global_pool_flatten(graph: Graph) -> bool:
    """Fold the Flatten after a global pooling into a keepdims=0 reduction."""
    changed = False
    for pool in list(graph.nodes):
        if not is_op(pool, "GlobalAveragePool", "GlobalMaxPool") or pool not in graph.nodes:
            continue
        flat = sole_consumer(graph, pool.outputs[0])
        shape = shape_of(graph, pool.inputs[0])
        if flat is None or shape is None or len(shape) < 3 or not _flattens_to_2d(graph, flat, pool.outputs[0]):
            continue
        reduce_op = "ReduceMean" if pool.op_type == "GlobalAveragePool" else "ReduceMax"
        if not has_kernel(graph, "", reduce_op):
            continue
        axes = list(range(2, len(shape)))
        node = Node(reduce_op, [pool.inputs[0]], flat.outputs, {"keepdims": 0}, flat.name, "")
        # ReduceMean/ReduceMax take axes as an input from opset 18 on, as an attribute before
        if opset(graph) >= 18:
            name = graph.unique_name("axes")
            graph.add_initializer(name, np.array(axes, dtype=np.int64))
            node.inputs = (pool.inputs[0], name)
        else:
            node.attrs["axes"] = axes
        replace(graph, [pool, flat], node)
        changed = True
    return changed
