"""The fused kernels' memory declarations (out=, packed) and the residual fusion Conv + Add/Sum [+ Relu]."""

from __future__ import annotations

import functools
import gc
import weakref
from collections import Counter

import numpy as np
import pytest

from minfer_core import InferenceSession, KernelContext, TensorType, get_registry, kernel, load_model, to_model_proto
from minfer_core import hookimpl, use_plugins
from minfer_core.cli_passes import STANDARD_DOMAINS, optimize_graph
from minfer_core.testing import GraphBuilder, random_feeds
from minfer_passes import portable, residual
from minfer_passes.shapes import shape_inference
from modelkit import outputs_around

RNG = np.random.default_rng(0)


def _w(*shape: int) -> np.ndarray:
    return (RNG.standard_normal(shape) / np.sqrt(np.prod(shape[1:]))).astype(np.float32)


def _ctx(constants, types=None) -> KernelContext:
    types = types or tuple(None if c is None else TensorType(c.dtype, c.shape) for c in constants)
    return KernelContext("n", "FusedConv", 1, types, (None,), tuple(constants), 1)


def _fused(op: str):
    return get_registry().select_kernel("ai.minfer", op, 1)


def test_fused_kernels_declare_out_and_the_base_kernels_packing():
    """FusedConv/FusedGemm/FusedMatMul take out=; each declares packed exactly what its base kernel packs."""
    reg = get_registry()
    for op, base in (("FusedConv", "Conv"), ("FusedGemm", "Gemm"), ("FusedMatMul", "MatMul")):
        k, inner = _fused(op), reg.select_kernel("", base, 10_000)
        assert k.out and k.views is False
        assert k.packed == (inner.packed if inner.prepare else ())


@pytest.mark.parametrize("act", ["Relu", "Sigmoid", ""])
def test_fused_conv_writes_into_out_and_adds_the_residual(act):
    """With out= the result (Conv + Z, then the activation) is the very buffer passed; Z is left untouched."""
    x, w, b = RNG.standard_normal((2, 3, 5, 5)).astype(np.float32), _w(4, 3, 3, 3), _w(4, 1)[:, 0]
    z = RNG.standard_normal((2, 4, 3, 3)).astype(np.float32)
    attrs = {"kernel_shape": [3, 3], "activation": act, "activation_params": []}
    run = _fused("FusedConv").fn(_ctx([None, w, b, None]), **attrs)  # X, W, B and Z
    conv = get_registry().select_kernel("", "Conv", 22)
    plain = conv.fn(_ctx([None, w, b]), kernel_shape=[3, 3])(x, w, b)
    want = plain + z
    want = {"Relu": np.maximum(want, 0), "Sigmoid": 1 / (1 + np.exp(-want)), "": want}[act]
    z_before = z.copy()
    out = np.empty_like(want)
    got = run(x, None, None, z, out=out)  # the engine passes None for released (packed) weights
    assert got is out
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(z, z_before)
    np.testing.assert_allclose(run(x, w, b, z), want, rtol=1e-5, atol=1e-6)  # no out: allocates


def test_fused_gemm_and_matmul_write_into_out():
    a, bw, c = RNG.standard_normal((3, 4)).astype(np.float32), _w(4, 5), _w(1, 5)[0]
    gemm = _fused("FusedGemm").fn(_ctx([None, bw, c]), activation="Relu", activation_params=[])
    out = np.empty((3, 5), np.float32)
    assert gemm(a, bw, c, out=out) is out
    np.testing.assert_allclose(out, np.maximum(a @ bw + c, 0), rtol=1e-5, atol=1e-6)
    mm = _fused("FusedMatMul").fn(_ctx([None, bw]), activation="Tanh", activation_params=[])
    assert mm(a, bw, out=out) is out
    np.testing.assert_allclose(out, np.tanh(a @ bw), rtol=1e-5, atol=1e-6)


def test_fused_conv_does_not_keep_the_packed_constants_alive():
    """packed=(1, 2): FusedConv's run closure holds neither ctx nor the original W and B (the Conv it wraps packs them)."""
    w, b = _w(4, 3, 3, 3), _w(4, 1)[:, 0]
    ctx = _ctx([None, w, b])
    ref = weakref.ref(ctx)
    run = _fused("FusedConv").fn(ctx, kernel_shape=[3, 3], activation="Relu", activation_params=[])
    del ctx
    gc.collect()
    assert ref() is None
    if isinstance(run, functools.partial):  # the Conv's own run with the epilogue bound: what the partial holds
        cells = [run.func, *run.args, *run.keywords.values()]
    else:
        cells = [c.cell_contents for c in run.__closure__ or ()]
    held = [v for c in cells for v in (c.values() if isinstance(c, dict) else c if isinstance(c, (list, tuple)) else [c])]
    assert not any(v is w or v is b for v in held)
    assert run(np.ones((1, 3, 4, 4), np.float32), None, None).shape == (1, 4, 2, 2)


class _UnpackingConv:
    """A plugin whose Conv (preferred: above minfer-ops-numba's 10) reads W and B at run time: it packs nothing."""

    @staticmethod
    @kernel("Conv", since=1, priority=100, prepare=True)
    def conv(ctx, *, kernel_shape=None, **attrs):
        pads = attrs.get("pads")

        def run(x, w, b=None):
            assert w is not None, "the unpacking Conv needs its weights at run time"
            if pads:
                x = np.pad(x, [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
            n, _, h, wd = x.shape
            kh, kw = w.shape[2:]
            y = np.zeros((n, w.shape[0], h - kh + 1, wd - kw + 1), x.dtype)
            for i in range(kh):
                for j in range(kw):
                    y += np.einsum("nchw,mc->nmhw", x[:, :, i:i + y.shape[2], j:j + y.shape[3]], w[:, :, i, j])
            return y + (0 if b is None else b.reshape(-1, 1, 1))

        return run

    @hookimpl
    def register_kernels(self, register):
        register([self.conv])


def test_fused_conv_copies_what_an_unpacking_base_kernel_needs():
    """Under a Conv that packs nothing, FusedConv still honours its packed=(1, 2): it holds a copy of W and B."""
    g = _block(z_kind="input", act="Relu")
    shape_inference(g)
    want = InferenceSession(g.copy(), passes="none").run(None, random_feeds(g))
    with use_plugins(_UnpackingConv()):
        sess = InferenceSession(g.copy(), passes=["shape_inference", "conv_residual_fusion"])
        assert [n.op_type for n in sess.graph.nodes] == ["FusedConv"]
        assert len(sess.program.released) == 2
        got = sess.run(None, random_feeds(g))
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-5)


# ---- the residual fusion pass -----------------------------------------------------------


def _block(z_kind: str = "input", act: str | None = "Relu", op: str = "Add", expose: str = "none",
           swap: bool = False, opset: int = 17):
    """x -> Conv(3x3, pad 1) -> Add/Sum(Z) [-> act] with Z of kind input / later / conv / broadcast."""
    b = GraphBuilder(opset=opset)
    x = b.input((1, 4, 5, 5))
    y = b.op("Conv", x, b.const(_w(4, 4, 3, 3)), b.const(_w(4, 1)[:, 0]), kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    if z_kind == "input":
        z = b.input((1, 4, 5, 5))
    elif z_kind == "later":
        z = b.op("Tanh", b.input((1, 4, 5, 5)))
    elif z_kind == "conv":
        z = b.op("Conv", x, b.const(_w(4, 4, 1, 1)), kernel_shape=[1, 1])
    elif z_kind == "x":
        z = x
    else:
        z = b.input(z_kind)  # a broadcasting shape
    if expose == "conv_output":
        b.output(y)
    elif expose == "conv_consumer":
        b.output(b.op("Neg", y))
    s = b.op(op, *((z, y) if swap else (y, z)))
    if expose == "sum_output":
        b.output(s)
    elif expose == "sum_consumer":
        b.output(b.op("Neg", s))
    b.output(b.op(act, s) if act else s)
    return b.build()


def _fuse(g):
    changed, want, got = outputs_around(g, residual.conv_residual_fusion)
    for a, w in zip(got, want):
        np.testing.assert_allclose(a, w, rtol=1e-5, atol=1e-6)
    return changed, [(n.domain, n.op_type) for n in g.topological_order()]


@pytest.mark.parametrize("z_kind", ["input", "later", "conv", "x"])
@pytest.mark.parametrize("op", ["Add", "Sum"])
@pytest.mark.parametrize("swap", [False, True])
def test_residual_block_becomes_one_fused_conv(z_kind, op, swap):
    changed, ops = _fuse(_block(z_kind, op=op, swap=swap))
    assert changed
    fused = [o for o in ops if o == ("ai.minfer", "FusedConv")]
    assert len(fused) == 1 and ("", op) not in ops and ("", "Relu") not in ops


def test_residual_without_activation_and_with_another_activation():
    g = _block(act=None)
    assert _fuse(g)[1] == [("ai.minfer", "FusedConv")]
    assert "activation" not in g.nodes[0].attrs and len(g.nodes[0].inputs) == 4
    g = _block(act="Sigmoid")
    assert _fuse(g)[1] == [("ai.minfer", "FusedConv")] and g.nodes[0].attrs["activation"] == "Sigmoid"


@pytest.mark.parametrize("expose", ["conv_output", "conv_consumer"])
def test_no_fusion_through_a_read_conv_output(expose):
    changed, ops = _fuse(_block(expose=expose))
    assert not changed and ("", "Conv") in ops


@pytest.mark.parametrize("expose", ["sum_output", "sum_consumer"])
def test_sum_read_elsewhere_keeps_its_activation_apart(expose):
    g = _block(expose=expose)
    changed, ops = _fuse(g)
    assert changed and ("", "Relu") in ops and ("", "Add") not in ops
    fused = next(n for n in g.nodes if n.op_type == "FusedConv")
    assert "activation" not in fused.attrs


@pytest.mark.parametrize("shape", [(1, 4, 1, 1), (4, 1, 1), (5,), (1, 1, 5, 5), (2, 4, 5, 5), (1, 1, 1, 1)])
def test_broadcasting_residual_is_left_alone(shape):
    changed, ops = _fuse(_block(z_kind=shape))
    assert not changed and ops == [("", "Conv"), ("", "Add"), ("", "Relu")]


def test_residual_fusion_is_idempotent_and_portable_expands_to_conv_add_relu():
    g = _block(z_kind="later")
    shape_inference(g)
    assert residual.conv_residual_fusion(g) and not residual.conv_residual_fusion(g)
    portable.expand_fused(g)
    g.validate()
    assert [n.op_type for n in g.topological_order()] == ["Tanh", "Conv", "Add", "Relu"]
    assert {n.domain for n in g.nodes} <= set(STANDARD_DOMAINS) and "ai.minfer" not in g.opsets
    g = _block(act=None)
    shape_inference(g)
    residual.conv_residual_fusion(g)
    portable.expand_fused(g)
    assert [n.op_type for n in g.nodes] == ["Conv", "Add"]


def test_resnet50_residual_blocks_fuse():
    """On light_resnet50 under `all`: every Sum (+ Relu) joins a Conv; the model still matches its original."""
    from minfer_core.testing.zoo import model_path, randomized

    graph = load_model(model_path("light_resnet50"))
    optimize_graph(graph, "all")
    ops = Counter(n.op_type for n in graph.nodes)
    assert ops["Sum"] == 0 and ops["Add"] == 0 and ops["Relu"] == 0, dict(ops)
    assert sum(len(n.inputs) > 3 and bool(n.inputs[3]) for n in graph.nodes if n.op_type == "FusedConv") == 16
    model = randomized("light_resnet50", seed=7)
    g = load_model(model)
    optimize_graph(g, "all")
    x = np.random.default_rng(8).standard_normal(g.types[g.inputs[0]].shape).astype(np.float32)
    want = InferenceSession(model, passes="none").run(None, {g.inputs[0]: x})
    sess = InferenceSession(to_model_proto(g), passes="none")
    assert sess.program.released  # FusedConv packs its weights: the engine holds them once
    for got, w in zip(sess.run(None, {g.inputs[0]: x}), want):
        np.testing.assert_allclose(got, w, rtol=1e-3, atol=1e-5)
