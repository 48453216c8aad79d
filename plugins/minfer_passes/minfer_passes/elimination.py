"""Elimination passes: remove what computes nothing.

- ``dead_code_elimination``: nodes none of whose outputs is read (by a node or
  as a graph output), then initializers nothing reads. Exact: nothing
  observable depended on them (ONNX ops have no side effects).
- ``identity_elimination``: nodes that return their input unchanged are
  bypassed (readers read the input). Each case and the condition that makes
  it exact: Identity (always); Dropout in inference (mask unused,
  training_mode absent or a constant false); Cast whose ``to`` is the input's
  dtype; Reshape/Flatten/Squeeze/Unsqueeze whose static output shape equals the
  static input shape; MaxPool/AveragePool with all-1 kernel, strides and
  dilations and zero pads (MaxPool's Indices unused); Split with a single
  output; Pad whose pads are all zero; Transpose whose perm is the identity;
  Expand whose result shape equals the static input shape. When the
  bypassed output is a graph output, the input's producer is renamed instead
  (only if that input has no other reader and is not itself an interface value).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from minfer_core import Graph, Node, onnx_dtype

from ._util import const, dtype_of, shape_of


def dead_code_elimination(graph: Graph) -> bool:
    """Remove nodes whose outputs nothing reads, then initializers nothing reads."""
    changed = False
    for node in reversed(graph.topological_order()):
        if not any(graph.is_used(o) for o in node.outputs):
            graph.remove_node(node)
            changed = True
    read = {name for n in graph.nodes for name in n.inputs} | set(graph.outputs) | _subgraph_reads(graph)
    for name in [n for n in graph.initializers if n not in read]:
        graph.remove_initializer(name)
        changed = True
    return changed


def _subgraph_reads(graph: Graph) -> set[str]:
    """Names subgraphs (If/Loop/Scan bodies) read from the enclosing scope."""
    names: set[str] = set()
    for sub in graph.subgraphs():
        names |= {n for node in sub.nodes for n in node.inputs} | set(sub.outputs) | _subgraph_reads(sub)
    return names


# ---- identity elimination -----------------------------------------------------------


def _all(values: object, want: int) -> bool:
    return values is None or all(int(v) == want for v in values)  # type: ignore[union-attr]


def _same_shape(graph: Graph, node: Node) -> bool:
    src, out = shape_of(graph, node.inputs[0]), shape_of(graph, node.outputs[0])
    return src is not None and src == out


def _identity(graph: Graph, node: Node) -> bool:
    return True


def _dropout(graph: Graph, node: Node) -> bool:
    if len(node.outputs) > 1 and graph.is_used(node.outputs[1]):
        return False
    if len(node.inputs) > 2 and node.inputs[2]:
        mode = const(graph, node.inputs[2])
        return mode is not None and not bool(np.asarray(mode))
    return True


def _cast(graph: Graph, node: Node) -> bool:
    src = dtype_of(graph, node.inputs[0])
    try:
        return src is not None and onnx_dtype(int(node.attrs["to"])) == src
    except (KeyError, TypeError, ValueError):
        return False


def _pool(graph: Graph, node: Node) -> bool:
    a = node.attrs
    if node.op_type == "MaxPool" and len(node.outputs) > 1 and graph.is_used(node.outputs[1]):
        return False
    if a.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID", "SAME_UPPER", "SAME_LOWER"):
        return False
    return (
        _all(a.get("kernel_shape"), 1) and _all(a.get("strides"), 1) and _all(a.get("pads"), 0)
        and _all(a.get("dilations"), 1) and a.get("storage_order", 0) == 0
    )


def _split(graph: Graph, node: Node) -> bool:
    if len(node.outputs) != 1:
        return False
    sizes = node.attrs.get("split")
    if sizes is None and len(node.inputs) > 1 and node.inputs[1]:
        sizes = const(graph, node.inputs[1])
        if sizes is None:
            return False
    if sizes is None:
        return True
    shape = shape_of(graph, node.inputs[0])
    return shape is not None and list(np.asarray(sizes).reshape(-1)) == [shape[node.attrs.get("axis", 0)]]


def _pad(graph: Graph, node: Node) -> bool:
    pads = node.attrs.get("pads", node.attrs.get("paddings"))
    if pads is None and len(node.inputs) > 1:
        pads = const(graph, node.inputs[1])
    return pads is not None and not np.any(np.asarray(pads))


def _transpose(graph: Graph, node: Node) -> bool:
    perm = node.attrs.get("perm")
    if perm is None:  # default perm reverses the axes: the identity only up to rank 1
        shape = graph.type_of(node.inputs[0])
        return shape is not None and shape.rank is not None and shape.rank <= 1
    return list(perm) == list(range(len(perm)))


def _expand(graph: Graph, node: Node) -> bool:
    src, target = shape_of(graph, node.inputs[0]), const(graph, node.inputs[1])
    if src is None or target is None:
        return False
    try:
        return tuple(np.broadcast_shapes(src, tuple(int(d) for d in target))) == src
    except ValueError:
        return False


CASES: dict[str, Callable[[Graph, Node], bool]] = {
    "Identity": _identity,
    "Dropout": _dropout,
    "Cast": _cast,
    "Reshape": _same_shape,
    "Flatten": _same_shape,
    "Squeeze": _same_shape,
    "Unsqueeze": _same_shape,
    "MaxPool": _pool,
    "AveragePool": _pool,
    "Split": _split,
    "Pad": _pad,
    "Transpose": _transpose,
    "Expand": _expand,
}


def identity_elimination(graph: Graph) -> bool:
    """Bypass every node that returns its input unchanged (see the module docstring)."""
    changed = False
    for node in list(graph.nodes):
        check = CASES.get(node.op_type) if not node.domain else None
        if check is None or not node.inputs or not node.inputs[0]:
            continue
        if _same_type(graph, node) and check(graph, node) and graph.bypass(node, node.inputs[0]):
            changed = True
    return changed


def _same_type(graph: Graph, node: Node) -> bool:
    """The output's declared dtype must be the input's (a stale annotation would otherwise lie)."""
    a, b = dtype_of(graph, node.inputs[0]), dtype_of(graph, node.outputs[0])
    return a is None or b is None or a == b
