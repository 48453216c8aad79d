"""Passes on QDQ models (onnxruntime's quantize_static): int8 weights stay int8, each Q -> DQ pair one rounding step.

``qdq_fusion`` (before constant folding, which would otherwise turn every
``DequantizeLinear`` of an int8 weight into a float copy held for the session):

- ``DequantizeLinear(W) -> Conv/Gemm/MatMul`` (W a constant 8-bit tensor,
  its scale and zero point constant, per tensor or per axis; the Conv's,
  Gemm's or MatMul's only use of it is as the weight, input 1; X float32)
  becomes ``ai.minfer::DequantConv(X, Wq, scale, zero_point, [B])`` (and
  ``DequantGemm``, ``DequantMatMul``) with the base op's attributes and the
  DequantizeLinear's ``axis`` (`qdq_ops`: its kernel holds the int8 weight and
  dequantizes it into scratch on each run, exactly as DequantizeLinear rounds).
- ``QuantizeLinear(x) -> DequantizeLinear`` of a float32 activation (per-tensor
  constant scale and 8-bit zero point, every reader of the quantized value a
  DequantizeLinear with the same ones) becomes
  ``ai.minfer::QuantizeDequantize(x; scale, low, high)``:
  ``clip(rint(x / scale), low, high) * scale`` with ``low = qmin - zero_point``,
  ``high = qmax - zero_point``, which is bit for bit what the pair computes
  (``(q - zp) * scale`` of an integer, in float32).

``qdq_epilogue_fusion`` (after the float fusions) moves the rounding into the
producer's epilogue, where each tile is still in cache:

- a QuantizeDequantize whose input is the sole output of a Dequant* op, a
  FusedConv/FusedGemm/FusedMatMul or a ChannelAffine with no activation, a Relu
  or a Clip becomes that node's ``activation`` (``QuantizeDequantize``, params
  ``[scale, low, high]``; the Relu or Clip narrows ``low``/``high``: exact,
  since division by a positive scale and rint are monotone);
- a Dequant* node's sole reader, a ChannelAffine (what channel_affine_fusion
  makes of a BatchNormalization between two Q/DQ pairs) or an Add/Mul by a
  constant that keeps the output's shape (a bias after the rounding), becomes
  its second stage (``* M``, ``+ A``, ``post_activation``), which the next
  rounding then joins;
- a Dequant* node's sole reader adding a same-shape ``Z`` (Add, or Sum of two:
  a residual block's tail), read only by a QuantizeDequantize, becomes its
  last stage: ``+ Z`` (input 7) and that rounding (``residual_params``);
- a Relu or Clip whose only reader is a QuantizeDequantize is folded into its
  bounds, and a QuantizeDequantize after MaxPool/Reshape/Transpose/... of
  values already on the same grid is removed (those ops move grid values, and
  rounding a grid value again returns it);
- a rounding that no producer takes in (an integer MatMul's output), read only
  by an Add/Mul of a constant varying along one axis at most, read only by
  another rounding, becomes one ``QuantizeDequantize(x, [M], [A])`` ending in
  that rounding (``post_*``): a bias between two roundings in one pass.

Both are exact (the property suite holds them to 1e-6): the rewritten graph
computes what the DQ -> float op -> Q graph computes, as onnxruntime's
ORT_DISABLE_ALL does, with the float ops' own rounding. Never through a graph
output or a value another node reads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import Graph, Node

from ._util import MINFER_DOMAIN, add_const, broadcasts_into, const, dims_of, has_kernel, same_shape
from .qdq_ops import DEQUANT, QDQ

INT8 = (np.dtype(np.int8), np.dtype(np.uint8))
# nodes whose epilogue can take the rounding as their activation
EPILOGUE_OPS = (*DEQUANT.values(), "FusedConv", "FusedGemm", "FusedMatMul", "ChannelAffine")
# ops that only move or select values: grid values in, the same grid's values out
GRID_KEEPING = ("MaxPool", "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "Identity")


# ---- recognising quantization parameters ----------------------------------------------------------


def _scalar_params(graph: Graph, node: Node) -> tuple[float, float, float] | None:
    """(scale, low, high) of a per-tensor Q or DQ with constant float32 scale and 8-bit zero point."""
    scale = const(graph, node.inputs[1]) if len(node.inputs) > 1 else None
    zp = const(graph, node.inputs[2]) if len(node.inputs) > 2 and node.inputs[2] else np.zeros((), np.uint8)
    if scale is None or zp is None or scale.size != 1 or zp.size != 1 or scale.dtype != np.float32:
        return None
    if zp.dtype not in INT8 or node.attrs.get("output_dtype") or node.attrs.get("block_size"):
        return None
    if float(scale.reshape(-1)[0]) <= 0 or not np.isfinite(scale).all():
        return None
    info, z = np.iinfo(zp.dtype), int(zp.reshape(-1)[0])
    return float(scale.reshape(-1)[0]), float(info.min - z), float(info.max - z)


def _is(node: Node | None, op_type: str, domain: str = "") -> bool:
    return node is not None and node.domain == domain and node.op_type == op_type


# ---- qdq_fusion -----------------------------------------------------------------------------------


def _pair(graph: Graph, q: Node) -> bool:
    """QuantizeLinear read only by matching DequantizeLinears -> one QuantizeDequantize."""
    params = _scalar_params(graph, q)
    out = q.outputs[0]
    t = graph.type_of(q.inputs[0])
    if params is None or out in graph.outputs or t is None or t.dtype != np.float32:
        return False
    # a reader whose output is a graph output goes first: the new node produces that name
    readers = sorted(graph.consumers(out), key=lambda d: d.outputs[0] not in graph.outputs)
    if not readers or not all(_is(d, "DequantizeLinear") and d.inputs[0] == out and _scalar_params(graph, d) == params
                              for d in readers) or any(d.outputs[0] in graph.outputs for d in readers[1:]):
        return False
    scale, low, high = params
    first = readers[0].outputs[0]
    graph.opsets.setdefault(MINFER_DOMAIN, 1)
    graph.replace([q, *readers], Node(QDQ, [q.inputs[0]], [first], {"scale": scale, "low": low, "high": high},
                                      q.name, MINFER_DOMAIN))
    for d in readers[1:]:
        graph.replace_all_uses(d.outputs[0], first, graph_outputs=False)
    return True


def _weight_reader(graph: Graph, dq: Node) -> Node | None:
    """The Conv/Gemm/MatMul that reads ``dq``'s output as its weight (input 1) and nowhere else."""
    out = dq.outputs[0]
    reader = graph.sole_consumer(out)
    if reader is None or reader.domain or reader.op_type not in DEQUANT or out in graph.outputs:
        return None
    if len(reader.inputs) < 2 or reader.inputs[1] != out or out in reader.inputs[:1] + reader.inputs[2:]:
        return None
    return reader


def _weights(graph: Graph, dq: Node) -> Node | None:
    """DequantizeLinear of a constant 8-bit weight into a Conv/Gemm/MatMul -> that op's Dequant* form."""
    w, scale = const(graph, dq.inputs[0]), const(graph, dq.inputs[1]) if len(dq.inputs) > 1 else None
    zp_name = dq.inputs[2] if len(dq.inputs) > 2 else ""
    zp = const(graph, zp_name) if zp_name else None
    if w is None or scale is None or w.dtype not in INT8 or scale.dtype != np.float32 or (zp_name and zp is None):
        return None
    if scale.ndim > 1 or dq.attrs.get("block_size") or dq.attrs.get("output_dtype") or w.ndim < 1:
        return None
    reader = _weight_reader(graph, dq)
    if reader is None or (reader.op_type == "MatMul" and w.ndim != 2):
        return None
    x = graph.type_of(reader.inputs[0])
    if x is None or x.dtype != np.float32:  # the weight dequantizes to float32: the base op needs X of that type
        return None
    if not has_kernel(graph, MINFER_DOMAIN, DEQUANT[reader.op_type]):
        return None
    axis = int(dq.attrs.get("axis", 1)) % w.ndim
    if scale.size > 1 and scale.shape[0] != w.shape[axis]:
        return None
    attrs = {**reader.attrs, "axis": axis}
    inputs = [reader.inputs[0], dq.inputs[0], dq.inputs[1], zp_name, *reader.inputs[2:]]
    new = Node(DEQUANT[reader.op_type], inputs, reader.outputs, attrs, reader.name, MINFER_DOMAIN)
    graph.opsets.setdefault(MINFER_DOMAIN, 1)
    return graph.replace([dq, reader], new)


def qdq_fusion(graph: Graph) -> bool:
    """Keep QDQ weights int8 (Dequant{Conv,Gemm,MatMul}) and make each activation Q -> DQ pair one QuantizeDequantize."""
    if not has_kernel(graph, MINFER_DOMAIN, QDQ):
        return False
    changed = False
    for node in list(graph.nodes):
        if node not in graph.nodes:
            continue
        if _is(node, "QuantizeLinear") and _pair(graph, node):
            changed = True
        elif _is(node, "DequantizeLinear") and _weights(graph, node) is not None:
            changed = True
    return changed


# ---- qdq_epilogue_fusion --------------------------------------------------------------------------


def _bounds(graph: Graph, act: Node | None, scale: float) -> tuple[float, float] | None:
    """What Relu/Clip(act) does to rint(x / scale): clamps it to these bounds (None: not a Relu or constant Clip)."""
    if act is None or act.domain:
        return None
    if act.op_type == "Relu":
        return 0.0, np.inf
    if act.op_type != "Clip":
        return None
    if len(act.inputs) > 1:  # opset 11: bounds as inputs; constant or absent
        found = [const(graph, n) if n else np.asarray(b, np.float32) for n, b in zip(
            (act.inputs[1:] + ("", ""))[:2], (-np.inf, np.inf))]
        if any(f is None or f.size != 1 for f in found):
            return None
        lo, hi = (float(f.reshape(-1)[0]) for f in found)
    else:
        lo, hi = float(act.attrs.get("min", -np.inf)), float(act.attrs.get("max", np.inf))
    s = np.float32(scale)
    with np.errstate(over="ignore"):
        return float(np.rint(np.float32(lo) / s)), float(np.rint(np.float32(hi) / s))


def _narrowed(params: list[float], bounds: tuple[float, float] | None) -> list[float] | None:
    if bounds is None:
        return None
    low, high = max(params[1], bounds[0]), min(params[2], bounds[1])
    return None if low > high else [params[0], low, high]


def _absorb_activation(graph: Graph, qd: Node) -> bool:
    """Relu/Clip(x) read only by this QuantizeDequantize: the QuantizeDequantize reads x, with narrower bounds."""
    act = graph.producer(qd.inputs[0])
    if act is None or act.outputs[0] in graph.outputs or graph.sole_consumer(act.outputs[0]) is not qd:
        return False
    a = qd.attrs
    params = _narrowed([a["scale"], a["low"], a["high"]], _bounds(graph, act, a["scale"]))
    if params is None:
        return False
    attrs = {**a, "scale": params[0], "low": params[1], "high": params[2]}  # its M, A and second rounding kept
    graph.replace([act, qd], Node(QDQ, [act.inputs[0], *qd.inputs[1:]], qd.outputs, attrs, qd.name, MINFER_DOMAIN))
    return True


def _has_post(node: Node) -> bool:
    """Whether a Dequant* node already has its second epilogue stage (* M, + A, post activation)."""
    return bool(node.attrs.get("post_activation")) or any(node.inputs[5:7])


def _has_residual(node: Node) -> bool:
    """Whether a Dequant* node already ends in + Z and a rounding (its last stage: nothing fuses after it)."""
    return node.op_type in DEQUANT.values() and len(node.inputs) > 7 and bool(node.inputs[7])


def _merge_residual(graph: Graph, d: Node) -> bool:
    """A Dequant* node whose sole reader adds a same-shape Z (Add, or Sum of two) that a QuantizeDequantize alone
    reads: Z and that rounding as the node's last epilogue stage (a quantized ResNet block's tail)."""
    y = d.outputs[0]
    add = graph.sole_consumer(y)
    if _has_residual(d) or y in graph.outputs or add is None or add.domain or add.op_type not in ("Add", "Sum"):
        return False
    if len(add.inputs) != 2 or add.inputs[0] == add.inputs[1]:
        return False
    z = add.inputs[1] if add.inputs[0] == y else add.inputs[0]
    t, qd = graph.type_of(y), graph.sole_consumer(add.outputs[0])
    if t is None or t.dtype != np.float32 or not same_shape(graph, y, z) or graph.type_of(z).dtype != t.dtype:
        return False
    if add.outputs[0] in graph.outputs or not _is(qd, QDQ, MINFER_DOMAIN) or len(qd.inputs) != 1:
        return False
    inputs = (list(d.inputs) + [""] * 7)[:7] + [z]
    attrs = {**d.attrs, "residual_params": [qd.attrs["scale"], qd.attrs["low"], qd.attrs["high"]]}
    graph.replace([d, add, qd], Node(d.op_type, inputs, qd.outputs, attrs, d.name, d.domain))  # after Z's producer
    return True


def _compose(graph: Graph, current: str, current_params: list[float], qd: Node) -> list[float] | None:
    """QuantizeDequantize's params after an activation ``current`` (none, Relu or Clip), or None when it cannot."""
    a = qd.attrs
    params = [a["scale"], a["low"], a["high"]]
    if current == "Relu":
        return _narrowed(params, (0.0, np.inf))
    if current == "Clip":
        lo, hi = ([float(v) for v in current_params] + [-np.inf, np.inf])[:2]
        s = np.float32(a["scale"])
        with np.errstate(over="ignore"):
            return _narrowed(params, (float(np.rint(np.float32(lo) / s)), float(np.rint(np.float32(hi) / s))))
    return None if current else params


def _into_producer(graph: Graph, qd: Node) -> bool:
    """The rounding as the producer's epilogue activation (after its own Relu/Clip, if any)."""
    p = graph.producer(qd.inputs[0])
    if not _plain(qd) or p is None or p.domain != MINFER_DOMAIN or p.op_type not in EPILOGUE_OPS or len(p.outputs) != 1:
        return False
    if p.outputs[0] in graph.outputs or graph.sole_consumer(p.outputs[0]) is not qd or _has_residual(p):
        return False
    slot = "post_activation" if p.op_type in DEQUANT.values() and _has_post(p) else "activation"
    params = _compose(graph, p.attrs.get(slot, ""), list(p.attrs.get(f"{slot}_params", [])), qd)
    if params is None:
        return False
    attrs = {**p.attrs, slot: QDQ, f"{slot}_params": params}
    graph.replace([p, qd], Node(p.op_type, p.inputs, qd.outputs, attrs, p.name, p.domain))
    return True


def _post_operands(graph: Graph, node: Node, y: str) -> tuple[str, str, str, list[float]] | None:
    """(M, A, activation, params) when ``node`` is ChannelAffine, or Add/Mul of ``y`` and a constant that keeps y's shape."""
    t = graph.type_of(y)
    if t is None or t.shape is None:
        return None
    if node.domain == MINFER_DOMAIN and node.op_type == "ChannelAffine" and node.inputs[0] == y:
        names = (list(node.inputs[1:3]) + ["", ""])[:2]
        values = [const(graph, name) if name else None for name in names]
        if any(name and value is None for name, value in zip(names, values)):
            return None
        per_channel = (-1,) + (1,) * (len(t.shape) - 2)  # S and B are per channel (axis 1): laid out to broadcast
        mul, add = ("" if v is None else add_const(graph, f"{n}_nchw", v.reshape(per_channel)) for n, v in zip(names, values))
        return mul, add, node.attrs.get("activation", ""), [float(v) for v in node.attrs.get("activation_params", [])]
    if node.domain or node.op_type not in ("Add", "Mul") or len(node.inputs) != 2 or y not in node.inputs:
        return None
    other = node.inputs[1] if node.inputs[0] == y else node.inputs[0]
    value = const(graph, other)
    dims = dims_of(graph, y)
    if value is None or other == y or dims is None or value.dtype != t.dtype or not broadcasts_into(value.shape, dims):
        return None
    return ("", other, "", []) if node.op_type == "Add" else (other, "", "", [])


def _merge_post(graph: Graph, d: Node) -> bool:
    """A Dequant* node's sole reader ChannelAffine (or Add/Mul by a constant) as its second epilogue stage."""
    y = d.outputs[0]
    reader = graph.sole_consumer(y)
    if _has_post(d) or _has_residual(d) or y in graph.outputs or reader is None or len(reader.outputs) != 1:
        return False
    found = _post_operands(graph, reader, y)
    if found is None:
        return False
    mul, add, act, params = found
    inputs = (list(d.inputs) + ["", "", ""])[:5] + [mul, add]
    attrs = {**d.attrs, "post_activation": act, "post_activation_params": params} if act else dict(d.attrs)
    graph.replace([d, reader], Node(d.op_type, inputs, reader.outputs, attrs, d.name, d.domain))
    for name in reader.inputs[1:]:  # a ChannelAffine's S and B, now laid out per channel in new initializers
        if name in graph.initializers and not graph.is_used(name) and name not in (*graph.outputs, *graph.inputs):
            graph.remove_initializer(name)
    return True


def _plain(node: Node | None) -> bool:
    """Whether ``node`` is a QuantizeDequantize that only rounds (no * M, + A or second rounding)."""
    return _is(node, QDQ, MINFER_DOMAIN) and len(node.inputs) == 1 and not node.attrs.get("post_scale")


def _merge_rounding(graph: Graph, qd: Node) -> bool:
    """A plain rounding whose sole reader adds (or multiplies by) a constant read only by another plain rounding:
    one QuantizeDequantize(x, [M], [A]) ending in that rounding (a quantized linear layer's bias between the
    product's rounding and the output's, where the product is no Dequant* node to take them in its epilogue).
    The constant may vary along one axis at most (a bias, a per-channel scale)."""
    y = qd.outputs[0]
    reader = graph.sole_consumer(y)
    if not _plain(qd) or y in graph.outputs or reader is None or reader.domain or reader.op_type not in ("Add", "Mul"):
        return False
    found = _post_operands(graph, reader, y)
    last = graph.sole_consumer(reader.outputs[0])
    if found is None or reader.outputs[0] in graph.outputs or not _plain(last):
        return False
    mul, add, _, _ = found
    value = const(graph, mul or add)
    if sum(d > 1 for d in value.shape) > 1:
        return False
    a = last.attrs
    attrs = {**qd.attrs, "post_scale": a["scale"], "post_low": a["low"], "post_high": a["high"]}
    inputs = [qd.inputs[0], mul, add] if add else [qd.inputs[0], mul]
    graph.replace([qd, reader, last], Node(QDQ, inputs, last.outputs, attrs, qd.name, MINFER_DOMAIN))
    return True


def _grid_of(node: Node | None) -> tuple[float, float, float] | None:
    """The (scale, low, high) grid ``node``'s output is on, when it ends in a QuantizeDequantize rounding."""
    if node is None or node.domain != MINFER_DOMAIN:
        return None
    if node.op_type == QDQ:
        a = node.attrs
        if a.get("post_scale"):  # a second rounding last: its grid
            return a["post_scale"], a.get("post_low", 0.0), a.get("post_high", 0.0)
        return None if len(node.inputs) > 1 else (a["scale"], a["low"], a["high"])
    if _has_residual(node):
        s, lo, hi = node.attrs["residual_params"]
        return float(s), float(lo), float(hi)
    if node.op_type == "FloatQLinearConv":  # `integer`'s epilogue roundings: the last one is the output's grid
        grid = node.attrs.get("residual_rounding") or node.attrs.get("output_rounding")
        return None if not grid else (float(grid[0]), float(grid[1]), float(grid[2]))
    # a Dequant* node with a second stage ends in that stage: its first activation's grid is not its output's
    slot = "post_activation" if node.op_type in DEQUANT.values() and _has_post(node) else "activation"
    if node.attrs.get(slot) == QDQ:
        s, lo, hi = node.attrs[f"{slot}_params"]
        return float(s), float(lo), float(hi)
    return None


def _redundant(graph: Graph, qd: Node) -> bool:
    """QuantizeDequantize of MaxPool/Reshape/... of values already on its grid: bypass it."""
    mover = graph.producer(qd.inputs[0])
    if not _plain(qd) or mover is None or mover.domain or mover.op_type not in GRID_KEEPING or not mover.inputs:
        return False
    source = graph.producer(mover.inputs[0])
    while source is not None and not source.domain and source.op_type in GRID_KEEPING and source.inputs:
        source = graph.producer(source.inputs[0])  # a chain of them (Reshape -> Transpose: splitting heads)
    grid = _grid_of(source)
    if grid is None or grid != (qd.attrs["scale"], qd.attrs["low"], qd.attrs["high"]):
        return False
    return graph.bypass(qd)


def _epilogue_sweep(graph: Graph) -> bool:
    changed = False
    for node in list(graph.nodes):
        if node not in graph.nodes:
            continue
        if node.domain == MINFER_DOMAIN and node.op_type in DEQUANT.values() and (
                _merge_post(graph, node) or _merge_residual(graph, node)):
            changed = True
            continue
        qd = node
        while qd in graph.nodes and _is(qd, QDQ, MINFER_DOMAIN) and _absorb_activation(graph, qd):
            qd, changed = graph.producer(qd.outputs[0]), True  # type: ignore[assignment]
        if qd in graph.nodes and _is(qd, QDQ, MINFER_DOMAIN) and (
                _redundant(graph, qd) or _into_producer(graph, qd) or _merge_rounding(graph, qd)):
            changed = True
    return changed


def qdq_epilogue_fusion(graph: Graph) -> bool:
    """Move each QuantizeDequantize into its producer's epilogue, folding Relu/Clip into its bounds."""
    changed = False
    while _epilogue_sweep(graph):
        changed = True
    return changed


def patterns() -> Any:
    """The passes' target strategy: Q -> DQ around a Conv or MatMul on DQ'd int8 weights, in random context.

    Per-tensor or per-channel weights, uint8 or int8 activations with random zero points, a Relu or Clip
    before the output's Q, a residual added and rounded, a MaxPool or Reshape re-quantized to the same grid;
    any intermediate sometimes also read elsewhere or a graph output (then that part must not fuse).
    """
    from hypothesis import strategies as st

    from minfer_core.testing import GraphBuilder
    from minfer_core.testing.strategies import expose

    def qdq(draw: Any, b: GraphBuilder, x: str, scale: str, zp: str) -> str:
        q = b.op("QuantizeLinear", x, scale, zp)
        how = draw(st.sampled_from(["none", "none", "consumer", "output"]))  # `expose`, with an integer value
        if how != "none":
            b.output(b.op("Cast", q, to=1) if how == "consumer" else q)
        return b.op("DequantizeLinear", q, scale, zp)

    def params(draw: Any, b: GraphBuilder) -> tuple[str, str]:
        dtype = draw(st.sampled_from([np.uint8, np.int8]))
        info = np.iinfo(dtype)
        zp = draw(st.integers(int(info.min) // 2, int(info.max) // 2))
        return b.const(np.float32(draw(st.sampled_from([0.02, 0.05, 0.1, 0.25])))), b.const(np.asarray(zp, dtype))

    def weight(draw: Any, b: GraphBuilder, shape: tuple[int, ...], axis: int) -> str:
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        w = b.const(rng.integers(-127, 128, shape).astype(np.int8))
        if draw(st.booleans()):
            return b.op("DequantizeLinear", w, b.const(np.float32(0.01)), b.const(np.int8(0)))
        s = b.const((rng.random(shape[axis]) * 0.02 + 0.001).astype(np.float32))
        return b.op("DequantizeLinear", w, s, b.const(np.zeros(shape[axis], np.int8)), axis=axis)

    @st.composite
    def graphs(draw: Any) -> Any:
        b = GraphBuilder(opset=13)
        conv = draw(st.booleans())
        shape = (1, draw(st.integers(1, 4)), draw(st.integers(2, 5)), draw(st.integers(2, 5))) if conv else \
            (draw(st.integers(1, 4)), draw(st.integers(1, 6)))
        x = b.input(shape)
        y = qdq(draw, b, x, *params(draw, b))
        m = draw(st.integers(1, 4))
        if conv:
            w = weight(draw, b, (m, shape[1], 2, 2), 0)
            expose(draw, b, w)
            bias = [b.const(np.linspace(-1, 1, m, dtype=np.float32))] if draw(st.booleans()) else []
            y = b.op("Conv", y, w, *bias, kernel_shape=[2, 2], pads=[1, 1, 0, 0])
        else:
            w = weight(draw, b, (shape[1], m), 1)
            expose(draw, b, w)
            y = b.op("MatMul", y, w)
        expose(draw, b, y)
        act = draw(st.sampled_from(["", "Relu", "Clip"]))
        if act:
            y = b.op("Relu", y) if act == "Relu" else b.op("Clip", y, b.const(np.float32(-0.5)), b.const(np.float32(2.0)))
            expose(draw, b, y)
        scale, zp = params(draw, b)
        y = qdq(draw, b, y, scale, zp)
        if draw(st.booleans()):  # a residual of the output's shape, then a rounding (a ResNet block's tail)
            z = qdq(draw, b, b.input((1, m, *shape[2:]) if conv else (shape[0], m)), *params(draw, b))
            y = b.op(draw(st.sampled_from(["Add", "Sum"])), *draw(st.permutations([y, z])))
            expose(draw, b, y)
            scale, zp = params(draw, b)
            y = qdq(draw, b, y, scale, zp)
        if draw(st.booleans()):  # a bias or scale after the rounding, then another rounding
            c = np.linspace(0.5, 1.5, m, dtype=np.float32).reshape((m, 1, 1) if conv else (m,))
            y = b.op(draw(st.sampled_from(["Add", "Mul"])), y, b.const(c))
            expose(draw, b, y)
            scale, zp = params(draw, b)
            y = qdq(draw, b, y, scale, zp)
        if draw(st.booleans()):
            if conv and min(shape[2:]) > 2:
                y = b.op("MaxPool", y, kernel_shape=[2, 2])
            else:
                y = b.op("Reshape", y, b.const(np.asarray([-1], np.int64)))
            y = qdq(draw, b, y, scale, zp)
        b.output(y)
        return b.build()

    return graphs()
