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


def test_quantize_dequantize_full_form_is_its_stages_in_turn():
    """QuantizeDequantize(X, M, A; post_*) is the rounding, * M, + A, then the rounding on the post grid."""
    from minfer_core import KernelContext, TensorType
    from minfer_passes.qdq_ops import quantize_dequantize

    rng = np.random.default_rng(0)
    x = (4 * rng.standard_normal((2, 6, 5, 5))).astype(np.float32)
    m, a = (rng.random((6, 1, 1)) + 0.5).astype(np.float32), rng.standard_normal((6, 1, 1)).astype(np.float32)
    first, post = {"scale": 0.05, "low": -128.0, "high": 127.0}, {"scale": 0.03, "low": 0.0, "high": 255.0}
    ctx = KernelContext("q", "QuantizeDequantize", 1, (TensorType(np.float32, x.shape),), (None,), (None,), 1)
    plain = {key: quantize_dequantize.prepared(ctx, attrs) for key, attrs in (("first", first), ("post", post))}
    want = plain["post"](plain["first"](x) * m + a)
    full = {**first, **{f"post_{k}": v for k, v in post.items()}}
    np.testing.assert_array_equal(quantize_dequantize.prepared(ctx, full)(x, m, a), want)


def test_dequant_conv_epilogue_is_the_registered_rounding_kernel(minfer_plugin, monkeypatch):
    """A DequantConv's epilogue (rounding, BN's * M + A, rounding) is one call of the QuantizeDequantize kernel the
    registry picks (a plugin's faster one), on each tile, where the base kernel calls it; the outputs stay the unfused
    graph's. (minfer-ops-numba's liveconv and pointwise apply the chain themselves from its description, by
    quant.Chains: test_numba_liveconv, test_numba_pointwise.)"""
    import minfer_core
    from minfer_passes.qdq_ops import quantize_dequantize

    try:
        from minfer_ops_numba import quant
    except ImportError:
        pass
    else:
        monkeypatch.setattr(quant.Chains, "of", lambda self, epilogue: None)

    calls = []

    @minfer_core.kernel("QuantizeDequantize", domain="ai.minfer", priority=100, prepare=True, out=True, inplace=(0,),
                        views=False)
    def recording(ctx, **attrs):
        """ai.minfer::QuantizeDequantize-1, recording the operands it is called with."""
        fn = quantize_dequantize.prepared(ctx, attrs)

        def run(x, m=None, a=None, *, out=None):
            calls.append((attrs.get("post_scale", 0.0), m is not None, a is not None))
            return fn(x, m, a, out=out)

        return run

    class Plugin:
        @minfer_core.hookimpl
        def register_kernels(self, register):
            register(recording)

    minfer_plugin(Plugin())
    model = _qdq_conv_bn_model(per_channel=True)
    x = (3 * np.random.default_rng(1).standard_normal((1, 4, 9, 9))).astype(np.float32)
    got = Engine(model).run(None, {"x": x})[0]
    assert any(post and m and a for post, m, a in calls), calls  # rounding, BN's * M + A, Relu's grid: one call
    np.testing.assert_array_equal(got, Engine(model, passes="none").run(None, {"x": x})[0])


def _qdq_depthwise_model(group: int) -> onnx.ModelProto:
    """x -> Q/DQ -> Conv(DQ(int8 W), group) -> Q/DQ, 8 channels: depthwise when group is 8."""
    rng = np.random.default_rng(0)
    w = rng.integers(-127, 128, (8, 8 // group, 3, 3)).astype(np.int8)
    inits = [numpy_helper.from_array(w, "wq"), numpy_helper.from_array(np.float32(0.01), "ws"),
             numpy_helper.from_array(np.int8(3), "wz")]
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"])]
    for i, s in enumerate((0.02, 0.05)):
        inits += [numpy_helper.from_array(np.float32(s), f"s{i}"), numpy_helper.from_array(np.uint8(128), f"z{i}")]
    nodes += [helper.make_node("QuantizeLinear", ["x", "s0", "z0"], ["q0"]),
              helper.make_node("DequantizeLinear", ["q0", "s0", "z0"], ["d0"]),
              helper.make_node("Conv", ["d0", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1], group=group),
              helper.make_node("QuantizeLinear", ["y", "s1", "z1"], ["q1"]),
              helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["out"])]
    return make_model(nodes, [tensor("x", [1, 8, 7, 7])], [tensor("out", [1, 8, 7, 7])], inits, opset=13)


@pytest.mark.parametrize("group", [8, 1])
def test_depthwise_dequant_conv_gives_its_base_kernel_a_float_constant(minfer_plugin, group):
    """A depthwise DequantConv dequantizes its weight once, at build, as DequantizeLinear does, and hands the base Conv
    kernel that float32 constant (kernels for constant weights then apply); any other conv's weight stays per run."""
    import minfer_core
    from minfer_ops_conv.conv import conv

    seen = []

    @minfer_core.kernel("Conv", since=1, priority=100, prepare=True, out=True, views=False, packed=(1, 2),
                        epilogue=True)
    def recording(ctx, **attrs):
        """Conv-1, recording the constant weight it is prepared with."""
        seen.append(ctx.constants[1] if len(ctx.constants) > 1 else None)
        return conv.prepared(ctx, attrs)

    class Plugin:
        @minfer_core.hookimpl
        def register_kernels(self, register):
            register(recording)

    minfer_plugin(Plugin())
    model = _qdq_depthwise_model(group)
    engine = Engine(model, disabled_passes=["qdq_integer_conv"])  # else the group is an integer conv (qdq_exact)
    assert [n.op_type for n in engine.graph.nodes] == ["QuantizeDequantize", "DequantConv"]
    wq = numpy_helper.to_array(next(i for i in model.graph.initializer if i.name == "wq"))
    if group == 1:
        assert seen == [None]
    else:
        (w,) = seen
        assert w.dtype == np.float32
        np.testing.assert_array_equal(w, (wq.astype(np.float32) - np.float32(3)) * np.float32(0.01))
    x = (3 * np.random.default_rng(1).standard_normal((1, 8, 7, 7))).astype(np.float32)
    np.testing.assert_array_equal(engine.run(None, {"x": x})[0], Engine(model, passes="none").run(None, {"x": x})[0])


def test_portable_lowering_writes_the_full_rounding_as_standard_ops(tmp_path):
    """QuantizeDequantize with M, A and a post grid lowers (--portable) to Q/DQ, Mul, Add, Q/DQ: onnxruntime then
    computes exactly what minfer's kernel computes on the node."""
    ort = pytest.importorskip("onnxruntime")
    from minfer_core.cli import main

    rng = np.random.default_rng(0)
    m, a = (rng.random((4, 1, 1)) + 0.5).astype(np.float32), rng.standard_normal((4, 1, 1)).astype(np.float32)
    node = helper.make_node("QuantizeDequantize", ["x", "m", "a"], ["y"], domain="ai.minfer", scale=0.05, low=-128.0,
                            high=127.0, post_scale=0.03, post_low=0.0, post_high=255.0)
    model = make_model([node], [tensor("x", [1, 4, 5, 5])], [tensor("y", [1, 4, 5, 5])],
                       [numpy_helper.from_array(m, "m"), numpy_helper.from_array(a, "a")], opset=13,
                       extra_opsets=[helper.make_opsetid("ai.minfer", 1)])
    src, dst = tmp_path / "full.onnx", tmp_path / "portable.onnx"
    onnx.save(model, src)
    assert main(["optimize", str(src), str(dst), "--portable"]) == 0
    portable = onnx.load(str(dst))
    portable.ir_version = model.ir_version
    assert {n.domain for n in portable.graph.node} == {""}
    x = (4 * rng.standard_normal((1, 4, 5, 5))).astype(np.float32)
    want = Engine(model, passes="none").run(None, {"x": x})[0]
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    got = ort.InferenceSession(portable.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)


def _qdq_residual_model(add: str) -> onnx.ModelProto:
    """x -> Q/DQ (d0) -> Conv(DQ(int8 W)) -> Q/DQ -> Add/Sum(., d0) -> Relu -> Q/DQ: a quantized residual block's tail."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.integers(-127, 128, (4, 4, 3, 3)).astype(np.int8), "wq"),
             numpy_helper.from_array(np.float32(0.01), "ws"), numpy_helper.from_array(np.int8(0), "wz")]
    for i, (s, z) in enumerate([(0.02, 128), (0.05, 120), (0.04, 0)]):
        inits += [numpy_helper.from_array(np.float32(s), f"s{i}"), numpy_helper.from_array(np.uint8(z), f"z{i}")]
    nodes = [helper.make_node("DequantizeLinear", ["wq", "ws", "wz"], ["w"])]
    for i, (src, dst) in enumerate([("x", "d0"), ("y", "d1"), ("r", "out")]):
        nodes += [helper.make_node("QuantizeLinear", [src, f"s{i}", f"z{i}"], [f"q{i}"]),
                  helper.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [dst])]
    nodes += [helper.make_node("Conv", ["d0", "w"], ["y"], kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
              helper.make_node(add, ["d1", "d0"], ["sum"]), helper.make_node("Relu", ["sum"], ["r"])]
    return make_model(nodes, [tensor("x", [1, 4, 9, 9])], [tensor("out", [1, 4, 9, 9])], inits, opset=13)


@pytest.mark.parametrize("add", ["Add", "Sum"])
def test_residual_add_and_its_rounding_join_the_dequant_conv(add):
    """A residual block's tail, Q/DQ(Relu(Conv(...) + Z)) with Z on a grid, is one DequantConv: + Z and the rounding
    (Relu in its bounds) are its epilogue's last stage; outputs equal the unfused graph's."""
    model = _qdq_residual_model(add)
    # uint8 activations: onnxruntime gives the conv its own copy of the shared DQ and fuses it (qdq_exact)
    engine = Engine(model, disabled_passes=["qdq_integer_conv"])
    assert sorted(n.op_type for n in engine.graph.nodes) == ["DequantConv", "QuantizeDequantize"]
    x = (3 * np.random.default_rng(1).standard_normal((1, 4, 9, 9))).astype(np.float32)
    np.testing.assert_array_equal(engine.run(None, {"x": x})[0], Engine(model, passes="none").run(None, {"x": x})[0])


def test_portable_lowering_writes_the_residual_back(tmp_path):
    """--portable writes a DequantConv's + Z and rounding back as Add and Q/DQ: onnxruntime computes what it computes
    on the original model."""
    ort = pytest.importorskip("onnxruntime")
    from minfer_core.cli import main

    model = _qdq_residual_model("Add")
    src, dst = tmp_path / "qdq.onnx", tmp_path / "portable.onnx"
    onnx.save(model, src)
    # the conv stays a DequantConv (uint8: else qdq_integer_conv makes it an integer conv, as onnxruntime does)
    assert main(["optimize", str(src), str(dst), "--portable", "--disable", "qdq_integer_conv"]) == 0
    portable = onnx.load(str(dst))
    portable.ir_version = model.ir_version
    assert {n.domain for n in portable.graph.node} == {""}
    x = (3 * np.random.default_rng(1).standard_normal((1, 4, 9, 9))).astype(np.float32)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    want, got = (ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
                 for m in (model, portable))
    np.testing.assert_array_equal(got, want)


def _rounded_bias_model(op: str, gelu: bool) -> onnx.ModelProto:
    """x -> Q/DQ -> Add (or Mul) of a vector along the last axis -> Q/DQ [-> Tanh -> Q/DQ]: a quantized linear layer's
    bias between its product's rounding and its output's (the product here a graph input: no producer takes them)."""
    vector = np.linspace(-0.7, 0.9, 8, dtype=np.float32)
    inits = [numpy_helper.from_array(vector, "c")]
    nodes, x = [], "x"
    steps = [("first", 0.05, 3), (op, 0.04, -2)] + ([("Tanh", 0.01, 0)] if gelu else [])
    for i, (step, s, z) in enumerate(steps):
        if step == "Tanh":
            nodes.append(helper.make_node("Tanh", [x], [f"y{i}"]))
            x = f"y{i}"
        elif step != "first":
            nodes.append(helper.make_node(step, [x, "c"], [f"y{i}"]))
            x = f"y{i}"
        inits += [numpy_helper.from_array(np.float32(s), f"s{i}"), numpy_helper.from_array(np.int8(z), f"z{i}")]
        nodes += [helper.make_node("QuantizeLinear", [x, f"s{i}", f"z{i}"], [f"q{i}"]),
                  helper.make_node("DequantizeLinear", [f"q{i}", f"s{i}", f"z{i}"], [f"d{i}"])]
        x = f"d{i}"
    return make_model(nodes, [tensor("x", [4, 8])], [tensor(x, [4, 8])], inits, opset=13)


@pytest.mark.parametrize("op", ["Add", "Mul"])
def test_a_bias_between_two_roundings_is_one_rounding_node(op):
    """Rounding -> Add (Mul) of a constant vector -> rounding, with no producer to take them in, builds to one
    QuantizeDequantize holding the vector and the second rounding; outputs (ties, saturation, NaN) equal those of the
    three nodes it replaces bit for bit (qdq_fusion's roundings keep NaN where QuantizeLinear's cast does not)."""
    model = _rounded_bias_model(op, gelu=False)
    engine = Engine(model)
    (node,) = engine.graph.nodes
    assert node.op_type == "QuantizeDequantize" and len(node.inputs) == (3 if op == "Add" else 2)
    assert node.attrs["post_scale"] == pytest.approx(0.04) and (node.attrs["post_low"], node.attrs["post_high"]) == (
        -126.0, 129.0)
    x = (np.random.default_rng(3).standard_normal((4, 8)) * 4).astype(np.float32)
    x[0, :4] = [np.nan, 0.025, -0.075, 1e9]
    want = Engine(model, disabled_passes=["qdq_epilogue_fusion"]).run(None, {"x": x})[0]
    assert len(Engine(model, disabled_passes=["qdq_epilogue_fusion"]).graph.nodes) == 3
    np.testing.assert_array_equal(engine.run(None, {"x": x})[0], want)


def test_a_rounding_after_a_bias_still_seeds_a_lookup():
    """The merged rounding's output is on its second grid: the chain after it still becomes one Lookup reading it."""
    model = _rounded_bias_model("Add", gelu=True)
    engine = Engine(model)
    assert [n.op_type for n in engine.graph.nodes] == ["QuantizeDequantize", "Lookup"]
    x = (np.random.default_rng(4).standard_normal((4, 8)) * 4).astype(np.float32)
    np.testing.assert_array_equal(engine.run(None, {"x": x})[0], Engine(model, passes="none").run(None, {"x": x})[0])
