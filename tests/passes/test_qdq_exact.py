"""qdq_integer_conv: a QDQ conv group runs on exact integers, as onnxruntime's default level (ORT_ENABLE_ALL) runs it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from minfer_core import Engine
from modelkit import make_model, onnxruntime_levels, tensor

pytest.importorskip("onnxruntime")


def _tie_model(m: int = 8) -> tuple:
    """x -> Q/DQ -> Conv(1x1, one input channel: no summation order; DQ'd int8 W, DQ'd int32 bias) -> Q/DQ, with
    y_scale = 2 * x_scale * w_scale: each odd integer sum lies on a half step, which the integer path rounds to even
    and the float path (products of rounded dequantized values) to whichever side its rounding errors fall."""
    xs, ws = np.float32(0.0173), np.float32(0.00611)
    ys = np.float32(2) * (xs * ws)  # the integer path's multiplier is 0.5 exactly
    rng = np.random.default_rng(0)
    consts = {"xs": xs, "xz": np.int8(-3), "wq": rng.integers(-127, 128, (m, 1, 1, 1)).astype(np.int8), "ws": ws,
              "wz": np.int8(0), "bq": rng.integers(-50, 50, m).astype(np.int32), "bs": xs * ws, "bz": np.int32(0),
              "ys": ys, "yz": np.int8(5)}
    node = helper.make_node
    nodes = [node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]), node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             node("DequantizeLinear", ["wq", "ws", "wz"], ["w"]), node("DequantizeLinear", ["bq", "bs", "bz"], ["b"]),
             node("Conv", ["xd", "w", "b"], ["y"]), node("QuantizeLinear", ["y", "ys", "yz"], ["yq"]),
             node("DequantizeLinear", ["yq", "ys", "yz"], ["out"])]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
    model = make_model(nodes, [tensor("x", [1, 1, 16, 16])], [tensor("out", [1, m, 16, 16])], inits, opset=13)
    # every int8 input value once, as the float its DequantizeLinear gives (QuantizeLinear recovers it exactly)
    x = ((np.arange(-128, 128, dtype=np.float32) - np.float32(-3)) * xs).reshape(1, 1, 16, 16)
    return model, {"x": x}


def test_qdq_conv_group_gives_onnxruntime_default_levels_bits():
    """DequantizeLinear -> Conv (int8 weight, int32 bias) -> QuantizeLinear builds to an integer conv whose output
    equals onnxruntime's ORT_ENABLE_ALL (QLinearConv) bit for bit where ORT_DISABLE_ALL (a float conv) differs."""
    model, feeds = _tie_model()
    disabled, default = onnxruntime_levels(model, feeds)
    assert (disabled != default).sum() > 10  # the case separates the two ways of computing the group
    engine = Engine(model)
    assert [n.op_type for n in engine.graph.nodes] == ["FloatQLinearConv"]
    np.testing.assert_array_equal(engine.run(None, feeds)[0], default)


def test_qdq_conv_group_with_shared_input_stays_float():
    """A group whose input DequantizeLinear another node reads too (a residual) is left to the float path, as
    onnxruntime leaves it: its output then equals ORT_DISABLE_ALL's."""
    model, feeds = _tie_model()
    model.graph.node.append(helper.make_node("Identity", ["xd"], ["xd_copy"]))
    model.graph.output.append(tensor("xd_copy", [1, 1, 16, 16]))
    engine = Engine(model)
    assert "FloatQLinearConv" not in [n.op_type for n in engine.graph.nodes]
    disabled, _ = onnxruntime_levels(model, feeds)
    np.testing.assert_array_equal(engine.run(None, feeds)[0], disabled)
