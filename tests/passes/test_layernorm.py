"""layer_norm_fusion: the ReduceMean spelling of LayerNorm as one standard LayerNormalization."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import minfer_core

D = 16


def _ln(square: str = "Pow", eps_first: bool = False, gamma: tuple[int, ...] | None = (D,), beta: bool = True,
        opset: int = 17, shape: tuple[int, ...] = (2, 5, D)) -> onnx.ModelProto:
    """A LayerNorm as older exporters write it: ReduceMean, Sub, Pow (or Mul), ReduceMean, Add, Sqrt, Div, Mul, Add."""
    rng = np.random.default_rng(0)
    f = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    inits = [f("two", 2.0), f("eps", 1e-5)]
    n = helper.make_node
    nodes = [n("ReduceMean", ["x"], ["m"], axes=[-1], keepdims=1), n("Sub", ["x", "m"], ["e"]),
             n("Pow", ["e", "two"], ["sq"]) if square == "Pow" else n("Mul", ["e", "e"], ["sq"]),
             n("ReduceMean", ["sq"], ["v"], axes=[-1], keepdims=1),
             n("Add", ["eps", "v"] if eps_first else ["v", "eps"], ["ve"]), n("Sqrt", ["ve"], ["s"]),
             n("Div", ["e", "s"], ["y0"])]
    y = "y0"
    if gamma is not None:
        inits.append(f("gamma", 1 + 0.1 * rng.standard_normal(gamma)))
        nodes.append(n("Mul", [y, "gamma"], ["y1"]))
        y = "y1"
    if beta:
        inits.append(f("beta", 0.1 * rng.standard_normal(D)))
        nodes.append(n("Add", ["beta", y], ["y2"]))
        y = "y2"
    nodes.append(n("Identity", [y], ["y"]))
    graph = helper.make_graph(nodes, "ln", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(shape))],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    return model


def _x(shape: tuple[int, ...] = (2, 5, D)) -> np.ndarray:
    return (np.random.default_rng(1).standard_normal(shape) * 3 + 1).astype(np.float32)


def _ops(sess: minfer_core.InferenceSession) -> list[str]:
    return [n.op_type for n in sess.graph.nodes]


@pytest.mark.parametrize("square, eps_first, gamma, beta", [
    ("Pow", False, (D,), True), ("Mul", True, (1, 1, D), True), ("Pow", True, None, False), ("Mul", False, (1,), False),
])
def test_each_spelling_becomes_one_layer_normalization_matching_onnxruntime(square, eps_first, gamma, beta):
    """Pow or Mul, eps on either side, scale and shift of any per-feature shape or absent: one node, same outputs."""
    ort = pytest.importorskip("onnxruntime")
    model = _ln(square, eps_first, gamma, beta)
    sess = minfer_core.InferenceSession(model, passes="all")
    assert _ops(sess) == ["LayerNormalization"]
    x = _x()
    (y,) = sess.run(None, {"x": x})
    (ref,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.allclose(y, ref, rtol=1e-4, atol=1e-5)


def test_a_scale_along_another_axis_stays_a_mul():
    """A scale of shape (5, 1) varies by row, not by feature: LayerNormalization cannot take it."""
    model = _ln(gamma=(5, 1))
    sess = minfer_core.InferenceSession(model, passes="all")
    assert "LayerNormalization" in _ops(sess) and "Mul" in {s for n in sess.graph.nodes for s in
                                                            [n.op_type, *n.attrs.get("ops", [])]}
    x = _x()
    (y,) = sess.run(None, {"x": x})
    (want,) = minfer_core.InferenceSession(model, passes="none").run(None, {"x": x})
    assert np.allclose(y, want, rtol=1e-4, atol=1e-5)


def test_before_opset_17_or_with_an_exposed_intermediate_nothing_fuses():
    """LayerNormalization exists from opset 17; a deviation that is also a graph output must stay computed."""
    old = minfer_core.InferenceSession(_ln(opset=13), passes="all")
    assert "LayerNormalization" not in _ops(old)
    exposed = _ln()
    exposed.graph.output.append(helper.make_tensor_value_info("s", TensorProto.FLOAT, [2, 5, 1]))
    sess = minfer_core.InferenceSession(exposed, passes="all")
    assert "LayerNormalization" not in _ops(sess)
    x = _x()
    got, want = sess.run(None, {"x": x}), minfer_core.InferenceSession(exposed, passes="none").run(None, {"x": x})
    assert all(np.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, want))


def test_the_real_model_encoder_gets_its_second_layer_norm_whole():
    """The encoder block's decomposed LayerNorm fuses; the block still matches onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
    import realmodels

    model = realmodels.encoder_block(seed=0)
    sess = minfer_core.InferenceSession(model, passes="all")
    ops = _ops(sess)
    assert ops.count("LayerNormalization") == 2 and "ReduceMean" not in ops and "Sqrt" not in ops
    rng = np.random.default_rng(4)
    feeds = {"x": rng.standard_normal((2, 7, 64)).astype(np.float32),
             "attention_mask": (rng.random((2, 7)) > 0.3).astype(np.int64)}
    (y,) = sess.run(None, feeds)
    (ref,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert np.allclose(y, ref, rtol=1e-4, atol=1e-4)
