"""Integer kernels' fast paths stay exact: depthwise integer convs through the registered Conv kernel, integer
products with constant 8-bit weights in one float32 GEMM when that GEMM's sums are exact, QLinearConv fused with
the QuantizeLinear before it and the DequantizeLinear after it."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from modelkit import make_model, ort_run, tensor
from onnx import TensorProto, helper, numpy_helper

from minfer_core import Engine, hookimpl, kernel, use_plugins

pytest.importorskip("onnxruntime")

RNG = np.random.default_rng(15)
SEEN: list[np.ndarray] = []


@kernel("Conv", since=1, priority=1000, prepare=True, out=True, views=False, packed=(1, 2), epilogue=True)
def spy_conv(ctx, **attrs):
    """Conv (test): records the weights it was prepared with, then runs minfer-ops-conv's Conv."""
    from minfer_ops_conv import conv

    SEEN.append(ctx.constants[1])
    return conv.conv.fn(ctx, **attrs)


class SpyPlugin:
    __name__ = "spy-conv"

    @hookimpl
    def register_kernels(self, register):
        register(spy_conv)


def _inits(**consts: np.ndarray) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]


def depthwise_model(op_type: str, x_type: type, stride: int) -> onnx.ModelProto:
    """A depthwise 3x3 QLinearConv (per-channel weights, bias) or ConvInteger on a 1x16x9x9 8-bit input."""
    w = RNG.integers(-127, 128, (16, 1, 3, 3)).astype(np.int8)
    attrs = dict(group=16, kernel_shape=[3, 3], pads=[1, 1, 1, 1], strides=[stride, stride])
    x_elem = helper.np_dtype_to_tensor_dtype(np.dtype(x_type))
    out = (9 + stride - 1) // stride
    if op_type == "ConvInteger":
        consts = dict(w=w, xz=np.asarray(3, x_type), wz=np.int8(0))
        node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], **attrs)
        y = tensor("y", [1, 16, out, out], TensorProto.INT32)
    else:
        consts = dict(xs=np.float32(0.05), xz=np.asarray(7, x_type), w=w, ws=(RNG.random(16) * 0.02).astype(np.float32),
                      wz=np.zeros(16, np.int8), ys=np.float32(0.4), yz=np.asarray(5, x_type),
                      b=RNG.integers(-3000, 3000, 16).astype(np.int32))
        node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], **attrs)
        y = tensor("y", [1, 16, out, out], x_elem)
    return make_model([node], [tensor("x", [1, 16, 9, 9], x_elem)], [y], _inits(**consts), opset=13)


@pytest.mark.parametrize("stride", [1, 2])
@pytest.mark.parametrize("x_type", [np.uint8, np.int8])
@pytest.mark.parametrize("op_type", ["QLinearConv", "ConvInteger"])
def test_depthwise_integer_conv_runs_the_registered_conv_kernel(monkeypatch, op_type, x_type, stride):
    """A depthwise integer conv runs the registered Conv kernel (any plugin's) on its weights held centered as
    float32, and stays bit-exact against onnxruntime."""
    monkeypatch.setenv("MINFER_TUNE", "0")  # the top-priority kernel, not a timed choice
    model = depthwise_model(op_type, x_type, stride)
    info = np.iinfo(x_type)
    x = RNG.integers(info.min, int(info.max) + 1, (1, 16, 9, 9)).astype(x_type)
    SEEN.clear()
    with use_plugins(SpyPlugin()):
        got = Engine(model).run(None, {"x": x})[0]
    assert len(SEEN) == 1 and SEEN[0].dtype == np.float32 and SEEN[0].shape == (16, 1, 3, 3)
    np.testing.assert_array_equal(got, ort_run(model, {"x": x})[0])


def product_model(op_type: str, b: np.ndarray, k: int) -> onnx.ModelProto:
    """MatMulInteger or QLinearMatMul of a (2, 4, k) uint8 input by the constant int8 ``b`` (k, 24)."""
    if op_type == "MatMulInteger":
        consts = dict(b=b, az=np.uint8(255), bz=np.int8(-2))
        node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
        y = tensor("y", [2, 4, 24], TensorProto.INT32)
    else:
        consts = dict(as_=np.float32(0.02), az=np.uint8(255), b=b, bs=np.float32(0.01), bz=np.int8(-2),
                      ys=np.float32(0.7), yz=np.uint8(120))
        node = helper.make_node("QLinearMatMul", ["a", "as_", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
        y = tensor("y", [2, 4, 24], TensorProto.UINT8)
    return make_model([node], [tensor("a", [2, 4, k], TensorProto.UINT8)], [y], _inits(**consts), opset=13)


@pytest.mark.parametrize("op_type", ["MatMulInteger", "QLinearMatMul"])
@pytest.mark.parametrize("weights", ["small", "saturated"])
def test_integer_product_with_constant_weights_is_exact(op_type, weights):
    """MatMulInteger and QLinearMatMul with a constant 8-bit B are bit-exact against onnxruntime whether one float32
    GEMM sums them exactly (small weights, K = 1024) or not (weights near -128, whose sums pass 2**24)."""
    k = 1024
    b = (RNG.integers(-6, 7, (k, 24)) if weights == "small" else RNG.integers(-128, -100, (k, 24))).astype(np.int8)
    model = product_model(op_type, b, k)
    a = RNG.integers(0, 256, (2, 4, k)).astype(np.uint8)
    a[0, 0] = 0  # |a - a_zp| = 255 on a whole row: with B near -128 its sums reach 255 * 114 * 1024 > 2**24
    np.testing.assert_array_equal(Engine(model).run(None, {"a": a})[0], ort_run(model, {"a": a})[0])


def test_integer_product_holds_its_weights_8_bit():
    """A MatMulInteger with a constant int8 B keeps that B as int8: the built engine holds no float copy of it."""
    from bench.quantized import held_array_bytes

    b = RNG.integers(-6, 7, (1024, 24)).astype(np.int8)
    engine = Engine(product_model("MatMulInteger", b, 1024))
    assert held_array_bytes(engine) < 2 * b.nbytes


def qoperator_chain(x_type: type, depthwise: bool) -> onnx.ModelProto:
    """QuantizeLinear -> QLinearConv (3x3, bias) -> DequantizeLinear -> Relu -> QuantizeLinear -> QLinearConv
    -> DequantizeLinear, as onnxruntime's QOperator format leaves float ops between its integer convs."""
    c = 8
    nodes, consts = [], {}
    src = "x"
    for i in range(2):
        consts.update({f"s{i}": np.float32(0.05 + 0.03 * i), f"z{i}": np.asarray(5 + 9 * i, x_type),
                       f"w{i}": RNG.integers(-127, 128, (c, 1 if depthwise else c, 3, 3)).astype(np.int8),
                       f"ws{i}": (RNG.random(c) * 0.02 + 0.001).astype(np.float32), f"wz{i}": np.zeros(c, np.int8),
                       f"ys{i}": np.float32(0.2), f"yz{i}": np.asarray(3 + i, x_type),
                       f"b{i}": RNG.integers(-500, 500, c).astype(np.int32)})
        nodes += [helper.make_node("QuantizeLinear", [src, f"s{i}", f"z{i}"], [f"q{i}"]),
                  helper.make_node("QLinearConv", [f"q{i}", f"s{i}", f"z{i}", f"w{i}", f"ws{i}", f"wz{i}", f"ys{i}",
                                                   f"yz{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1],
                                   group=c if depthwise else 1),
                  helper.make_node("DequantizeLinear", [f"c{i}", f"ys{i}", f"yz{i}"], [f"d{i}"])]
        if i == 0:
            nodes.append(helper.make_node("Relu", ["d0"], ["r0"]))
            src = "r0"
    return make_model(nodes, [tensor("x", [1, c, 7, 7])], [tensor("d1", [1, c, 7, 7])], _inits(**consts), opset=13)


def dynamic_chain(depthwise: bool) -> onnx.ModelProto:
    """quantize_dynamic's conv: DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul by x_scale * w_scale."""
    c = 8
    consts = dict(w=RNG.integers(-127, 128, (c, 1 if depthwise else c, 3, 3)).astype(np.int8), wz=np.int8(0),
                  ws=np.float32(0.013))
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("Mul", ["xs", "ws"], ["s"]),
             helper.make_node("ConvInteger", ["xq", "w", "xz", "wz"], ["acc"], pads=[1, 1, 1, 1],
                              group=c if depthwise else 1),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "s"], ["y"])]
    return make_model(nodes, [tensor("x", [1, c, 7, 7])], [tensor("y", [1, c, 7, 7])], _inits(**consts), opset=13)


def test_conv_integer_casts_and_scales_in_its_epilogue_exactly():
    """ConvInteger -> Cast -> Mul by a scalar becomes one ScaledConvInteger, bit-exact against onnxruntime."""
    for depthwise in (False, True):
        model = dynamic_chain(depthwise)
        x = (2 * RNG.standard_normal((1, 8, 7, 7))).astype(np.float32)
        engine = Engine(model)
        ops = [n.op_type for n in engine.graph.nodes]
        assert "ScaledConvInteger" in ops and "Cast" not in ops and "ConvInteger" not in ops, ops
        np.testing.assert_array_equal(engine.run(None, {"x": x})[0], ort_run(model, {"x": x})[0])


@pytest.mark.parametrize("depthwise", [False, True])
@pytest.mark.parametrize("x_type", [np.uint8, np.int8])
def test_qlinear_conv_reads_and_writes_float_when_fused_exactly(x_type, depthwise):
    """QuantizeLinear -> QLinearConv -> DequantizeLinear becomes one FloatQLinearConv (no 8-bit tensor between the
    float ops), bit-exact against onnxruntime on the unfused model."""
    model = qoperator_chain(x_type, depthwise)
    x = (2 * RNG.standard_normal((1, 8, 7, 7))).astype(np.float32)
    engine = Engine(model)
    ops = [n.op_type for n in engine.graph.nodes]
    assert ops.count("FloatQLinearConv") == 2 and "QuantizeLinear" not in ops and "DequantizeLinear" not in ops, ops
    np.testing.assert_array_equal(engine.run(None, {"x": x})[0], ort_run(model, {"x": x})[0])


@pytest.mark.parametrize("kind", ["qoperator", "dynamic"])
def test_fused_integer_convs_lower_to_standard_ops_for_portable(tmp_path, kind):
    """`minfer optimize --portable` writes each FloatQLinearConv back as QuantizeLinear -> QLinearConv ->
    DequantizeLinear and each ScaledConvInteger as ConvInteger -> Cast -> Mul, which onnxruntime runs to exactly the
    original model's outputs."""
    from minfer_core.cli import main

    model = qoperator_chain(np.uint8, False) if kind == "qoperator" else dynamic_chain(False)
    src, dst = tmp_path / "q.onnx", tmp_path / "portable.onnx"
    onnx.save(model, src)
    assert main(["optimize", str(src), str(dst), "--portable"]) == 0
    portable = onnx.load(str(dst))
    portable.ir_version = model.ir_version
    assert {n.domain for n in portable.graph.node} == {""}
    assert [n.op_type for n in portable.graph.node].count("QLinearConv" if kind == "qoperator" else "ConvInteger") \
        == (2 if kind == "qoperator" else 1)
    x = (2 * RNG.standard_normal((1, 8, 7, 7))).astype(np.float32)
    np.testing.assert_array_equal(ort_run(portable, {"x": x})[0], ort_run(model, {"x": x})[0])
