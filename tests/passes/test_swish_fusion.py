"""activation_fusion's Swish: Conv/Gemm/MatMul -> Sigmoid [after a scaling] -> Mul (and Swish-24) as one fused node."""

from __future__ import annotations

import numpy as np
import pytest

from minfer_core import Engine, InferenceSession
from minfer_core.testing import GraphBuilder, random_feeds
from minfer_passes.activation import activation_fusion
from minfer_passes.portable import expand_fused
from minfer_passes.shapes import shape_inference
from onnx import helper, numpy_helper

from modelkit import make_model, ort_run, tensor


def _conv(b: GraphBuilder, shape=(2, 3, 6, 6), out=4) -> str:
    rng = np.random.default_rng(0)
    w = b.const((rng.standard_normal((out, shape[1], 3, 3)) * 0.5).astype(np.float32))
    bias = b.const(rng.standard_normal(out).astype(np.float32))
    return b.op("Conv", b.input(shape), w, bias, kernel_shape=[3, 3], pads=[1, 1, 1, 1])


def _silu(form: str, opset: int = 17, alpha: float = 1.702) -> GraphBuilder:
    """A Conv then Swish in ``form``: "sigmoid" x * Sigmoid(x), "swapped" Sigmoid(x) * x, "scaled" x *
    Sigmoid(alpha * x) (alpha a 0-d constant), "scaled_first" Sigmoid(x * alpha) with alpha a (1,) constant, "op"
    Swish-24."""
    b = GraphBuilder(opset=opset)
    x = _conv(b)
    if form == "op":
        y = b.op("Swish", x, alpha=alpha)
    elif form in ("sigmoid", "swapped"):
        s = b.op("Sigmoid", x)
        y = b.op("Mul", x, s) if form == "sigmoid" else b.op("Mul", s, x)
    else:
        c = b.const(np.array(alpha if form == "scaled" else [alpha], np.float32))
        s = b.op("Sigmoid", b.op("Mul", c, x) if form == "scaled" else b.op("Mul", x, c))
        y = b.op("Mul", x, s)
    b.output(y)
    return b


def _fused(graph):
    shape_inference(graph)
    before = graph.copy()
    assert activation_fusion(graph)
    graph.validate()
    return before, graph


@pytest.mark.parametrize("form, alpha", [("sigmoid", 1.0), ("swapped", 1.0), ("scaled", 1.702), ("scaled_first", 0.5)])
def test_sigmoid_and_mul_after_a_conv_become_one_fused_conv(form, alpha):
    """Every form of x * Sigmoid(alpha * x) after a Conv fuses into FusedConv(activation Swish, [alpha]) with
    the unfused graph's outputs (rtol 1e-5, the pass's declared tolerance)."""
    before, graph = _fused(_silu(form, alpha=alpha).build())
    [node] = graph.nodes
    assert (node.domain, node.op_type, node.attrs["activation"]) == ("ai.minfer", "FusedConv", "Swish")
    assert node.attrs["activation_params"] == [pytest.approx(alpha)]
    assert list(node.outputs) == list(before.outputs)
    feeds = random_feeds(before)
    want = InferenceSession(before, passes="none").run(None, feeds)[0]
    got = InferenceSession(graph, passes="none").run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_swish_op_fuses_with_its_alpha():
    """Swish-24 right after the Conv fuses like the other single-node activations, alpha from its attribute."""
    _, graph = _fused(_silu("op", opset=24, alpha=0.75).build())
    [node] = graph.nodes
    assert node.attrs["activation"] == "Swish" and node.attrs["activation_params"] == [pytest.approx(0.75)]


@pytest.mark.parametrize("base", ["Gemm", "MatMul"])
def test_swish_after_gemm_and_matmul(base):
    b = GraphBuilder(opset=17)
    w = b.const(np.random.default_rng(1).standard_normal((5, 7)).astype(np.float32))
    x = b.op(base, b.input((3, 5)), w)
    b.output(b.op("Mul", b.op("Sigmoid", x), x))
    before, graph = _fused(b.build())
    assert [(n.op_type, n.attrs["activation"]) for n in graph.nodes] == [(f"Fused{base}", "Swish")]
    feeds = random_feeds(before)
    np.testing.assert_allclose(InferenceSession(graph, passes="none").run(None, feeds)[0],
                               InferenceSession(before, passes="none").run(None, feeds)[0], rtol=1e-5, atol=1e-6)


def _unfusable(case: str):
    b = GraphBuilder(opset=17)
    x = _conv(b)
    if case == "sigmoid read elsewhere":
        s = b.op("Sigmoid", x)
        b.output(b.op("Mul", x, s))
        b.output(s)
    elif case == "conv read elsewhere":
        b.output(b.op("Mul", x, b.op("Sigmoid", x)))
        b.output(b.op("Neg", x))
    elif case == "mul of another value":
        other = b.input((2, 4, 6, 6))
        s = b.op("Sigmoid", x)
        b.output(b.op("Mul", other, s))
        b.output(b.op("Neg", x))
    elif case == "scale not constant":
        s = b.op("Sigmoid", b.op("Mul", x, b.input((1,))))
        b.output(b.op("Mul", x, s))
    elif case == "scale of many values":
        s = b.op("Sigmoid", b.op("Mul", x, b.const(np.full((4, 1, 1), 2.0, np.float32))))
        b.output(b.op("Mul", x, s))
    elif case == "scale broadcasts to a higher rank":
        s = b.op("Sigmoid", b.op("Mul", x, b.const(np.full((1, 1, 1, 1, 1), 2.0, np.float32))))
        b.output(b.op("Mul", x, s))
    elif case == "scaled value is an output":
        t = b.op("Mul", x, b.const(np.float32(2.0)))
        b.output(b.op("Mul", x, b.op("Sigmoid", t)))
        b.output(t)
    elif case == "sigmoid times itself":
        s = b.op("Sigmoid", x)
        b.output(b.op("Mul", s, s))
        b.output(b.op("Neg", x))
    return b.build()


@pytest.mark.parametrize("case", ["sigmoid read elsewhere", "conv read elsewhere", "mul of another value",
                                  "scale not constant", "scale of many values", "scale broadcasts to a higher rank",
                                  "scaled value is an output", "sigmoid times itself"])
def test_what_must_not_fuse_as_swish(case):
    """A value the fused node would no longer compute, or a Mul that is not x * Sigmoid(alpha * x), stays as it is."""
    graph = _unfusable(case)
    shape_inference(graph)
    ops = sorted(n.op_type for n in graph.nodes)
    activation_fusion(graph)
    assert not any(n.attrs.get("activation") == "Swish" for n in graph.nodes)
    assert "Conv" in ops and sorted(n.op_type for n in graph.nodes) == ops


@pytest.mark.parametrize("opset, ops", [(17, ["Conv", "Mul", "Mul", "Sigmoid"]), (24, ["Conv", "Swish"])])
def test_portable_form_of_the_fused_swish(opset, ops):
    """--portable expands the fused Swish to Mul, Sigmoid, Mul below opset 24 and to Swish from it, computing the
    same values."""
    before, graph = _fused(_silu("scaled", opset=opset).build())
    expand_fused(graph)
    graph.validate()
    assert sorted(n.op_type for n in graph.nodes) == ops and not any(n.domain for n in graph.nodes)
    feeds = random_feeds(before)
    np.testing.assert_allclose(InferenceSession(graph, passes="none").run(None, feeds)[0],
                               InferenceSession(before, passes="none").run(None, feeds)[0], rtol=1e-5, atol=1e-6)


def test_fused_swish_model_matches_onnxruntime():
    """The whole engine (every pass, the installed kernels) on Conv -> Mul(1.702) -> Sigmoid -> Mul against
    onnxruntime, with NaN and infinities in the input: NaN where onnxruntime has NaN, its values elsewhere."""
    rng = np.random.default_rng(2)
    inits = [numpy_helper.from_array((rng.standard_normal((16, 3, 3, 3)) * 0.5).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b"),
             numpy_helper.from_array(np.array(1.702, np.float32), "alpha")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["c", "alpha"], ["t"]), helper.make_node("Sigmoid", ["t"], ["s"]),
             helper.make_node("Mul", ["c", "s"], ["y"])]
    model = make_model(nodes, [tensor("x", [2, 3, 20, 20])], [tensor("y", [2, 16, 20, 20])], inits, opset=17)
    x = rng.standard_normal((2, 3, 20, 20)).astype(np.float32) * 20
    x[0, 0, 0, :3] = [np.nan, np.inf, -np.inf]
    engine = Engine(model)
    assert [(n.op_type, n.attrs.get("activation")) for n in engine.graph.nodes] == [("FusedConv", "Swish")]
    got, want = engine.run(None, {"x": x})[0], ort_run(model, {"x": x})[0]
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
