"""pad_conv_fusion: a Pad of +0.0 on the spatial axes before a Conv becomes the Conv's own padding."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from minfer_core import InferenceSession, load_model
from minfer_core.testing import signature
from minfer_passes.pad_fusion import pad_conv_fusion
from modelkit import make_model, ort_run, tensor

C, M = 4, 6  # input and output channels of the Conv


def _pad_conv(shape, pads, *, opset=17, conv=None, pad_attrs=None, value=None, axes=None, extra=()):
    """x -> Pad -> Conv (k3 unless told, weights and bias random) -> y, the Pad in its opset's form."""
    rng = np.random.default_rng(len(shape) + sum(pads))
    conv = dict(conv or {})
    conv.setdefault("kernel_shape", [3] * (len(shape) - 2))
    inits = [numpy_helper.from_array(rng.standard_normal((M, C, *conv["kernel_shape"])).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(M).astype(np.float32), "b")]
    pad_attrs = dict(pad_attrs or {})
    if opset < 11:
        pad_inputs = ["x"]
        pad_attrs["pads"] = list(pads)
        if value is not None:
            pad_attrs["value"] = value
    else:
        pad_inputs = ["x", "pads"]
        inits.append(numpy_helper.from_array(np.array(pads, np.int64), "pads"))
        if value is not None or axes is not None:
            pad_inputs.append("value" if value is not None else "")
            if value is not None:
                inits.append(numpy_helper.from_array(np.array(value, np.float32), "value"))
        if axes is not None:
            pad_inputs.append("axes")
            inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
    nodes = [helper.make_node("Pad", pad_inputs, ["p"], **pad_attrs),
             helper.make_node("Conv", ["p", "w", "b"], ["y"], **conv), *extra]
    outputs = [tensor("y", None)] + [tensor(n.output[0], None) for n in extra]
    return make_model(nodes, [tensor("x", list(shape))], outputs, inits, opset=opset)


def _feeds(model):
    dims = [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    return {"x": np.random.default_rng(7).standard_normal(dims).astype(np.float32)}


FOLDS = {
    "symmetric": (dict(shape=(1, C, 6, 7), pads=[0, 0, 1, 1, 0, 0, 1, 1]), [1, 1, 1, 1]),
    "width-only asymmetric onto own pads": (
        dict(shape=(2, C, 5, 6), pads=[0, 0, 0, 1, 0, 0, 0, 1], conv={"pads": [1, 0, 1, 2], "strides": [2, 1]}),
        [1, 1, 1, 3]),
    "Pad-2 attributes, dilated": (
        dict(shape=(1, C, 6, 6), pads=[0, 0, 2, 0, 0, 0, 0, 1], opset=10, value=0.0, conv={"dilations": [2, 1]}),
        [2, 0, 0, 1]),
    "Pad-18 axes, auto_pad VALID": (
        dict(shape=(1, C, 5, 5), pads=[2, 1], opset=18, axes=[-1], conv={"auto_pad": "VALID"}), [0, 2, 0, 1]),
    "1-D conv, value 0": (dict(shape=(1, C, 8), pads=[0, 0, 3, 0, 0, 1], opset=13, value=0.0), [3, 1]),
}


@pytest.mark.parametrize("case", FOLDS, ids=list(FOLDS))
def test_the_pad_goes_and_the_conv_pads_are_the_sum(case):
    """The Pad disappears; the Conv reads its input and pads by its own pads plus the Pad's spatial ones."""
    kw, want = FOLDS[case]
    graph = load_model(_pad_conv(**kw))
    assert pad_conv_fusion(graph)
    (conv,) = graph.nodes
    assert conv.op_type == "Conv" and conv.inputs[0] == "x" and conv.outputs == ("y",)
    assert conv.attrs["pads"] == want and conv.attrs.get("auto_pad", "NOTSET") == "NOTSET"


@pytest.mark.parametrize("case", FOLDS, ids=list(FOLDS))
def test_the_folded_model_gives_onnxruntimes_outputs(case):
    """With every pass the folded model gives onnxruntime's outputs of the Pad -> Conv model, and minfer's without passes."""
    model = _pad_conv(**FOLDS[case][0])
    sess = InferenceSession(model, passes="all")
    assert "Pad" not in [n.op_type for n in sess.graph.nodes]
    got, = sess.run(None, _feeds(model))
    np.testing.assert_allclose(got, ort_run(model, _feeds(model))[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got, InferenceSession(model, passes="none").run(None, _feeds(model))[0], rtol=1e-5, atol=1e-5)


def test_two_pads_in_a_row_both_fold():
    """Pad -> Pad -> Conv: both Pads go in one application, their pads summed into the Conv's."""
    model = _pad_conv((1, C, 5, 5), [0, 0, 1, 0, 0, 0, 0, 0])
    first = helper.make_node("Pad", ["x0", "pads2"], ["x"])
    model.graph.node.insert(0, first)
    model.graph.initializer.append(numpy_helper.from_array(np.array([0, 0, 0, 2, 0, 0, 1, 0], np.int64), "pads2"))
    model.graph.input[0].name = "x0"
    graph = load_model(model)
    assert pad_conv_fusion(graph)
    assert [(n.op_type, n.attrs["pads"]) for n in graph.nodes] == [("Conv", [1, 2, 1, 0])]


REFUSALS = {
    "reflect mode": dict(pad_attrs={"mode": "reflect"}),
    "edge mode": dict(pad_attrs={"mode": "edge"}),
    "value 0.5": dict(value=0.5),
    "value -0.0": dict(value=-0.0),
    "Pad-2 value 1.0": dict(opset=10, value=1.0),
    "channel pad": dict(pads=[0, 1, 1, 1, 0, 0, 1, 1], conv={"kernel_shape": [3, 3]}),
    "negative pad (a crop)": dict(pads=[0, 0, 1, -1, 0, 0, 1, 1]),
    "auto_pad SAME_UPPER": dict(conv={"auto_pad": "SAME_UPPER"}),
    "second reader": dict(extra=[helper.make_node("Relu", ["p"], ["r"])]),
}


@pytest.mark.parametrize("case", REFUSALS, ids=list(REFUSALS))
def test_a_pad_that_is_not_conv_padding_is_left_alone(case):
    """Another mode or value, a channel or negative pad, SAME_* auto_pad or another reader: nothing changes."""
    kw = dict(shape=(1, C, 5, 6), pads=[0, 0, 1, 1, 0, 0, 1, 1]) | REFUSALS[case]
    if kw["pads"][1]:  # the Conv must take the padded channel count: one more input channel per group
        kw["shape"] = (1, C - 1, 5, 6)
    graph = load_model(_pad_conv(**kw))
    before = signature(graph)
    assert not pad_conv_fusion(graph)
    assert signature(graph) == before


def test_a_pad_output_that_is_a_graph_output_stays():
    """A Pad whose output is also a graph output is not folded: the interface keeps the padded value."""
    model = _pad_conv((1, C, 5, 6), [0, 0, 1, 1, 0, 0, 1, 1])
    model.graph.output.append(tensor("p", None))
    graph = load_model(model)
    assert not pad_conv_fusion(graph)


def test_the_ocr_recognizers_zero_pad_folds_and_its_reflect_pad_stays():
    """The benchmark's OCR recognizer: its constant-zero Pad folds into the depthwise Conv after it; its reflect Pad,
    which no Conv padding can express, is the only Pad the built session runs; outputs match onnxruntime."""
    from bench.models import build

    model = build("ocr_recognizer", 1)
    sess = InferenceSession(model)
    pads = [n for n in sess.graph.nodes if n.op_type == "Pad"]
    assert [n.attrs.get("mode") for n in pads] == ["reflect"]
    assert [s.kernel.op_type for s in sess.program.specs].count("Pad") == 1
    feeds = {"x": np.random.default_rng(2).standard_normal((1, 3, 32, 64)).astype(np.float32)}
    for got, want in zip(sess.run(None, feeds), ort_run(model, feeds)):
        np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-5)
