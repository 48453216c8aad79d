"""``reshape_dim_copy``: a Reshape target computed from another tensor's shape, as a constant of zeros that copy.

Pattern (what torch.onnx writes to split and merge attention heads with a
symbolic batch and sequence):

    T = Concat(Unsqueeze(Gather(Shape(S), i)), ..., constant pieces, axis=0)
    Y = Reshape(X, T)                              (allowzero 0)

where every gathered entry j of T is dim i of S and S's dim i is surely X's
dim j (the same known size or the same symbolic name). Then entry j is 0,
which Reshape reads as "X's dim j": the target becomes a constant, the
shape arithmetic (Shape, Gather, Unsqueeze, Concat: a few microseconds a
node, six to eight nodes per attention block) is left to dead-code
elimination, and shape inference now knows Y's dims, so the next Reshape's
target often resolves as well (the pass re-infers and repeats). Exact.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import Graph, Node

from ._util import add_const, const, is_op, opset
from .shapes import shape_inference

# ---- the pass ------------------------------------------------------------------------------------


def _same_dim(a: Any, b: Any) -> bool:
    """Two dims that are surely equal: one known size, or one symbolic name."""
    return a == b and (isinstance(a, str) and bool(a) or isinstance(a, int) and a >= 0)


def _gathered(graph: Graph, piece: str) -> tuple[str, int] | None:
    """(S, i) when ``piece`` is Unsqueeze(Gather(Shape(S), i), axes=[0]) with a scalar constant i."""
    unsq = graph.producer(piece)
    if unsq is None or not is_op(unsq, "Unsqueeze"):
        return None
    axes = unsq.attrs.get("axes") if opset(graph) < 13 else const(graph, unsq.inputs[1] if len(unsq.inputs) > 1 else "")
    gather = graph.producer(unsq.inputs[0])
    if axes is None or list(np.asarray(axes).reshape(-1)) != [0] or gather is None or not is_op(gather, "Gather"):
        return None
    shape = graph.producer(gather.inputs[0])
    index = const(graph, gather.inputs[1])
    if (shape is None or not is_op(shape, "Shape") or set(shape.attrs) & {"start", "end"} or gather.attrs.get("axis", 0)
            or index is None or index.ndim != 0):
        return None
    return shape.inputs[0], int(index)


def _target(graph: Graph, reshape: Node) -> np.ndarray | None:
    """The constant target equal to ``reshape``'s computed one, or None when some entry is not provable."""
    concat = graph.producer(reshape.inputs[1])
    x = graph.type_of(reshape.inputs[0])
    if concat is None or not is_op(concat, "Concat") or concat.attrs.get("axis") != 0 or x is None or x.shape is None:
        return None
    entries: list[int] = []
    for piece in concat.inputs:
        value = const(graph, piece)
        if value is not None and value.ndim == 1:
            entries += [int(v) for v in value]
            continue
        found = _gathered(graph, piece)
        src = graph.type_of(found[0]) if found is not None else None
        if found is None or src is None or src.shape is None:
            return None
        j, i = len(entries), found[1]
        if not (-len(src.shape) <= i < len(src.shape)) or j >= len(x.shape) or not _same_dim(src.shape[i], x.shape[j]):
            return None
        entries.append(0)
    return np.asarray(entries, np.int64)


def _step(graph: Graph) -> bool:
    changed = False
    for node in list(graph.nodes):
        if not is_op(node, "Reshape") or len(node.inputs) < 2 or node.attrs.get("allowzero", 0):
            continue
        if const(graph, node.inputs[1]) is not None:
            continue
        target = _target(graph, node)
        if target is None:
            continue
        graph.set_input(node, 1, add_const(graph, f"{node.name or 'reshape'}_shape", target))
        changed = True
    return changed


def reshape_dim_copy(graph: Graph) -> bool:
    """Replace a Reshape target built from Shape/Gather/Unsqueeze/Concat by constant zeros where the dims are
    provably the input's own (then re-infer shapes, which may prove the next Reshape's)."""
    changed = False
    for _ in range(16):  # each round can resolve Reshapes downstream of the last (split heads, then merge them)
        if not _step(graph):
            break
        changed = True
        shape_inference(graph)
    return changed


# ---- property-suite patterns ---------------------------------------------------------------------


def patterns() -> Any:
    """The pass's target strategy: heads split and merged with targets computed from a symbolic input's shape.

    The shape read from the Reshape's own input, or from another tensor of the same (or a different) shape;
    dims static, symbolic or unknown; sometimes a gathered dim that is not the copied one.
    """
    from hypothesis import strategies as st

    from minfer_core.testing import GraphBuilder
    from minfer_core.testing.strategies import loosen

    @st.composite
    def graphs(draw: Any) -> Any:
        b = GraphBuilder(opset=draw(st.sampled_from([13, 17])))
        n, s = draw(st.integers(1, 3)), draw(st.integers(1, 4))
        h, d = draw(st.sampled_from([1, 2])), draw(st.sampled_from([2, 4]))
        x = b.input((n, s, h * d))
        loosen(draw, b, x, axes=(0, 1))
        other = b.input((n, s, h * d)) if draw(st.booleans()) else x
        shp = b.op("Shape", other)
        picks = draw(st.sampled_from([(0, 1), (0, 1), (1, 0)]))  # (1, 0) gathers the wrong dims: no proof (unless equal)

        def dim(i: int) -> str:
            gathered = b.op("Gather", shp, b.const(np.asarray(i, np.int64)), axis=0)
            return b.op("Unsqueeze", gathered, b.const(np.asarray([0], np.int64)))

        heads = b.op("Concat", dim(picks[0]), dim(picks[1]), b.const(np.asarray([h, d], np.int64)), axis=0)
        y = b.op("Transpose", b.op("Reshape", b.op("Neg", x), heads), perm=[0, 2, 1, 3])
        y = b.op("Transpose", b.op("Relu", y), perm=[0, 2, 1, 3])
        merged = b.op("Concat", dim(0), dim(1), b.const(np.asarray([h * d], np.int64)), axis=0)
        b.output(b.op("Reshape", y, merged))
        return b.build()

    return graphs()
