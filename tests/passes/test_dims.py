"""Passes treat symbolic, unknown and negative dims as sizes they do not know, and never crash on them."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from onnx import helper, numpy_helper

from modelkit import make_model, ort_run, tensor
from minfer_core import Graph, InferenceSession, Node, TensorType, get_registry
from minfer_core.testing import target_strategy
from minfer_passes import fusion
from minfer_passes.shapes import shape_inference


def _matmul_add(c_shape: tuple[int, ...], batch: object = -1) -> Graph:
    """y = MatMul(x, w) + c with x declared [batch, 8] and every value annotated, as a lenient importer leaves it."""
    f32 = np.dtype(np.float32)
    g = Graph([Node("MatMul", ["x", "w"], ["m"], name="mm"), Node("Add", ["m", "c"], ["y"], name="add")],
              inputs=["x"], outputs=["y"],
              initializers={"w": np.ones((8, 4), np.float32), "c": np.ones(c_shape, np.float32)},
              types={"x": TensorType(f32, (batch, 8)), "m": TensorType(f32, (batch, 4)), "y": TensorType(f32, (batch, 4))})
    return g


@pytest.mark.parametrize("batch", [-1, None, "N"])
def test_matmul_add_to_gemm_fuses_an_unknown_batch_with_a_row_bias(batch):
    """A bias of [N] broadcasts over any number of rows: the fusion fires for a -1, unknown or symbolic batch."""
    g = _matmul_add((4,), batch)
    assert fusion.matmul_add_to_gemm(g)
    assert [n.op_type for n in g.nodes] == ["Gemm"]
    g.validate()


@pytest.mark.parametrize("batch", [-1, None, "N"])
def test_matmul_add_to_gemm_keeps_a_bias_that_depends_on_the_batch(batch):
    """A bias of [3, N] equals Gemm's C only if the batch is 3, which an unknown batch does not promise."""
    g = _matmul_add((3, 4), batch)
    assert not fusion.matmul_add_to_gemm(g)
    assert [n.op_type for n in g.nodes] == ["MatMul", "Add"]


def _negative_batch_model():
    """A PaddlePaddle-style classifier head: the batch dim stored as dim_value -1."""
    w = numpy_helper.from_array(np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32), "w")
    b = numpy_helper.from_array(np.linspace(-1, 1, 4, dtype=np.float32), "b")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["m"]), helper.make_node("Add", ["m", "b"], ["logits"]),
             helper.make_node("Softmax", ["logits"], ["y"], axis=-1)]
    return make_model(nodes, [tensor("x", [-1, 8])], [tensor("y", [-1, 4])], [w, b])


def test_model_with_a_negative_batch_dim_builds_and_matches_onnxruntime():
    """The -1 batch model builds with every pass (MatMul+Add becomes Gemm) and gives onnxruntime's outputs."""
    model = _negative_batch_model()
    session = InferenceSession(model.SerializeToString())
    assert "Gemm" in {n.op_type for n in session.graph.nodes}
    for rows in (1, 3):
        x = np.random.default_rng(rows).standard_normal((rows, 8)).astype(np.float32)
        (got,) = session.run(None, {"x": x})
        np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def _negative(graph: Graph) -> Graph:
    """``graph`` with the first dim of every input declared -1 (only the types change)."""
    for name in graph.inputs:
        t = graph.types.get(name)
        if t is not None and t.shape:
            graph.types[name] = TensorType(t.dtype, (-1, *t.shape[1:]))
    return graph


ALL = [p for p in get_registry().passes if p.patterns is not None]


@pytest.mark.parametrize("p", ALL, ids=[p.name for p in ALL])
def test_pass_never_crashes_on_negative_dims(p):
    """Every pass, on its own target graphs with every input's first dim declared -1, runs and leaves a valid graph."""

    @settings(max_examples=10, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(target_strategy(p))
    def prop(graph: Graph) -> None:
        g = _negative(graph)
        shape_inference(g)
        p.fn(g)
        g.validate()

    prop()


def test_random_graphs_declare_symbolic_and_unknown_input_dims():
    """The random-graph strategy declares inputs with symbolic and unknown dims, and random_feeds still feeds them."""
    from minfer_core.testing import random_feeds
    from minfer_core.testing.strategies import graphs

    kinds: set[str] = set()

    @settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(graphs(max_nodes=2))
    def prop(graph: Graph) -> None:
        feeds = random_feeds(graph)
        for name in graph.inputs:
            declared = graph.types[name].shape
            kinds.update(type(d).__name__ for d in declared)
            fed = feeds[name].shape
            assert len(fed) == len(declared) and all(d == f for d, f in zip(declared, fed) if isinstance(d, int))

    prop()
    assert kinds == {"int", "str", "NoneType"}
