"""A QDQ model's integer conv (qdq_integer_conv, then FloatQLinearConv) takes the rounding after it and a residual
block's tail (+ Z, rounded) into its epilogue, bit for bit the unfused nodes, with and without compiled steps."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from modelkit import make_model, onnxruntime_levels, ort_run, tensor
from onnx import helper, numpy_helper

from minfer_core import Engine

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.usefixtures("numba_plugin")

RNG = np.random.default_rng(5)
C, HW = 8, 9
SHAPE = [1, C, HW, HW]


def residual_block(tail: str, act: str = "Relu", depthwise: bool = False) -> onnx.ModelProto:
    """quantize_static's QDQ block: DQ(x) -> Conv(DQ(W), DQ(B)) -> Q/DQ -> act -> Q/DQ, then (``tail``) nothing,
    or Add/Sum of a quantized Z -> Q/DQ (a residual block's tail)."""
    xs, ws = np.float32(0.031), (RNG.random(C) * 0.02 + 0.002).astype(np.float32)
    consts = {"xs": xs, "xz": np.uint8(7), "wq": RNG.integers(-127, 128, (C, 1 if depthwise else C, 3, 3)).astype(np.int8),
              "ws": ws, "wz": np.zeros(C, np.int8), "bq": RNG.integers(-300, 300, C).astype(np.int32),
              "bs": xs * ws, "bz": np.zeros(C, np.int32), "ys": np.float32(0.11), "yz": np.uint8(120),
              "rs": np.float32(0.07), "rz": np.uint8(3), "zs": np.float32(0.05), "zz": np.uint8(128),
              "as": np.float32(0.09), "az": np.uint8(10)}
    node = helper.make_node
    nodes = [node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]), node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0),
             node("DequantizeLinear", ["bq", "bs", "bz"], ["b"], axis=0),
             node("Conv", ["xd", "w", "b"], ["y"], pads=[1, 1, 1, 1], group=C if depthwise else 1),
             node("QuantizeLinear", ["y", "ys", "yz"], ["yq"]), node("DequantizeLinear", ["yq", "ys", "yz"], ["yd"])]
    if act:
        nodes.append(node("Relu", ["yd"], ["ya"]))
    nodes += [node("QuantizeLinear", ["ya" if act else "yd", "rs", "rz"], ["rq"]),
              node("DequantizeLinear", ["rq", "rs", "rz"], ["rd"])]
    inputs, out = [tensor("x", SHAPE)], "rd"
    if tail:
        inputs.append(tensor("z", SHAPE))
        nodes += [node("QuantizeLinear", ["z", "zs", "zz"], ["zq"]), node("DequantizeLinear", ["zq", "zs", "zz"], ["zd"]),
                  node(tail, ["zd", "rd"] if tail == "Sum" else ["rd", "zd"], ["s"]),
                  node("QuantizeLinear", ["s", "as", "az"], ["sq"]), node("DequantizeLinear", ["sq", "as", "az"], ["out"])]
        out = "out"
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
    return make_model(nodes, inputs, [tensor(out, SHAPE)], inits, opset=13)


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {i.name: (3 * RNG.standard_normal(SHAPE)).astype(np.float32) for i in model.graph.input}


def _numpy_steps(monkeypatch) -> None:
    """The integer conv's own numpy steps: no compiled Requantize, no registered rounding kernel."""
    from minfer_ops_conv import requantize

    monkeypatch.setattr(requantize.Compiled, "find", staticmethod(lambda *a, **k: None))
    monkeypatch.setattr(requantize, "registered_rounding", lambda *a, **k: None)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("depthwise", [False, True])
@pytest.mark.parametrize("tail", ["", "Add", "Sum"])
def test_rounding_and_residual_tail_join_the_integer_conv_exactly(monkeypatch, tail, depthwise, compiled):
    """The QuantizeDequantize after a FloatQLinearConv (``output_rounding``) and a residual Add/Sum with its rounding
    (``residual_rounding``, Z input 11) join its epilogue: one node, bit for bit the graph without the integer
    fusion, and within one output step of onnxruntime's default level."""
    if not compiled:
        _numpy_steps(monkeypatch)
    model = residual_block(tail, depthwise=depthwise)
    feeds = _feeds(model)
    engine = Engine(model)
    convs = [n for n in engine.graph.nodes if n.op_type == "FloatQLinearConv"]
    assert len(convs) == 1 and "output_rounding" in convs[0].attrs, [n.op_type for n in engine.graph.nodes]
    assert ("residual_rounding" in convs[0].attrs) == bool(tail)
    assert [n.op_type for n in engine.graph.nodes].count("QuantizeDequantize") == (1 if tail else 0)  # Z's own
    got = engine.run(None, feeds)[0]
    unfused = Engine(model, disabled_passes=("integer_conv_fusion",))
    assert "FloatQLinearConv" not in [n.op_type for n in unfused.graph.nodes]
    np.testing.assert_array_equal(got, unfused.run(None, feeds)[0])
    step = 0.09 if tail else 0.07  # the output grid's: onnxruntime's QLinearAdd rounds its own way
    np.testing.assert_allclose(got, onnxruntime_levels(model, feeds)[1], rtol=0, atol=step + 1e-6)


def _sum_read_by_a_conv() -> onnx.ModelProto:
    """residual_block("Add") whose rounded sum (Q -> DQ) a second QDQ conv alone reads: a stage's last block in
    MobileNetV2, where the conv takes the QuantizeLinear in (``float_input`` 1) and no rounding node is left."""
    model = residual_block("Add")
    rng = np.random.default_rng(1)
    extra = {"w2q": rng.integers(-127, 128, (C, C, 1, 1)).astype(np.int8), "w2s": np.float32(0.01),
             "w2z": np.int8(0), "y2s": np.float32(0.1), "y2z": np.uint8(100), "o2s": np.float32(0.08),
             "o2z": np.uint8(3)}
    node = helper.make_node
    model.graph.node.extend([
        node("DequantizeLinear", ["w2q", "w2s", "w2z"], ["w2"]), node("Conv", ["out", "w2"], ["y2"]),
        node("QuantizeLinear", ["y2", "y2s", "y2z"], ["y2q"]), node("DequantizeLinear", ["y2q", "y2s", "y2z"], ["y2d"]),
        node("Relu", ["y2d"], ["r2"]),
        node("QuantizeLinear", ["r2", "o2s", "o2z"], ["r2q"]), node("DequantizeLinear", ["r2q", "o2s", "o2z"], ["out2"])])
    model.graph.initializer.extend([numpy_helper.from_array(np.asarray(v), k) for k, v in extra.items()])
    del model.graph.output[:]
    model.graph.output.extend([tensor("out2", SHAPE)])
    return model


@pytest.mark.parametrize("compiled", [True, False])
def test_residual_sum_the_next_conv_quantizes_is_rounded_in_the_epilogue(monkeypatch, compiled):
    """A residual sum whose readers all quantize it on one grid (here the next conv, through the QuantizeLinear it
    took in) is rounded on that grid in the first conv's epilogue (``residual_rounding``): no Add node is left, and
    the outputs are bit for bit the graph's without the integer fusion (the second conv quantizes a value of its
    grid: the same integers), within one step of onnxruntime's default level."""
    if not compiled:
        _numpy_steps(monkeypatch)
    model = _sum_read_by_a_conv()
    feeds = _feeds(model)
    engine = Engine(model)
    ops = [n.op_type for n in engine.graph.nodes]
    assert "Add" not in ops and ops.count("FloatQLinearConv") == 2, ops
    first = next(n for n in engine.graph.nodes if "residual_rounding" in n.attrs)
    assert first.attrs["residual_rounding"] == [float(np.float32(0.09)), -10.0, 245.0]  # the sum's Q: scale, zp 10
    got = engine.run(None, feeds)[0]
    unfused = Engine(model, disabled_passes=("integer_conv_fusion",))
    np.testing.assert_array_equal(got, unfused.run(None, feeds)[0])
    np.testing.assert_allclose(got, onnxruntime_levels(model, feeds)[1], rtol=0, atol=0.08 + 1e-6)


def test_rounding_is_not_fused_into_a_node_that_already_quantizes_its_output():
    """A FloatQLinearConv whose output another FloatQLinearConv reads (``output_quantization``) keeps that grid: the
    two last steps are exclusive, and the kernel refuses both with a message naming them."""
    from minfer_core import KernelContext, TensorType, get_registry, prepare_node

    t = TensorType(np.float32, tuple(SHAPE))
    scalars = [TensorType(np.float32, ()), TensorType(np.uint8, ())]
    types = (t, *scalars, TensorType(np.int8, (C, C, 3, 3)), TensorType(np.float32, ()), TensorType(np.int8, ()),
             *scalars)
    consts = (None, np.float32(0.1), np.uint8(0), np.ones((C, C, 3, 3), np.int8), np.float32(0.1), np.int8(0),
              np.float32(0.1), np.uint8(0))
    ctx = KernelContext("both", "FloatQLinearConv", 1, types, (t,), consts, 1)
    attrs = dict(float_input=1, float_output=1, output_quantization=[0.1, 0.0, 255.0], output_rounding=[0.1, 0.0, 255.0],
                 pads=[1, 1, 1, 1], kernel_shape=[3, 3])
    with pytest.raises(Exception, match="output_quantization.*output_rounding"):
        prepare_node(get_registry(), ctx, attrs, "ai.minfer")


@pytest.mark.parametrize("tail", ["", "Add"])
def test_rounded_integer_conv_lowers_for_portable(tmp_path, tail):
    """`minfer optimize --portable` writes the epilogue's roundings and residual back as QuantizeLinear ->
    DequantizeLinear pairs and an Add, which onnxruntime runs to the original model's outputs."""
    from minfer_core.cli import main

    model = residual_block(tail)
    src, dst = tmp_path / "q.onnx", tmp_path / "portable.onnx"
    onnx.save(model, src)
    assert main(["optimize", str(src), str(dst), "--portable"]) == 0
    portable = onnx.load(str(dst))
    portable.ir_version = model.ir_version
    assert {n.domain for n in portable.graph.node} == {""}
    feeds = _feeds(model)
    np.testing.assert_array_equal(ort_run(portable, feeds)[0], Engine(model).run(None, feeds)[0])


def test_rounding_after_maxpool_of_a_rounded_integer_conv_is_dropped():
    """A MaxPool of a FloatQLinearConv's rounded output, quantized again on the same grid (a QDQ ResNet's stem), reads
    grid values: qdq_epilogue_fusion drops that rounding, and the output stays bit for bit the unfused graph's."""
    model = residual_block("", act="")  # a Relu would narrow the first grid's bounds: then the two grids differ
    node = helper.make_node
    model.graph.node.extend([node("MaxPool", ["rd"], ["p"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
                             node("QuantizeLinear", ["p", "rs", "rz"], ["pq"]),
                             node("DequantizeLinear", ["pq", "rs", "rz"], ["pd"])])
    model.graph.output[0].CopyFrom(tensor("pd", [1, C, 5, 5]))
    feeds = _feeds(model)
    engine = Engine(model)
    assert [n.op_type for n in engine.graph.nodes] == ["FloatQLinearConv", "MaxPool"]
    unfused = Engine(model, disabled_passes=("integer_conv_fusion",))
    np.testing.assert_array_equal(engine.run(None, feeds)[0], unfused.run(None, feeds)[0])


def test_a_residual_rounded_conv_s_type_is_inferred():
    """FloatQLinearConv's inference takes every attribute the integer fusion gives it, ``residual_rounding`` too (it
    was passed on to onnx's Conv inference, which refused it: a graph whose fused conv's type was inferred again, as
    the pass suite's runs do, failed to build)."""
    from minfer_core import TensorType
    from minfer_ops_conv.qlinear import _infer_float_qlinear_conv

    f32, i8 = np.dtype(np.float32), np.dtype(np.int8)
    types = (TensorType(i8, (1, 1, 6, 4)), TensorType(f32, ()), TensorType(i8, ()), TensorType(i8, (3, 1, 3, 3)),
             TensorType(f32, ()), TensorType(i8, ()), TensorType(f32, ()), TensorType(i8, ()), None,
             TensorType(f32, (3,)), TensorType(f32, (3,)), TensorType(f32, (1, 3, 4, 2)))
    (out,) = _infer_float_qlinear_conv(*types, float_output=1, output_rounding=[0.05, -128.0, 127.0],
                                       residual_rounding=[0.05, -128.0, 127.0], kernel_shape=[3, 3], strides=[2, 2],
                                       pads=[1, 1, 1, 1])
    assert out.dtype == f32 and tuple(out.shape) == (1, 3, 3, 2)
