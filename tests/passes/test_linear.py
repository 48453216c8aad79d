"""matmul_bias_fusion and ai.minfer::FusedMatMulBias: a linear layer with its bias, residual and activation."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import minfer_core

D, F = 8, 16


def _mlp(batch: int = 2, seq: int = 5, residual_shape: tuple[int, ...] | None = None) -> onnx.ModelProto:
    """LayerNorm-free MLP block as exporters write it: MatMul + bias, Erf GELU, MatMul + bias + residual."""
    rng = np.random.default_rng(0)
    f = lambda name, shape: numpy_helper.from_array(rng.standard_normal(shape).astype(np.float32), name)  # noqa: E731
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    inits = [f("w1", (D, F)), f("b1", (F,)), f("w2", (F, D)), f("b2", (1, D)),
             c("r2", math.sqrt(2)), c("one", 1.0), c("half", 0.5)]
    n = helper.make_node
    nodes = [n("MatMul", ["x", "w1"], ["f0"]), n("Add", ["b1", "f0"], ["f1"]),
             n("Div", ["f1", "r2"], ["g0"]), n("Erf", ["g0"], ["g1"]), n("Add", ["g1", "one"], ["g2"]),
             n("Mul", ["f1", "g2"], ["g3"]), n("Mul", ["g3", "half"], ["g"]),
             n("MatMul", ["g", "w2"], ["m0"]), n("Add", ["m0", "b2"], ["m"]), n("Add", ["m", "r"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, D]),
              helper.make_tensor_value_info("r", TensorProto.FLOAT, list(residual_shape or (batch, seq, D)))]
    graph = helper.make_graph(nodes, "mlp", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, D])],
                              inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _feeds(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    dims = lambda v: [d.dim_value for d in v.type.tensor_type.shape.dim]  # noqa: E731
    return {v.name: rng.standard_normal(dims(v)).astype(np.float32) for v in model.graph.input}


def _fused(sess: minfer_core.InferenceSession) -> list[tuple[list[str], str]]:
    return [(list(n.inputs), n.attrs.get("activation", "")) for n in sess.graph.nodes if n.op_type == "FusedMatMulBias"]


def test_mlp_block_becomes_two_fused_linear_layers_and_matches_onnxruntime():
    """Bias, GELU and residual go into the two MatMuls; the outputs are onnxruntime's."""
    ort = pytest.importorskip("onnxruntime")
    model = _mlp()
    sess = minfer_core.InferenceSession(model, passes="all", threads=2)
    assert [n.op_type for n in sess.graph.nodes] == ["FusedMatMulBias", "FusedMatMulBias"]
    assert _fused(sess) == [(["x", "w1", "b1"], "Gelu"), (["g", "w2", "b2", "r"], "")]
    feeds = _feeds(model)
    (ref,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    (y,) = sess.run(None, feeds)
    assert np.allclose(y, ref, rtol=1e-5, atol=1e-5)


def test_fused_layers_give_the_unfused_bits():
    """The epilogue adds and activates in the nodes' own order: no rounding moves (the GEMM aside)."""
    model = _mlp(batch=3, seq=7)
    feeds = _feeds(model)
    (fused,) = minfer_core.InferenceSession(model, passes="all").run(None, feeds)
    (plain,) = minfer_core.InferenceSession(model, passes="all", disabled_passes=["matmul_bias_fusion"]).run(None, feeds)
    assert np.array_equal(fused, plain)


def test_a_residual_that_broadcasts_stays_an_add():
    """A residual smaller than the product would be broadcast by its Add: it is not taken into the node."""
    model = _mlp(residual_shape=(D,))
    sess = minfer_core.InferenceSession(model, passes="all")
    assert _fused(sess)[1] == (["g", "w2", "b2"], "")
    feeds = _feeds(model)
    (y,) = sess.run(None, feeds)
    (plain,) = minfer_core.InferenceSession(model, passes="none").run(None, feeds)
    assert np.allclose(y, plain, rtol=1e-5, atol=1e-5)


def test_a_bias_that_is_a_graph_output_stops_the_fusion_there():
    """Never fuse through a value that is a graph output: the first layer keeps its Add and GELU apart."""
    model = _mlp()
    model.graph.output.append(helper.make_tensor_value_info("f0", TensorProto.FLOAT, [2, 5, F]))
    sess = minfer_core.InferenceSession(model, passes="all")
    assert [inputs for inputs, _ in _fused(sess)] == [["g", "w2", "b2", "r"]]
    feeds = _feeds(model)
    got, want = sess.run(None, feeds), minfer_core.InferenceSession(model, passes="none").run(None, feeds)
    assert all(np.allclose(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(got, want))


def test_split_product_applies_the_epilogue_to_every_part_once():
    """Over two threads the product is split: each part gets its bias and residual exactly once."""
    from minfer_ops_basic import linalg

    model = _mlp(batch=4, seq=64)
    feeds = _feeds(model)
    plain = minfer_core.InferenceSession(model, passes="all", disabled_passes=["matmul_bias_fusion"], threads=1)
    fused = minfer_core.InferenceSession(model, passes="all", threads=2)
    old = linalg.SPLIT_WORK
    linalg.SPLIT_WORK = 1  # every product splits, by rows or by columns
    try:
        (got,) = fused.run(None, feeds)
    finally:
        linalg.SPLIT_WORK = old
    (want,) = plain.run(None, feeds)
    assert np.allclose(got, want, rtol=1e-5, atol=1e-5)


def test_portable_lowering_runs_in_onnxruntime(tmp_path):
    """--portable turns FusedMatMulBias back into MatMul, Add, Add and the GELU's Erf form: onnxruntime runs it."""
    ort = pytest.importorskip("onnxruntime")
    from minfer_core.cli import main

    model = _mlp()
    src, fused, dst = tmp_path / "mlp.onnx", tmp_path / "fused.onnx", tmp_path / "portable.onnx"
    onnx.save(model, str(src))
    assert main(["optimize", str(src), str(fused)]) == 0
    assert [n.op_type for n in onnx.load(str(fused)).graph.node] == ["FusedMatMulBias", "FusedMatMulBias"]
    assert main(["optimize", str(src), str(dst), "--portable"]) == 0
    portable = onnx.load(str(dst))
    assert {n.domain for n in portable.graph.node} == {""}
    assert {"MatMul", "Add", "Erf"} <= {n.op_type for n in portable.graph.node}
    portable.ir_version = 10
    feeds = _feeds(model)
    (y,) = ort.InferenceSession(portable.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert np.allclose(y, want, rtol=1e-5, atol=1e-5)


def test_the_real_model_encoder_becomes_21_nodes_matching_onnxruntime():
    """With its reshape targets proved (reshape_dim_copy), the encoder's residuals join its linear layers too."""
    import sys
    from pathlib import Path

    ort = pytest.importorskip("onnxruntime")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
    import realmodels

    model = realmodels.encoder_block(seed=0)
    sess = minfer_core.InferenceSession(model, passes="all")
    ops = [n.op_type for n in sess.graph.nodes]
    assert ops.count("FusedMatMulBias") == 6 and "Add" not in ops and "Shape" not in ops and len(ops) == 21
    assert sum(len(n.inputs) == 4 for n in sess.graph.nodes if n.op_type == "FusedMatMulBias") == 2  # both residuals
    rng = np.random.default_rng(6)
    feeds = {"x": rng.standard_normal((2, 11, 64)).astype(np.float32),
             "attention_mask": (rng.random((2, 11)) > 0.3).astype(np.int64)}
    (y,) = sess.run(None, feeds)
    (ref,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert np.allclose(y, ref, rtol=1e-4, atol=1e-4)
