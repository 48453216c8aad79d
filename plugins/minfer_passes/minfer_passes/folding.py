"""Folding passes: compute at build time what does not depend on the inputs.

- ``constant_folding``: a node whose inputs are all constants (initializers;
  Constant nodes have none) is run once with its registered kernel and
  replaced by initializers. Exact: it is the same kernel on the same values.
  Bounded: outputs above `MAX_FOLD_ELEMENTS` elements are left to run time,
  as are nodes with subgraphs, random ops, and nodes producing graph outputs
  (the interface keeps its producers).
- ``shape_folding``: ``Shape`` and ``Size`` of a value whose shape is static
  become int64 initializers, so the Gather/Concat/Unsqueeze chains that
  compute target shapes fold in the next round of ``constant_folding``.
  Exact when the annotated shape is the run-time shape, which static
  inference guarantees for static graph inputs.
"""

from __future__ import annotations

import numpy as np

from minfer_core import Graph, Node, OptionalType, SequenceType

from ._util import has_kernel, run_node, shape_of

MAX_FOLD_ELEMENTS = 1 << 24
"""Largest output (in elements) constant folding materializes: ~64 MB of float32."""

NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike", "Multinomial", "Bernoulli"}


def _foldable(graph: Graph, node: Node) -> bool:
    if node.op_type in NONDETERMINISTIC or any(o in graph.outputs for o in node.outputs):
        return False
    if any(isinstance(v, (Graph, list)) and _has_graph(v) for v in node.attrs.values()):
        return False
    if not all(not name or name in graph.initializers for name in node.inputs):
        return False
    if not has_kernel(graph, node.domain, node.op_type):
        return False
    return _size_ok(graph, node)


def _has_graph(value: object) -> bool:
    return isinstance(value, Graph) or (isinstance(value, list) and any(isinstance(v, Graph) for v in value))


def _size_ok(graph: Graph, node: Node) -> bool:
    for out in node.outputs:
        shape = shape_of(graph, out) if out else None
        if shape is not None and int(np.prod(shape, dtype=np.int64)) > MAX_FOLD_ELEMENTS:
            return False
    return True


def _fold(graph: Graph, node: Node) -> bool:
    inputs = [graph.initializers[n] if n else None for n in node.inputs]
    try:
        with np.errstate(all="ignore"):
            results = run_node(graph, node, inputs)
    except Exception:
        return False  # a kernel that cannot run on these constants leaves the node to run time, where it reports
    if not all(isinstance(r, (np.ndarray, np.generic)) for r in results) or any(
            isinstance(graph.type_of(o), (SequenceType, OptionalType)) for o in node.outputs if o):
        return False  # a sequence (a list) or an optional cannot be an initializer
    if any(np.asarray(r).size > MAX_FOLD_ELEMENTS for r in results):
        return False
    graph.remove_node(node)
    for name, value in zip(node.outputs, results):
        if name:
            # kernels may return views of their inputs; an initializer must own its memory
            graph.add_initializer(name, np.array(value, copy=True))
    return True


def constant_folding(graph: Graph) -> bool:
    """Replace every node whose inputs are all constants by the constants it computes."""
    changed = False
    for node in graph.topological_order():
        if _foldable(graph, node) and _fold(graph, node):
            changed = True
    return changed


def shape_folding(graph: Graph) -> bool:
    """Replace Shape/Size of a statically shaped value by an int64 constant."""
    changed = False
    for node in list(graph.nodes):
        if node.domain or node.op_type not in ("Shape", "Size") or node.outputs[0] in graph.outputs:
            continue
        shape = shape_of(graph, node.inputs[0])
        if shape is None:
            continue
        if node.op_type == "Size":
            value = np.array(int(np.prod(shape, dtype=np.int64)), dtype=np.int64)
        else:
            value = np.array(shape, dtype=np.int64)[node.attrs.get("start", 0) : node.attrs.get("end", None)]
        graph.remove_node(node)
        graph.add_initializer(node.outputs[0], value)
        changed = True
    return changed
