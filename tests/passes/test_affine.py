"""channel_affine_fusion: inference BatchNormalization (+ activation) -> ai.minfer::ChannelAffine, and its kernel."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from minfer_core import InferenceSession, KernelContext, TensorType, get_registry, load_model, to_model_proto
from minfer_core.cli_passes import STANDARD_DOMAINS, optimize_graph
from minfer_core.parallel import using_threads
from minfer_core.testing import GraphBuilder, random_feeds
from minfer_passes import affine, portable
from minfer_passes.shapes import shape_inference
from modelkit import outputs_around

RNG = np.random.default_rng(0)


def _bn_params(c: int, dtype=np.float32, low: float = 0.5) -> list[np.ndarray]:
    return [RNG.uniform(lo, hi, c).astype(dtype) for lo, hi in ((low, 1.5), (-1, 1), (-1, 1), (0.2, 2))]


def _graph(shape=(2, 3, 5, 4), act: str | None = "Relu", expose: str = "none", computed: int | None = None,
           conv: int = 0, low: float = 0.5, opset: int = 17, dtype=np.float32, **bn_attrs):
    """x -> BN [-> act] [-> Conv(k=conv)] -> Neg; the BN output exposed, a BN parameter computed, on request."""
    b = GraphBuilder(opset=opset)
    x = b.input(shape, dtype)
    params = [b.const(p) for p in _bn_params(shape[1], dtype, low)]
    if computed is not None:
        params[computed] = b.input((shape[1],), dtype)
    y = b.op("BatchNormalization", x, *params, **bn_attrs)
    if expose == "output":
        b.output(y)
    elif expose == "consumer":
        b.output(b.op("Tanh", y))
    if act:
        y = b.op(act, y)
    if conv:
        w = b.const(RNG.standard_normal((4, shape[1], conv, conv)).astype(dtype))
        y = b.op("Conv", y, w, kernel_shape=[conv, conv], pads=[conv // 2] * 4)
    b.output(b.op("Neg", y))
    return b.build()


def _fuse(g, exact: bool = False):
    """Apply the pass; check the outputs against the graph without it; return the op types after."""
    changed, want, got = outputs_around(g, affine.channel_affine_fusion)
    for a, w in zip(got, want):
        if exact:
            np.testing.assert_array_equal(a, w)
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-5)
    return changed, [n.op_type for n in g.topological_order()]


@pytest.mark.parametrize("shape", [(1, 3, 5, 4), (2, 4, 7, 6), (3, 2), (2, 3, 17), (1, 2, 3, 4, 5), (1, 5, 1, 1)])
def test_bn_relu_becomes_one_channel_affine_with_the_bn_kernels_rounding(shape):
    """BN + Relu is one ChannelAffine whose outputs equal the BN and Relu kernels' bit for bit."""
    g = _graph(shape)
    changed, ops = _fuse(g, exact=True)
    assert changed and ops == ["ChannelAffine", "Neg"]
    node = g.nodes[0]
    assert node.domain == "ai.minfer" and node.attrs["activation"] == "Relu"


@pytest.mark.parametrize("act", ["LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "Tanh", None])
def test_other_activations_fuse_too(act):
    changed, ops = _fuse(_graph(act=act))
    assert changed and ops == ["ChannelAffine", "Neg"]


@pytest.mark.parametrize("expose", ["output", "consumer"])
def test_a_bn_output_read_elsewhere_keeps_the_activation_apart(expose):
    """Never fuse through a graph output or a value another node reads: only the BN becomes ChannelAffine."""
    g = _graph(expose=expose)
    changed, ops = _fuse(g)
    assert changed and "Relu" in ops and "BatchNormalization" not in ops
    assert "activation" not in next(n for n in g.nodes if n.op_type == "ChannelAffine").attrs


@pytest.mark.parametrize("computed", [0, 1, 2, 3])
def test_bn_with_a_computed_parameter_is_left_alone(computed):
    changed, ops = _fuse(_graph(computed=computed))
    assert not changed and ops == ["BatchNormalization", "Relu", "Neg"]


def test_training_mode_and_int_inputs_are_left_alone():
    # a training-mode BN with one output is an invalid model (the strict build and onnxruntime refuse it): pass only
    assert not affine.channel_affine_fusion(_graph(training_mode=1, opset=15))
    b = GraphBuilder()
    x = b.input((1, 2, 3, 3))
    y = b.op("BatchNormalization", x, *[b.const(p) for p in _bn_params(2)])
    b.output(y)
    g = b.build()
    g.types.pop(x)  # unknown rank: no fusion
    assert not affine.channel_affine_fusion(g)


@pytest.mark.parametrize("act", ["Relu", "LeakyRelu", None])
@pytest.mark.parametrize("k", [1, 3])
def test_a_positive_scale_moves_into_the_following_conv(act, k):
    """act(X*S + B) read by a Conv: the kernel computes act(X + B/S), the Conv's W takes S (zero padding stays 0)."""
    g = _graph(act=act, conv=k)
    changed, ops = _fuse(g)
    assert changed and ops == ["ChannelAffine", "Conv", "Neg"]
    assert g.nodes[0].inputs[1] == ""


@pytest.mark.parametrize("act", ["Relu", "Sigmoid"])
def test_the_scale_stays_when_it_cannot_move(act):
    """A negative scale does not commute with Relu, nor any scale with Sigmoid: S stays in ChannelAffine."""
    g = _graph(act=act, conv=1, low=-1.5 if act == "Relu" else 0.5)
    changed, ops = _fuse(g)
    assert changed and ops == ["ChannelAffine", "Conv", "Neg"] and g.nodes[0].inputs[1]


def test_pass_is_idempotent():
    g = _graph(conv=3)
    shape_inference(g)
    assert affine.channel_affine_fusion(g) and not affine.channel_affine_fusion(g)


@pytest.mark.parametrize("opset", [7, 13])
@pytest.mark.parametrize("conv", [0, 1])
def test_portable_expands_to_standard_ops_that_onnxruntime_runs(opset, conv):
    """--portable: BatchNormalization(X, S, B, 0, 1; eps 0) [+ act] from opset 9, Mul + Add before."""
    ort = pytest.importorskip("onnxruntime")
    g = _graph(conv=conv, opset=opset)
    shape_inference(g)
    feeds = random_feeds(g)
    want = InferenceSession(g.copy(), passes="none").run(None, feeds)
    assert affine.channel_affine_fusion(g)
    assert portable.expand_fused(g)
    g.validate()
    assert {n.domain for n in g.nodes} <= set(STANDARD_DOMAINS) and "ai.minfer" not in g.opsets
    ops = Counter(n.op_type for n in g.nodes)
    assert ops["BatchNormalization" if opset >= 9 else "Add"] == 1 and ops["Relu"] == 1
    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    got = ort.InferenceSession(to_model_proto(g).SerializeToString(), opts).run(None, feeds)
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


def test_densenet_keeps_no_batchnorm_nor_relu():
    """light_densenet121 under `all`: its 62 pre-activation BN + Relu pairs are 62 ChannelAffine nodes."""
    from minfer_core.testing.zoo import model_path

    graph = load_model(model_path("light_densenet121"))
    optimize_graph(graph, "all")
    ops = Counter(n.op_type for n in graph.nodes)
    assert ops["ChannelAffine"] == 62 and ops["BatchNormalization"] == 0 and ops["Relu"] == 0, dict(ops)


# ---- the kernel ---------------------------------------------------------------------------------


def _kernel(s, b, act="", params=()):
    ctx = KernelContext("n", "ChannelAffine", 1, (None, TensorType(b.dtype, b.shape), TensorType(b.dtype, b.shape)),
                        (None,), (None, s, b), 1)
    k = get_registry().select_kernel("ai.minfer", "ChannelAffine", 1)
    assert k.out and k.inplace == (0,) and k.views is False
    return k.fn(ctx, activation=act, activation_params=list(params))


def _reference(x, s, b, act, params):
    shape = (-1,) + (1,) * (x.ndim - 2)
    y = x * s.reshape(shape) + b.reshape(shape) if s is not None else x + b.reshape(shape)
    if act == "Relu":
        return np.maximum(y, 0)
    if act == "LeakyRelu":
        return np.where(y < 0, y * params[0], y)
    if act == "Clip":
        return np.clip(y, *params)
    return y


SHAPES = [(1, 256, 56, 56), (2, 64, 28, 29), (3, 5, 4, 3), (1, 1024, 7, 7), (4, 7), (1, 3, 70000), (2, 1, 1, 1),
          (0, 3, 4, 4)]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("act,params", [("Relu", ()), ("LeakyRelu", (0.1,)), ("Clip", (-0.5, 0.5)), ("", ())])
@pytest.mark.parametrize("scaled", [True, False])
def test_kernel_is_the_same_with_one_and_two_threads(monkeypatch, shape, act, params, scaled):
    """Chunks split over two threads (threshold lowered to split even small tensors) give the serial result."""
    x = RNG.standard_normal(shape).astype(np.float32)
    s, b = RNG.uniform(0.5, 1.5, shape[1]).astype(np.float32), RNG.uniform(-1, 1, shape[1]).astype(np.float32)
    s = s if scaled else None
    run = _kernel(s, b, act, params)
    serial = run(x, s, b)
    np.testing.assert_allclose(serial, _reference(x, s, b, act, params), rtol=1e-6, atol=1e-6)
    monkeypatch.setattr(affine, "SPLIT", 1)
    monkeypatch.setattr(affine, "CHUNK", 1000)
    with using_threads(2):
        out = np.empty_like(x)
        assert run(x, s, b, out=out) is out
        np.testing.assert_array_equal(out, serial)
        inplace = x.copy()
        assert run(inplace, s, b, out=inplace) is inplace  # inplace=(0,): out may be X itself
        np.testing.assert_array_equal(inplace, serial)


def test_kernel_leaves_its_input_alone_and_reads_computed_parameters():
    x = RNG.standard_normal((2, 3, 4, 5)).astype(np.float32)
    before = x.copy()
    s, b = RNG.uniform(0.5, 1.5, 3).astype(np.float32), RNG.uniform(-1, 1, 3).astype(np.float32)
    run = _kernel(None, b)  # built without constants: S and B are read at run time
    got = run(x, s, b)
    np.testing.assert_array_equal(x, before)
    np.testing.assert_allclose(got, _reference(x, s, b, "", ()), rtol=1e-6)
    with pytest.raises(ValueError, match="one value per channel"):
        run(x, s[:2], b)
