"""reshape_dim_copy: Reshape targets computed from a shape become constant zeros where the dims are provably copied."""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

import minfer_core


def _split_heads(shape_of: str = "x", index: tuple[int, int] = (0, 1)) -> object:
    """x (batch, seq, 8) -> Reshape(x, Concat(Shape(S)[i], Shape(S)[j], [2], [4])), batch and seq symbolic."""
    i64 = lambda name, v: numpy_helper.from_array(np.asarray(v, np.int64), name)  # noqa: E731
    n = helper.make_node
    nodes = [n("Shape", [shape_of], ["shp"]),
             n("Gather", ["shp", "i"], ["d0"], axis=0), n("Gather", ["shp", "j"], ["d1"], axis=0),
             n("Unsqueeze", ["d0", "ax"], ["u0"]), n("Unsqueeze", ["d1", "ax"], ["u1"]),
             n("Concat", ["u0", "u1", "heads"], ["target"], axis=0), n("Reshape", ["x", "target"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8]),
              helper.make_tensor_value_info("o", TensorProto.FLOAT, ["other", "seq", 8])]
    graph = helper.make_graph(nodes, "heads", inputs, [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [i64("i", index[0]), i64("j", index[1]), i64("ax", [0]), i64("heads", [2, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def _run(model, passes):
    rng = np.random.default_rng(0)
    feeds = {"x": rng.standard_normal((3, 5, 8)).astype(np.float32), "o": rng.standard_normal((3, 5, 8)).astype(np.float32)}
    sess = minfer_core.InferenceSession(model, passes=passes)
    return sess, sess.run(None, feeds)[0]


def test_a_target_read_from_the_input_itself_becomes_a_constant_and_the_shape_ops_go():
    """Shape(x)[0], Shape(x)[1] are x's own dims 0 and 1: the target is [0, 0, 2, 4] and only the Reshape stays."""
    sess, y = _run(_split_heads(), "all")
    assert [n.op_type for n in sess.graph.nodes] == ["Reshape"]
    _, want = _run(_split_heads(), "none")
    assert np.array_equal(y, want) and y.shape == (3, 5, 2, 4)


def test_dims_that_are_not_provably_the_same_keep_the_computation():
    """Another tensor's symbolic batch, or dims gathered out of order, prove nothing: the Shape stays."""
    for model in (_split_heads(shape_of="o"), _split_heads(index=(1, 0))):
        sess, y = _run(model, "all")
        assert "Shape" in [n.op_type for n in sess.graph.nodes]
        _, want = _run(model, "none")
        assert np.array_equal(y, want)
