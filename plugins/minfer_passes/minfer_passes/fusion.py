"""Fusion passes that fold constants into weights: the node count drops, the math stays.

- ``conv_bn_fusion``: ``BatchNormalization(Conv(x, W, B))`` in inference mode,
  with W, B (or no B) and every BN parameter constant, becomes
  ``Conv(x, W', B')``: ``s = scale / sqrt(var + eps)``, ``W' = W * s`` per output
  channel, ``B' = (B - mean) * s + bias``. Exact in real arithmetic; in floats
  the rounding moves (hence rtol 1e-4). Computed in float64, cast back. The
  same for ``ConvTranspose`` (its W is (C, M/group, k...): the output channel
  is group g's column j, scaled along that axis), as a segmentation or text
  detector's upsampling head has it (the OCR detector: a 24x160x160
  BatchNormalization + Relu pass of 224 us after its ConvTranspose).
- ``affine_fusion``: a per-channel constant ``Mul`` or ``Add`` after a Conv or a
  BatchNormalization folds into its weights and bias (Mul by c: ``W*c, B*c``
  or ``scale*c, bias*c``; Add of c: ``B+c`` or ``bias+c``), and a constant
  ``Add`` after a Gemm folds into its C when the sum keeps Gemm's output shape.
  The constant must broadcast along the channel axis only (scalars, [C,1,1],
  [1,C,1,1]), so the fused output has the same shape. Float rounding moves.
- ``matmul_add_to_gemm``: ``Add(MatMul(A, B), C)`` with A of rank 2 (M may be
  symbolic or unknown), B a 2-D constant and C broadcastable to [M, N]
  without growing it becomes ``Gemm(A, B, C)``. Exact up to summation order
  inside the kernel.

Every fusion requires the intermediate value to have exactly one reader and
not to be a graph output.
"""

from __future__ import annotations

import numpy as np

from minfer_core import Graph, Node

from ._util import FLOATS, add_const, broadcasts_into, const, dims_of, has_kernel, is_op, per_channel, shape_of


def _bn_params(graph: Graph, bn: Node) -> tuple[np.ndarray, ...] | None:
    if len(bn.inputs) < 5 or bn.attrs.get("training_mode", 0) or bn.attrs.get("spatial", 1) != 1:
        return None
    if any(graph.consumers(o) or o in graph.outputs for o in bn.outputs[1:] if o):
        return None
    params = [const(graph, n) for n in bn.inputs[1:5]]
    if any(p is None for p in params):
        return None
    return tuple(np.asarray(p, dtype=np.float64).reshape(-1) for p in params)  # type: ignore[union-attr]


def _conv_weights(graph: Graph, conv: Node) -> tuple[np.ndarray, np.ndarray] | None:
    """(W, B) of a Conv or ConvTranspose whose weights are constant; a zero B when it has none."""
    w = const(graph, conv.inputs[1])
    if w is None or w.ndim < 3:
        return None
    if len(conv.inputs) > 2 and conv.inputs[2]:
        b = const(graph, conv.inputs[2])
        if b is None:
            return None
    else:
        b = np.zeros(_out_channels(conv, w), dtype=w.dtype)
    return w, b


def _out_channels(conv: Node, w: np.ndarray) -> int:
    return w.shape[0] if conv.op_type == "Conv" else w.shape[1] * int(conv.attrs.get("group", 1))


def _scaled(conv: Node, w: np.ndarray, s: np.ndarray) -> np.ndarray:
    """W (in float64) with output channel m scaled by s[m]: Conv's axis 0; ConvTranspose's (C, M/group, k...)
    weight has group g's output channels along axis 1 of its g-th block of input channels."""
    if conv.op_type == "Conv":
        return w.astype(np.float64) * s.reshape((-1,) + (1,) * (w.ndim - 1))
    group = int(conv.attrs.get("group", 1))
    blocks = w.astype(np.float64).reshape((group, w.shape[0] // group) + w.shape[1:])
    return (blocks * s.reshape((group, 1, w.shape[1]) + (1,) * (w.ndim - 2))).reshape(w.shape)


def _rebuild_conv(graph: Graph, conv: Node, last: Node, w: np.ndarray, b: np.ndarray, dtype: np.dtype) -> None:
    names = [add_const(graph, f"{conv.name or 'conv'}_W", w.astype(dtype)),
             add_const(graph, f"{conv.name or 'conv'}_B", b.astype(dtype))]
    fused = Node(conv.op_type, [conv.inputs[0], *names], last.outputs, dict(conv.attrs), conv.name, "")
    graph.replace([conv, last], fused)
    # drop the replaced weights now, not at the dead-code pass: else every folded conv holds two copies
    for name in conv.inputs[1:]:
        if name in graph.initializers and not graph.is_used(name):
            graph.remove_initializer(name)


def conv_bn_fusion(graph: Graph) -> bool:
    """Fold an inference BatchNormalization into the preceding Conv's (or ConvTranspose's) weights and bias."""
    changed = False
    for conv in list(graph.nodes):
        if not is_op(conv, "Conv", "ConvTranspose") or conv not in graph.nodes:
            continue
        bn = graph.sole_consumer(conv.outputs[0])
        if not is_op(bn, "BatchNormalization") or bn.inputs[0] != conv.outputs[0]:
            continue
        params, wb = _bn_params(graph, bn), _conv_weights(graph, conv)
        if params is None or wb is None:
            continue
        scale, bias, mean, var = params
        w, b = wb
        s = scale / np.sqrt(var + float(bn.attrs.get("epsilon", 1e-5)))
        if s.size != b.size:  # a BN over another axis length than the conv's output channels: not this pattern
            continue
        w64 = _scaled(conv, w, s)
        b64 = (b.astype(np.float64) - mean) * s + bias
        _rebuild_conv(graph, conv, bn, w64, b64, w.dtype)
        changed = True
    return changed


# ---- affine folding ------------------------------------------------------------------


def _channel_const(graph: Graph, node: Node, value: str, channels: int, rank: int) -> np.ndarray | None:
    other = node.inputs[1] if node.inputs[0] == value else node.inputs[0]
    c = const(graph, other)
    return None if c is None else per_channel(c, channels, rank)


def _fold_into_conv(graph: Graph, conv: Node, op: Node, c: np.ndarray) -> bool:
    wb = _conv_weights(graph, conv)
    if wb is None:
        return False
    w, b = (x.astype(np.float64) for x in wb)
    if op.op_type == "Mul":
        w, b = w * c.reshape((-1,) + (1,) * (w.ndim - 1)), b * c
    else:
        b = b + c
    _rebuild_conv(graph, conv, op, w, b, wb[0].dtype)
    return True


def _fold_into_bn(graph: Graph, bn: Node, op: Node, c: np.ndarray) -> bool:
    if _bn_params(graph, bn) is None:
        return False
    scale, bias = (np.asarray(const(graph, n)) for n in bn.inputs[1:3])
    dtype = scale.dtype
    if op.op_type == "Mul":
        scale, bias = scale.astype(np.float64) * c, bias.astype(np.float64) * c
    else:
        bias = bias.astype(np.float64) + c
    names = [add_const(graph, f"{bn.name or 'bn'}_scale", scale.astype(dtype)),
             add_const(graph, f"{bn.name or 'bn'}_bias", bias.astype(dtype))]
    fused = Node(bn.op_type, [bn.inputs[0], *names, *bn.inputs[3:5]], op.outputs[:1], dict(bn.attrs), bn.name, "")
    graph.replace([bn, op], fused)
    return True


def _fold_into_gemm(graph: Graph, gemm: Node, op: Node) -> bool:
    other = op.inputs[1] if op.inputs[0] == gemm.outputs[0] else op.inputs[0]
    c, out = const(graph, other), dims_of(graph, gemm.outputs[0])
    w = const(graph, gemm.inputs[1])
    if c is None or out is None or w is None or c.dtype != w.dtype or c.ndim > 2:
        return False
    if not broadcasts_into(c.shape, out):
        return False
    beta = float(gemm.attrs.get("beta", 1.0))
    if len(gemm.inputs) > 2 and gemm.inputs[2]:
        old = const(graph, gemm.inputs[2])
        if old is None:
            return False
        c = (beta * old.astype(np.float64) + c).astype(c.dtype)
    attrs = dict(gemm.attrs, beta=1.0)
    name = add_const(graph, f"{gemm.name or 'gemm'}_C", c)
    fused = Node("Gemm", [gemm.inputs[0], gemm.inputs[1], name], op.outputs, attrs, gemm.name, "")
    graph.replace([gemm, op], fused)
    return True


def _affine_step(graph: Graph, node: Node) -> bool:
    nxt = graph.sole_consumer(node.outputs[0])
    if not is_op(nxt, "Mul", "Add") or len(nxt.inputs) != 2:
        return False
    if is_op(node, "Gemm"):
        return nxt.op_type == "Add" and _fold_into_gemm(graph, node, nxt)
    dims = dims_of(graph, node.outputs[0])  # only the rank and the channel count matter
    if dims is None or len(dims) < 3 or dims[1] is None or _dtype_differs(graph, nxt, node.outputs[0]):
        return False
    c = _channel_const(graph, nxt, node.outputs[0], dims[1], len(dims))
    if c is None:
        return False
    c = c.astype(np.float64)
    return _fold_into_conv(graph, node, nxt, c) if node.op_type == "Conv" else _fold_into_bn(graph, node, nxt, c)


def _dtype_differs(graph: Graph, node: Node, value: str) -> bool:
    other = node.inputs[1] if node.inputs[0] == value else node.inputs[0]
    a, b = graph.type_of(value), graph.type_of(other)
    return a is None or b is None or a.dtype != b.dtype


def affine_fusion(graph: Graph) -> bool:
    """Fold constant per-channel Mul/Add after Conv or BatchNormalization (Add after Gemm) into its parameters."""
    changed = False
    for node in list(graph.nodes):
        if node in graph.nodes and is_op(node, "Conv", "BatchNormalization", "Gemm") and _affine_step(graph, node):
            changed = True
    return changed


def _gemm_operands(graph: Graph, mm: Node) -> tuple[Node, str] | None:
    """(the Add, its other operand C) when ``Add(MatMul(A, B), C)`` is exactly ``Gemm(A, B, C)``.

    A of rank 2 (its rows may be a symbolic, unknown or negative dim), B a 2-D
    float constant, C of static shape and B's dtype, of rank <= 2, broadcasting
    into [M, N] without growing it (each dim 1 or equal to a known size).
    """
    add = graph.sole_consumer(mm.outputs[0])
    a, b = dims_of(graph, mm.inputs[0]), const(graph, mm.inputs[1])
    if not is_op(add, "Add") or a is None or len(a) != 2 or b is None or b.ndim != 2:
        return None
    other = add.inputs[1] if add.inputs[0] == mm.outputs[0] else add.inputs[0]
    c, c_type = shape_of(graph, other), graph.type_of(other)
    if c is None or c_type is None or len(c) > 2 or c_type.dtype != b.dtype:
        return None
    if b.dtype not in FLOATS:  # Gemm is only sure to have a kernel for float types
        return None
    return (add, other) if broadcasts_into(c, (a[0], b.shape[1])) else None


def matmul_add_to_gemm(graph: Graph) -> bool:
    """Turn Add(MatMul(A, B), C) into Gemm(A, B, C) where that is the same computation."""
    changed = False
    if not has_kernel(graph, "", "Gemm"):
        return False
    for mm in list(graph.nodes):
        if not is_op(mm, "MatMul") or mm not in graph.nodes:
            continue
        found = _gemm_operands(graph, mm)
        if found is None:
            continue
        add, other = found
        gemm = Node("Gemm", [mm.inputs[0], mm.inputs[1], other], add.outputs, {}, mm.name, "")
        graph.replace([mm, add], gemm)
        changed = True
    return changed
