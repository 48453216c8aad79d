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
- ``global_conv_to_gemm``: a Conv with constant 1x1 weights, one group and no
  padding on a [N, C, 1, 1] input (what a global pooling produces) is a
  matrix product: with a following flatten-to-[N, M] as its only reader,
  ``Conv, Flatten`` become ``Flatten(x), Gemm(W[M, C], B, transB=1)`` (and
  ``global_pool_flatten`` then merges the pooling with that Flatten). Exact
  up to summation order.
"""

from __future__ import annotations

import numpy as np

from minfer_core import Graph, Node

from ._util import FLOATS, const, dims_of, has_kernel, is_op, opset, shape_of

VIEWS = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def transpose_merge(graph: Graph) -> bool:
    """Merge or cancel consecutive Transposes."""
    changed = False
    for outer in list(graph.nodes):
        if not is_op(outer, "Transpose") or outer not in graph.nodes:
            continue
        inner = graph.producer(outer.inputs[0])
        if not is_op(inner, "Transpose") or graph.sole_consumer(inner.outputs[0]) is not outer:
            continue
        p1, p2 = inner.attrs.get("perm"), outer.attrs.get("perm")
        if p1 is None or p2 is None or len(p1) != len(p2):
            continue
        perm = [int(p1[i]) for i in p2]
        merged = Node("Transpose", [inner.inputs[0]], outer.outputs, {"perm": perm}, outer.name, "")
        graph.replace([inner, outer], merged)
        if perm == list(range(len(perm))):
            _drop_identity(graph, merged)
        changed = True
    return changed


def _drop_identity(graph: Graph, node: Node) -> None:
    if not graph.bypass(node):  # an interface value must keep a producer: keep a plain Identity
        graph.replace([node], Node("Identity", node.inputs, node.outputs, {}, node.name, ""))


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
        flat = graph.sole_consumer(pool.outputs[0])
        shape = dims_of(graph, pool.inputs[0])  # only the rank matters: N and C may be symbolic
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
        graph.replace([pool, flat], node)
        changed = True
    return changed


def _pointwise_on_1x1(graph: Graph, conv: Node) -> bool:
    """A Conv that is a matrix product: 1x1 spatial input, 1x1 kernel, one group, no padding, constant W."""
    shape, w = dims_of(graph, conv.inputs[0]), const(graph, conv.inputs[1])  # N may be symbolic or unknown
    if shape is None or len(shape) != 4 or shape[2:] != (1, 1) or w is None or w.shape[2:] != (1, 1):
        return False
    if w.dtype not in FLOATS:  # Gemm is only sure to have a kernel for float types
        return False
    a = conv.attrs
    if a.get("group", 1) != 1 or any(a.get("pads", [0])) or a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return False
    bias = conv.inputs[2] if len(conv.inputs) > 2 else ""
    return not bias or const(graph, bias) is not None


def global_conv_to_gemm(graph: Graph) -> bool:
    """Replace a 1x1 Conv on a 1x1 spatial input (as after a global pooling) by Flatten + Gemm.

    Only when the Conv's only reader flattens it to [N, M] (Flatten axis 1, or
    a Reshape to [N, M]): the Gemm then writes that reader's output. Without
    such a reader a Reshape back to [N, M, 1, 1] would add a node for no
    gain (the Conv kernel already runs a 1x1 conv as one matrix product).
    """
    changed = False
    if not has_kernel(graph, "", "Gemm"):
        return False
    for conv in list(graph.nodes):
        if not is_op(conv, "Conv") or conv not in graph.nodes or not _pointwise_on_1x1(graph, conv):
            continue
        reader = graph.sole_consumer(conv.outputs[0])
        if reader is None or not _flattens_to_2d(graph, reader, conv.outputs[0]):
            continue
        w = const(graph, conv.inputs[1])
        m = w.shape[0]  # type: ignore[union-attr]
        weights = graph.unique_name(f"{conv.name or 'conv'}_gemm_W")
        graph.add_initializer(weights, w.reshape(m, -1))  # type: ignore[union-attr]
        flat_in = graph.unique_name(f"{conv.name or 'conv'}_flat")
        flatten = Node("Flatten", [conv.inputs[0]], [flat_in], {"axis": 1}, graph.unique_name("flatten"), "")
        gemm_inputs = [flat_in, weights] + ([conv.inputs[2]] if len(conv.inputs) > 2 and conv.inputs[2] else [])
        graph.replace([conv, reader], [flatten, Node("Gemm", gemm_inputs, reader.outputs, {"transB": 1}, conv.name, "")])
        changed = True
    return changed
