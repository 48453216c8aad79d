"""masked_softmax_fusion and ai.minfer::MaskedSoftmax: attention's scale, padding mask and Softmax in one node."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import minfer_core
from minfer_passes.softmax import _fill

N, H, S = 2, 3, 6


def _attention_scores(scale_op: str = "Div", expand: bool = True, fill: float = -1e9) -> onnx.ModelProto:
    """Scores / sqrt(d), Where(Expand(padding mask, Shape(scores)), fill, .), Softmax, as torch.onnx writes them."""
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    n = helper.make_node
    nodes = [n(scale_op, ["s", "c"], ["t"])]
    cond = "m"
    if expand:
        nodes += [n("Shape", ["t"], ["shape"]), n("Expand", ["m", "shape"], ["me"])]
        cond = "me"
    nodes += [n("Where", [cond, "fill", "t"], ["w"]), n("Softmax", ["w"], ["y"], axis=-1)]
    inputs = [helper.make_tensor_value_info("s", TensorProto.FLOAT, [N, H, S, S]),
              helper.make_tensor_value_info("m", TensorProto.BOOL, [N, 1, 1, S])]
    graph = helper.make_graph(nodes, "scores", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, [N, H, S, S])],
                              [c("c", 8.0 if scale_op == "Div" else 0.125), c("fill", fill)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _feeds(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    mask = rng.random((N, 1, 1, S)) > 0.6
    mask[0, ..., :] = True  # a batch whose every key is padding: Where gives equal scores, Softmax 1/S
    return {"s": (rng.standard_normal((N, H, S, S)) * 20).astype(np.float32), "m": mask}


@pytest.mark.parametrize("scale_op, expand, fill", [("Div", True, -1e9), ("Mul", False, -np.inf), ("Mul", True, 0.5)])
def test_scale_mask_and_softmax_become_one_node_with_the_same_bits(scale_op, expand, fill):
    """One MaskedSoftmax (Expand and Shape gone) computes what the four or six nodes did, bit for bit."""
    model = _attention_scores(scale_op, expand, fill)
    sess = minfer_core.InferenceSession(model, passes="all")
    assert [(n.op_type, list(n.inputs)) for n in sess.graph.nodes] == [("MaskedSoftmax", ["s", "m"])]
    feeds = _feeds()
    (y,) = sess.run(None, feeds)
    (want,) = minfer_core.InferenceSession(model, passes="all", disabled_passes=["masked_softmax_fusion"]).run(None, feeds)
    assert np.array_equal(y, want, equal_nan=True)


def test_matches_onnxruntime():
    """The fused node's outputs are onnxruntime's on the unfused model."""
    ort = pytest.importorskip("onnxruntime")
    model = _attention_scores()
    feeds = _feeds(1)
    (y,) = minfer_core.InferenceSession(model, passes="all").run(None, feeds)
    (ref,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert np.allclose(y, ref, rtol=1e-5, atol=1e-6)


def test_fill_by_bits_writes_what_where_writes_even_over_inf_and_nan():
    """The bit-mask fill equals np.where for a broadcast mask, including non-finite scores and fills."""
    rng = np.random.default_rng(2)
    y = rng.standard_normal((2, 3, 4, 5)).astype(np.float32)
    y[0, 0, 0, :3] = [np.inf, -np.inf, np.nan]
    cond = rng.random((2, 1, 1, 5)) > 0.5
    cond[0, 0, 0, :3] = False
    for fill in (-np.inf, np.nan, -1e9):
        got = y.copy()
        _fill(got, cond, np.asarray(fill, np.float32))
        assert np.array_equal(got, np.where(cond, np.float32(fill), y), equal_nan=True)


def test_a_scaled_value_read_elsewhere_keeps_its_node():
    """Never fuse through a value another node reads: the scale stays, mask and Softmax still fuse."""
    model = _attention_scores(expand=False)
    model.graph.output.append(helper.make_tensor_value_info("t", TensorProto.FLOAT, [N, H, S, S]))
    sess = minfer_core.InferenceSession(model, passes="all")
    fused = [n for n in sess.graph.nodes if n.op_type == "MaskedSoftmax"]
    assert len(fused) == 1 and fused[0].inputs[0] == "t" and not fused[0].attrs.get("op")
    feeds = _feeds()
    got, want = sess.run(None, feeds), minfer_core.InferenceSession(model, passes="none").run(None, feeds)
    assert all(np.array_equal(a, b) for a, b in zip(got, want))


def test_portable_lowering_runs_in_onnxruntime(tmp_path):
    """--portable writes the scale, Where and Softmax back: onnxruntime runs it to the same outputs."""
    ort = pytest.importorskip("onnxruntime")
    from minfer_core.cli import main

    model = _attention_scores()
    src, dst = tmp_path / "scores.onnx", tmp_path / "portable.onnx"
    onnx.save(model, str(src))
    assert main(["optimize", str(src), str(dst), "--portable"]) == 0
    portable = onnx.load(str(dst))
    assert [n.op_type for n in portable.graph.node] == ["Div", "Where", "Softmax"]
    portable.ir_version = 10
    feeds = _feeds(3)
    (y,) = ort.InferenceSession(portable.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    (want,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert np.allclose(y, want, rtol=1e-6, atol=1e-7)


def test_the_real_model_encoder_fuses_its_attention_scores_and_matches_onnxruntime():
    """The encoder block's Div, Expand and Where go into its Softmax; outputs stay onnxruntime's."""
    ort = pytest.importorskip("onnxruntime")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "models"))
    import realmodels

    model = realmodels.encoder_block(seed=0)
    sess = minfer_core.InferenceSession(model, passes="all")
    ops = [n.op_type for n in sess.graph.nodes]
    assert "MaskedSoftmax" in ops and not {"Where", "Expand", "Softmax"} & set(ops)
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((3, 9, 64)).astype(np.float32),
             "attention_mask": (rng.random((3, 9)) > 0.3).astype(np.int64)}
    (y,) = sess.run(None, feeds)
    (ref,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    assert np.allclose(y, ref, rtol=1e-4, atol=1e-4)
