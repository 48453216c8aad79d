"""ConvInteger and QLinearConv (minfer-ops-conv's quant.py) bit-exact against onnxruntime on single-node models."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from onnx import helper, numpy_helper

from minfer_core import Engine
from minfer_core.testing.ops import ORT_IR_VERSION, onnxruntime_outputs
from modelkit import assert_within_level_spread, ints, quantized_by_onnxruntime

pytest.importorskip("onnxruntime")

# onnxruntime's CPU QLinearConv has uint8 x with uint8 or int8 w, and int8 x with int8 w (not int8 x, uint8 w)
PAIRS = [(np.uint8, np.uint8), (np.uint8, np.int8), (np.int8, np.int8)]
QLINEAR_INPUTS = ["x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale", "y_zero_point", "b"]


def model_of(op_type: str, names: list[str], inputs: list[np.ndarray | None], attrs: dict, constant: bool):
    """A one-node opset-10 model; every input but x is an initializer when ``constant``; None leaves one out."""
    used = [(n, a) for n, a in zip(names, inputs) if a is not None]
    node = helper.make_node(op_type, [n if a is not None else "" for n, a in zip(names, inputs)], ["y"], **attrs)
    feeds = {n: a for n, a in used if n == "x" or not constant}
    inits = [numpy_helper.from_array(a, n) for n, a in used if n not in feeds]
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
        [helper.make_empty_tensor_value_info("y")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 10)])
    model.ir_version = ORT_IR_VERSION
    return model, feeds


def assert_exact(model, feeds) -> np.ndarray:
    """minfer's output has onnxruntime's dtype, shape and every bit."""
    want = onnxruntime_outputs(model, feeds)[0]
    got = Engine(model).run(None, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape, f"{got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    np.testing.assert_array_equal(got, want)
    return got


@st.composite
def geometries(draw):
    """Random conv geometry: rank 1-3, group, kernel, strides, dilations, explicit pads or auto_pad."""
    rank = draw(st.sampled_from([1, 2, 2, 3]))
    group = draw(st.sampled_from([1, 1, 2, 3]))
    cg, mg = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 3)) for _ in range(rank)]
    dil = [draw(st.sampled_from([1, 1, 2])) for _ in range(rank)]
    strides = [draw(st.sampled_from([1, 1, 2, 3])) for _ in range(rank)]
    spatial = [draw(st.integers((k - 1) * d + 1, (k - 1) * d + 6)) for k, d in zip(kernel, dil)]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto_pad.startswith("SAME"):
        dil = [1] * rank  # onnxruntime refuses dilated SAME convs
    attrs = {"strides": strides, "dilations": dil, "group": group}
    if draw(st.booleans()):
        attrs["kernel_shape"] = kernel
    if auto_pad == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel * 2]
    else:
        attrs["auto_pad"] = auto_pad
    x_shape = [draw(st.integers(1, 2)), cg * group] + spatial
    return x_shape, [mg * group, cg] + kernel, attrs


@given(geometries(), st.sampled_from(PAIRS), st.booleans(), st.booleans(), st.integers(0, 2**31))
def test_qlinear_conv_is_bit_exact(geometry, pair, per_channel, constant, seed):
    """QLinearConv equals onnxruntime bit for bit: any geometry, 8-bit types, scalar or per-channel w scale/zp, bias."""
    x_shape, w_shape, attrs = geometry
    xt, wt = pair
    rng = np.random.default_rng(seed)
    m = w_shape[0]
    channels = (m,) if per_channel else ()
    w_scale = rng.uniform(0.001, 0.05, channels).astype(np.float32)
    bias = rng.integers(-20000, 20000, m).astype(np.int32) if rng.random() < 0.7 else None
    inputs = [ints(rng, xt, x_shape), np.float32(rng.uniform(0.001, 0.05)), ints(rng, xt, ()),
              ints(rng, wt, w_shape), w_scale, ints(rng, wt, channels),
              np.float32(rng.uniform(0.005, 2.0)), ints(rng, xt, ()), bias]
    inputs = [np.asarray(a) if a is not None else None for a in inputs]
    assert_exact(*model_of("QLinearConv", QLINEAR_INPUTS, inputs, attrs, constant))


@given(geometries(), st.sampled_from(PAIRS + [(np.int8, np.uint8)]), st.sampled_from(["both", "x", "none"]),
       st.booleans(), st.integers(0, 2**31))
def test_conv_integer_is_bit_exact(geometry, pair, zero_points, constant, seed):
    """ConvInteger equals onnxruntime bit for bit: any geometry, 8-bit types, zero points given or left out."""
    x_shape, w_shape, attrs = geometry
    rng = np.random.default_rng(seed)
    xt, wt = pair
    inputs = [ints(rng, xt, x_shape), ints(rng, wt, w_shape), ints(rng, xt, ()), ints(rng, wt, ())]
    inputs = inputs[: {"both": 4, "x": 3, "none": 2}[zero_points]]
    assert_exact(*model_of("ConvInteger", ["x", "w", "x_zero_point", "w_zero_point"], inputs, attrs, constant))


def test_conv_integer_per_channel_weight_zero_point():
    """ConvInteger's 1-D w_zero_point applies per output channel (each channel equals onnxruntime's scalar-zp run)."""
    rng = np.random.default_rng(0)
    x, w = ints(rng, np.uint8, (2, 2, 6, 5)), ints(rng, np.int8, (3, 2, 3, 2))
    xz, wz = np.array(7, np.uint8), np.array([-3, 0, 5], np.int8)
    attrs = {"group": 1, "pads": [1, 0, 1, 1], "strides": [2, 1]}
    names = ["x", "w", "x_zero_point", "w_zero_point"]
    got = Engine(model_of("ConvInteger", names, [x, w, xz, wz], attrs, True)[0]).run(None, {"x": x})[0]
    for c in range(3):  # onnxruntime takes only a scalar w_zero_point: one run per output channel
        want = onnxruntime_outputs(*model_of("ConvInteger", names, [x, w[c : c + 1], xz, wz[c]], attrs, True))[0]
        np.testing.assert_array_equal(got[:, c : c + 1], want)


@pytest.mark.parametrize("xt,wt", PAIRS)
def test_qlinear_conv_saturates_and_rounds_as_onnxruntime(xt, wt):
    """Outputs beyond y's range saturate, and ties round as onnxruntime's float32 requantization does."""
    rng = np.random.default_rng(1)
    x, w = ints(rng, xt, (1, 3, 8, 8)), ints(rng, wt, (4, 3, 3, 3))
    bias = np.array([2**30, -(2**30), 0, 7], np.int32)  # channels 0 and 1 saturate high and low
    inputs = [x, np.float32(0.5), ints(rng, xt, ()), w, np.float32(0.25), np.zeros((), wt),
              np.float32(1.0), ints(rng, xt, ()), bias]  # scale 1/8: many accumulators land on .5 ties
    got = assert_exact(*model_of("QLinearConv", QLINEAR_INPUTS, [np.asarray(a) for a in inputs], {"pads": [1] * 4},
                                 True))
    info = np.iinfo(xt)
    assert (got[0, 0] == info.max).all() and (got[0, 1] == info.min).all()


def test_qlinear_conv_requantizes_in_float32_as_onnxruntime():
    """Requantization is float32(acc) * float32(x_scale * w_scale / y_scale), where float64 would round differently."""
    xs, ws, ys = np.float32(0.0123), np.float32(0.0071), np.float32(0.9)
    candidates = np.arange(-1_400_000, 1_400_000)  # |acc| < 2**24: float32(acc) is exact, only the scale rounds
    exact = np.rint(candidates * (np.float64(xs) * np.float64(ws) / np.float64(ys)))
    in_float32 = np.rint(candidates.astype(np.float32) * ((xs * ws) / ys))
    bias = candidates[exact != in_float32].astype(np.int32)  # accumulators where the two roundings disagree
    assert len(bias) >= 4
    x_zero_point = np.array(3, np.uint8)
    x = np.full((1, 1, 2, 2), x_zero_point, np.uint8)  # x == x_zp: each channel's accumulator is its bias
    w = np.ones((len(bias), 1, 1, 1), np.int8)
    inputs = [x, xs, x_zero_point, w, ws, np.zeros((), np.int8), ys, np.array(128, np.uint8), bias]
    inputs = [np.asarray(a) for a in inputs]
    got = assert_exact(*model_of("QLinearConv", QLINEAR_INPUTS, inputs, {}, True))
    np.testing.assert_array_equal(got[0, :, 0, 0], in_float32[exact != in_float32] + 128)


def small_conv_model():
    """Float Conv -> Relu -> grouped strided Conv -> MaxPool, weights as initializers (opset 13)."""
    rng = np.random.default_rng(0)
    weights = {"w1": (8, 3, 3, 3), "b1": (8,), "w2": (8, 4, 3, 3), "b2": (8,)}
    inits = [numpy_helper.from_array((0.3 * rng.standard_normal(s)).astype(np.float32), n) for n, s in weights.items()]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1], group=2, strides=[2, 2]),
             helper.make_node("MaxPool", ["c2"], ["y"], kernel_shape=[2, 2], strides=[2, 2])]
    graph = helper.make_graph(nodes, "small", [helper.make_tensor_value_info("x", 1, [1, 3, 16, 16])],
                              [helper.make_empty_tensor_value_info("y")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = ORT_IR_VERSION
    return model


@pytest.mark.parametrize("activations,weights,per_channel", [("QInt8", "QInt8", True), ("QUInt8", "QInt8", False),
                                                             ("QUInt8", "QUInt8", True)])
def test_quantize_static_qoperator_model_matches_onnxruntime(tmp_path, activations, weights, per_channel):
    """A quantize_static QOperator model runs in minfer within the spread of onnxruntime's optimization levels."""
    from onnxruntime.quantization import QuantType

    model = quantized_by_onnxruntime(small_conv_model(), tmp_path, "QOperator", (1, 3, 16, 16), calibration=4,
                                     per_channel=per_channel, activation_type=QuantType[activations],
                                     weight_type=QuantType[weights])
    assert "QLinearConv" in {n.op_type for n in model.graph.node}
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)}
    assert_within_level_spread(model, feeds)


@pytest.mark.parametrize("op_type", ["ConvInteger", "QLinearConv"])
def test_accumulators_beyond_float32_stay_exact(op_type):
    """Accumulators far above 2**24 (extreme 8-bit values, K = 2700) stay exact and requantize as onnxruntime's."""
    rng = np.random.default_rng(3)
    x = np.where(rng.random((1, 300, 5, 5)) < 0.9, 255, 0).astype(np.uint8)
    w = np.where(rng.random((4, 300, 3, 3)) < 0.9, -128, 127).astype(np.int8)
    zeros = [np.zeros((), np.uint8), np.zeros((), np.int8)]
    if op_type == "ConvInteger":
        names = ["x", "w", "x_zero_point", "w_zero_point"]
        got = assert_exact(*model_of(op_type, names, [x, w, *zeros], {}, False))
        assert np.abs(got.astype(np.int64)).min() > 2**25
        return
    inputs = [x, np.float32(0.003), zeros[0], w, np.float32(0.007), zeros[1], np.float32(13.0), np.array(200, np.uint8),
              rng.integers(-1000, 1000, 4).astype(np.int32)]
    assert_exact(*model_of(op_type, QLINEAR_INPUTS, [np.asarray(a) for a in inputs], {"pads": [1] * 4}, True))
