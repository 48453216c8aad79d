"""An integer conv's epilogue takes the ChannelAffine after it (a BatchNormalization the quantizer left, and its Relu
or Clip), and its requantization runs through ai.minfer::Requantize's registered kernel: bit for bit the unfused
nodes, with and without minfer-ops-numba's compiled kernel."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from modelkit import make_model, ort_run, tensor
from onnx import TensorProto, helper, numpy_helper

from minfer_core import Engine, TensorType

pytest.importorskip("onnxruntime")
pytestmark = pytest.mark.usefixtures("numba_plugin")

RNG = np.random.default_rng(21)
C = 8


def _inits(**consts: np.ndarray) -> list[onnx.TensorProto]:
    return [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]


def _bn(nodes: list, consts: dict, src: str, dst: str, tag: str) -> None:
    """An inference BatchNormalization of ``src`` (random statistics, some scales negative)."""
    for name, lo, hi in (("g", -1.5, 1.5), ("be", -1, 1), ("mu", -1, 1), ("va", 0.2, 2)):
        consts[f"{name}{tag}"] = RNG.uniform(lo, hi, C).astype(np.float32)
    nodes.append(helper.make_node("BatchNormalization", [src, f"g{tag}", f"be{tag}", f"mu{tag}", f"va{tag}"], [dst]))


def _act(nodes: list, consts: dict, act: str, src: str, dst: str) -> None:
    if act == "Relu":
        nodes.append(helper.make_node("Relu", [src], [dst]))
    else:
        consts.update(lo=np.float32(0.0), hi=np.float32(6.0))
        nodes.append(helper.make_node("Clip", [src, "lo", "hi"], [dst]))


def qoperator_bn_chain(x_type: type, depthwise: bool, act: str, convs: int = 3) -> onnx.ModelProto:
    """(Q -> QLinearConv -> DQ -> BatchNormalization -> act) twice, then Q -> QLinearConv -> DQ -> BatchNormalization:
    what onnxruntime's QOperator quantizer leaves of conv, BN, act blocks it was not asked to fold."""
    nodes: list = []
    consts: dict = {}
    src = "x"
    last = convs - 1
    for i in range(convs):
        consts.update({f"s{i}": np.float32(0.05 + 0.03 * i), f"z{i}": np.asarray(5 + 9 * i, x_type),
                       f"w{i}": RNG.integers(-127, 128, (C, 1 if depthwise else C, 3, 3)).astype(np.int8),
                       f"ws{i}": (RNG.random(C) * 0.02 + 0.001).astype(np.float32), f"wz{i}": np.zeros(C, np.int8),
                       f"ys{i}": np.float32(0.2), f"yz{i}": np.asarray(3 + i, x_type),
                       f"b{i}": RNG.integers(-500, 500, C).astype(np.int32)})
        nodes += [helper.make_node("QuantizeLinear", [src, f"s{i}", f"z{i}"], [f"q{i}"]),
                  helper.make_node("QLinearConv", [f"q{i}", f"s{i}", f"z{i}", f"w{i}", f"ws{i}", f"wz{i}", f"ys{i}",
                                                   f"yz{i}", f"b{i}"], [f"c{i}"], pads=[1, 1, 1, 1],
                                   group=C if depthwise else 1),
                  helper.make_node("DequantizeLinear", [f"c{i}", f"ys{i}", f"yz{i}"], [f"d{i}"])]
        _bn(nodes, consts, f"d{i}", f"n{i}", str(i))
        if i < last:
            _act(nodes, consts, act, f"n{i}", f"r{i}")
            src = f"r{i}"
    return make_model(nodes, [tensor("x", [1, C, 7, 7])], [tensor(f"n{last}", [1, C, 7, 7])], _inits(**consts),
                      opset=13)


def dynamic_bn_chain(depthwise: bool, act: str) -> onnx.ModelProto:
    """quantize_dynamic's conv (DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul) -> BatchNormalization -> act."""
    consts = dict(w=RNG.integers(-127, 128, (C, 1 if depthwise else C, 3, 3)).astype(np.int8), wz=np.int8(0),
                  ws=np.float32(0.013))
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("Mul", ["xs", "ws"], ["s"]),
             helper.make_node("ConvInteger", ["xq", "w", "xz", "wz"], ["acc"], pads=[1, 1, 1, 1],
                              group=C if depthwise else 1),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "s"], ["y"])]
    _bn(nodes, consts, "y", "n", "")
    _act(nodes, consts, act, "n", "out")
    return make_model(nodes, [tensor("x", [1, C, 7, 7])], [tensor("out", [1, C, 7, 7])], _inits(**consts), opset=13)


def _fused_ops(engine: Engine) -> list[str]:
    return [n.op_type for n in engine.graph.nodes]


def _compiled_off(monkeypatch) -> None:
    """The integer convs' own numpy steps instead of a registered Requantize kernel."""
    from minfer_ops_conv import requantize

    monkeypatch.setattr(requantize.Compiled, "find", staticmethod(lambda *a, **k: None))


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("act", ["Relu", "Clip"])
@pytest.mark.parametrize("depthwise", [False, True])
@pytest.mark.parametrize("x_type", [np.uint8, np.int8])
def test_batchnorm_after_qlinear_conv_joins_its_epilogue_exactly(monkeypatch, x_type, depthwise, act, compiled):
    """QLinearConv -> DequantizeLinear -> BatchNormalization -> Relu/Clip becomes one FloatQLinearConv with S, B and
    the activation, each quantizing its output on the next one's input grid, bit for bit the graph without the
    integer fusion, and matching onnxruntime."""
    if not compiled:
        _compiled_off(monkeypatch)
    model = qoperator_bn_chain(x_type, depthwise, act)
    x = (2 * RNG.standard_normal((1, C, 7, 7))).astype(np.float32)
    engine = Engine(model)
    ops = _fused_ops(engine)
    assert ops == ["FloatQLinearConv"] * 3, ops
    first, middle, last = (n.attrs for n in engine.graph.nodes)
    assert first["activation"] == middle["activation"] == act and "activation" not in last
    assert [a["float_input"] for a in (first, middle, last)] == [1, 2, 2]
    assert "output_quantization" in first and "output_quantization" in middle and "output_quantization" not in last
    got = engine.run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, Engine(model, disabled_passes=("integer_conv_fusion",)).run(None, {"x": x})[0])
    # onnxruntime folds the BN in its own order: the float32 rounding may move a value one step of y's grid
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=0, atol=0.21 * 1.6)


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("act", ["Relu", "Clip"])
@pytest.mark.parametrize("depthwise", [False, True])
def test_batchnorm_after_scaled_conv_integer_joins_its_epilogue_exactly(monkeypatch, depthwise, act, compiled):
    """ConvInteger -> Cast -> Mul -> BatchNormalization -> Relu/Clip becomes one ScaledConvInteger with S, B and the
    activation, bit for bit the graph without the integer fusion, and matching onnxruntime."""
    if not compiled:
        _compiled_off(monkeypatch)
    model = dynamic_bn_chain(depthwise, act)
    x = (2 * RNG.standard_normal((1, C, 7, 7))).astype(np.float32)
    engine = Engine(model)
    ops = _fused_ops(engine)
    assert "ScaledConvInteger" in ops and "ChannelAffine" not in ops and "BatchNormalization" not in ops, ops
    got = engine.run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, Engine(model, disabled_passes=("integer_conv_fusion",)).run(None, {"x": x})[0])
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kind", ["qoperator", "dynamic"])
def test_integer_conv_with_affine_epilogue_lowers_for_portable(tmp_path, kind):
    """`minfer optimize --portable` writes an integer conv's affine epilogue back as a BatchNormalization (and the
    activation) after the conv's standard nodes, which onnxruntime runs to the original model's outputs."""
    from minfer_core.cli import main

    model = qoperator_bn_chain(np.uint8, False, "Clip") if kind == "qoperator" else dynamic_bn_chain(False, "Relu")
    src, dst = tmp_path / "q.onnx", tmp_path / "portable.onnx"
    onnx.save(model, src)
    assert main(["optimize", str(src), str(dst), "--portable"]) == 0
    portable = onnx.load(str(dst))
    portable.ir_version = model.ir_version
    assert {n.domain for n in portable.graph.node} == {""}
    x = (2 * RNG.standard_normal((1, C, 7, 7))).astype(np.float32)
    np.testing.assert_allclose(ort_run(portable, {"x": x})[0], ort_run(model, {"x": x})[0], rtol=0, atol=0.21 * 1.6)


def _requantize_pair(attrs: dict, operands: tuple[bool, bool, bool], shape: tuple[int, ...]):
    from minfer_ops_conv import requantize

    found = requantize.Compiled.find("rq", TensorType(np.float32, shape), operands, **attrs)
    assert found is not None, "minfer-ops-numba's Requantize kernel was not selected"
    return found.fn, lambda *args, out: requantize.requantize.fn(*args, out=out, **attrs)


CASES = [
    dict(low=-3.0, high=252.0, out_scale=0.2, activation="Clip", activation_params=[0.0, 6.0]),
    dict(low=-128.0, high=127.0, out_scale=0.05, activation="Relu"),
    dict(low=-7.0, high=248.0, divide=1),
    dict(rounding=0, activation="Relu"),
    dict(low=-100.0, high=100.0),
    dict(low=-3.0, high=252.0, out_scale=0.2, activation="Relu", post_scale=0.05, post_low=0.0, post_high=255.0),
    dict(low=-128.0, high=127.0, out_scale=0.03, post_scale=0.07, post_low=-120.0, post_high=135.0),
]


@pytest.mark.parametrize("attrs", CASES)
@pytest.mark.parametrize("per_channel", [False, True])
def test_compiled_requantize_is_the_numpy_kernel_bit_for_bit(attrs, per_channel):
    """minfer-ops-numba's Requantize gives the numpy kernel's bits, on whole tensors and on tiles of one (strided
    views, as a conv's epilogue passes them), ties, saturation, NaN and infinities included."""
    shape = (2, 6, 100, 170)  # enough values that a step in float64 instead of float32 shows (a few round apart)
    operands = (not attrs.get("divide"), per_channel, True)
    compiled, numpy_kernel = _requantize_pair(attrs, operands, shape)
    x = RNG.integers(-3000, 3000, shape).astype(np.float32)
    x.reshape(-1)[:6] = [np.nan, np.inf, -np.inf, 0.5, 1.5, -2.5]
    n = 6 if per_channel else 1
    m = (RNG.random(n) * 0.01 + 0.001).astype(np.float32) if not attrs.get("divide") else np.float32([0.5] * n)
    c = RNG.integers(-50, 50, n).astype(np.float32) if operands[0] else None
    s = RNG.uniform(-2, 2, n).astype(np.float32) if per_channel else None
    b = RNG.uniform(-1, 1, n).astype(np.float32)
    whole = [np.empty(shape, np.float32) for _ in range(2)]
    for fn, out in zip((compiled, numpy_kernel), whole):
        fn(x, m, c, s, b, out=out)
    np.testing.assert_array_equal(whole[0], whole[1])
    region = (slice(1, 2), slice(2, 5), slice(10, 40))
    ch = region[1] if per_channel else slice(None)
    tiles = [np.zeros(shape, np.float32) for _ in range(2)]
    for fn, out in zip((compiled, numpy_kernel), tiles):
        fn(x[region], m[ch] if per_channel else m, None if c is None else c[ch], None if s is None else s[ch], b[ch],
           out=out[region])
    np.testing.assert_array_equal(tiles[0], tiles[1])


@pytest.mark.parametrize("special", [np.nan, np.inf, None])
def test_dynamic_input_quantized_in_the_conv_is_dynamic_quantize_linear(special):
    """A ScaledConvInteger that quantizes its float input itself (DynamicQuantizeLinear folded in) gives the
    unfused graph's bits, on an input holding NaN or an infinity too (through the registered kernel then)."""
    model = dynamic_bn_chain(False, "Relu")
    x = (2 * RNG.standard_normal((1, C, 7, 7))).astype(np.float32)
    if special is not None:
        x[0, 3, 2, 2] = special
    engine = Engine(model)
    assert [n.attrs.get("dynamic_input") for n in engine.graph.nodes] == [1], _fused_ops(engine)
    want = Engine(model, disabled_passes=("integer_conv_fusion",)).run(None, {"x": x})[0]
    with np.errstate(invalid="ignore"):
        np.testing.assert_array_equal(engine.run(None, {"x": x})[0], want)


def dynamic_bias_chain(depthwise: bool, act: str, bias_shape: tuple[int, ...], hw: int = 7) -> onnx.ModelProto:
    """quantize_dynamic's conv of a model whose BatchNormalizations were folded first (quant_pre_process): the
    conv's bias as an Add of one value per channel after the Mul, then the activation (an hw x hw input)."""
    consts = dict(w=RNG.integers(-127, 128, (C, 1 if depthwise else C, 3, 3)).astype(np.int8), wz=np.int8(0),
                  ws=np.float32(0.013), bias=RNG.uniform(-1, 1, bias_shape).astype(np.float32))
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"]),
             helper.make_node("Mul", ["xs", "ws"], ["s"]),
             helper.make_node("ConvInteger", ["xq", "w", "xz", "wz"], ["acc"], pads=[1, 1, 1, 1],
                              group=C if depthwise else 1),
             helper.make_node("Cast", ["acc"], ["accf"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["accf", "s"], ["y"]),
             helper.make_node("Add", ["bias", "y"], ["n"])]
    if act:
        _act(nodes, consts, act, "n", "out")
    return make_model(nodes, [tensor("x", [1, C, hw, hw])], [tensor("out" if act else "n", [1, C, hw, hw])],
                      _inits(**consts), opset=13)


@pytest.mark.parametrize("bias_shape", [(C, 1, 1), (1, C, 1, 1)])
@pytest.mark.parametrize("act", ["", "Relu", "Clip"])
@pytest.mark.parametrize("depthwise", [False, True])
def test_bias_add_after_scaled_conv_integer_joins_its_epilogue_exactly(depthwise, act, bias_shape):
    """ConvInteger -> Cast -> Mul -> Add(per-channel bias) [-> Relu/Clip] becomes one ScaledConvInteger with the
    bias as its B and the activation: no Add or activation pass left, bit for bit the graph without the integer
    fusion, and onnxruntime's values."""
    model = dynamic_bias_chain(depthwise, act, bias_shape)
    x = (2 * RNG.standard_normal((1, C, 7, 7))).astype(np.float32)
    engine = Engine(model)
    (node,) = engine.graph.nodes
    assert node.op_type == "ScaledConvInteger" and len(node.inputs) == 7 and not node.inputs[5], node.inputs
    assert node.attrs.get("activation", "") == act
    got = engine.run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, Engine(model, disabled_passes=("integer_conv_fusion",)).run(None, {"x": x})[0])
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_a_bias_along_another_axis_stays_an_add():
    """A constant of C values along the last axis (a map C wide) is no per-channel bias: the Add stays."""
    model = dynamic_bias_chain(False, "", (1, 1, 1, C), hw=C)
    x = (2 * RNG.standard_normal((1, C, C, C))).astype(np.float32)
    engine = Engine(model)
    assert [n.op_type for n in engine.graph.nodes][0] == "ScaledConvInteger"
    assert len(engine.graph.nodes) == 2
    np.testing.assert_allclose(engine.run(None, {"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)
