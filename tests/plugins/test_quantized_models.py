"""Models quantized by onnxruntime (QDQ per-tensor and per-channel, QOperator, dynamic) run in minfer.

Each case quantizes light_squeezenet, light_resnet50 (random weights), a MobileNetV2 (tests/models/realmodels.py,
width 0.5) or a small transformer block (the benchmark's, shrunk) and compares minfer with onnxruntime on the same
quantized model, within onnxruntime's own spread between ORT_DISABLE_ALL and ORT_ENABLE_ALL (for QDQ, ENABLE_ALL
fuses Q/DQ pairs into int8 kernels, which round once instead of twice: one step of the output's scale). The
quantized models are made once per module (calibration takes seconds).

The weights must stay 8-bit in minfer: a built quantized model holds at most 0.35x the array bytes its float model
holds (every numpy array reachable from the engine, each buffer once; the int8 weights alone are 0.25x).
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest

from minfer_core import Engine
from minfer_core.testing.ops import ORT_IR_VERSION
from modelkit import onnxruntime_levels, quantized_by_onnxruntime

pytest.importorskip("onnxruntime")

# Float ops outside the quantized ones (LayerNormalization, float MatMuls, Softmax, the int32 -> float Mul) may round
# in another order than onnxruntime's MLAS: a few float32 ulps of the output's magnitude, never a quantization step.
ULPS = 8
KINDS = ["dynamic", "qdq", "qdq_per_channel", "qoperator"]
WEIGHT_RATIO = 0.35
PRE = "_pre"


@pytest.fixture(autouse=True)
def first_conv_method(monkeypatch):
    """Convs take their first candidate method instead of the fastest timed one: which method wins depends on the
    machine's load, and on a QDQ model a method's different float rounding can move a value across a quantization
    step (the comparison is then no longer reproducible)."""
    from minfer_ops_conv import conv, depthwise

    monkeypatch.setattr(conv, "TUNE", False)
    monkeypatch.setattr(depthwise, "TUNE", False)


def float_model(name: str) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    """The float model and its input shape: a light model with random weights, MobileNetV2, or a transformer block."""
    if name == "transformer":
        from bench.models import transformer_block

        return transformer_block(1, seq=16, d=64, heads=4, ffn=128), (1, 16, 64)
    if name == "mobilenet_v2":
        sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "models"))
        import realmodels

        return realmodels.mobilenet_v2(0), (1, 3, 224, 224)
    from minfer_core.testing.zoo import randomized

    model = randomized(name)
    model.ir_version = ORT_IR_VERSION
    return model, (1, 3, 224, 224)


def quantized(model: onnx.ModelProto, shape: tuple[int, ...], kind: str, tmp_path) -> onnx.ModelProto:
    """``model`` through quantize_dynamic, or quantize_static (QDQ, QOperator) calibrated on random inputs of ``shape``;
    a kind ending in "_pre" first through onnxruntime's quant_pre_process, as its docs advise (BatchNormalization
    folded into the convs: a QDQ model's convs then meet with no float op between, an 8-bit edge)."""
    if kind.endswith(PRE):
        from onnxruntime.quantization.shape_inference import quant_pre_process

        onnx.save(model, tmp_path / "raw.onnx")
        quant_pre_process(str(tmp_path / "raw.onnx"), str(tmp_path / "pre.onnx"), skip_symbolic_shape=True)
        model, kind = onnx.load(tmp_path / "pre.onnx"), kind[: -len(PRE)]
        model.ir_version = ORT_IR_VERSION
    if kind != "dynamic" and model.opset_import[0].version < 13:
        # per-axis DequantizeLinear needs opset 13, QOperator's uint8 MaxPool 12; the light models are opset 8/9
        model = onnx.version_converter.convert_version(model, 13)
        model.ir_version = ORT_IR_VERSION
    if kind == "dynamic":
        return quantized_by_onnxruntime(model, tmp_path, "dynamic")
    fmt = "QOperator" if kind == "qoperator" else "QDQ"
    return quantized_by_onnxruntime(model, tmp_path, fmt, shape, per_channel=kind == "qdq_per_channel")


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """``models(name, kind)``: (model, input shape), made once per module; kind "float" is the float model."""
    cache: dict[tuple[str, str], tuple[onnx.ModelProto, tuple[int, ...]]] = {}

    def get(name: str, kind: str) -> tuple[onnx.ModelProto, tuple[int, ...]]:
        if (name, kind) not in cache:
            model, shape = get(name, "float") if kind != "float" else float_model(name)
            if kind != "float":
                model = quantized(model, shape, kind, tmp_path_factory.mktemp(f"{name}-{kind}"))
            cache[name, kind] = (model, shape)
        return cache[name, kind]

    return get


def assert_quantized_as(model: onnx.ModelProto, kind: str) -> None:
    """The quantizer did what ``kind`` says: integer ops fed by DynamicQuantizeLinear, QLinear ops, or Q/DQ pairs."""
    ops = {n.op_type for n in model.graph.node}
    if kind == "dynamic":
        assert "DynamicQuantizeLinear" in ops and ops & {"MatMulInteger", "ConvInteger"}, ops
        return
    if kind == "qoperator":
        assert ops & {"QLinearConv", "QLinearMatMul"}, ops
        return
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops, ops
    inits = {t.name: t for t in model.graph.initializer}
    per_axis = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[1] in inits
                and len(inits[n.input[1]].dims) == 1 and inits[n.input[1]].dims[0] > 1]
    assert bool(per_axis) == (kind == "qdq_per_channel")


def _case(name: str, kind: str, reason: str = ""):
    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
    return pytest.param(name, kind, id=f"{name}-{kind}", marks=marks)


CASES = [_case(name, kind) for name in ["light_squeezenet", "transformer"] for kind in KINDS]
CASES += [_case("light_resnet50", kind) for kind in KINDS]
CASES += [_case("mobilenet_v2", kind) for kind in KINDS + ["qdq" + PRE, "qoperator" + PRE]]


@pytest.mark.parametrize("name,kind", CASES)
def test_quantized_model_matches_onnxruntime(models, name, kind):
    """A model quantized by onnxruntime (QDQ per-tensor/per-channel, QOperator, dynamic) runs in minfer within
    onnxruntime's spread."""
    model, shape = models(name, kind)
    assert_quantized_as(model, kind.removesuffix(PRE))
    feeds = {model.graph.input[0].name: np.random.default_rng(2).standard_normal(shape).astype(np.float32)}
    want, fused = onnxruntime_levels(model, feeds)
    spread = float(np.abs(want - fused).max())
    floor = ULPS * float(np.spacing(np.abs(want).max()))
    got = Engine(model).run(None, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape, f"{got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    error = float(np.abs(got - want).max())
    assert error <= max(spread, floor), f"max |minfer - onnxruntime| {error:.3g} > spread {spread:.3g}, floor {floor:.3g}"


def array_bytes(model: onnx.ModelProto) -> int:
    """The bytes of the numpy arrays a built Engine of ``model`` keeps (its weights as held, each buffer once)."""
    from bench.quantized import held_array_bytes

    return held_array_bytes(Engine(model))


@pytest.mark.parametrize("name,kind", [(n, k) for n in ["light_resnet50", "mobilenet_v2"] for k in KINDS])
def test_quantized_weights_stay_8_bit(models, name, kind):
    """A built quantized model holds at most 0.35x the array bytes of its float model: its weights stay int8."""
    quant = array_bytes(models(name, kind)[0])
    ratio = quant / array_bytes(models(name, "float")[0])
    assert ratio <= WEIGHT_RATIO, f"{name} {kind} holds {ratio:.2f}x the float model's bytes ({quant / 1e6:.1f} MB)"


def _weight_dequantized_ops(model: onnx.ModelProto) -> int:
    """How many Conv/Gemm/MatMul of ``model`` read a DequantizeLinear of an initializer as their weight."""
    inits = {t.name for t in model.graph.initializer}
    dequantized = {n.output[0] for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in inits}
    return sum(n.op_type in ("Conv", "Gemm", "MatMul") and n.input[1] in dequantized for n in model.graph.node)


@pytest.mark.parametrize("name", ["light_resnet50", "mobilenet_v2", "transformer"])
def test_qdq_weights_feed_int8_kernels(models, name):
    """In a built QDQ model no weight is dequantized ahead of time (each weighted op is a Dequant* op on the int8
    weight, or an integer conv or matmul: qdq_integer_conv, qdq_integer_matmul) and no activation Q -> DQ pair is
    left (each is one QuantizeDequantize rounding, an integer conv's input conversion, or a QuantizeLinear that only
    integer matmuls read)."""
    model = models(name, "qdq_per_channel")[0]
    engine = Engine(model)
    ops = [(n.domain, n.op_type) for n in engine.graph.nodes]
    quantized = [n.outputs[0] for n in engine.graph.nodes if (n.domain, n.op_type) == ("", "QuantizeLinear")]
    readers = {c.op_type for q in quantized for c in engine.graph.consumers(q)}
    assert ("", "DequantizeLinear") not in ops and readers <= {"ScaledMatMulInteger"}, sorted(set(ops))
    dequant = sum(op in ("DequantConv", "DequantGemm", "DequantMatMul", "FloatQLinearConv", "ScaledMatMulInteger")
                  for _, op in ops)
    assert dequant == _weight_dequantized_ops(model) > 0


@pytest.mark.parametrize("op_type", ["ConvInteger", "QLinearConv"])
@pytest.mark.parametrize("w_type", [np.int8, np.uint8])
def test_integer_conv_beyond_float32_exact_range_is_exact(op_type, w_type):
    """An integer conv whose sums pass 2**24 (256 channels x 3x3 of large same-signed products) is computed by exact
    float32 convs of input-channel chunks summed in float64: bit-exact against onnxruntime (one float32 conv is not)."""
    import onnxruntime as ort
    from onnx import helper, numpy_helper

    from modelkit import make_model, tensor

    rng = np.random.default_rng(3)
    # same-signed products near their largest: sums near 255 * 127 * 2304 = 7.5e7, where float32 steps by 4 or 8
    w = rng.integers(64, 128, (8, 256, 3, 3)).astype(w_type)
    x = rng.integers(200, 256, (1, 256, 6, 6)).astype(np.uint8)
    consts = {"w": w, "xz": np.uint8(0), "wz": np.asarray(0, w_type)}
    if op_type == "ConvInteger":
        node = helper.make_node("ConvInteger", ["x", "w", "xz", "wz"], ["y"], pads=[1, 1, 1, 1])
        out = tensor("y", [1, 8, 6, 6], onnx.TensorProto.INT32)
    else:
        consts.update(xs=np.float32(0.02), ws=(rng.random(8) * 0.01).astype(np.float32), ys=np.float32(60.0),
                      yz=np.uint8(128), b=rng.integers(-2**20, 2**20, 8).astype(np.int32))
        consts["wz"] = np.full(8, consts["wz"], w_type)
        node = helper.make_node("QLinearConv", ["x", "xs", "xz", "w", "ws", "wz", "ys", "yz", "b"], ["y"], pads=[1, 1, 1, 1])
        out = tensor("y", [1, 8, 6, 6], onnx.TensorProto.UINT8)
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
    model = make_model([node], [tensor("x", [1, 256, 6, 6], onnx.TensorProto.UINT8)], [out], inits, opset=13)
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(Engine(model).run(None, {"x": x})[0], want)
