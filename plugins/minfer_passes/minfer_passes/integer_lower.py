"""``--portable``'s lowering of `integer`'s nodes: each FloatQLinearConv and ScaledConvInteger back to the standard
ops it stands for, its epilogue's ChannelAffine, roundings and residual Add after them (exact: the same float32
operations, node by node)."""

from __future__ import annotations

from minfer_core import Graph, Node

from ._util import MINFER_DOMAIN, fresh
from .integer import AFFINE, AFFINE_SLOT, FUSED, SCALED
from .qdq_ops import qdq_nodes


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
        # a quantized edge (`_quantized_edges`) lowers to the float value and its reader's QuantizeLinear
        float_in, float_out = attrs.pop("float_input", 0), attrs.pop("float_output", 0)
        attrs.pop("output_quantization", None)
        rounding = attrs.pop("output_rounding", None)
        residual = attrs.pop("residual_rounding", None)
        last = node.outputs[0]
        if rounding:  # the epilogue's last step: QuantizeLinear -> DequantizeLinear of what the rest computes
            last = fresh(graph, f"{node.name or 'qlinear_conv'}_unrounded")
            if graph.type_of(node.outputs[0]) is not None:
                graph.types[last] = graph.type_of(node.outputs[0])
        affine = _lowered_affine(graph, node, attrs, AFFINE_SLOT[FUSED], last)
        inputs, new = list(node.inputs[: AFFINE_SLOT[FUSED]]), []
        while len(inputs) > 8 and not inputs[-1]:
            inputs.pop()
        name = node.name or "qlinear_conv"
        if float_in:
            xq = fresh(graph, f"{name}_x_quantized")
            new.append(Node("QuantizeLinear", inputs[:3], [xq], {}, fresh(graph, f"{name}_quantize")))
            inputs[0] = xq
        y = fresh(graph, f"{name}_y_quantized") if float_out else node.outputs[0]
        new.append(Node("QLinearConv", inputs, [y], attrs, node.name, ""))
        if float_out:
            f = affine.inputs[0] if affine is not None else last
            new.append(Node("DequantizeLinear", [y, inputs[6], inputs[7]], [f], {}, fresh(graph, f"{name}_dequantize")))
        if affine is not None:
            new.append(affine)
        if rounding and residual:  # then + Z (input 11) and its rounding
            rounded, total = fresh(graph, f"{name}_rounded"), fresh(graph, f"{name}_plus_residual")
            for v in (rounded, total):
                if graph.type_of(node.outputs[0]) is not None:
                    graph.types[v] = graph.type_of(node.outputs[0])
            new += qdq_nodes(graph, last, rounded, *rounding, name=f"{name}_rounding")
            new.append(Node("Add", [rounded, node.inputs[11]], [total], {}, fresh(graph, f"{name}_residual")))
            new += qdq_nodes(graph, total, node.outputs[0], *residual, name=f"{name}_residual_rounding")
        elif rounding:
            new += qdq_nodes(graph, last, node.outputs[0], *rounding, name=f"{name}_rounding")
        graph.replace([node], new)
        changed = True
    return changed


def _lowered_affine(graph: Graph, node: Node, attrs: dict, slot: int, out: str | None = None) -> Node | None:
    """The ChannelAffine node an integer conv's epilogue stands for (reading a fresh value typed as the output,
    writing ``out``, the node's output by default), or None; takes the activation out of ``attrs``."""
    act, params = attrs.pop("activation", ""), attrs.pop("activation_params", [])
    if not any(node.inputs[slot : slot + 2]):  # none, or empty slots before a residual Z
        return None
    mid = fresh(graph, f"{node.name or node.op_type}_pre_affine")
    t = graph.type_of(node.outputs[0])
    if t is not None:
        graph.types[mid] = t
    ca_attrs = {"activation": act, "activation_params": list(params)} if act else {}
    return Node(AFFINE, [mid, *node.inputs[slot : slot + 2]], [out or node.outputs[0]], ca_attrs,
                fresh(graph, f"{node.name or node.op_type}_affine"), MINFER_DOMAIN)


def _lower_scaled(graph: Graph, node: Node) -> None:
    attrs = dict(node.attrs)
    affine = _lowered_affine(graph, node, attrs, AFFINE_SLOT[SCALED])
    dynamic = bool(attrs.pop("dynamic_input", 0))
    scaled = affine.inputs[0] if affine is not None else node.outputs[0]
    graph.replace([node], lowered_scaled(graph, node, "ConvInteger", attrs, dynamic, scaled, "conv_integer")
                  + ([affine] if affine is not None else []))


def lowered_scaled(graph: Graph, node: Node, op_type: str, attrs: dict, dynamic: bool, out: str,
                   default_name: str) -> list[Node]:
    """A scaled integer node (ScaledConvInteger, ScaledMatMulInteger: X, W, x_zero_point, w_zero_point, scale) as
    ``op_type`` (ConvInteger, MatMulInteger) with ``attrs``, Cast to float32 and Mul by its scale into ``out``; when
    ``dynamic`` (its ``dynamic_input``), first the DynamicQuantizeLinear of X and the Mul of its scale by input 4."""
    inputs, scale, new = list(node.inputs[:4]), node.inputs[4], []
    name = node.name or default_name
    if dynamic:
        xq, xs, xz, scale = (fresh(graph, f"{name}_{part}") for part in ("x_quantized", "x_scale", "x_zero_point",
                                                                            "scale"))
        new += [Node("DynamicQuantizeLinear", [inputs[0]], [xq, xs, xz], {}, fresh(graph, f"{name}_quantize")),
                Node("Mul", [xs, node.inputs[4]], [scale], {}, fresh(graph, f"{name}_scales"))]
        inputs[0], inputs[2] = xq, xz
    while inputs and not inputs[-1]:
        inputs.pop()
    y, f = fresh(graph, f"{name}_int32"), fresh(graph, f"{name}_float")
    return new + [Node(op_type, inputs, [y], attrs, node.name, ""),
                  Node("Cast", [y], [f], {"to": 1}, fresh(graph, f"{name}_cast")),
                  Node("Mul", [f, scale], [out], {}, fresh(graph, f"{name}_scale"))]
