"""QDQ transformer layers: the rounding a quantizer repeats after splitting heads (Reshape -> Transpose) goes."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from minfer_core import Engine
from modelkit import make_model, tensor


def _split_heads_model() -> object:
    """x -> Q/DQ -> MatMul(DQ(int8 W)) -> Q/DQ -> Reshape (4 heads) -> Transpose -> Q/DQ on the same grid, as
    quantize_static writes a transformer's query projection."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-127, 128, (16, 16)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.float32(0.01), "ws"), numpy_helper.from_array(np.int8(0), "wz"),
             numpy_helper.from_array(np.array([1, 6, 4, 4], np.int64), "heads")]
    for name, s, z in (("x", 0.05, 3), ("y", 0.04, -2)):
        inits += [numpy_helper.from_array(np.float32(s), f"{name}s"), numpy_helper.from_array(np.int8(z), f"{name}z")]
    nodes = [helper.make_node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]),
             helper.make_node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"]),
             helper.make_node("MatMul", ["xd", "w"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "ys", "yz"], ["mq"]),
             helper.make_node("DequantizeLinear", ["mq", "ys", "yz"], ["md"]),
             helper.make_node("Reshape", ["md", "heads"], ["r"]),
             helper.make_node("Transpose", ["r"], ["t"], perm=[0, 2, 1, 3]),
             helper.make_node("QuantizeLinear", ["t", "ys", "yz"], ["tq"]),
             helper.make_node("DequantizeLinear", ["tq", "ys", "yz"], ["y"])]
    return make_model(nodes, [tensor("x", [1, 6, 16])], [tensor("y", [1, 4, 6, 4])], inits, opset=13)


def test_rounding_after_reshape_and_transpose_of_grid_values_is_removed():
    """A Q/DQ pair after Reshape -> Transpose of values a rounding on the same grid produced changes nothing: the
    built graph ends at the Transpose (the chain of movers is followed back to the rounding), same outputs."""
    model = _split_heads_model()
    engine = Engine(model)
    assert [n.op_type for n in engine.graph.nodes][-2:] == ["Reshape", "Transpose"]
    x = (3 * np.random.default_rng(1).standard_normal((1, 6, 16))).astype(np.float32)
    np.testing.assert_array_equal(engine.run(None, {"x": x})[0], Engine(model, passes="none").run(None, {"x": x})[0])
