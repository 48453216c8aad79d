"""Inference BatchNormalization rounds as onnxruntime's CPU kernel: bit for bit, with and without minfer's passes.

onnxruntime folds BN into y = x * a + b with each step rounded in float32: a = (1 / sqrt(var + eps)) * scale,
b = bias - mean * a. A fold in float64 rounded once moves a or b by an ulp on some channels, and a
DynamicQuantizeLinear reading the result turns an ulp into a whole quantization step (issue 15: the dynamic
quantized resnet50 and mobilenet_v2).
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from minfer_core import Engine
from modelkit import make_model, tensor

pytest.importorskip("onnxruntime")

SHAPE = (2, 64, 9, 9)
EPS = 1e-3


def bn_params(channels: int) -> dict[str, np.ndarray]:
    """Seeded scale, bias, mean and var of float32, as a trained network's would spread."""
    rng = np.random.default_rng(5)
    return {"scale": rng.uniform(0.2, 2.0, channels), "bias": rng.normal(0, 1, channels),
            "mean": rng.normal(0, 2, channels), "var": rng.uniform(0.01, 3.0, channels)}


def float64_fold_differs(p: dict[str, np.ndarray]) -> bool:
    """Whether folding in float64 and rounding once gives other a or b than onnxruntime's float32 steps."""
    f = np.float32
    a32 = f(1) / np.sqrt(p["var"].astype(f) + f(EPS)) * p["scale"].astype(f)
    b32 = p["bias"].astype(f) - p["mean"].astype(f) * a32
    a64 = p["scale"].astype(f).astype(np.float64) / np.sqrt(p["var"].astype(f).astype(np.float64) + f(EPS))
    b64 = p["bias"].astype(f) - p["mean"].astype(f).astype(np.float64) * a64
    return bool(np.any(a64.astype(f) != a32) or np.any(b64.astype(f) != b32))


def bn_model(activation: str, quantize: bool) -> onnx.ModelProto:
    """X -> BatchNormalization [-> activation] [-> DynamicQuantizeLinear]; every value an output."""
    params = {k: v.astype(np.float32) for k, v in bn_params(SHAPE[1]).items()}
    nodes = [helper.make_node("BatchNormalization", ["x", *params], ["bn"], epsilon=EPS)]
    outputs = [tensor("bn", list(SHAPE))]
    last = "bn"
    if activation:
        nodes.append(helper.make_node(activation, [last], ["act"]))
        outputs.append(tensor("act", list(SHAPE)))
        last = "act"
    if quantize:
        nodes.append(helper.make_node("DynamicQuantizeLinear", [last], ["q", "q_scale", "q_zero"]))
        outputs += [tensor("q", list(SHAPE), TensorProto.UINT8), tensor("q_scale", [], TensorProto.FLOAT),
                    tensor("q_zero", [], TensorProto.UINT8)]
    inits = [numpy_helper.from_array(v, k) for k, v in params.items()]
    return make_model(nodes, [tensor("x", list(SHAPE))], outputs, inits, opset=15)


def test_case_is_one_a_float64_fold_gets_wrong():
    """The parameters used here are ones where a float64 fold rounds a or b apart from onnxruntime (else the
    tests below could not fail)."""
    assert float64_fold_differs(bn_params(SHAPE[1]))


@pytest.mark.parametrize("passes", ["none", None])
@pytest.mark.parametrize("activation,quantize", [("", False), ("Relu", False), ("Relu", True)])
def test_batchnorm_matches_onnxruntime_bit_for_bit(passes, activation, quantize):
    """BatchNormalization (alone, or as a ChannelAffine with its Relu, before a DynamicQuantizeLinear) gives
    onnxruntime's values exactly, with every pass off and with the default passes."""
    model = bn_model(activation, quantize)
    feeds = {"x": (np.random.default_rng(6).standard_normal(SHAPE) * 3).astype(np.float32)}
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.graph_optimization_level, opts.log_severity_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL, 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    want = sess.run(None, feeds)
    got = Engine(model, **({"passes": passes} if passes else {})).run(None, feeds)
    for name, w, g in zip([o.name for o in model.graph.output], want, got):
        np.testing.assert_array_equal(g, w, err_msg=name)

