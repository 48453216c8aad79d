"""``integer_conv_fusion``: the float conversions around an integer conv, in the conv's input conversion and epilogue.

onnxruntime's QOperator format (quantize_static) leaves the float ops it does not quantize (a BatchNormalization it
was not asked to fold, a Clip, ...) between ``DequantizeLinear`` and ``QuantizeLinear`` nodes, so that each
QLinearConv of such a model is read from a QuantizeLinear and read by a DequantizeLinear. Each of those is a pass
over the whole tensor out of cache, and an 8-bit array written only to be converted back to float.

Pattern: a QLinearConv whose input X is the output of a QuantizeLinear (per tensor, constant float32 scale and 8-bit
zero point equal to the conv's ``x_scale``/``x_zero_point`` constants) that nothing else reads, and/or whose output
is read only by a DequantizeLinear with the conv's ``y_scale``/``y_zero_point`` constants; never through a graph
output. Replacement: ``ai.minfer::FloatQLinearConv`` (minfer-ops-conv's kernel) with the conv's inputs (X the
QuantizeLinear's float input when ``float_input``), its attributes, and ``float_input``/``float_output``: the
kernel quantizes X while converting it for the integer conv and dequantizes each output tile in its epilogue.

Exact: the kernel does the same float32 operations as the three nodes (QuantizeLinear's division and
round-half-even, the conv's exact integer sums and requantization, DequantizeLinear's ``(q - zp) * scale``).

onnxruntime's quantize_dynamic follows each ConvInteger with ``Cast`` (to float32) and ``Mul`` by the product of
the input's and the weight's scales: two more passes over the output. Pattern: a ConvInteger whose output only a
Cast to float32 reads, whose output only a Mul by a float32 value of one element (no broadcast beyond the output's
rank) reads; never through a graph output. Replacement: ``ai.minfer::ScaledConvInteger(x, w, x_zero_point,
w_zero_point, scale)``, the conv's attributes: its epilogue rounds each tile's exact integers to float32 as the
Cast does and multiplies them as the Mul does. Exact too.

``--portable`` lowers the nodes back to the ones they stand for (`lower_integer`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import Graph, Node

from ._util import MINFER_DOMAIN, const, fresh, has_kernel

FUSED = "FloatQLinearConv"
SCALED = "ScaledConvInteger"
INT8 = (np.dtype(np.int8), np.dtype(np.uint8))
# a QuantizeLinear or DequantizeLinear with any other attribute (blocked, another output type, a precision) is not
# the per-tensor one the kernel computes
PLAIN_ATTRS = {"axis"}


def _params(graph: Graph, scale_name: str, zp_name: str) -> tuple[np.ndarray, np.ndarray] | None:
    """A per-tensor float32 scale and 8-bit zero point, both constant."""
    scale, zp = const(graph, scale_name), const(graph, zp_name)
    if scale is None or zp is None or scale.size != 1 or zp.size != 1 or scale.dtype != np.float32:
        return None
    return (scale, zp) if zp.dtype in INT8 else None


def _same(a: tuple[np.ndarray, np.ndarray] | None, b: tuple[np.ndarray, np.ndarray] | None) -> bool:
    return a is not None and b is not None and a[1].dtype == b[1].dtype and all(
        np.array_equal(x.reshape(-1), y.reshape(-1)) for x, y in zip(a, b))


def _quantize_in(graph: Graph, conv: Node) -> Node | None:
    """The QuantizeLinear whose float32 output only ``conv`` reads, as its X, with the conv's x parameters."""
    q = graph.producer(conv.inputs[0])
    if q is None or q.domain or q.op_type != "QuantizeLinear" or len(q.inputs) < 3 or set(q.attrs) - PLAIN_ATTRS:
        return None
    t = graph.type_of(q.inputs[0])
    if t is None or t.dtype != np.float32 or q.outputs[0] in graph.outputs:
        return None
    if graph.sole_consumer(q.outputs[0]) is not conv:
        return None
    if conv.inputs.count(q.outputs[0]) != 1:
        return None
    same = _same(_params(graph, q.inputs[1], q.inputs[2]), _params(graph, conv.inputs[1], conv.inputs[2]))
    return q if same else None


def _dequantize_out(graph: Graph, conv: Node) -> Node | None:
    """The DequantizeLinear that alone reads ``conv``'s output, with the conv's y parameters."""
    y = conv.outputs[0]
    dq = graph.sole_consumer(y)
    if dq is None or dq.domain or dq.op_type != "DequantizeLinear" or y in graph.outputs or len(dq.inputs) < 3:
        return None
    if dq.inputs[0] != y or y in dq.inputs[1:] or set(dq.attrs) - PLAIN_ATTRS:
        return None
    same = _same(_params(graph, dq.inputs[1], dq.inputs[2]), _params(graph, conv.inputs[6], conv.inputs[7]))
    return dq if same else None


def integer_conv_fusion(graph: Graph) -> bool:
    """QuantizeLinear -> QLinearConv -> DequantizeLinear (either end alone too) as one FloatQLinearConv; ConvInteger
    -> Cast to float32 -> Mul by one float32 value as one ScaledConvInteger."""
    fused = _qlinear_convs(graph)
    return _scaled_convs(graph) or fused


def _scale_of(graph: Graph, mul: Node, cast_out: str, rank: int) -> str | None:
    """The Mul's other operand when it is one float32 element that does not broadcast beyond ``rank`` dims."""
    others = [v for v in mul.inputs if v != cast_out]
    if len(mul.inputs) != 2 or len(others) != 1:
        return None
    t = graph.type_of(others[0])
    if t is None or t.dtype != np.float32 or t.shape is None or len(t.shape) > rank:
        return None
    return others[0] if all(d == 1 for d in t.shape) else None


def _scaled_convs(graph: Graph) -> bool:
    if not has_kernel(graph, MINFER_DOMAIN, SCALED):
        return False
    changed = False
    for conv in list(graph.nodes):
        if conv.domain or conv.op_type != "ConvInteger" or conv.outputs[0] in graph.outputs:
            continue
        cast = graph.sole_consumer(conv.outputs[0])
        if cast is None or cast.domain or cast.op_type != "Cast" or cast.attrs.get("to") != 1:
            continue
        mul = graph.sole_consumer(cast.outputs[0])
        t = graph.type_of(conv.outputs[0])
        if mul is None or mul.domain or mul.op_type != "Mul" or cast.outputs[0] in graph.outputs or t is None:
            continue
        scale = _scale_of(graph, mul, cast.outputs[0], len(t.shape) if t.shape is not None else 0)
        if scale is None:
            continue
        inputs = (list(conv.inputs) + [""] * 4)[:4] + [scale]
        graph.opsets.setdefault(MINFER_DOMAIN, 1)
        graph.replace([conv, cast, mul], Node(SCALED, inputs, list(mul.outputs), dict(conv.attrs), conv.name,
                                              MINFER_DOMAIN))
        changed = True
    return changed


def _qlinear_convs(graph: Graph) -> bool:
    if not has_kernel(graph, MINFER_DOMAIN, FUSED):
        return False
    changed = False
    for conv in list(graph.nodes):
        if conv.domain or conv.op_type != "QLinearConv" or len(conv.inputs) < 8:
            continue
        q, dq = _quantize_in(graph, conv), _dequantize_out(graph, conv)
        if q is None and dq is None:
            continue
        inputs = list(conv.inputs)
        if q is not None:
            inputs[0] = q.inputs[0]
        outputs = list(dq.outputs if dq is not None else conv.outputs)
        attrs = {**conv.attrs, "float_input": int(q is not None), "float_output": int(dq is not None)}
        graph.opsets.setdefault(MINFER_DOMAIN, 1)
        graph.replace([n for n in (q, conv, dq) if n is not None], Node(FUSED, inputs, outputs, attrs, conv.name,
                                                                          MINFER_DOMAIN))
        changed = True
    return changed


def lower_integer(graph: Graph) -> bool:
    """--portable: each FloatQLinearConv back to [QuantizeLinear ->] QLinearConv [-> DequantizeLinear], each
    ScaledConvInteger to ConvInteger -> Cast -> Mul."""
    changed = False
    for node in list(graph.nodes):
        if node.domain == MINFER_DOMAIN and node.op_type == SCALED:
            _lower_scaled(graph, node)
            changed = True
        if node.domain != MINFER_DOMAIN or node.op_type != FUSED:
            continue
        attrs = dict(node.attrs)
        float_in, float_out = attrs.pop("float_input", 0), attrs.pop("float_output", 0)
        inputs, new = list(node.inputs), []
        name = node.name or "qlinear_conv"
        if float_in:
            xq = fresh(graph, f"{name}_x_quantized")
            new.append(Node("QuantizeLinear", inputs[:3], [xq], {}, fresh(graph, f"{name}_quantize")))
            inputs[0] = xq
        y = fresh(graph, f"{name}_y_quantized") if float_out else node.outputs[0]
        new.append(Node("QLinearConv", inputs, [y], attrs, node.name, ""))
        if float_out:
            new.append(Node("DequantizeLinear", [y, inputs[6], inputs[7]], list(node.outputs), {},
                            fresh(graph, f"{name}_dequantize")))
        graph.replace([node], new)
        changed = True
    return changed


def _lower_scaled(graph: Graph, node: Node) -> None:
    inputs = list(node.inputs[:4])
    while inputs and not inputs[-1]:
        inputs.pop()
    name = node.name or "conv_integer"
    y, f = fresh(graph, f"{name}_int32"), fresh(graph, f"{name}_float")
    graph.replace([node], [Node("ConvInteger", inputs, [y], dict(node.attrs), node.name, ""),
                           Node("Cast", [y], [f], {"to": 1}, fresh(graph, f"{name}_cast")),
                           Node("Mul", [f, node.inputs[4]], list(node.outputs), {}, fresh(graph, f"{name}_scale"))])


def patterns() -> Any:
    """The pass's target strategy: Q -> QLinearConv -> DQ (int8 or uint8 activations, random zero points, a bias,
    per-tensor or per-channel weights, stride 1 or 2), or ConvInteger -> Cast -> Mul by a scalar, each intermediate
    sometimes read elsewhere or a graph output."""
    from hypothesis import strategies as st

    from minfer_core.testing import GraphBuilder

    def exposed(draw: Any, b: GraphBuilder, value: str) -> None:
        """`strategies.expose` for an 8-bit value: nothing, another reader (a Cast: no Neg of uint8), or an output."""
        how = draw(st.sampled_from(["none", "none", "consumer", "output"]))
        if how != "none":
            b.output(b.op("Cast", value, to=1) if how == "consumer" else value)

    def params(draw: Any, b: GraphBuilder, dtype: Any) -> tuple[str, str]:
        info = np.iinfo(dtype)
        zp = draw(st.integers(int(info.min) // 2, int(info.max) // 2))
        return b.const(np.float32(draw(st.sampled_from([0.02, 0.05, 0.1])))), b.const(np.asarray(zp, dtype))

    @st.composite
    def scaled(draw: Any) -> Any:
        """ConvInteger (uint8 input, int8 weights, zero points or not) -> Cast -> Mul by a float32 scalar."""
        b = GraphBuilder(opset=13)
        c, m = draw(st.integers(1, 4)), draw(st.integers(1, 4))
        x = b.input((1, c, draw(st.integers(3, 6)), draw(st.integers(3, 6))), dtype=np.uint8)
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        w = b.const(rng.integers(-127, 128, (m, c, 3, 3)).astype(np.int8))
        zps = [b.const(np.uint8(draw(st.integers(0, 255)))), b.const(np.int8(draw(st.integers(-3, 3))))]
        y = b.op("ConvInteger", x, w, *zps[: draw(st.integers(0, 2))], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
        exposed(draw, b, y)
        f = b.op("Cast", y, to=1)
        exposed(draw, b, f)
        s = b.input(draw(st.sampled_from([(), (1,), (1, 1, 1, 1)]))) if draw(st.booleans()) else \
            b.const(np.float32(draw(st.sampled_from([0.001, 0.37]))))
        b.output(b.op("Mul", *draw(st.permutations([f, s]))))
        return b.build()

    @st.composite
    def graphs(draw: Any) -> Any:
        b = GraphBuilder(opset=13)
        dtype = draw(st.sampled_from([np.uint8, np.int8]))
        c, m, depthwise = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.booleans())
        m = c if depthwise else m
        x = b.input((1, c, draw(st.integers(3, 6)), draw(st.integers(3, 6))))
        xs, xz = params(draw, b, dtype)
        xq = b.op("QuantizeLinear", x, xs, xz)
        exposed(draw, b, xq)
        rng = np.random.default_rng(draw(st.integers(0, 2**16)))
        w = b.const(rng.integers(-127, 128, (m, 1 if depthwise else c, 3, 3)).astype(np.int8))
        per_channel = draw(st.booleans())
        ws = b.const((rng.random(m) * 0.02 + 0.001).astype(np.float32) if per_channel else np.float32(0.01))
        wz = b.const(np.zeros(m, np.int8) if per_channel else np.int8(0))
        ys, yz = params(draw, b, dtype)
        bias = [b.const(rng.integers(-500, 500, m).astype(np.int32))] if draw(st.booleans()) else []
        stride = draw(st.sampled_from([1, 2]))
        y = b.op("QLinearConv", xq, xs, xz, w, ws, wz, ys, yz, *bias, kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                 strides=[stride, stride], group=m if depthwise else 1)
        exposed(draw, b, y)
        b.output(b.op("DequantizeLinear", y, ys, yz))
        return b.build()

    return st.one_of(graphs(), scaled())
