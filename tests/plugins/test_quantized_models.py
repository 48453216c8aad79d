"""Models quantized by onnxruntime in the QDQ format (per-tensor, per-channel) and dynamically run in minfer.

Each case quantizes light_squeezenet, light_resnet50 (random weights) or a small
transformer block (the benchmark's, shrunk) and compares minfer with onnxruntime
on the same quantized model, within onnxruntime's own spread between
ORT_DISABLE_ALL and ORT_ENABLE_ALL (for QDQ, ENABLE_ALL fuses Q/DQ pairs into
int8 kernels, which round once instead of twice: one step of the output's scale).
"""

from __future__ import annotations

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
KINDS = ["dynamic", "qdq", "qdq_per_channel"]


@pytest.fixture(autouse=True)
def first_conv_method(monkeypatch):
    """Convs take their first candidate method instead of the fastest timed one: which method wins depends on the
    machine's load, and on a QDQ model a method's different float rounding can move a value across a quantization
    step (the comparison is then no longer reproducible)."""
    from minfer_ops_conv import conv, depthwise

    monkeypatch.setattr(conv, "TUNE", False)
    monkeypatch.setattr(depthwise, "TUNE", False)


def float_model(name: str) -> tuple[onnx.ModelProto, tuple[int, ...]]:
    """The float model and its input shape: a light model with random weights, or a small transformer block."""
    if name == "transformer":
        from bench.models import transformer_block

        return transformer_block(1, seq=16, d=64, heads=4, ffn=128), (1, 16, 64)
    from minfer_core.testing.zoo import randomized

    model = randomized(name)
    model.ir_version = ORT_IR_VERSION
    return model, (1, 3, 224, 224)


def quantized(model: onnx.ModelProto, shape: tuple[int, ...], kind: str, tmp_path) -> onnx.ModelProto:
    """``model`` through quantize_dynamic, or quantize_static (QDQ) calibrated on three random inputs of ``shape``."""
    if kind == "qdq_per_channel" and model.opset_import[0].version < 13:
        # per-axis DequantizeLinear needs opset 13; the light models are opset 8/9
        model = onnx.version_converter.convert_version(model, 13)
        model.ir_version = ORT_IR_VERSION
    if kind == "dynamic":
        return quantized_by_onnxruntime(model, tmp_path, "dynamic")
    return quantized_by_onnxruntime(model, tmp_path, "QDQ", shape, per_channel=kind == "qdq_per_channel")


def assert_quantized_as(model: onnx.ModelProto, kind: str) -> None:
    """The quantizer did what ``kind`` says: integer ops fed by DynamicQuantizeLinear, or Q/DQ pairs (per-axis)."""
    ops = {n.op_type for n in model.graph.node}
    if kind == "dynamic":
        assert "DynamicQuantizeLinear" in ops and ops & {"MatMulInteger", "ConvInteger"}, ops
        return
    assert {"QuantizeLinear", "DequantizeLinear"} <= ops, ops
    inits = {t.name: t for t in model.graph.initializer}
    per_axis = [n for n in model.graph.node if n.op_type == "DequantizeLinear" and n.input[1] in inits
                and len(inits[n.input[1]].dims) == 1 and inits[n.input[1]].dims[0] > 1]
    assert bool(per_axis) == (kind == "qdq_per_channel")


CASES = [pytest.param(name, kind, id=f"{name}-{kind}") for name in ["light_squeezenet", "transformer"] for kind in KINDS]
CASES += [pytest.param("light_resnet50", kind, id=f"light_resnet50-{kind}") for kind in KINDS[1:]]
CASES.append(pytest.param("light_resnet50", "dynamic", id="light_resnet50-dynamic", marks=pytest.mark.xfail(
    strict=True, reason="minfer's float64-folded BatchNormalization rounds 1 float32 ulp apart from onnxruntime's on "
                        "a few values; the next DynamicQuantizeLinear turns that into a whole quantization step, which "
                        "53 layers grow to ~2e-3 on the softmax (onnxruntime's own level spread is 0)")))


@pytest.mark.parametrize("name,kind", CASES)
def test_quantized_model_matches_onnxruntime(tmp_path, name, kind):
    """A model quantized by onnxruntime (QDQ per-tensor/per-channel, dynamic) runs in minfer within onnxruntime's spread."""
    model, shape = float_model(name)
    model = quantized(model, shape, kind, tmp_path)
    assert_quantized_as(model, kind)
    feeds = {model.graph.input[0].name: np.random.default_rng(2).standard_normal(shape).astype(np.float32)}
    want, fused = onnxruntime_levels(model, feeds)
    spread = float(np.abs(want - fused).max())
    floor = ULPS * float(np.spacing(np.abs(want).max()))
    got = Engine(model).run(None, feeds)[0]
    assert got.dtype == want.dtype and got.shape == want.shape, f"{got.dtype}{got.shape} vs {want.dtype}{want.shape}"
    error = float(np.abs(got - want).max())
    assert error <= max(spread, floor), f"max |minfer - onnxruntime| {error:.3g} > spread {spread:.3g}, floor {floor:.3g}"
