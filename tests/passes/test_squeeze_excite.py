"""squeeze_excite_fusion and ai.minfer::SqueezeExcite: what fuses, what must not, the kernel, the portable form."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from minfer_core import Engine, InferenceSession, KernelContext, TensorType, load_model
from minfer_core.testing import random_feeds
from minfer_passes.activation import activation_fusion
from minfer_passes.portable import expand_fused
from minfer_passes.shapes import shape_inference
from minfer_passes.squeeze_excite import squeeze_excite, squeeze_excite_fusion
from modelkit import make_model, ort_run, tensor

C, HIDDEN = 12, 4


def se_model(*, shape=(2, C, 5, 7), gate="HardSigmoid", bias=True, group=1, pads=None, expose=None,
             other_mul=False, opset=17, silu=False):
    """x -> Relu -> SE block (GAP, 1x1 Conv + Relu, 1x1 Conv + ``gate``, Mul) -> Neg; ``expose``: a value of the
    block also made a graph output; ``silu``: the first conv's activation x * Sigmoid(x) (EfficientNet's)."""
    rng = np.random.default_rng(3)
    c = shape[1]
    inits = [numpy_helper.from_array((rng.standard_normal((HIDDEN, c // group, 1, 1)) * 0.5).astype(np.float32), "w1"),
             numpy_helper.from_array((rng.standard_normal((c, HIDDEN, 1, 1)) * 0.5).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(HIDDEN).astype(np.float32), "b1"),
             numpy_helper.from_array(rng.standard_normal(c).astype(np.float32), "b2")]
    conv1 = {"group": group} if group != 1 else {}
    if pads:
        conv1["pads"] = pads
    gate_attrs = {"alpha": 1 / 6, "beta": 0.5} if gate == "HardSigmoid" else {}
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("GlobalAveragePool", ["r"], ["p"]),
             helper.make_node("Conv", ["p", "w1"] + (["b1"] if bias else []), ["h0"], kernel_shape=[1, 1], **conv1),
             *([helper.make_node("Sigmoid", ["h0"], ["hs"]), helper.make_node("Mul", ["h0", "hs"], ["h"])] if silu
               else [helper.make_node("Relu", ["h0"], ["h"])]),
             helper.make_node("Conv", ["h", "w2"] + (["b2"] if bias else []), ["g0"], kernel_shape=[1, 1]),
             helper.make_node(gate, ["g0"], ["g"], **gate_attrs),
             helper.make_node("Mul", ["other" if other_mul else "r", "g"], ["m"]), helper.make_node("Neg", ["m"], ["y"])]
    inputs = [tensor("x", list(shape))] + ([tensor("other", list(shape))] if other_mul else [])
    outputs = [tensor("y", list(shape))] + ([tensor(expose, None)] if expose else [])
    return make_model(nodes, inputs, outputs, inits, opset=opset)


def fused(model):
    graph = load_model(model)
    shape_inference(graph)
    before = graph.copy()
    activation_fusion(graph)
    changed = squeeze_excite_fusion(graph)
    graph.validate()
    return before, graph, changed


@pytest.mark.parametrize("gate", ["HardSigmoid", "Sigmoid"])
@pytest.mark.parametrize("bias", [True, False])
def test_se_block_becomes_one_node_with_the_unfused_values(gate, bias):
    """GAP -> Conv+Relu -> Conv+gate -> Mul is one SqueezeExcite with both activations and the convs' weights as
    given; its numpy kernel gives the unfused graph's values (rtol 1e-5)."""
    before, graph, changed = fused(se_model(gate=gate, bias=bias))
    assert changed
    [se] = [n for n in graph.nodes if n.op_type == "SqueezeExcite"]
    assert se.domain == "ai.minfer" and (se.attrs["inner_activation"], se.attrs["activation"]) == ("Relu", gate)
    assert list(se.inputs) == (["r", "w1", "b1", "w2", "b2"] if bias else ["r", "w1", "", "w2"])
    assert sorted(n.op_type for n in graph.nodes) == ["Neg", "Relu", "SqueezeExcite"]
    feeds = random_feeds(before)
    want = InferenceSession(before, passes="none").run(None, feeds)[0]
    got = InferenceSession(graph, passes="none").run(None, feeds)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", [dict(expose="p"), dict(expose="h"), dict(expose="g"), dict(other_mul=True),
                                  dict(group=2), dict(pads=[0, 0, 1, 1]), dict(shape=(2, C, 6))])
def test_what_must_not_fuse(case):
    """A block value read elsewhere, a Mul of another value, a grouped or padded conv, a pooled 1-D map: unfused."""
    if "shape" in case:  # a rank-3 input: the GAP's mean over one axis
        model = se_model(**case)
    else:
        model = se_model(**case)
    _, graph, changed = fused(model)
    assert not changed and not any(n.op_type == "SqueezeExcite" for n in graph.nodes)


def test_float16_stays_unfused():
    """A float16 block is left to the standard kernels (the fused ones would pool in float16)."""
    model = se_model()
    for t in (*model.graph.input, *model.graph.output):
        t.type.tensor_type.elem_type = 10  # FLOAT16
    for init in model.graph.initializer:
        init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init).astype(np.float16), init.name))
    _, graph, changed = fused(model)
    assert not changed


@pytest.mark.parametrize("silu, gate", [(False, "HardSigmoid"), (True, "Sigmoid")])
def test_whole_engine_matches_onnxruntime(silu, gate):
    """Every pass, the installed kernels (minfer-ops-numba's when installed): onnxruntime's values, for
    MobileNetV3's block and EfficientNet's (SiLU inside, fused as the first conv's Swish; a Sigmoid gate)."""
    model = se_model(shape=(2, C, 7, 7), silu=silu, gate=gate)
    engine = Engine(model)
    [se] = [n for n in engine.graph.nodes if n.op_type == "SqueezeExcite"]
    assert (se.attrs["inner_activation"], se.attrs["activation"]) == ("Swish" if silu else "Relu", gate)
    x = np.random.default_rng(4).standard_normal((2, C, 7, 7)).astype(np.float32)
    np.testing.assert_allclose(engine.run(None, {"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("opset", [13, 17])
def test_portable_form_is_the_four_steps(opset):
    """--portable writes GlobalAveragePool, Conv, Relu, Conv, HardSigmoid, Mul back, with the same values."""
    before, graph, _ = fused(se_model(opset=opset))
    expand_fused(graph)
    graph.validate()
    assert not any(n.domain for n in graph.nodes)
    assert sorted(n.op_type for n in graph.nodes) == sorted(
        ["Relu", "GlobalAveragePool", "Conv", "Relu", "Conv", "HardSigmoid", "Mul", "Neg"])
    feeds = random_feeds(before)
    np.testing.assert_allclose(InferenceSession(graph, passes="none").run(None, feeds)[0],
                               InferenceSession(before, passes="none").run(None, feeds)[0], rtol=1e-5, atol=1e-6)


def test_numpy_kernel_in_place_and_its_errors():
    """The kernel writes into out (X's own memory too, as the engine may hand it), and refuses weights that do not
    fit X."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, C, 3, 4)).astype(np.float32)
    w1 = rng.standard_normal((HIDDEN, C, 1, 1)).astype(np.float32)
    w2 = rng.standard_normal((C, HIDDEN, 1, 1)).astype(np.float32)
    b1, b2 = rng.standard_normal(HIDDEN).astype(np.float32), rng.standard_normal(C).astype(np.float32)
    types = tuple(TensorType(a.dtype, a.shape) for a in (x, w1, b1, w2, b2))
    ctx = KernelContext("se", "SqueezeExcite", 1, types, (None,), (None, w1, b1, w2, b2), 1)
    run = squeeze_excite.prepared(ctx, {"inner_activation": "Relu", "activation": "Sigmoid"})
    pooled = x.mean(axis=(2, 3))
    hidden = np.maximum(pooled @ w1.reshape(HIDDEN, C).T + b1, 0)
    want = x * (1 / (1 + np.exp(-(hidden @ w2.reshape(C, HIDDEN).T + b2))))[:, :, None, None]
    np.testing.assert_allclose(run(x, w1, b1, w2, b2), want, rtol=1e-5, atol=1e-6)
    y = x.copy()
    assert run(y, w1, b1, w2, b2, out=y) is y
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="W1 \\(M, C, 1, 1\\)"):
        run(x[:, :5], w1, b1, w2, b2)
