"""elementwise_fusion and ai.minfer::FusedElementwise: what fuses, what must not, the program, the kernel."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from minfer_core import Engine, InferenceSession, KernelContext, KernelError, TensorType, get_registry, load_model
from minfer_core.cli_passes import optimize_graph
from minfer_core.testing import GraphBuilder, random_feeds
from minfer_passes import elementwise_kernel
from minfer_passes.elementwise import decode, elementwise_fusion
from minfer_passes.shapes import shape_inference
from modelkit import make_model, ort_run, spy_parallel_for, tensor

FUSED = "FusedElementwise"


def _fused(graph):
    return [n for n in graph.nodes if n.op_type == FUSED]


def _fuse(graph):
    """Shape-infer, fuse, validate; returns (the fused graph, outputs before, outputs after) on random feeds."""
    shape_inference(graph)
    before = graph.copy()
    elementwise_fusion(graph)
    graph.validate()
    feeds = random_feeds(before)
    want = InferenceSession(before, passes="none").run(None, feeds)
    got = InferenceSession(graph.copy(), passes="none").run(None, feeds)
    return graph, want, got


def _silu(shape=(2, 3, 4), dtype=np.float32):
    b = GraphBuilder()
    x = b.input(shape, dtype)
    b.output(b.op("Mul", x, b.op("Sigmoid", x)))
    return b


def test_silu_becomes_one_node_with_the_documented_program():
    """x * Sigmoid(x) fuses into one FusedElementwise: ops [Sigmoid, Mul], refs input 0 then step 0."""
    g, want, got = _fuse(_silu().build())
    [node] = g.nodes
    assert node.op_type == FUSED and node.domain == "ai.minfer" and list(node.inputs) == g.inputs
    assert node.attrs["ops"] == ["Sigmoid", "Mul"]
    assert node.attrs["args"] == [0, -1, -1, 0, 1, -1]  # register 1 = step 0 (1 input, no constants)
    assert node.attrs["constants"].dtype == np.float32 and node.attrs["constants"].size == 0
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


def test_gelu_tanh_gives_the_readme_example_program():
    """PyTorch's tanh-GELU fuses into the very program plugins/minfer_passes/README.md shows."""
    b = GraphBuilder()
    x = b.input((4, 8))
    c = lambda v: b.const(np.float32(v))  # noqa: E731
    inner = b.op("Add", x, b.op("Mul", b.op("Pow", x, c(3.0)), c(0.044715)))
    t = b.op("Add", b.op("Tanh", b.op("Mul", inner, c(np.sqrt(2 / np.pi)))), c(1.0))
    b.output(b.op("Mul", b.op("Mul", x, c(0.5)), t))
    g, want, got = _fuse(b.build())
    [node] = g.nodes
    assert node.attrs["ops"] == ["Pow", "Mul", "Add", "Mul", "Tanh", "Add", "Mul", "Mul"]
    assert node.attrs["args"] == [0, 1, -1, 6, 2, -1, 0, 7, -1, 8, 3, -1, 9, -1, -1, 10, 4, -1, 0, 5, -1, 12, 11, -1]
    np.testing.assert_allclose(node.attrs["constants"], [3.0, 0.044715, 0.7978846, 1.0, 0.5], rtol=1e-6)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-7)


def test_chain_with_scalar_and_broadcast_operands_fuses_whole():
    """A chain reading a scalar constant (an immediate), a bias vector and a broadcasting input fuses into one node."""
    b = GraphBuilder()
    x, row = b.input((2, 3, 4)), b.input((3, 1))
    y = b.op("Add", x, b.const(np.linspace(-1, 1, 4).astype(np.float32)))
    y = b.op("Tanh", b.op("Mul", y, b.const(np.float32(0.5))))
    b.output(b.op("Max", b.op("Sub", y, row), b.const(np.float32(-0.25))))
    g, want, got = _fuse(b.build())
    [node] = g.nodes
    assert node.attrs["ops"] == ["Add", "Mul", "Tanh", "Sub", "Max"]
    assert list(node.attrs["constants"]) == [0.5, -0.25] and len(node.inputs) == 3  # x, the bias, row
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6, atol=1e-7)


def test_never_fuses_through_a_graph_output():
    """An intermediate that is a graph output ends a group: Tanh, Neg | Abs, Relu fuse as two groups, the output kept."""
    b = GraphBuilder()
    mid = b.op("Neg", b.op("Tanh", b.input((4, 5))))
    b.output(mid)
    b.output(b.op("Relu", b.op("Abs", mid)))
    g, want, got = _fuse(b.build())
    assert [n.attrs["ops"] for n in g.nodes] == [["Tanh", "Neg"], ["Abs", "Relu"]]
    assert g.nodes[0].outputs[0] == mid and mid in g.outputs
    for w, o in zip(want, got):
        np.testing.assert_allclose(o, w, rtol=1e-6)


def test_never_fuses_a_value_read_outside_the_group():
    """Sigmoid read by the Mul and by a Softmax stays its own node: nothing of two ops is left to fuse."""
    b = GraphBuilder()
    x = b.input((3, 4))
    s = b.op("Sigmoid", x)
    b.output(b.op("Mul", x, s), b.op("Softmax", s))
    g, _, _ = _fuse(b.build())
    assert not _fused(g) and [n.op_type for n in g.nodes] == ["Sigmoid", "Mul", "Softmax"]


@pytest.mark.parametrize("dtype", [np.float16, np.int32])
def test_other_dtypes_are_left_alone(dtype):
    """Chains of float16 or integer tensors are not fused (the kernel is checked for float32/float64 only)."""
    b = GraphBuilder()
    x = b.input((3, 4), dtype)
    b.output(b.op("Abs", b.op("Neg", b.op("Add", x, x))))
    g = b.build()
    shape_inference(g)
    assert not elementwise_fusion(g)


def test_single_ops_and_a_clip_with_an_input_bound_are_left_alone():
    """A group of one op is no group; Clip whose bound is a graph input cannot join one."""
    b = GraphBuilder()
    x = b.input((3, 4))
    b.output(b.op("Clip", b.op("Exp", x), b.input(())))
    g = b.build()
    shape_inference(g)
    assert not elementwise_fusion(g)


def test_a_smaller_tensor_is_not_recomputed_at_full_size():
    """LayerNorm's tail: (var + eps) and its Sqrt are [N,1] tensors, so they stay out of the [N,D] group."""
    b = GraphBuilder()
    cen, var = b.input((8, 16)), b.input((8, 1))
    std = b.op("Sqrt", b.op("Add", var, b.const(np.float32(1e-5))))
    y = b.op("Add", b.op("Mul", b.op("Div", cen, std), b.const(np.ones(16, np.float32))), b.const(np.zeros(16, np.float32)))
    b.output(y)
    g, want, got = _fuse(b.build())
    assert sorted(n.attrs["ops"] for n in _fused(g)) == [["Add", "Sqrt"], ["Div", "Mul", "Add"]]
    np.testing.assert_allclose(got[0], want[0], rtol=1e-6)


def test_where_with_a_bool_condition_and_float64_fuse():
    """Where (bool condition input) after a Div fuses in float64, and keeps the numbers."""
    b = GraphBuilder()
    x, cond = b.input((2, 3, 5), np.float64), b.input((1, 5), np.bool_)
    s = b.op("Div", x, b.const(np.float64(3.0)))
    b.output(b.op("Where", cond, b.const(np.float64(-1e9)), s))
    g, want, got = _fuse(b.build())
    [node] = g.nodes
    assert node.attrs["ops"] == ["Div", "Where"] and node.attrs["constants"].dtype == np.float64
    np.testing.assert_array_equal(got[0], want[0])


def test_activation_fusion_and_gelu_keep_their_patterns():
    """Under `all`, Conv+Relu stays a FusedConv and Erf-GELU an ai.minfer Gelu; only the SiLU after them fuses here."""
    b = GraphBuilder(opset=17)
    x = b.input((1, 2, 5, 5))
    c = b.op("Conv", x, b.const(np.full((2, 2, 1, 1), 0.3, np.float32)), kernel_shape=[1, 1])
    r = b.op("Relu", c)
    gelu = b.op("Mul", b.op("Mul", r, b.op("Add", b.op("Erf", b.op("Div", r, b.const(np.float32(np.sqrt(2))))),
                                             b.const(np.float32(1.0)))), b.const(np.float32(0.5)))
    b.output(b.op("Mul", gelu, b.op("Sigmoid", gelu)))
    g = b.build()
    feeds = random_feeds(g)
    engine = Engine(g.copy(), passes="all")
    assert [n.op_type for n in engine.graph.nodes] == ["FusedConv", "Gelu", FUSED]
    want = InferenceSession(g, passes="none").run(None, feeds)
    np.testing.assert_allclose(engine.run(None, feeds)[0], want[0], rtol=1e-5, atol=1e-6)


# ---- a small model against onnxruntime ----------------------------------------------------------


def _gelu_tanh_model(shape=(2, 8, 16)):
    """GELU-tanh as PyTorch exports it, then SiLU, a bias and a Where, with a LeakyRelu and a Clip on the way."""
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    inits = [c("three", 3.0), c("k", 0.044715), c("s", np.sqrt(2 / np.pi)), c("one", 1.0), c("half", 0.5),
             c("bias", np.linspace(-1, 1, shape[-1])), c("lo", -4.0), c("hi", 4.0), c("neg", -1.0)]
    n = helper.make_node
    nodes = [n("Pow", ["x", "three"], ["p"]), n("Mul", ["p", "k"], ["pk"]), n("Add", ["x", "pk"], ["inner"]),
             n("Mul", ["inner", "s"], ["arg"]), n("Tanh", ["arg"], ["t"]), n("Add", ["t", "one"], ["t1"]),
             n("Mul", ["x", "half"], ["xh"]), n("Mul", ["xh", "t1"], ["gelu"]),
             n("Add", ["gelu", "bias"], ["gb"]), n("Sigmoid", ["gb"], ["sg"]), n("Mul", ["gb", "sg"], ["silu"]),
             n("LeakyRelu", ["silu"], ["lr"], alpha=0.1), n("Clip", ["lr", "lo", "hi"], ["cl"]),
             n("Where", ["mask", "cl", "neg"], ["y"])]
    return make_model(nodes, [tensor("x", list(shape)), tensor("mask", [shape[-1]], TensorProto.BOOL)],
                      [tensor("y", list(shape))], inits)


def test_gelu_tanh_chain_matches_the_engine_without_passes_and_onnxruntime():
    """The 14-op chain becomes one FusedElementwise whose outputs match passes="none" and onnxruntime."""
    model = _gelu_tanh_model()
    rng = np.random.default_rng(0)
    feeds = {"x": (3 * rng.standard_normal((2, 8, 16))).astype(np.float32), "mask": rng.random(16) < 0.7}
    engine = Engine(load_model(model), passes="all")
    [node] = engine.graph.nodes
    assert node.op_type == FUSED and len(node.attrs["ops"]) == 14
    got = engine.run(None, feeds)[0]
    np.testing.assert_allclose(got, InferenceSession(model, passes="none").run(None, feeds)[0], rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-5, atol=1e-6)


def test_portable_lowering_runs_in_onnxruntime(tmp_path):
    """`optimize --portable` lowers FusedElementwise to one standard node per step, which onnxruntime runs alike."""
    from minfer_core.cli import main

    model = _gelu_tanh_model()
    src, dst = tmp_path / "m.onnx", tmp_path / "p.onnx"
    onnx.save(model, src)
    assert main(["optimize", str(src), str(dst), "--portable"]) == 0
    lowered = onnx.load(str(dst))
    assert {n.domain for n in lowered.graph.node} == {""} and len(lowered.graph.node) == 14
    lowered.ir_version = 10
    feeds = {"x": np.random.default_rng(1).standard_normal((2, 8, 16)).astype(np.float32), "mask": np.arange(16) % 3 > 0}
    np.testing.assert_allclose(ort_run(lowered, feeds)[0], ort_run(model, feeds)[0], rtol=1e-6, atol=1e-7)


def test_fused_model_round_trips_through_onnx(tmp_path):
    """`minfer optimize` writes the program as plain attributes (strings, ints, a tensor); the file loads and runs."""
    from minfer_core.cli import main

    model = _gelu_tanh_model()
    src, dst = tmp_path / "m.onnx", tmp_path / "f.onnx"
    onnx.save(model, src)
    assert main(["optimize", str(src), str(dst)]) == 0
    [node] = onnx.load(str(dst)).graph.node
    kinds = {a.name: a.type for a in node.attribute}
    assert kinds == {"ops": onnx.AttributeProto.STRINGS, "args": onnx.AttributeProto.INTS,
                     "constants": onnx.AttributeProto.TENSOR}
    feeds = {"x": np.linspace(-5, 5, 256, dtype=np.float32).reshape(2, 8, 16), "mask": np.arange(16) % 2 == 0}
    want = InferenceSession(model, passes="none").run(None, feeds)[0]
    np.testing.assert_allclose(InferenceSession(str(dst), passes="none").run(None, feeds)[0], want, rtol=1e-5, atol=1e-6)


# ---- the kernel ---------------------------------------------------------------------------------


def _prepared(n_inputs, ops, args, constants, dtype=np.float32):
    kern = get_registry().select_kernel("ai.minfer", FUSED, 1)
    t = TensorType(np.dtype(dtype), None)
    ctx = KernelContext("fused", FUSED, 1, (t,) * n_inputs, (t,), (None,) * n_inputs, 1)
    return kern, kern.prepared(ctx, {"ops": ops, "args": args, "constants": np.asarray(constants, dtype)})


def test_kernel_writes_into_out_across_blocks_with_broadcast_inputs():
    """Given out=, the kernel returns out itself, filled over many blocks; a (C,1,1) input broadcasts."""
    kern, run = _prepared(2, ["Mul", "Sigmoid", "Mul"], [0, 1, -1, 0, -1, -1, 2, 3, -1], [])
    assert kern.out and kern.views is False
    x = np.random.default_rng(0).standard_normal((2, 64, 40, 40)).astype(np.float32)
    scale = np.linspace(0.5, 1.5, 64, dtype=np.float32).reshape(64, 1, 1)
    out = np.full(x.shape, np.nan, np.float32)
    assert run(x, scale, out=out) is out
    xs = x * scale
    np.testing.assert_allclose(out, xs * (1 / (1 + np.exp(-x))), rtol=1e-6, atol=1e-7)
    # per image: 40 channels (64,000 elements) and the other 24
    assert elementwise_kernel.blocks(x.shape) == [(i, slice(a, b)) for i in (0, 1) for a, b in ((0, 40), (40, 64))]


def test_kernel_may_write_over_an_input_even_when_its_last_step_reads_late():
    """out may be input 0 (declared inplace): a HardSwish last step goes through scratch and still computes right."""
    kern, run = _prepared(1, ["Neg", "HardSwish"], [0, -1, -1, 1, -1, -1], [])
    assert 0 in kern.inplace
    x = np.linspace(-4, 4, 3 * 70_000, dtype=np.float32).reshape(3, 70_000)
    want = -x * np.clip(-x / 6 + 0.5, 0, 1)
    buf = x.copy()
    assert run(buf, out=buf) is buf
    np.testing.assert_allclose(buf, want, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("in_place", [False, True])
def test_kernel_split_over_two_threads_gives_the_same_bits(monkeypatch, in_place):
    """Runs of blocks on two intra-op threads compute every element as the serial loop does."""
    from minfer_core.parallel import using_threads

    _, run = _prepared(2, ["Tanh", "Pow", "Sub", "Where"], [0, -1, -1, 3, 2, -1, 4, 0, -1, 1, 5, 0], [3.0])
    x = np.random.default_rng(2).standard_normal((4, 64, 40, 40)).astype(np.float32)
    mask = np.arange(40) % 3 == 0
    serial = run(x, mask)
    calls = spy_parallel_for(monkeypatch, elementwise_kernel)
    monkeypatch.setattr(elementwise_kernel, "SPLIT", elementwise_kernel.BLOCK)  # one block per range
    with using_threads(2):
        y = x.copy() if in_place else np.empty_like(x)
        assert run(y if in_place else x, mask, out=y) is y
    assert calls == [8] and np.array_equal(y, serial)
    np.testing.assert_allclose(serial, np.where(mask, np.tanh(x) ** 3 - x, x), rtol=1e-5, atol=1e-6)


def test_kernel_handles_zero_d_and_empty_outputs():
    """A 0-d output is computed (not indexed into a scalar); an empty one is returned as is."""
    _, run = _prepared(1, ["Abs", "Sqrt"], [0, -1, -1, 1, -1, -1], [])
    np.testing.assert_allclose(run(np.asarray(-4.0, np.float32)), 2.0)
    assert run(np.zeros((0, 3), np.float32)).shape == (0, 3)


def test_kernel_refuses_a_malformed_program_naming_the_node():
    """A reference to a later step or an unknown op is a KernelError naming the node and the rule."""
    with pytest.raises(KernelError, match="'fused'.*step 0 \\(Neg\\)"):
        _prepared(1, ["Neg", "Abs"], [1, -1, -1, 1, -1, -1], [])
    with pytest.raises(KernelError, match="unknown op 'Gelu'"):
        _prepared(1, ["Gelu"], [0, -1, -1], [])
    with pytest.raises(KernelError, match="must be constants"):
        _prepared(2, ["Pow"], [0, 1, -1], [])


def test_decode_reads_inputs_then_constants_then_steps():
    """References: inputs first, then constants, then step results, each step after what it reads."""
    steps, consts = decode(1, ["Mul", "Tanh", "Add"], [0, 1, -1, 2, -1, -1, 3, 0, -1], np.float32([0.5]))
    assert steps == [("Mul", (0, 1)), ("Tanh", (2,)), ("Add", (3, 0))] and consts.tolist() == [0.5]


# ---- real models ---------------------------------------------------------------------------------


def _realmodels():
    path = Path(__file__).resolve().parents[1] / "models" / "realmodels.py"
    spec = importlib.util.spec_from_file_location("realmodels_for_elementwise", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


@pytest.mark.parametrize("name, expected", [
    # the xy decode, the wh decode; its four SiLUs follow convs: activation_fusion makes them FusedConv's Swish
    ("yolo_head", [["Sigmoid", "Mul"], ["Clip", "Exp", "Mul"]]),
    ("encoder_block", [["Add", "Add"], ["Add", "Sqrt"], ["Div", "Mul", "Add"], ["Add", "Add"]]),  # bias+residual, LN
])
def test_fires_where_expected_on_real_models(name, expected):
    """On the YOLO head and the transformer block, `all` fuses exactly the expected elementwise groups."""
    graph = load_model(getattr(_realmodels(), name)(seed=0))
    # without the passes that take the encoder's bias/residual Adds and decomposed LayerNorm whole first
    optimize_graph(graph, "all", disabled=("matmul_bias_fusion", "layer_norm_fusion"))
    assert sorted(n.attrs["ops"] for n in _fused(graph)) == sorted(expected)


def test_one_node_serves_alternating_input_shapes():
    """A fused node fed other shapes in turn (a symbolic batch) computes each right: its per-shape layout is keyed
    by the inputs' shapes, a bias broadcasting against each."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 8])
    nodes = [helper.make_node("Add", ["x", "bias"], ["a"]), helper.make_node("Sigmoid", ["a"], ["s"]),
             helper.make_node("Mul", ["a", "s"], ["y"])]
    bias = numpy_helper.from_array(np.linspace(-1, 1, 8, dtype=np.float32), "bias")
    model = make_model(nodes, [x], [tensor("y", None)], [bias])
    sess = Engine(model.SerializeToString())
    assert [n.op_type for n in sess.graph.nodes] == ["FusedElementwise"]
    rng = np.random.default_rng(0)
    for n in (3, 1, 70000, 3):
        feed = rng.standard_normal((n, 8)).astype(np.float32)
        a = feed + numpy_helper.to_array(bias)
        np.testing.assert_allclose(sess.run(None, {"x": feed})[0], a / (1 + np.exp(-a)), rtol=1e-5, atol=1e-6)
