"""Dynamic shapes: build once, run many shapes; same results as fresh engines and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import minfer_core.sequential as sequential_mod
import minfer_core.infer as infer_mod
from modelkit import make_model, ort_run, tensor
from minfer_core import BadFeedError, InferenceSession

RNG = np.random.default_rng(7)


def _init(name: str, shape: tuple[int, ...]) -> object:
    return numpy_helper.from_array((RNG.standard_normal(shape) * 0.3).astype(np.float32), name)


def attention_like_model():
    """x[N, S, 16] -> MatMul, Add, Relu, Reshape to heads, Transpose, Softmax, MatMul, back to [N, S, 16]."""
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "bias"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("Reshape", ["r", "heads"], ["rh"]),
        helper.make_node("Transpose", ["rh"], ["t"], perm=[0, 2, 1, 3]),
        helper.make_node("Transpose", ["rh"], ["tk"], perm=[0, 2, 3, 1]),
        helper.make_node("MatMul", ["t", "tk"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["p"], axis=-1),
        helper.make_node("MatMul", ["p", "t"], ["ctx"]),
        helper.make_node("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3]),
        helper.make_node("Reshape", ["ct", "merge"], ["m"]),
        helper.make_node("MatMul", ["m", "wo"], ["o"]),
        helper.make_node("Add", ["o", "x"], ["y"]),
    ]
    inits = [
        _init("w", (16, 32)),
        _init("bias", (32,)),
        _init("wo", (32, 16)),
        numpy_helper.from_array(np.array([0, 0, 4, 8], np.int64), "heads"),
        numpy_helper.from_array(np.array([0, 0, 32], np.int64), "merge"),
    ]
    return make_model(nodes, [tensor("x", ["N", "S", 16])], [tensor("y", ["N", "S", 16])], inits)


def conv_model():
    """x[N, 3, H, W] -> Conv 3x3 pad 1, Relu, MaxPool 2x2, Conv 1x1, GlobalAveragePool, Flatten, Gemm."""
    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c"], ["r"]),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p", "pw"], ["q"]),
        helper.make_node("GlobalAveragePool", ["q"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "gw", "gb"], ["y"], transB=1),
    ]
    inits = [_init("cw", (8, 3, 3, 3)), _init("cb", (8,)), _init("pw", (12, 8, 1, 1)), _init("gw", (5, 12)), _init("gb", (5,))]
    return make_model(nodes, [tensor("x", ["N", 3, "H", "W"])], [tensor("y", ["N", 5])], inits)


def _x(shape: tuple[int, ...], seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


@pytest.mark.parametrize(
    "build, shapes",
    [
        (attention_like_model, [(1, 5, 16), (3, 7, 16), (1, 5, 16), (2, 1, 16), (3, 7, 16)]),
        (conv_model, [(1, 3, 8, 8), (2, 3, 12, 10), (1, 3, 8, 8), (3, 3, 6, 14), (2, 3, 12, 10)]),
    ],
)
def test_alternating_shapes_match_fresh_engines_and_onnxruntime(build, shapes):
    """One engine run on alternating shapes gives what a fresh engine and onnxruntime give."""
    model = build()
    sess = InferenceSession(model)
    for i, shape in enumerate(shapes):
        x = _x(shape, i)
        (got,) = sess.run(None, {"x": x})
        (fresh,) = InferenceSession(model).run(None, {"x": x})
        (want,) = ort_run(model, {"x": x})
        np.testing.assert_array_equal(got, fresh)
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_earlier_outputs_survive_runs_of_other_shapes():
    """Arrays returned for one shape keep their values while other shapes run."""
    model = conv_model()
    sess = InferenceSession(model)
    shapes = [(1, 3, 8, 8), (2, 3, 12, 10), (1, 3, 8, 8)]
    kept = [(shape, i, sess.run(None, {"x": _x(shape, i)})[0]) for i, shape in enumerate(shapes * 2)]
    for shape, i, y in kept:
        np.testing.assert_allclose(y, ort_run(model, {"x": _x(shape, i)})[0], rtol=1e-4, atol=1e-5)


def test_shape_inference_runs_once_per_signature(monkeypatch):
    """Runtime shape inference is cached per input-shape signature; repeated shapes reuse plan and loop."""
    calls = []
    real = sequential_mod.infer_runtime
    monkeypatch.setattr(sequential_mod, "infer_runtime", lambda *a: calls.append(1) or real(*a))
    sess = InferenceSession(attention_like_model())
    shapes = [(1, 5, 16), (3, 7, 16), (1, 5, 16), (3, 7, 16), (1, 5, 16)]
    plans, loops = {}, {}
    for i, shape in enumerate(shapes):
        sess.run(None, {"x": _x(shape, i)})
        sig = ((shape, np.dtype(np.float32)),)
        assert sess.executor.plans.plans.setdefault(sig, sess.executor.plans.plans[sig]) is plans.setdefault(sig, sess.executor.plans.plans[sig])  # not re-planned
        if i >= 2:  # once both shapes are planned the arena stops growing: loops are reused as they are
            assert sess.executor.plans.bound[sig] is loops.setdefault(sig, sess.executor.plans.bound[sig])
    assert len(calls) == 2


def test_only_nodes_downstream_of_changed_inputs_are_reinferred(monkeypatch):
    """A branch fed only by a static input keeps its build-time types when another input changes shape."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Relu", ["s"], ["b"]),
        helper.make_node("Neg", ["b"], ["c"]),
    ]
    model = make_model(nodes, [tensor("x", ["N", 4]), tensor("s", [3])], [tensor("a", ["N", 4]), tensor("c", [3])])
    sess = InferenceSession(model)
    inferred = []
    real = infer_mod._infer_node
    monkeypatch.setattr(infer_mod, "_infer_node", lambda g, n, *a: inferred.append(n.outputs[0]) or real(g, n, *a))
    sess.run(None, {"x": _x((2, 4), 0), "s": _x((3,), 1)})
    assert inferred == ["a"]



def test_new_shapes_export_each_node_for_inference_once(monkeypatch):
    """Runtime inference of a new shape reuses the nodes exported for the previous one, with the same results."""
    model, shapes = attention_like_model(), [(1, 5, 16), (3, 7, 16), (2, 4, 16)]
    fresh = [InferenceSession(model).run(None, {"x": _x(s, i)})[0] for i, s in enumerate(shapes)]
    sess = InferenceSession(model)
    exported = []
    real = infer_mod._export_node
    monkeypatch.setattr(infer_mod, "_export_node", lambda n, o: exported.append(id(n)) or real(n, o))
    for i, (shape, want) in enumerate(zip(shapes, fresh)):
        np.testing.assert_allclose(sess.run(None, {"x": _x(shape, i)})[0], want, rtol=1e-5, atol=1e-6)
    assert exported and len(exported) == len(set(exported))


def test_a_feed_contradicting_a_static_dim_names_it():
    """A feed whose size differs from a static dim is a BadFeedError naming the input and the dim."""
    sess = InferenceSession(conv_model())
    with pytest.raises(BadFeedError, match=r"input 'x' expects shape \[N, 3, H, W\], got \(1, 4, 8, 8\): dim 1 must be 3"):
        sess.run(None, {"x": _x((1, 4, 8, 8), 0)})


def test_inputs_sharing_a_symbolic_dim_must_agree():
    """Two inputs that use the same symbolic dim must give it the same size."""
    nodes = [helper.make_node("Add", ["a", "b"], ["y"])]
    model = make_model(nodes, [tensor("a", ["N", 2]), tensor("b", ["N", 2])], [tensor("y", ["N", 2])])
    sess = InferenceSession(model)
    with pytest.raises(BadFeedError, match=r"input 'b' dim 0 is the symbolic dim 'N' = 3, but input 'a' set 'N' = 2"):
        sess.run(None, {"a": _x((2, 2), 0), "b": _x((3, 2), 1)})


def test_a_bad_feed_leaves_the_engine_usable():
    """After a rejected feed the engine still runs valid shapes correctly."""
    model = attention_like_model()
    sess = InferenceSession(model)
    with pytest.raises(BadFeedError):
        sess.run(None, {"x": _x((1, 5, 15), 0)})
    x = _x((2, 3, 16), 1)
    np.testing.assert_allclose(sess.run(None, {"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


def test_data_dependent_shapes_still_run():
    """Values whose shape depends on data (NonZero) are left to their kernel and stay correct."""
    nodes = [
        helper.make_node("NonZero", ["x"], ["nz"]),
        helper.make_node("Transpose", ["nz"], ["t"]),
        helper.make_node("Cast", ["t"], ["y"], to=TensorProto.FLOAT),
    ]
    model = make_model(nodes, [tensor("x", ["N"])], [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    sess = InferenceSession(model)
    for x in ([0, 1, 2, 0], [3, 0, 0, 0], [1, 1], [0, 1, 2, 0]):
        arr = np.array(x, np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": arr})[0], np.nonzero(arr)[0][:, None].astype(np.float32))
