"""The QDQ passes: int8 weights held as int8, Q -> DQ pairs as one rounding step, exactly as the QDQ graph computes."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from onnx import helper, numpy_helper

from minfer_core import Engine, get_registry
from minfer_core.testing.checks import check_pass
from minfer_passes import qdq
from modelkit import make_model, tensor


@pytest.fixture(autouse=True)
def first_conv_method(monkeypatch):
    """Convs take their first candidate method: two engines compared bit for bit must not time different methods."""
    from minfer_ops_conv import conv, depthwise

    monkeypatch.setattr(conv, "TUNE", False)
    monkeypatch.setattr(depthwise, "TUNE", False)


def _pass(name):
    return next(p for p in get_registry().passes if p.name == name)


@settings(max_examples=40, deadline=None)
@given(qdq.patterns())
def test_both_passes_keep_outputs_exactly(graph):
    """qdq_fusion, then qdq_epilogue_fusion, keep the QDQ graph's outputs (exact rounding) and the graph valid."""
    installed = get_registry().passes
    check_pass(_pass("qdq_fusion"), graph.copy(), installed=installed)
    check_pass(_pass("qdq_epilogue_fusion"), graph, installed=installed)


def _qdq_conv_bn_model(per_channel: bool, relu6: bool = False) -> onnx.ModelProto:
    """x -> Q/DQ -> Conv(DQ(int8 W), bias) -> Q/DQ -> BatchNormalization -> Q/DQ -> Relu (or ReLU6 as a Clip) -> Q/DQ,
    as quantize_static writes."""
    rng = np.random.default_rng(0)
    m, c = 6, 4
    w = rng.integers(-127, 128, (m, c, 3, 3)).astype(np.int8)
    ws = (rng.random(m) * 0.01 + 0.002).astype(np.float32) if per_channel else np.float32(0.004)
    inits = [numpy_helper.from_array(w, "wq"), numpy_helper.from_array(np.asarray(ws), "ws"),
             numpy_helper.from_array(np.zeros(np.shape(ws), np.int8), "wz"),
             numpy_helper.from_array(rng.standard_normal(m).astype(np.float32), "bias")]
    for name, value in [("scale", 1 + 0.2 * rng.standard_normal(m)), ("shift", 0.1 * rng.standard_normal(m)),
                        ("mean", 0.1 * rng.standard_normal(m)), ("var", 0.5 + rng.random(m))]:
        inits.append(numpy_helper.from_array(value.astype(np.float32), name))
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=0)]
    x = "x"
    for i, (step, s, z) in enumerate([("conv", 0.02, 128), ("bn", 0.05, 120), ("relu", 0.04, 0), ("out", 0.03, 0)]):
        inits += [numpy_helper.from_array(np.float32(s), f"s{i}"), numpy_helper.from_array(np.uint8(z), f"z{i}")]
        nodes += [helper.make_node("QuantizeLinear", [x, f"s{i}", f"z{i}"], [f"q{i}"]),
                  helper.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [f"d{i}"])]
        x = f"d{i}"
        if step == "conv":
            nodes.append(helper.make_node("Conv", [x, "w", "bias"], ["y0"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]))
        elif step == "bn":
            nodes.append(helper.make_node("BatchNormalization", [x, "scale", "shift", "mean", "var"], ["y1"]))
        elif step == "relu" and relu6:
            inits += [numpy_helper.from_array(np.float32(0), "zero"), numpy_helper.from_array(np.float32(6), "six")]
            nodes.append(helper.make_node("Clip", [x, "zero", "six"], ["y2"]))
        elif step == "relu":
            nodes.append(helper.make_node("Relu", [x], ["y2"]))
        if step != "out":
            x = f"y{i}"
    return make_model(nodes, [tensor("x", [1, c, 9, 9])], [tensor(x, [1, m, 9, 9])], inits, opset=13)


@pytest.mark.parametrize("per_channel", [False, True])
def test_qdq_conv_bn_relu_is_one_node_on_int8_weights(per_channel):
    """Conv on a DQ'd int8 weight, its BatchNormalization and Relu and their four Q/DQ pairs build to a QuantizeDequantize
    and one DequantConv (BN and Relu in its epilogue), holding the int8 weight; outputs equal the unfused graph's."""
    model = _qdq_conv_bn_model(per_channel)
    x = (3 * np.random.default_rng(1).standard_normal((1, 4, 9, 9))).astype(np.float32)
    engine = Engine(model)
    ops = sorted(n.op_type for n in engine.graph.nodes)
    assert ops == ["DequantConv", "QuantizeDequantize", "QuantizeDequantize"], ops
    assert "wq" in engine.program.released and not any(v.dtype == np.float32 and v.shape == (6, 4, 3, 3)
                                                       for v in engine.graph.initializers.values())
    want = Engine(model, passes="none").run(None, {"x": x})[0]
    np.testing.assert_array_equal(engine.run(None, {"x": x})[0], want)


def test_quantize_dequantize_rounds_as_the_pair():
    """QuantizeDequantize equals onnxruntime's QuantizeLinear -> DequantizeLinear bit for bit: ties to even, saturation."""
    ort = pytest.importorskip("onnxruntime")
    s, z = np.float32(0.05), np.int8(-3)
    ties = ((np.arange(-140, 140) + 0.5) * s).astype(np.float32)
    x = np.concatenate([ties, np.random.default_rng(0).standard_normal(500).astype(np.float32) * 5])
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "z"], ["q"]),
             helper.make_node("DequantizeLinear", ["q", "s", "z"], ["y"])]
    model = make_model(nodes, [tensor("x", [x.size])], [tensor("y", [x.size])],
                       [numpy_helper.from_array(s, "s"), numpy_helper.from_array(z, "z")], opset=13)
    engine = Engine(model)
    assert [n.op_type for n in engine.graph.nodes] == ["QuantizeDequantize"]
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(engine.run(None, {"x": x})[0], want)


@pytest.mark.parametrize("relu6", [False, True])
def test_portable_lowering_runs_in_onnxruntime_as_the_qdq_model(tmp_path, relu6):
    """`minfer optimize --portable` writes the fused QDQ nodes back as standard Q/DQ, Conv, Mul/Add (and a Clip for
    bounds a ReLU6 narrowed): onnxruntime computes exactly what it computes on the original model."""
    ort = pytest.importorskip("onnxruntime")
    from minfer_core.cli import main

    model = _qdq_conv_bn_model(True, relu6)
    src, dst = tmp_path / "qdq.onnx", tmp_path / "portable.onnx"
    onnx.save(model, src)
    assert main(["optimize", str(src), str(dst), "--portable"]) == 0
    portable = onnx.load(str(dst))
    portable.ir_version = model.ir_version
    assert {n.domain for n in portable.graph.node} == {""}
    assert ("Clip" in {n.op_type for n in portable.graph.node}) == relu6
    x = (3 * np.random.default_rng(1).standard_normal((1, 4, 9, 9))).astype(np.float32)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want, got = (ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
                 for m in (model, portable))
    np.testing.assert_array_equal(got, want)
