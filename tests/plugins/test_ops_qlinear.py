"""onnxruntime's com.microsoft QLinear* ops and QGemm (minfer-ops-conv's qlinear.py) bit-exact against onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from minfer_core import Engine
from minfer_core.testing.ops import ORT_IR_VERSION, onnxruntime_outputs
from modelkit import assert_within_level_spread, ints, quantized_by_onnxruntime

pytest.importorskip("onnxruntime")

BINARY = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "c_scale", "c_zero_point"]
POOL = ["x", "x_scale", "x_zero_point", "y_scale", "y_zero_point"]
QGEMM = ["a", "a_scale", "a_zero_point", "b", "b_scale", "b_zero_point", "c", "y_scale", "y_zero_point"]
TYPES = [np.uint8, np.int8]


def model_of(op_type: str, names: list[str], inputs: list, attrs: dict | None = None, constant=("b",)):
    """A one-node com.microsoft model (opsets "" 17, com.microsoft 1); inputs named in ``constant`` are initializers."""
    used = [(n, np.asarray(a)) for n, a in zip(names, inputs) if a is not None]
    node = helper.make_node(op_type, [n if a is not None else "" for n, a in zip(names, inputs)], ["y"],
                            domain="com.microsoft", **(attrs or {}))
    feeds = {n: a for n, a in used if n not in constant}
    inits = [numpy_helper.from_array(a, n) for n, a in used if n in constant]
    graph = helper.make_graph(
        [node], "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
        [helper.make_empty_tensor_value_info("y")], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = ORT_IR_VERSION
    return model, feeds


def assert_exact(model, feeds) -> None:
    """minfer's output has onnxruntime's dtype, shape and every bit."""
    want = onnxruntime_outputs(model, feeds)[0]
    got = Engine(model).run(None, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape, f"{got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    np.testing.assert_array_equal(got, want)


def scale(rng: np.random.Generator, lo=0.002, hi=0.1) -> np.ndarray:
    return np.asarray(np.float32(rng.uniform(lo, hi)))


SHAPE_PAIRS = [((2, 3, 4, 5), (2, 3, 4, 5)), ((2, 3, 4, 5), (5,)), ((3, 1, 5), (4, 1)), ((7, 33), ()), ((1,), (2, 9))]


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("shapes", SHAPE_PAIRS)
def test_binary_ops_are_bit_exact(op_type, dtype, shapes):
    """QLinearAdd and QLinearMul equal onnxruntime bit for bit, broadcasting, random scales and zero points."""
    rng = np.random.default_rng(sum(shapes[0]) + len(op_type))
    inputs = [ints(rng, dtype, shapes[0]), scale(rng), ints(rng, dtype, ()), ints(rng, dtype, shapes[1]), scale(rng),
              ints(rng, dtype, ()), scale(rng, 0.01, 0.3), ints(rng, dtype, ())]
    assert_exact(*model_of(op_type, BINARY, inputs, constant=("b", "b_scale", "b_zero_point")))


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("c_zero_point", [1, 3])
def test_binary_ops_round_ties_with_the_zero_point_added(op_type, dtype, c_zero_point):
    """Scales of 1/2 and 1/4 make .5 ties: they round to the even *output* (odd zero point), as onnxruntime's do."""
    rng = np.random.default_rng(c_zero_point)
    inputs = [ints(rng, dtype, (4, 64)), np.float32(0.5), ints(rng, dtype, ()), ints(rng, dtype, (64,)),
              np.float32(0.25 if op_type == "QLinearAdd" else 1.0), ints(rng, dtype, ()), np.float32(1.0),
              np.asarray(c_zero_point, dtype)]
    assert_exact(*model_of(op_type, BINARY, inputs))


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("channels_last", [0, 1])
@pytest.mark.parametrize("shape", [(1, 8, 7, 7), (2, 5, 3, 4), (1, 64, 1, 1), (2, 16, 2, 2)])
def test_global_average_pool_is_bit_exact(dtype, channels_last, shape):
    """QLinearGlobalAveragePool equals onnxruntime bit for bit, NCHW and NHWC, incl. ties (scales 1, 4-pixel images)."""
    rng = np.random.default_rng(sum(shape) + channels_last)
    ties = shape == (2, 16, 2, 2)
    inputs = [ints(rng, dtype, shape), np.float32(1.0) if ties else scale(rng), ints(rng, dtype, ()),
              np.float32(1.0) if ties else scale(rng), ints(rng, dtype, ())]
    assert_exact(*model_of("QLinearGlobalAveragePool", POOL, inputs, {"channels_last": channels_last}))


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("alpha", [0.01, 0.25])
def test_leaky_relu_is_bit_exact(dtype, alpha):
    """QLinearLeakyRelu equals onnxruntime bit for bit over every 8-bit value."""
    rng = np.random.default_rng(int(alpha * 100))
    x = np.arange(np.iinfo(dtype).min, np.iinfo(dtype).max + 1).astype(dtype).reshape(2, 128)
    for x_scale, y_scale in [(scale(rng), scale(rng)), (np.float32(0.5), np.float32(1.0))]:
        inputs = [x, x_scale, ints(rng, dtype, ()), y_scale, ints(rng, dtype, ())]
        assert_exact(*model_of("QLinearLeakyRelu", POOL, inputs, {"alpha": alpha}))


@pytest.mark.parametrize("dtype", TYPES)
def test_sigmoid_is_bit_exact(dtype):
    """QLinearSigmoid equals onnxruntime bit for bit over every 8-bit value, at y_scale 1/256 and random ones."""
    rng = np.random.default_rng(11)
    x = np.arange(np.iinfo(dtype).min, np.iinfo(dtype).max + 1).astype(dtype).reshape(4, 64)
    for y_scale in [np.float32(1 / 256), scale(rng, 0.0005, 0.01), scale(rng, 0.0005, 0.01)]:
        inputs = [x, scale(rng, 0.01, 0.2), ints(rng, dtype, ()), y_scale, ints(rng, dtype, ())]
        assert_exact(*model_of("QLinearSigmoid", POOL, inputs))


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("axis", [1, -1])
def test_concat_is_bit_exact(dtype, axis):
    """QLinearConcat requantizes each input to y's scale and zero point (or copies it when they are y's) as onnxruntime."""
    rng = np.random.default_rng(axis + 5)
    y_scale, y_zero_point = scale(rng), ints(rng, dtype, ())
    shapes = [(2, 3, 4), (2, 5, 4)] if axis == 1 else [(2, 3, 4), (2, 3, 1), (2, 3, 6)]
    tuples = [[ints(rng, dtype, s), scale(rng), ints(rng, dtype, ())] for s in shapes]
    tuples[0][1:] = [y_scale, y_zero_point]  # the first is copied as is
    names = ["y_scale", "y_zero_point"] + [f"{k}{i}" for i in range(len(shapes)) for k in ("x", "s", "z")]
    assert_exact(*model_of("QLinearConcat", names, [y_scale, y_zero_point, *sum(tuples, [])], {"axis": axis}))


@pytest.mark.parametrize("a_type,b_type", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("float_output", [False, True])
def test_qgemm_is_bit_exact(a_type, b_type, per_column, float_output):
    """QGemm equals onnxruntime: transposes, alpha, int32 bias, per-column B scale/zp, quantized or float output."""
    rng = np.random.default_rng(int(per_column) + 2 * int(float_output))
    m, k, n = 3, 37, 10
    cols = (n,) if per_column else ()
    b_zero_point = ints(rng, b_type, cols) if b_type == np.uint8 else np.zeros(cols, b_type)  # symmetric int8 weights
    inputs = [ints(rng, a_type, (k, m)), scale(rng), ints(rng, a_type, ()), ints(rng, b_type, (n, k)),
              rng.uniform(0.002, 0.05, cols).astype(np.float32), b_zero_point,
              rng.integers(-5000, 5000, n).astype(np.int32)]
    if not float_output:
        inputs += [scale(rng, 0.05, 0.5), ints(rng, a_type, ())]
    attrs = {"transA": 1, "transB": 1, "alpha": 0.75}
    assert_exact(*model_of("QGemm", QGEMM, inputs, attrs, constant=("b", "b_scale", "b_zero_point", "c")))


def small_cnn(head: str):
    """Float Conv-Relu-Conv, residual Add, Relu, GlobalAveragePool, and a Gemm or MatMul+Add head (opset 17)."""
    rng = np.random.default_rng(0)
    fc = (8, 10) if head == "MatMul" else (10, 8)
    weights = {"w1": (8, 3, 3, 3), "b1": (8,), "w2": (8, 8, 3, 3), "b2": (8,), "fc": fc, "fb": (10,)}
    inits = [numpy_helper.from_array((0.3 * rng.standard_normal(s)).astype(np.float32), n) for n, s in weights.items()]
    inits.append(numpy_helper.from_array(np.array([1, 8], np.int64), "shape"))
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1] * 4),
             helper.make_node("Relu", ["c1"], ["r1"]),
             helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], pads=[1] * 4),
             helper.make_node("Add", ["c2", "r1"], ["s"]),
             helper.make_node("Relu", ["s"], ["r2"]),
             helper.make_node("GlobalAveragePool", ["r2"], ["p"]),
             helper.make_node("Reshape", ["p", "shape"], ["f"])]
    if head == "Gemm":
        nodes.append(helper.make_node("Gemm", ["f", "fc", "fb"], ["y"], transB=1))
    else:
        nodes += [helper.make_node("MatMul", ["f", "fc"], ["m"]), helper.make_node("Add", ["m", "fb"], ["y"])]
    graph = helper.make_graph(nodes, "cnn", [helper.make_tensor_value_info("x", 1, [1, 3, 16, 16])],
                              [helper.make_tensor_value_info("y", 1, [1, 10])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = ORT_IR_VERSION
    return model


@pytest.mark.parametrize("head", ["Gemm", "MatMul"])
@pytest.mark.parametrize("activations,weights,per_channel", [("QUInt8", "QInt8", False), ("QInt8", "QInt8", True),
                                                             ("QUInt8", "QUInt8", True)])
def test_quantized_residual_cnn_matches_onnxruntime(tmp_path, head, activations, weights, per_channel):
    """A residual CNN quantized by quantize_static (QOperator: com.microsoft ops) runs within onnxruntime's level spread."""
    from onnxruntime.quantization import QuantType

    model = quantized_by_onnxruntime(small_cnn(head), tmp_path, "QOperator", (1, 3, 16, 16), per_channel=per_channel,
                      activation_type=QuantType[activations], weight_type=QuantType[weights])
    ms_ops = {n.op_type for n in model.graph.node if n.domain == "com.microsoft"}
    assert {"QLinearAdd", "QLinearGlobalAveragePool"} <= ms_ops and (head != "Gemm" or "QGemm" in ms_ops)
    assert_within_level_spread(model, {"x": np.random.default_rng(2).standard_normal((1, 3, 16, 16)).astype(np.float32)})


@pytest.mark.parametrize("name", ["light_squeezenet", "light_resnet50"])
def test_quantized_light_models_match_onnxruntime(tmp_path, name):
    """squeezenet (QLinearConcat, Softmax) and resnet50 (QGemm, AveragePool) quantized QOperator match onnxruntime."""
    from minfer_core.testing.zoo import randomized

    model = randomized(name)
    model.ir_version = ORT_IR_VERSION
    model = quantized_by_onnxruntime(model, tmp_path, "QOperator", (1, 3, 224, 224))
    assert any(n.domain == "com.microsoft" for n in model.graph.node)
    feeds = {model.graph.input[0].name: np.random.default_rng(2).standard_normal((1, 3, 224, 224)).astype(np.float32)}
    assert_within_level_spread(model, feeds)


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("opset", [12, 13])
@pytest.mark.parametrize("shape,axis", [((2, 10), -1), ((3, 4, 5), 1), ((1, 1000), 1), ((2, 3, 7), None)])
def test_softmax_is_bit_exact(dtype, opset, shape, axis):
    """QLinearSoftmax equals onnxruntime: its exp table, float32 row sums, floor(1/y_scale) and saturation."""
    rng = np.random.default_rng(sum(shape) + opset)
    attrs = {"opset": opset} if axis is None else {"opset": opset, "axis": axis}
    for y_scale in [1 / 256, 0.0039, 0.01]:  # 0.0039: floor(1 / y_scale) = 256, so the largest saturate
        y_zero_point = np.asarray(0 if dtype == np.uint8 else -128, dtype)
        inputs = [ints(rng, dtype, shape), scale(rng, 0.01, 0.3), ints(rng, dtype, ()), np.float32(y_scale), y_zero_point]
        assert_exact(*model_of("QLinearSoftmax", POOL, inputs, attrs))


POOL_CASES = [((2, 4, 8, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
              ((2, 4, 8, 9), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "count_include_pad": 1}),
              ((1, 2, 7, 7), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1,
                              "count_include_pad": 1}),
              ((1, 2, 7, 7), {"kernel_shape": [3, 2], "auto_pad": "SAME_UPPER"}),
              ((1, 3, 10), {"kernel_shape": [3], "strides": [2]}),
              ((1, 2, 4, 5, 6), {"kernel_shape": [2, 2, 3]}),
              ((1, 7, 7, 3), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "channels_last": 1})]


@pytest.mark.parametrize("dtype", TYPES)
@pytest.mark.parametrize("shape,attrs", POOL_CASES)
def test_average_pool_is_bit_exact(dtype, shape, attrs):
    """QLinearAveragePool equals onnxruntime: float32 window sums, its pad counting, ceil_mode, NHWC, ties."""
    rng = np.random.default_rng(sum(shape))
    for x_scale, y_scale in [(scale(rng), scale(rng)), (np.float32(1.0), np.float32(0.25))]:  # the second makes ties
        inputs = [ints(rng, dtype, shape), x_scale, ints(rng, dtype, ()), y_scale, ints(rng, dtype, ())]
        assert_exact(*model_of("QLinearAveragePool", POOL, inputs, attrs))


@pytest.mark.parametrize("float_output", [False, True])
def test_qgemm_scales_in_float32_as_onnxruntime(float_output):
    """QGemm scales float32(acc) by the float32 product alpha * a_scale * b_scale (/ y_scale), in that order."""
    alpha, a_scale, b_scale, y_scale = np.float32(0.75), np.float32(0.0123), np.float32(0.0071), np.float32(0.0065537)
    candidates = np.arange(-12000, 12000) if not float_output else np.arange(-3_000_000, 3_000_000, 7)
    acc = candidates.astype(np.float32)
    ours = acc * ((alpha * a_scale * b_scale) / y_scale) if not float_output else acc * (alpha * a_scale * b_scale)
    other = acc * (alpha * (a_scale * b_scale / y_scale)) if not float_output else acc * (a_scale * b_scale) * alpha
    differ = np.rint(ours) != np.rint(other) if not float_output else ours != other
    bias = candidates[differ][:200].astype(np.int32)  # a == a_zero_point: each column's accumulator is its bias
    assert len(bias) >= 2
    inputs = [np.full((1, 1), 5, np.uint8), a_scale, np.asarray(5, np.uint8), np.ones((1, len(bias)), np.int8), b_scale,
              np.zeros((), np.int8), bias] + ([] if float_output else [y_scale, np.asarray(128, np.uint8)])
    assert_exact(*model_of("QGemm", QGEMM, inputs, {"alpha": 0.75}, constant=("b", "b_scale", "b_zero_point", "c")))
