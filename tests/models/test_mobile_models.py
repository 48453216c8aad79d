"""Mobile and OCR models as exporters write them (MobileNetV3, a DBNet text detector, a PP-LCNet classifier) match onnxruntime."""

from __future__ import annotations

from functools import lru_cache

import numpy as np
import onnx
import pytest

from modelkit import ort_run
from minfer_core import InferenceSession
from realmodels import mobilenet_v3, ocr_detector, orientation_classifier

pytest.importorskip("onnxruntime")

RTOL, ATOL = 1e-3, 1e-5
# small inputs and heads keep each case well under a second; the layer structure is the full model's
CASES = {
    "mobilenet_v3_small": lambda: mobilenet_v3(0, size=96, classes=100),
    "mobilenet_v3_large": lambda: mobilenet_v3(0, variant="large", size=64, width=0.5, classes=10),
    "ocr_detector": lambda: ocr_detector(0, size=64),
    "orientation_classifier": lambda: orientation_classifier(0),
}




@lru_cache(maxsize=None)
def _built(name: str) -> bytes:
    return CASES[name]().SerializeToString()  # calibrating the batch norms runs the graph once: build each once


def _model(name: str) -> onnx.ModelProto:
    return onnx.load_from_string(_built(name))


@pytest.fixture(autouse=True)
def untimed_choices(monkeypatch):
    """Convs take their first candidate method, and nodes several plugins' kernels apply to the highest-priority
    kernel, instead of the fastest timed: which runs (and how it rounds) then depends neither on the machine's load
    nor on choices stored by earlier processes."""
    from minfer_ops_conv import conv, depthwise

    monkeypatch.setattr(conv, "TUNE", False)
    monkeypatch.setattr(depthwise, "TUNE", False)
    monkeypatch.setenv("MINFER_TUNE", "0")


def _feeds(model: onnx.ModelProto, seed: int) -> dict[str, np.ndarray]:
    (inp,) = model.graph.input
    shape = [d.dim_value for d in inp.type.tensor_type.shape.dim]
    return {inp.name: np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


@pytest.mark.parametrize("passes", ["none", "all"])
@pytest.mark.parametrize("name", CASES)
def test_mobile_model_matches_onnxruntime(name, passes):
    """Each model's outputs match onnxruntime's within rtol 1e-3, atol 1e-5, with no passes and with all of them."""
    model = _model(name)
    feeds = _feeds(model, 1)
    got = InferenceSession(model, passes=passes).run(None, feeds)
    want = ort_run(model, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)


@pytest.mark.parametrize("name", CASES)
def test_outputs_depend_on_the_image(name):
    """With random weights the outputs still depend on the input (by 1% of their largest at least; uncalibrated batch
    norms let activations fade to 1e-4 or nothing): the comparison above checks the network, not a constant."""
    model = _model(name)
    a, b = (ort_run(model, _feeds(model, seed))[0] for seed in (1, 2))
    assert np.abs(a - b).max() > 0.01 * np.abs(a).max()


def test_models_have_the_layers_their_exporters_write():
    """The graphs hold the ops that make these models what they are (and that the benchmark means to measure)."""
    ops = {name: {n.op_type for n in _model(name).graph.node} for name in CASES}
    mobile = {"Conv", "BatchNormalization", "HardSwish", "HardSigmoid", "GlobalAveragePool", "Mul", "Gemm", "Flatten"}
    assert mobile <= ops["mobilenet_v3_small"] and mobile | {"Relu", "Add"} <= ops["mobilenet_v3_large"]
    assert {"Resize", "Concat", "ConvTranspose", "Sigmoid", "Shape", "Slice", "HardSwish"} <= ops["ocr_detector"]
    assert {"HardSwish", "HardSigmoid", "Softmax", "GlobalAveragePool"} <= ops["orientation_classifier"]
    depthwise = [n for n in _model("mobilenet_v3_small").graph.node
                 if n.op_type == "Conv" and any(a.name == "group" and a.i > 1 for a in n.attribute)]
    assert len(depthwise) == 11  # one per inverted-residual block
