"""minfer-ops-numba's pointwise Conv (pointwise.py: 1x1 at stride 1 by an AVX-512 micro-kernel in LLVM IR): against
onnx's reference Conv, on one thread and two, with the fused op's epilogue, its units, and where it applies."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from minfer_core import KernelContext, TensorType, get_registry  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_ops_numba import activation, pointwise, team  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from modelkit import assert_epilogue_once, conv_context, fused_epilogue, onnx_conv, team_and_split_runs  # noqa: E402

pytestmark = [pytest.mark.usefixtures("numba_plugin"),  # tests/plugins/conftest.py
              pytest.mark.skipif(not pointwise.available(), reason="the micro-kernel needs AVX-512F and LLVM >= 17")]

CASES = [  # (N, C, H, W), M, bias: M not a multiple of 4, pixels not of 64, one channel, batches, a 1x1 map
    ((1, 16, 112, 112), 96, True),
    ((1, 32, 7, 9), 5, True),
    ((2, 3, 10, 13), 8, False),
    ((3, 17, 5, 33), 13, True),
    ((1, 1, 4, 4), 2, True),
    ((2, 160, 7, 7), 960, True),
    ((1, 64, 1, 1), 7, False),
]


def case(xs, m, bias=True, seed=0):
    rng = np.random.default_rng(seed + sum(xs))
    x = rng.standard_normal(xs, dtype=np.float32)
    w = (rng.standard_normal((m, xs[1], 1, 1)) / np.sqrt(xs[1])).astype(np.float32)
    return x, w, rng.standard_normal(m, dtype=np.float32) if bias else None


def prepared(x, w, b):
    ctx = conv_context(x, w, b)
    assert pointwise.applies(ctx, {})
    return pointwise.conv.prepared(ctx, {})


@pytest.mark.parametrize("xs, m, bias", CASES)
def test_matches_the_reference_conv_with_the_same_bits_on_any_thread_count(xs, m, bias):
    """The micro-kernel's conv gives onnx's reference Conv within float32 rounding, into a fresh array or the
    engine's buffer (written whole), with the same bits on one thread and two (each output's products are summed
    in channel order whatever the units)."""
    x, w, b = case(xs, m, bias)
    run = prepared(x, w, b)
    want = onnx_conv(x, w, b, {})
    with using_threads(1):
        one = run(x, None, None)
    np.testing.assert_allclose(one, want, rtol=1e-5, atol=1e-5)
    y = np.full(want.shape, np.nan, np.float32)
    with using_threads(2):
        assert run(x, None, None, out=y) is y
    np.testing.assert_array_equal(y, one)


@pytest.mark.parametrize("xs, m, group", [((1, 136, 28, 28), 136, 4), ((2, 12, 5, 7), 18, 3), ((1, 12, 7, 7), 30, 3),
                                           ((1, 544, 7, 7), 544, 4), ((1, 8, 3, 3), 8, 8)])
def test_grouped_convs_match_the_reference_with_the_same_bits_on_any_thread_count(xs, m, group):
    """A grouped 1x1 conv (ShuffleNet's four groups; three groups of 6 outputs, whose 4-row tiles end at each
    group's end; three of 10, whose channel units on a 7x7 map cross groups where two or more CPUs cut them; one
    channel a group) gives onnx's reference Conv within float32 rounding, the same bits on one thread and two."""
    rng = np.random.default_rng(sum(xs) + group)
    x = rng.standard_normal(xs, dtype=np.float32)
    w = (rng.standard_normal((m, xs[1] // group, 1, 1)) / np.sqrt(xs[1] // group)).astype(np.float32)
    b = rng.standard_normal(m, dtype=np.float32)
    ctx, attrs = conv_context(x, w, b), {"group": group}
    assert pointwise.applies(ctx, attrs)
    run = pointwise.conv.prepared(ctx, attrs)
    with using_threads(1):
        one = run(x, None, None)
    np.testing.assert_allclose(one, onnx_conv(x, w, b, attrs), rtol=1e-5, atol=1e-5)
    with using_threads(2):
        np.testing.assert_array_equal(run(x, None, None), one)


def test_nan_and_infinity_reach_only_their_own_outputs():
    """A NaN or an infinity in one pixel of x makes that pixel's outputs NaN or infinite, no other's (masked loads
    read nothing past the map; no value crosses pixels)."""
    x, w, b = case((1, 8, 9, 10), 12)
    x[0, 3, 4, 5] = np.nan
    x[0, 1, 8, 9] = np.inf
    got = prepared(x, w, b)(x, None, None)
    assert np.isnan(got[0, :, 4, 5]).all()
    assert not np.isfinite(got[0, :, 8, 9]).any()
    mask = np.ones((9, 10), bool)
    mask[4, 5] = mask[8, 9] = False
    assert np.isfinite(got[0][:, mask]).all()


def _act(name, shape):
    ctx = KernelContext("act", name, 22, (TensorType(np.dtype(np.float32), shape),), (None,), (None,), 1)
    return (activation.relu if name == "Relu" else activation.hard_swish).prepared(ctx, {})


@pytest.mark.parametrize("xs, m, bias", [CASES[0], CASES[3], CASES[5]])
@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("name", ["Relu", "HardSwish"])
def test_team_path_gives_the_parallel_for_bits_with_the_epilogue(monkeypatch, xs, m, bias, residual, name):
    """Over a native team the conv gives the bits of its parallel_for path, bias, residual and activation applied
    in compiled code per block of pixels, and matches the reference plus that epilogue."""
    if not team.available():
        pytest.skip("no native team here: numba's threading layer is not OpenMP or TBB, or MINFER_NUMBA_TEAM=0")
    x, w, b = case(xs, m, bias)
    run = prepared(x, w, b)
    shape = (xs[0], m) + xs[2:]
    z = np.random.default_rng(3).standard_normal(shape, dtype=np.float32) if residual else None
    act = _act(name, shape)
    epilogue = fused_epilogue(name, (), z, act)
    got, want = team_and_split_runs(monkeypatch, pointwise, run, x, shape, epilogue)
    np.testing.assert_array_equal(got, want)
    ref = onnx_conv(x, w, b, {}) + (0 if z is None else z)
    np.testing.assert_allclose(got, act(ref), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("threads", [1, 2])
def test_an_epilogue_without_compiled_form_sees_each_output_once_after_its_sum(threads):
    """An epilogue that does not describe itself (no ``spec``) runs once on every output element, after the whole
    sum (bias included) is in it."""
    x, w, b = case((2, 24, 20, 21), 36)
    assert_epilogue_once(prepared(x, w, b), x, onnx_conv(x, w, b, {}), threads)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("chain", ["mul-add-post", "add", "scalar-mul-post"])
@pytest.mark.parametrize("xs, m", [((1, 24, 56, 56), 144), ((2, 17, 5, 33), 13)])
def test_a_dequant_conv_s_rounding_chain_runs_on_each_block(xs, m, chain, threads):
    """minfer-passes' DequantConv epilogue of a QDQ model's conv -> BatchNormalization (the rounding, * M + A per
    channel or one value, the next rounding: ``epilogue.rounding``) is applied to each 64-pixel block while in
    cache, with the bits of the same epilogue called on the whole output after the sums (the registered rounding
    kernel); the bias is in the sums first."""
    from minfer_passes.qdq_ops import _rounding

    x, w, b = case(xs, m, True, seed=3)
    x[0, :, :1, :3] = 30.0  # sums far past the grids: saturated
    shape = onnx_conv(x, w, b, {}).shape
    run = pointwise.conv.prepared(_live_weight_context(x, w, b), {})  # a DequantConv's: the weight with the run
    rng = np.random.default_rng(11)
    mv = (1 + 0.3 * rng.standard_normal((1, m, 1, 1))).astype(np.float32)
    av = (0.2 * rng.standard_normal((m, 1, 1))).astype(np.float32)
    mul, add, post = {"mul-add-post": (mv, av, [0.03, 0.0, 255.0]), "add": (None, av, None),
                      "scalar-mul-post": (np.full((1, 1, 1, 1), 1.7, np.float32), None, [0.05, -128.0, 127.0])}[chain]
    epilogue = _rounding(TensorType(np.dtype(np.float32), shape), [0.0125, -128.0, 127.0], mul, add, post)
    calls, described_calls = [], []

    def called(y, region):  # the same chain without its description: the kernel must call it, after the sums
        calls.append(region)
        epilogue(y, region)

    def described(y, region):  # the chain with its description: applied by the blocks, never called
        described_calls.append(region)
        epilogue(y, region)

    described.rounding = epilogue.rounding
    with using_threads(threads):
        got = run(x, w, None, out=np.full(shape, np.nan, np.float32), epilogue=described)
        want = run(x, w, None, out=np.full(shape, np.nan, np.float32), epilogue=called)
    assert calls == [(slice(None),) * 4]  # the description-less one once, on all of it; the described one in blocks
    assert described_calls == []
    np.testing.assert_array_equal(got, want)
    if chain == "mul-add-post" and xs[1] > 20:  # on the second grid (0..255), saturated at one of its bounds
        k = np.round(got / np.float32(post[0]))
        assert k.min() == post[1] or k.max() == post[2]


def test_an_epilogue_made_per_run_is_not_kept_after_its_run():
    """An epilogue made for one run (minfer-passes' residual one, holding that run's Z) is not kept by the kernel
    once the run returns: its arrays are freed with it (a cache of every epilogue seen kept up to nine Zs alive:
    quantized resnet50 held 6 MB more)."""
    import gc
    import weakref

    def residual(z):  # a closure holding z, as minfer-passes' `_residual` makes one per run
        def epilogue(y, region):  # no description: called after the sums
            y[region] += z[region]

        return epilogue

    x, w, b = case((1, 24, 20, 21), 36)
    run = prepared(x, w, b)
    z = np.ones((1, 36, 20, 21), np.float32)
    gone = weakref.ref(z)
    epilogue = residual(z)
    got = run(x, w, b, out=np.empty((1, 36, 20, 21), np.float32), epilogue=epilogue)
    np.testing.assert_allclose(got, onnx_conv(x, w, b, {}) + 1, rtol=1e-5, atol=1e-5)
    del z, epilogue
    gc.collect()
    assert gone() is None


def test_units_cover_every_output_once_split_by_pixels_or_by_channels():
    """The units cover each image's pixels and output channels exactly once: runs of whole 64-pixel blocks where an
    image has enough of them for the threads, else runs of output channels (multiples of 4) over the whole map."""
    for n, m, pixels, parts in [(1, 96, 12544, 2), (2, 16, 3136, 2), (1, 960, 49, 2), (3, 13, 165, 2), (1, 7, 1, 8),
                                (4, 64, 196, 2)]:
        found = pointwise.plan(n, m, pixels, parts)
        cover = np.zeros((n, m, pixels), int)
        for i, p0, p1, m0, m1 in found:
            assert m0 % pointwise.MR == 0 and (p0 % pointwise.W == 0)
            cover[i, m0:m1, p0:p1] += 1
        assert (cover == 1).all()
        assert len(found) >= min(parts, n * max(1, -(-m // pointwise.MR)))
    assert all(p1 - p0 == 49 for _, p0, p1, _, _ in pointwise.plan(1, 960, 49, 2))  # a 7x7 map: split by channels


def _live_weight_context(x, w, b, static=True):
    """A Conv node's context whose weight comes with each run (minfer-passes' DequantConv calls its base kernel so):
    its type only, static or not; the bias a constant."""
    wt = TensorType(w.dtype, w.shape if static else (None,) + w.shape[1:])
    types = (TensorType(x.dtype, x.shape), wt) + ((TensorType(b.dtype, b.shape),) if b is not None else ())
    return KernelContext("node", "Conv", 22, types, (None,), (None, None) + ((b,) if b is not None else ()), 1)


@pytest.mark.parametrize("bias", [True, False])
def test_a_weight_given_with_each_run_is_read_in_place(bias):
    """With a float32 weight of static shape given at each run (no constant), the kernel reads that run's weight:
    two runs with two weights give each its own reference conv; a weight of unknown shape is refused."""
    x, w, b = case((2, 24, 9, 11), 20, bias)
    ctx = _live_weight_context(x, w, b)
    assert pointwise.applies(ctx, {})
    run = pointwise.conv.prepared(ctx, {})
    for scale in (1.0, -0.5):
        np.testing.assert_allclose(run(x, w * np.float32(scale), None), onnx_conv(x, w * np.float32(scale), b, {}),
                                   rtol=1e-5, atol=1e-5)
    assert not pointwise.applies(_live_weight_context(x, w, b, static=False), {})


def test_applies_only_to_1x1_stride_1_unpadded_convs_with_constant_weights():
    """It takes float32 1x1 convs at stride 1 and dilation 1 without pads, grouped or not, of at most MAX_CHANNELS
    input channels a group, with constant weights (or a weight given with each run, above); it refuses every other
    conv, which another Conv kernel takes."""
    x, w, b = case((1, 32, 8, 8), 16)
    assert pointwise.applies(conv_context(x, w, b), {})
    assert pointwise.applies(conv_context(x, w, None), {"pads": [0, 0, 0, 0], "strides": [1, 1]})
    assert pointwise.applies(conv_context(x, w[:, :16], b), {"group": 2})
    wide = case((1, pointwise.MAX_CHANNELS + 1, 2, 2), 4)
    refused = [
        (conv_context(x, w, b), {"strides": [2, 2]}),
        (conv_context(x, w, b), {"dilations": [2, 2]}),
        (conv_context(x, w, b), {"pads": [1, 1, 1, 1]}),
        (conv_context(x, w[:, :16], b), {"group": 3}),  # 32 input channels are not 3 groups of 16
        (conv_context(x, w[:15, :16], b[:15]), {"group": 2}),  # 15 outputs are not 2 groups
        (conv_context(x, np.repeat(np.repeat(w, 3, axis=2), 3, axis=3), b), {}),  # 3x3
        (conv_context(*wide), {}),
        (conv_context(x, w, b, constant=False), {}),  # a bias given with each run
        (conv_context(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)), {}),
    ]
    for ctx, attrs in refused:
        assert not pointwise.applies(ctx, attrs), attrs
        chosen = get_registry().select_kernel("", "Conv", 22, ctx=ctx, attrs=attrs)
        assert chosen is not None and chosen.fn is not pointwise.conv.fn


def test_a_pointwise_node_is_timed_against_the_other_conv_kernels():
    """On a MobileNet pointwise node the registry offers this kernel beside smallconv.py's and minfer-ops-conv's
    numpy Conv, so the core times them per node shape and keeps the fastest (priority below smallconv's: it must
    win by the core's margin)."""
    from minfer_ops_numba import smallconv

    x, w, b = case((1, 16, 112, 112), 96)
    found = get_registry().kernel_candidates("", "Conv", 22, "numpy", conv_context(x, w, b), {})
    assert pointwise.conv in found and smallconv.conv in found
    assert found.index(smallconv.conv) < found.index(pointwise.conv)
    assert any(k.plugin == "minfer-ops-conv" for k in found)
