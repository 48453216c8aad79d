"""A new input shape's inference through the standard ops' fast ``infer=`` gives onnx's own inference's types."""

from __future__ import annotations

import sys
from pathlib import Path

import attrs
import numpy as np
import onnx
import pytest
from onnx import helper

import minfer_core
from minfer_core import InferenceSession, TensorType
from minfer_core.infer import infer_runtime
from minfer_ops_basic import fastinfer as basic_fast
from minfer_ops_conv import fastinfer as conv_fast
from modelkit import make_model, tensor

sys.path.append(str(Path(__file__).resolve().parent.parent / "models"))
import realmodels  # noqa: E402

# builder, input axis made symbolic, the sizes it takes in turn
MODELS = {
    "ocr_recognizer": (lambda: realmodels.ocr_recognizer(0), 3, (64, 96, 200)),
    "mobilenet_v2": (lambda: realmodels.mobilenet_v2(0, size=96), 0, (1, 2, 3)),
    "mobilenet_v3_small": (lambda: realmodels.mobilenet_v3(0, size=96), 0, (1, 3)),
    "orientation": (lambda: realmodels.orientation_classifier(0), 0, (1, 2)),
    "ocr_detector": (lambda: realmodels.ocr_detector(0), 0, (1, 2)),
    "detector": (lambda: realmodels.yolo_head(0), 0, (1, 4)),
    "encoder": (lambda: realmodels.encoder_block(0), 0, (1, 3)),
}


def _symbolic(model: onnx.ModelProto, axis: int) -> onnx.ModelProto:
    for value in model.graph.input:
        value.type.tensor_type.shape.dim[axis].dim_param = "S"
    for value in model.graph.output:  # what the outputs become is the inference's to say
        value.type.tensor_type.ClearField("shape")
    return model


def _types(sess: InferenceSession, size: int) -> tuple[dict[str, TensorType], set[str]]:
    """The runtime types of every value when each symbolic input dim is ``size``, and the nodes that failed."""
    p = sess.program
    inputs = {}
    for name in p.graph.inputs:
        t = p.graph.types[name]
        inputs[name] = TensorType(t.dtype, tuple(size if isinstance(d, str) or d is None else d for d in t.shape))
    types, failures = infer_runtime(p.graph, p.registry, p.step_nodes, inputs)
    return types, set(failures)


@pytest.fixture
def onnx_calls(monkeypatch):
    """Counts the calls of onnx's per-node inference."""
    calls = []
    real = onnx.shape_inference.infer_node_outputs
    monkeypatch.setattr(onnx.shape_inference, "infer_node_outputs", lambda *a, **k: calls.append(1) or real(*a, **k))
    return calls


def _without_fast_paths(monkeypatch, registry) -> None:
    """Every standard op's ``infer=`` dropped for the test: inference then asks onnx's schemas (the oracle)."""
    for key, defs in list(registry.ops.items()):
        if any(d.standard and d.infer is not None for d in defs):
            monkeypatch.setitem(registry.ops, key, [attrs.evolve(d, infer=None) if d.standard else d for d in defs])


@pytest.mark.parametrize("name", sorted(MODELS))
def test_fast_paths_give_onnx_types_over_real_models(name, monkeypatch, onnx_calls):
    """Per size, every value's runtime type and every failure equal those of onnx's inference alone, in fewer onnx calls."""
    make, axis, sizes = MODELS[name]
    sess = InferenceSession(_symbolic(make(), axis))
    fast = []
    for size in sizes:
        onnx_calls.clear()
        fast.append((_types(sess, size), len(onnx_calls)))
    _without_fast_paths(monkeypatch, minfer_core.get_registry())
    for size, ((types, failures), calls) in zip(sizes, fast):
        onnx_calls.clear()
        want, want_failures = _types(sess, size)
        assert types == want and failures == want_failures, size
        assert calls < len(onnx_calls), "no node took a fast path"


def _window_model() -> onnx.ModelProto:
    """Convs and pools over a symbolic batch and width: strides, dilations, asymmetric pads, groups, and the
    cases the fast paths leave to onnx (auto_pad, ceil_mode)."""
    rng = np.random.default_rng(0)
    w1 = helper.make_tensor("w1", onnx.TensorProto.FLOAT, (8, 4, 3, 2), rng.standard_normal(192).astype(np.float32))
    w2 = helper.make_tensor("w2", onnx.TensorProto.FLOAT, (8, 1, 3, 3), rng.standard_normal(72).astype(np.float32))
    nodes = [
        helper.make_node("Conv", ["x", "w1"], ["a"], strides=[2, 1], dilations=[1, 2], pads=[1, 0, 2, 1]),
        helper.make_node("Conv", ["a", "w2"], ["b"], group=8, auto_pad="SAME_UPPER", strides=[2, 2]),
        helper.make_node("MaxPool", ["b"], ["c"], kernel_shape=[2, 2], ceil_mode=1, strides=[2, 2]),
        helper.make_node("AveragePool", ["a"], ["d"], kernel_shape=[3, 1], pads=[1, 0, 1, 0], strides=[1, 2]),
        helper.make_node("MaxPool", ["a"], ["e", "i"], kernel_shape=[2, 3], dilations=[2, 1]),
        helper.make_node("Transpose", ["e"], ["t"], perm=[0, 3, 1, 2]),
        helper.make_node("Add", ["t", "bias"], ["y"]),
        helper.make_node("GlobalMaxPool", ["d"], ["g"]),
    ]
    bias = helper.make_tensor("bias", onnx.TensorProto.FLOAT, (1, 1, 1), [0.5])
    return make_model(nodes, [tensor("x", ["N", 4, 11, "W"])], [tensor(n, None) for n in "ycgi"], [w1, w2, bias])


def test_fast_paths_match_onnx_on_window_geometry(monkeypatch):
    """Conv and pool geometry (strides, dilations, asymmetric pads, groups, Indices), and the cases left to
    onnx, give onnx's types at each shape."""
    sess = InferenceSession(_window_model())
    got = [_types(sess, size) for size in (5, 8, 13)]
    _without_fast_paths(monkeypatch, minfer_core.get_registry())
    assert got == [_types(sess, size) for size in (5, 8, 13)]


def test_fast_paths_decline_what_they_leave_to_onnx():
    """A fast infer= returns None for a symbolic dim, auto_pad, ceil_mode, mismatched channels or dtypes, a window
    larger than the input, and shapes that do not broadcast."""
    f, i = np.float32, np.int64
    x = TensorType(f, (1, 4, 8, 8))
    w = TensorType(f, (6, 4, 3, 3))
    assert conv_fast.conv_types(x, w)[0] == TensorType(f, (1, 6, 6, 6))
    assert conv_fast.conv_types(TensorType(f, ("N", 4, 8, 8)), w) is None
    assert conv_fast.conv_types(x, w, auto_pad="SAME_UPPER") is None
    assert conv_fast.conv_types(x, w, group=2) is None
    assert conv_fast.conv_types(x, TensorType(f, (6, 4, 9, 9))) is None
    assert conv_fast.pool_types(x, kernel_shape=[2, 2], ceil_mode=1) is None
    assert conv_fast.pool_types(x, kernel_shape=[2, 2], strides=[0, 1]) is None
    assert conv_fast.pool_types(x, kernel_shape=[2, 2], strides=[2, 2])[1] == TensorType(i, (1, 4, 4, 4))
    assert basic_fast.broadcast_types(x, TensorType(f, (4, 1, 1)))[0] == x
    assert basic_fast.broadcast_types(x, TensorType(f, (3, 1, 1))) is None
    assert basic_fast.broadcast_types(x, TensorType(np.float64, (1,))) is None
    assert basic_fast.transpose_types(x, perm=[0, 0, 1, 2]) is None


def test_matmul_and_gemm_fast_paths_decline_what_they_leave_to_onnx():
    """MatMul and Gemm give their output type, and None for a 1-D operand, mismatched inner dims or a C that
    does not broadcast to the output."""
    f = np.float32
    a, b = TensorType(f, (2, 1, 5, 3)), TensorType(f, (4, 3, 7))
    assert basic_fast.matmul_types(a, b)[0] == TensorType(f, (2, 4, 5, 7))
    assert basic_fast.matmul_types(a, TensorType(f, (3,))) is None
    assert basic_fast.matmul_types(a, TensorType(f, (4, 7))) is None
    g, h = TensorType(f, (3, 5)), TensorType(f, (6, 3))
    assert basic_fast.gemm_types(g, h, TensorType(f, (6,)), transA=1, transB=1)[0] == TensorType(f, (5, 6))
    assert basic_fast.gemm_types(g, h, TensorType(f, (5,)), transA=1, transB=1) is None
    assert basic_fast.gemm_types(g, h) is None
