"""minfer-ops-conv's depthwise method (group == C == M) against a direct float64 reference and onnxruntime."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from minfer_core.parallel import using_threads
from minfer_ops_conv import _geometry as geo
from minfer_ops_conv import depthwise

TOL = {np.float16: 2e-2, np.float32: 2e-5, np.float64: 1e-12}


class Packed:
    """The part of conv.Packed the method reads."""

    def __init__(self, w: np.ndarray) -> None:
        self.depthwise = np.ascontiguousarray(w.reshape(w.shape[0], -1))


def reference(x: np.ndarray, w: np.ndarray, win: geo.Window, bias: np.ndarray | None = None) -> np.ndarray:
    """Direct depthwise conv in float64: zero-pad, then sum each tap's strided slice times its weight."""
    rank = len(win.kernel)
    pads = [(0, 0), (0, 0)] + [(max(b, 0), max(e, 0)) for b, e in zip(win.begin, win.end)]
    xp = np.pad(x.astype(np.float64), pads)
    n, c = x.shape[:2]
    out = np.zeros((n, c) + win.out_shape)
    for tap in np.ndindex(*win.kernel):
        sl = tuple(slice(t * d, t * d + (o - 1) * s + 1, s)
                   for t, d, o, s in zip(tap, win.dilations, win.out_shape, win.strides))
        out += xp[(slice(None), slice(None)) + sl] * w[(slice(None), 0) + tap].reshape((c,) + (1,) * rank)
    if bias is not None:
        out += bias.reshape((c,) + (1,) * rank)
    return out


def random_case(seed: int):
    """A random depthwise conv: rank 1-3, strides, dilations, asymmetric pads, batch 1-3, odd channel counts."""
    rng = np.random.default_rng(seed)
    rank = int(rng.integers(1, 4))
    kernel = tuple(int(k) for k in rng.integers(1, 4, rank))
    strides = tuple(int(s) for s in rng.integers(1, 4, rank))
    dilations = tuple(int(d) for d in rng.integers(1, 3, rank))
    pads = tuple(int(p) for p in rng.integers(0, 3, 2 * rank))
    size = (7, 6, 5)[rank - 1]
    spatial = tuple(int(s) for s in rng.integers(1, size + 1, rank))
    win = geo.window(spatial, kernel, strides=strides, dilations=dilations, pads=pads, clamp_same=True)
    if min(win.out_shape) < 1:
        win = geo.window(spatial, (1,) * rank, strides=strides, pads=pads, clamp_same=True)
    n, c = int(rng.integers(1, 4)), int(rng.integers(1, 12))
    x = rng.standard_normal((n, c) + spatial)
    w = rng.standard_normal((c, 1) + win.kernel)
    bias = rng.standard_normal(c) if rng.random() < 0.5 else None
    return x, w, win, bias


def run(plan, x, w, win, bias=None, epilogue=None, dtype=np.float32):
    y = np.full((x.shape[0], w.shape[0]) + win.out_shape, np.nan, dtype=dtype)
    b = None if bias is None else bias.astype(dtype)
    plan(x.astype(dtype), Packed(w.astype(dtype)), y, b, epilogue)
    return y


@pytest.mark.parametrize("layout", [None, "first", "last", "copies"])
@pytest.mark.parametrize("seed", range(40))
def test_matches_direct_reference(seed, layout):
    """Any rank, stride, dilation, pads, batch and channel count: every layout equals the direct sum."""
    x, w, win, bias = random_case(seed)
    if layout == "copies" and len(win.kernel) != 2:
        pytest.skip("the copies layout is 2-D only")
    y = run(depthwise.plan(win, layout), x, w, win, bias)
    np.testing.assert_allclose(y, reference(x, w, win, bias), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("layout", ["first", "last", "copies"])
@pytest.mark.parametrize("stride", [1, 2])
def test_dtypes(dtype, layout, stride):
    """float16/32/64 in, the same dtype out, within that dtype's rounding."""
    rng = np.random.default_rng(stride)
    x, w, bias = rng.standard_normal((2, 5, 9, 8)), rng.standard_normal((5, 1, 3, 3)), rng.standard_normal(5)
    win = geo.window((9, 8), (3, 3), strides=(stride, stride), pads=(1, 0, 2, 1), clamp_same=True)
    y = run(depthwise.plan(win, layout), x, w, win, bias, dtype=dtype)
    assert y.dtype == dtype
    ref = reference(x.astype(dtype), w.astype(dtype), win, bias.astype(dtype))
    np.testing.assert_allclose(y, ref, rtol=TOL[dtype], atol=TOL[dtype] * 10)


def test_bias_shaped_as_a_column():
    """The bias may come as (C,) or as conv.py's (C, 1, 1) column."""
    x, w, win, bias = random_case(3)
    bias = np.arange(w.shape[0], dtype=np.float64)
    column = bias.reshape((-1,) + (1,) * len(win.kernel))
    plan = depthwise.plan(win)
    np.testing.assert_array_equal(run(plan, x, w, win, bias), run(plan, x, w, win, column))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("layout", ["first", "last", "copies"])
@pytest.mark.parametrize("stride", [1, 2])
def test_epilogue_sees_each_finished_element_once(threads, layout, stride, monkeypatch):
    """The epilogue gets disjoint regions covering y once, each already holding conv + bias, from any thread."""
    monkeypatch.setattr(depthwise, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(depthwise, "MIN_CHANNEL_SPLIT_MACS", 0)
    monkeypatch.setattr(depthwise, "BLOCK_BYTES", 4096)  # several channel blocks per image
    rng = np.random.default_rng(threads)
    x, w, bias = rng.standard_normal((3, 13, 10, 11)), rng.standard_normal((13, 1, 3, 3)), rng.standard_normal(13)
    win = geo.window((10, 11), (3, 3), strides=(stride, stride), pads=(1, 1, 1, 1), clamp_same=True)
    expected = reference(x, w, win, bias)
    seen = np.zeros(expected.shape, dtype=np.int64)
    lock = threading.Lock()
    wrong = []

    def epilogue(y, region):
        if not np.allclose(y[region], expected[region], rtol=1e-4, atol=1e-4):
            wrong.append(region)
        np.maximum(y[region], 0, out=y[region])  # a fused Relu
        with lock:
            seen[region] += 1

    plan = depthwise.plan(win, layout)
    with using_threads(threads):
        y = run(plan, x, w, win, bias, epilogue)
    assert not wrong
    assert (seen == 1).all()
    np.testing.assert_allclose(y, np.maximum(expected, 0), rtol=1e-4, atol=1e-4)
    (choice,) = plan._choices.values()
    assert choice.parts == threads and len(choice.units) > 3  # split, when there are threads to split over


@pytest.mark.parametrize("layout", [None, "first", "last", "copies"])
def test_one_and_two_threads_agree(layout):
    """The parallel path computes the same values as the serial one (shufflenet-sized, big enough to split)."""
    rng = np.random.default_rng(0)
    x, w = rng.standard_normal((2, 136, 28, 28)), rng.standard_normal((136, 1, 3, 3))
    win = geo.window((28, 28), (3, 3), strides=(1, 1), pads=(1, 1, 1, 1), clamp_same=True)
    plan = depthwise.plan(win, layout)
    serial = run(plan, x, w, win)
    with using_threads(2):
        parallel = run(plan, x, w, win)
    np.testing.assert_allclose(parallel, serial, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(serial, reference(x, w, win), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["first", "last", "copies"])
def test_scratch_shared_between_plans_keeps_zero_borders(layout):
    """Plans of other geometries (same sizes, other pads) running in between never leak into the padding."""
    rng = np.random.default_rng(1)
    x, w = rng.standard_normal((1, 6, 8, 8)), rng.standard_normal((6, 1, 3, 3))
    padded = geo.window((8, 8), (3, 3), pads=(1, 1, 1, 1), clamp_same=True)
    shifted = geo.window((8, 8), (3, 3), pads=(2, 0, 0, 2), clamp_same=True)
    a, b = depthwise.plan(padded, layout), depthwise.plan(shifted, layout)
    for plan, win in [(a, padded), (b, shifted), (a, padded), (b, shifted)]:
        x = rng.standard_normal(x.shape)
        np.testing.assert_allclose(run(plan, x, w, win), reference(x, w, win), rtol=1e-4, atol=1e-4)


def test_new_weights_are_used():
    """A plan keeps prepared weights only while it is handed the same weight array."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 4, 6, 6))
    win = geo.window((6, 6), (3, 3), pads=(1, 1, 1, 1), clamp_same=True)
    plan = depthwise.plan(win)
    for _ in range(3):
        w = rng.standard_normal((4, 1, 3, 3))
        np.testing.assert_allclose(run(plan, x, w, win), reference(x, w, win), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layout", ["first", "last", "copies"])
@pytest.mark.parametrize("spatial,kernel,pads,strides", [
    ((1, 1), (3, 3), (1, 1, 1, 1), (1, 1)),  # one pixel, all padding around it
    ((2, 3), (5, 5), (2, 2, 2, 2), (1, 1)),  # kernel larger than the input
    ((5, 5), (3, 3), (0, 0, 0, 0), (5, 5)),  # one output
    ((4, 9), (1, 1), (0, 0, 0, 0), (2, 3)),  # strided 1x1
    ((3, 3), (1, 1), (2, 0, 0, 2), (1, 1)),  # pads only, no window overlap between taps
])
def test_tiny_and_odd_shapes(layout, spatial, kernel, pads, strides):
    """Degenerate geometries: tiny planes, kernels wider than the input, strides >= kernel."""
    rng = np.random.default_rng(4)
    x, w = rng.standard_normal((2, 3) + spatial), rng.standard_normal((3, 1) + kernel)
    win = geo.window(spatial, kernel, strides=strides, pads=pads, clamp_same=True)
    y = run(depthwise.plan(win, layout), x, w, win, np.ones(3))
    np.testing.assert_allclose(y, reference(x, w, win, np.ones(3)), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
@pytest.mark.parametrize("stride", [1, 2])
def test_matches_onnxruntime(auto_pad, stride):
    """A depthwise Conv node with auto_pad, as onnxruntime computes it."""
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 7, 11, 10)).astype(np.float32)
    w = rng.standard_normal((7, 1, 3, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], group=7, auto_pad=auto_pad, strides=[stride, stride])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x.shape)],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                              [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 10
    expected = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    win = geo.window((11, 10), (3, 3), strides=(stride, stride), auto_pad=auto_pad, clamp_same=True)
    y = run(depthwise.plan(win), x, w, win)
    np.testing.assert_allclose(y, expected, rtol=1e-5, atol=1e-5)


def test_layout_choice_is_kept_per_thread_count(monkeypatch):
    """The layout is chosen once per (batch, channels, dtype, threads) and reused."""
    monkeypatch.setattr(depthwise, "TUNE", True)
    x, w, win, _ = random_case(7)
    plan = depthwise.plan(win)
    run(plan, x, w, win)
    run(plan, x, w, win)
    with using_threads(2):
        run(plan, x, w, win)
    assert len(plan._choices) == 2


def test_tuning_keeps_only_the_chosen_layouts_buffers(monkeypatch):
    """After timing both layouts, the loser's zero-bordered buffers for this geometry are dropped."""
    monkeypatch.setattr(depthwise, "TUNE", True)
    rng = np.random.default_rng(11)
    win = geo.window((20, 20), (3, 3), pads=(1, 1, 1, 1), clamp_same=True)
    x, w = rng.standard_normal((1, 24, 20, 20)), rng.standard_normal((24, 1, 3, 3))
    plan = depthwise.plan(win)
    np.testing.assert_allclose(run(plan, x, w, win), reference(x, w, win), rtol=1e-4, atol=1e-4)
    (choice,) = plan._choices.values()
    layouts = {k[0] for pool in depthwise._all_padded for k in pool if k[3:] == plan._key}
    assert layouts == {choice.layout}


@pytest.mark.parametrize("layout", ["first", "last", "copies"])
@pytest.mark.parametrize("seed", range(0, 40, 3))
def test_random_cases_split_over_two_threads(seed, layout, monkeypatch):
    """Split into many small channel blocks over two threads, random geometries still equal the direct sum."""
    monkeypatch.setattr(depthwise, "MIN_SPLIT_MACS", 0)
    monkeypatch.setattr(depthwise, "MIN_CHANNEL_SPLIT_MACS", 0)
    monkeypatch.setattr(depthwise, "BLOCK_BYTES", 256)
    x, w, win, bias = random_case(seed)
    if layout == "copies" and len(win.kernel) != 2:
        pytest.skip("the copies layout is 2-D only")
    with using_threads(2):
        y = run(depthwise.plan(win, layout), x, w, win, bias)
    np.testing.assert_allclose(y, reference(x, w, win, bias), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("n,c,size,parts", [
    (1, 8, 8, 1),  # tiny: never split
    (1, 136, 28, 1),  # 0.96M multiply-adds in one image: not worth splitting its channels
    (1, 136, 56, 2),  # 3.8M in one image: its channels are split
    (2, 136, 28, 2),  # 1.9M over two images: one image a thread
])
def test_split_only_when_it_pays(n, c, size, parts):
    """Work is split over threads only above the thresholds, images before channels."""
    rng = np.random.default_rng(6)
    x, w = rng.standard_normal((n, c, size, size)), rng.standard_normal((c, 1, 3, 3))
    win = geo.window((size, size), (3, 3), pads=(1, 1, 1, 1), clamp_same=True)
    plan = depthwise.plan(win, "first")
    with using_threads(2):
        y = run(plan, x, w, win)
    (choice,) = plan._choices.values()
    assert choice.parts == parts
    np.testing.assert_allclose(y, reference(x, w, win), rtol=1e-4, atol=1e-4)


def test_numpy_settings_are_left_as_found():
    """The short ufunc buffer the method runs with does not leak into the caller's numpy settings."""
    before, errors = np.getbufsize(), np.geterr()
    x, w, win, bias = random_case(9)
    run(depthwise.plan(win), x, w, win, bias)
    assert np.getbufsize() == before and np.geterr() == errors



@pytest.mark.parametrize("layout", ["first", "last", "copies"])
def test_strided_view_as_input(layout):
    """x may be a strided view (every other channel of a larger tensor, a cropped plane): every layout copies it."""
    rng = np.random.default_rng(12)
    base = rng.standard_normal((2, 48, 11, 12)).astype(np.float32)
    x = base[:, ::2, 1:, :10]
    w = rng.standard_normal((24, 1, 3, 3)).astype(np.float32)
    win = geo.window((10, 10), (3, 3), strides=(2, 1), pads=(1, 1, 1, 1), clamp_same=True)
    y = np.empty((2, 24) + win.out_shape, np.float32)
    depthwise.plan(win, layout)(x, Packed(w), y, None, None)
    np.testing.assert_allclose(y, reference(np.ascontiguousarray(x), w, win), rtol=1e-4, atol=1e-4)


def test_tuning_may_split_one_image(monkeypatch):
    """With TRY_SPLIT, one image's channels split or not by timing; either way the result is the direct sum."""
    monkeypatch.setattr(depthwise, "TUNE", True)
    monkeypatch.setattr(depthwise, "TRY_SPLIT", True)
    monkeypatch.setattr(depthwise, "MIN_TRY_SPLIT_MACS", 0)
    rng = np.random.default_rng(13)
    x, w, b = rng.standard_normal((1, 40, 12, 12)), rng.standard_normal((40, 1, 3, 3)), rng.standard_normal(40)
    win = geo.window((12, 12), (3, 3), pads=(1, 1, 1, 1), clamp_same=True)
    plan = depthwise.plan(win)
    with using_threads(2):
        y = run(plan, x, w, win, b)
        again = run(plan, x, w, win, b)
    (choice,) = plan._choices.values()
    assert choice.parts in (1, 2)
    np.testing.assert_allclose(y, reference(x, w, win, b), rtol=1e-4, atol=1e-4)
    np.testing.assert_array_equal(y, again)
