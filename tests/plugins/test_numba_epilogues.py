"""minfer-ops-numba's Relu, Clip and LeakyRelu: the numpy kernels' bits, and the fused ops' epilogue on every tile."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

import minfer_core  # noqa: E402
from minfer_core import Engine, KernelContext, TensorType, get_registry  # noqa: E402
from minfer_ops_numba import activation, pointwise, team  # noqa: E402
from minfer_passes import ops  # noqa: E402
from modelkit import make_model, ort_run, tensor  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py

F32 = np.dtype(np.float32)
SPECIAL = np.array([np.nan, -np.nan, np.inf, -np.inf, -0.0, 0.0, 6.0, -6.0, 1e-45, -1e-45, 3.4e38, -3.4e38, 0.5, -0.5],
                   np.float32)


def values(shape: tuple[int, ...], seed: int = 6) -> np.ndarray:
    """Random float32 values of ``shape`` with NaN, +-inf, +-0.0, subnormals and the bounds' values among them."""
    x = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * 4
    flat = x.reshape(-1)
    flat[: min(flat.size, SPECIAL.size)] = SPECIAL[: flat.size]
    return x


def bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


def context(op_type: str, x: np.ndarray, bounds: tuple = ()) -> KernelContext:
    """A node of ``op_type`` on x; Clip's bounds as constant inputs (None: omitted)."""
    types = (TensorType(x.dtype, x.shape), *(None if b is None else TensorType(F32, ()) for b in bounds))
    consts = (None, *(None if b is None else np.float32(b) for b in bounds))
    return KernelContext("node", op_type, 22, types, (None,), consts, 1)


def prepared(kern, op_type: str, opset: int, x: np.ndarray, attrs: dict, bounds: tuple = ()):
    """(numba run callable, numpy run callable, the bounds as the engine passes them) for one node."""
    ctx = context(op_type, x, bounds)
    assert kern.applies(ctx, attrs)
    chosen = get_registry().select_kernel("", op_type, opset, ctx=ctx, attrs=attrs)
    assert chosen is not None and chosen.fn is kern.fn
    numpy_kern = get_registry().select_kernel("", op_type, opset)  # without a node: the numpy kernel
    assert numpy_kern.plugin != "minfer-ops-numba"
    inputs = tuple(None if b is None else np.float32(b) for b in bounds)
    return kern.prepared(ctx, attrs), numpy_kern.prepared(ctx, attrs), inputs


CASES = [  # kernel, op, opset, attributes, Clip-11's bounds
    (activation.relu, "Relu", 14, {}, ()),
    (activation.clip, "Clip", 13, {}, (0.0, 6.0)),
    (activation.clip, "Clip", 13, {}, (-1.5, 0.5)),
    (activation.clip, "Clip", 13, {}, (None, 0.0)),  # no min: a max bound at 0 (ties at +-0.0)
    (activation.clip, "Clip", 13, {}, (-2.0, None)),
    (activation.clip, "Clip", 13, {}, (None, None)),
    (activation.clip, "Clip", 13, {}, (3.0, -1.0)),  # min above max: max everywhere, as ONNX says
    (activation.clip_6, "Clip", 10, {"min": 0.0, "max": 6.0}, ()),
    (activation.clip_6, "Clip", 10, {}, ()),  # the float32 range: +-inf become +-FLT_MAX
    (activation.leaky_relu, "LeakyRelu", 16, {}, ()),
    (activation.leaky_relu, "LeakyRelu", 16, {"alpha": 0.3}, ()),
    (activation.leaky_relu, "LeakyRelu", 16, {"alpha": 1.0}, ()),
    (activation.leaky_relu, "LeakyRelu", 16, {"alpha": 2.5}, ()),  # above 1: numpy picks the minimum
]


@pytest.mark.parametrize("shape", [(14,), (3, 1, 1000), (1, 96, 56, 56), (1, 64, 128, 128)])  # the last: blocks
@pytest.mark.parametrize("kern, op_type, opset, attrs, bounds", CASES)
def test_relu_clip_leaky_relu_same_bits_as_numpy(shape, kern, op_type, opset, attrs, bounds):
    """Relu, Clip and LeakyRelu give the numpy kernels' very bits, out of place and in place: NaN (its sign too),
    +-inf, the sign of zero (numpy's maximum and minimum return the second operand on a tie) and subnormals."""
    x = values(shape)
    fast, ref, inputs = prepared(kern, op_type, opset, x, attrs, bounds)
    want = bits(ref(x, *inputs))
    np.testing.assert_array_equal(bits(fast(x, *inputs)), want)
    y = x.copy()
    assert fast(y, *inputs, out=y) is y  # in place, as declared
    np.testing.assert_array_equal(bits(y), want)


@pytest.mark.parametrize("kern, op_type, opset, attrs, bounds", CASES[:3] + CASES[-2:])
@pytest.mark.parametrize("region", [(slice(0, 1), slice(16, 48), slice(3, 9)),  # a pointwise conv's row tile
                                    (slice(1, 2), slice(None), slice(None), slice(2, 7)),  # short rows
                                    (slice(None), slice(5, 6), slice(None, None, 2))])  # strided rows: no merge
def test_a_strided_tile_is_written_in_place(kern, op_type, opset, attrs, bounds, region):
    """A tile that is a view of a larger output (not C-contiguous) is computed in place with the numpy kernel's
    bits, and nothing outside it changes: the fused ops' epilogue hands such tiles to these kernels."""
    whole = values((2, 64, 12, 10), seed=3)
    before = whole.copy()
    fast, ref, inputs = prepared(kern, op_type, opset, whole, attrs, bounds)
    assert getattr(fast, "strided", False) is True
    tile = whole[region]
    assert not tile.flags.c_contiguous
    want = bits(ref(before[region], *inputs))
    assert fast(tile, *inputs, out=tile) is tile
    np.testing.assert_array_equal(bits(whole[region]), want)
    whole[region] = before[region]
    np.testing.assert_array_equal(bits(whole), bits(before))


def test_which_nodes_these_kernels_take():
    """float32 only; Clip with constant (or omitted) bounds; LeakyRelu with alpha > 0 (where alpha * x is
    numpy's maximum(x, alpha * x) bit for bit: at alpha 0, numpy's 0 * inf is NaN where the formula keeps inf)."""
    x = np.zeros((2, 3), np.float32)
    assert not activation.relu.applies(context("Relu", x.astype(np.float64)), {})
    assert activation.clip.applies(context("Clip", x, (0.0, None)), {})
    runtime_bound = KernelContext("n", "Clip", 13, (TensorType(F32, (2, 3)), TensorType(F32, ())), (None,),
                                  (None, None), 1)
    assert not activation.clip.applies(runtime_bound, {})
    assert activation.leaky_relu.applies(context("LeakyRelu", x), {"alpha": 0.1})
    assert not activation.leaky_relu.applies(context("LeakyRelu", x), {"alpha": 0.0})
    assert not activation.leaky_relu.applies(context("LeakyRelu", x), {"alpha": -0.2})


# ---- the fused ops' epilogue ---------------------------------------------------------------------------------


@pytest.fixture
def first_conv_method(monkeypatch):
    """Convs take their first candidate method and no kernel is timed: fused and unfused engines then compute the
    same conv, and their outputs can be compared bit for bit."""
    from minfer_ops_conv import conv

    monkeypatch.setattr(conv, "TUNE", False)
    monkeypatch.setenv("MINFER_TUNE", "0")
    monkeypatch.setattr(team, "native", lambda epilogue: None)  # the Python epilogue under test: none compiled
    # and no conv compiled end to end (smallconv's, winograd's, pointwise's): the unfused conv would make other
    # BLAS calls, or none
    monkeypatch.setattr(team, "gemm_address", lambda: 0)
    monkeypatch.setattr(pointwise, "_AVAILABLE", False)


ACTS = [  # (activation node(s) after ``name``, extra initializers, opset)
    ("Clip", lambda src, dst: [helper.make_node("Clip", [src, "lo", "hi"], [dst])], 17),
    ("Clip-6", lambda src, dst: [helper.make_node("Clip", [src], [dst], min=0.0, max=6.0)], 10),
    ("Relu", lambda src, dst: [helper.make_node("Relu", [src], [dst])], 17),
    ("LeakyRelu", lambda src, dst: [helper.make_node("LeakyRelu", [src], [dst], alpha=0.1)], 17),
]


def _block(act, opset: int, c: int = 64, h: int = 96, w: int = 64):
    """x -> 1x1 Conv (output tiles of rows of every channel: strided views) -> act -> 3x3 depthwise Conv (tiles of
    whole channels: C-contiguous) -> act."""
    rng = np.random.default_rng(5)
    inits = [numpy_helper.from_array(rng.standard_normal((c, c, 1, 1), dtype=np.float32) / 8, "w1"),
             numpy_helper.from_array(rng.standard_normal(c, dtype=np.float32), "b1"),
             numpy_helper.from_array(rng.standard_normal((c, 1, 3, 3), dtype=np.float32) / 3, "w2"),
             numpy_helper.from_array(rng.standard_normal(c, dtype=np.float32), "b2"),
             numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["c1"]), *act("c1", "a1"),
             helper.make_node("Conv", ["a1", "w2", "b2"], ["c2"], group=c, pads=[1, 1, 1, 1]), *act("c2", "y")]
    if opset < 11:
        inits = inits[:4]
    model = make_model(nodes, [tensor("x", [1, c, h, w])], [tensor("y", [1, c, h, w])], inits, opset=opset)
    return model, rng.standard_normal((1, c, h, w), dtype=np.float32) * 2


@pytest.mark.usefixtures("first_conv_method")
@pytest.mark.parametrize("name, act, opset", ACTS, ids=[a[0] for a in ACTS])
def test_fused_conv_epilogue_runs_the_compiled_kernel_on_every_tile(monkeypatch, name, act, opset):
    """FusedConv + Clip/Relu/LeakyRelu calls the numba kernel in place on its strided row tiles and its contiguous
    channel tiles alike (numpy's activation never runs), and gives onnxruntime's outputs and the unfused graph's
    bits."""
    model, x = _block(act, opset)
    seen: list[bool] = []
    compiled = activation._in_place  # the dispatcher: the kernels were compiled by the fixture's build or earlier
    monkeypatch.setattr(activation, "_in_place", lambda y, *a: seen.append(y.flags.c_contiguous) or compiled(y, *a))
    numpy_calls: list = []
    for key, fn in list(ops.ACTIVATIONS.items()):
        monkeypatch.setitem(ops.ACTIVATIONS, key, lambda y, p, fn=fn: numpy_calls.append(y.shape) or fn(y, p))
    engine = Engine(model)
    assert [s.kernel.op_type for s in engine.program.specs] == ["FusedConv", "FusedConv"]
    seen.clear()  # the calls compiling at build
    got = engine.run(None, {"x": x})[0]
    assert True in seen and False in seen and numpy_calls == []
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(got, Engine(model, passes="none").run(None, {"x": x})[0])


@pytest.mark.usefixtures("first_conv_method")
def test_epilogue_leaves_strided_tiles_to_numpy_for_a_kernel_that_does_not_take_them(minfer_plugin, monkeypatch):
    """A registered in-place Clip whose run callable does not say ``strided`` gets only the C-contiguous tiles;
    numpy's activation computes the strided ones, and the outputs are the same."""
    calls: list[bool] = []

    @minfer_core.kernel("Clip", since=11, priority=100, prepare=True, out=True, inplace=(0,), views=False)
    def recording(ctx):
        """Clip-11, recording whether each call's input was C-contiguous."""

        def run(x, lo=None, hi=None, *, out=None):
            calls.append(x.flags.c_contiguous)
            return np.minimum(np.maximum(x, lo, out=out), hi, out=out)

        return run

    class Plugin:
        @minfer_core.hookimpl
        def register_kernels(self, register):
            register(recording)

    numpy_calls: list[bool] = []
    clip = ops.ACTIVATIONS["Clip"]
    monkeypatch.setitem(ops.ACTIVATIONS, "Clip", lambda y, p: numpy_calls.append(y.flags.c_contiguous) or clip(y, p))
    model, x = _block(ACTS[0][1], 17)
    want = Engine(model).run(None, {"x": x})[0]
    minfer_plugin(Plugin())
    got = Engine(model).run(None, {"x": x})[0]
    assert calls and all(calls) and numpy_calls and not any(numpy_calls)  # numba took every tile before
    np.testing.assert_array_equal(got, want)


@pytest.mark.usefixtures("first_conv_method")
def test_epilogue_does_not_take_a_standard_kernel(monkeypatch):
    """Where no plugin's kernel outranks the standard one (LeakyRelu with a negative alpha, which the numba kernel
    leaves to numpy), the epilogue is numpy's own activation, not minfer-ops-basic's whole-tensor kernel."""
    numpy_calls: list[bool] = []
    leaky = ops.ACTIVATIONS["LeakyRelu"]
    monkeypatch.setitem(ops.ACTIVATIONS, "LeakyRelu",
                        lambda y, p: numpy_calls.append(y.flags.c_contiguous) or leaky(y, p))
    act = lambda src, dst: [helper.make_node("LeakyRelu", [src], [dst], alpha=-0.2)]  # noqa: E731
    model, x = _block(act, 17)
    got = Engine(model).run(None, {"x": x})[0]
    assert True in numpy_calls and False in numpy_calls  # the contiguous tiles too
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


def test_numpy_clip_epilogue_keeps_np_clip_bits():
    """The numpy Clip epilogue (numpy's clip ufunc without np.clip's Python wrapper) gives np.clip's bits: NaN,
    +-inf and -0.0 (which np.clip keeps on a tie) included."""
    x = values((3, 1000))
    for lo, hi in [(0.0, 6.0), (-1.0, 1.0), (-np.inf, np.inf), (2.0, -2.0), (0.0, 0.0)]:
        y = x.copy()
        ops.ACTIVATIONS["Clip"](y, [lo, hi])
        np.testing.assert_array_equal(bits(y), bits(np.clip(x, np.float32(lo), np.float32(hi))))
