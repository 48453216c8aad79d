"""An 8-bit edge between two integer convs (QLinearConv -> QLinearConv: a QDQ model quantized after onnxruntime's
quant_pre_process folded its BatchNormalizations, or a QOperator model) becomes the centered-integer edge the
integer fusion makes between FloatQLinearConvs: bit for bit the unfused graph and onnxruntime, with and without
minfer-ops-numba (whose kernels take float32 outputs only: before this, such convs fell to the numpy kernel)."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from modelkit import make_model, ort_run, tensor
from onnx import helper, numpy_helper

from minfer_core import Engine

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.usefixtures("numba_plugin")

C = 8


def chain(x_type: type, depthwise: bool, reader: str) -> onnx.ModelProto:
    """x -> QuantizeLinear -> QLinearConv A -> QLinearConv B (reading A's 8-bit y as it is) -> DequantizeLinear;
    ``reader``: what else reads y ("none"; "dequantize": a DequantizeLinear to a second output; "output": y itself
    is a graph output; "add": a residual QLinearAdd of y and x's 8-bit value, and no conv B)."""
    rng = np.random.default_rng(5 + depthwise)
    consts = {"xs": np.float32(0.05), "xz": np.asarray(7, x_type), "ys": np.float32(0.11), "yz": np.asarray(3, x_type),
              "zs": np.float32(0.2), "zz": np.asarray(-2 if x_type is np.int8 else 130, x_type)}
    for i in "ab":
        consts[f"w{i}"] = rng.integers(-127, 128, (C, 1 if depthwise else C, 3, 3)).astype(np.int8)
        consts[f"ws{i}"] = (rng.random(C) * 0.02 + 0.001).astype(np.float32)
        consts[f"wz{i}"] = np.zeros(C, np.int8)
        consts[f"b{i}"] = rng.integers(-500, 500, C).astype(np.int32)
    group = C if depthwise else 1
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("QLinearConv", ["xq", "xs", "xz", "wa", "wsa", "wza", "ys", "yz", "ba"], ["y"],
                              pads=[1, 1, 1, 1], group=group),
             helper.make_node("QLinearConv", ["y", "ys", "yz", "wb", "wsb", "wzb", "zs", "zz", "bb"], ["z"],
                              pads=[1, 1, 1, 1], group=group),
             helper.make_node("DequantizeLinear", ["z", "zs", "zz"], ["out"])]
    outputs = [tensor("out", [1, C, 7, 7])]
    extra = {}
    if reader == "add":  # the residual tail of a QOperator model's block: y's only reader
        nodes[2] = helper.make_node("QLinearAdd", ["y", "ys", "yz", "xq", "xs", "xz", "zs", "zz"], ["z"],
                                    domain="com.microsoft")
        extra["extra_opsets"] = [helper.make_opsetid("com.microsoft", 1)]
    if reader == "dequantize":
        nodes.append(helper.make_node("DequantizeLinear", ["y", "ys", "yz"], ["side"]))
        outputs.append(tensor("side", [1, C, 7, 7]))
    elif reader == "output":
        elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(x_type))
        outputs.append(helper.make_tensor_value_info("y", elem, [1, C, 7, 7]))
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
    return make_model(nodes, [tensor("x", [1, C, 7, 7])], outputs, inits, opset=13, **extra)


@pytest.mark.parametrize("reader", ["none", "dequantize", "output", "add"])
@pytest.mark.parametrize("depthwise", [False, True])
@pytest.mark.parametrize("x_type", [np.uint8, np.int8])
def test_eight_bit_edge_becomes_centered_integers_exactly(x_type, depthwise, reader):
    """The writer quantizes its output on its own grid (``output_quantization``), the conv reader takes the centered
    integers (``float_input`` 2), any other reader gets the 8-bit y back from a QuantizeLinear (an add alone too);
    a y that is a graph output stays 8-bit. Every output equals the unfused graph's and onnxruntime's."""
    model = chain(x_type, depthwise, reader)
    x = (3 * np.random.default_rng(1).standard_normal((1, C, 7, 7))).astype(np.float32)
    engine = Engine(model)
    nodes = list(engine.graph.nodes)
    convs = [n for n in nodes if n.op_type == "FloatQLinearConv"]
    if reader == "output":
        assert not any(n.attrs.get("float_input") == 2 for n in convs), [n.attrs for n in convs]
    elif reader == "add":  # the conv's float32 output (the compiled kernels'), quantized again for the add
        (conv,) = convs
        assert conv.attrs["float_output"] == 1 and conv.attrs["output_quantization"][0] == pytest.approx(0.11)
        requantize = engine.graph.producer("y")
        assert requantize.op_type == "QuantizeLinear" and requantize.inputs[0] == conv.outputs[0]
    else:
        assert len(convs) == 2, [n.op_type for n in nodes]
        first, second = convs
        assert first.attrs["float_output"] == 1 and first.attrs["output_quantization"][0] == pytest.approx(0.11)
        assert second.attrs["float_input"] == 2 and second.inputs[0] == first.outputs[0]
        requantized = [n for n in nodes if n.op_type == "QuantizeLinear"]
        assert len(requantized) == (reader == "dequantize"), [n.op_type for n in nodes]
    got = engine.run(None, {"x": x})
    unfused = Engine(model, disabled_passes=("integer_conv_fusion",)).run(None, {"x": x})
    want = ort_run(model, {"x": x})
    for g, u, w in zip(got, unfused, want):
        assert g.dtype == w.dtype
        np.testing.assert_array_equal(g, u)
        # onnxruntime's QLinearAdd rounds its float sum by its own formula: it may land one step of z's grid (0.2)
        # off minfer's, with or without the rewrite (minfer's own unfused graph gives the bits above)
        np.testing.assert_allclose(g, w, rtol=0, atol=0.2 * 1.001 if reader == "add" else 0)
