"""minfer-ops-numba's Winograd F(2x2, 3x3) Conv (winograd.py): against onnx's reference Conv, its team path against
its parallel_for path, the fused op's epilogue, and where it applies."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from minfer_core import KernelContext, TensorType  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_ops_numba import activation, team, winograd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from modelkit import assert_epilogue_once, conv_context, fused_epilogue, onnx_conv, team_and_split_runs  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py

CASES = [  # (N, C, H, W), M, attributes, bias: pads of every kind, odd sizes (a last tile half outside y), batches
    ((1, 64, 56, 56), 64, dict(pads=[1, 1, 1, 1]), True),
    ((2, 32, 9, 11), 16, dict(pads=[1, 0, 2, 1]), True),
    ((1, 32, 7, 8), 20, dict(), False),
    ((1, 48, 13, 13), 40, dict(auto_pad="SAME_UPPER"), True),
    ((3, 40, 6, 5), 24, dict(pads=[2, 2, 2, 2]), True),
    ((1, 256, 14, 14), 256, dict(pads=[1, 1, 1, 1]), True),
    ((8, 32, 7, 7), 24, dict(pads=[1, 1, 1, 1]), True),  # small images: several a unit
]


def case(xs, m, bias=True, seed=0):
    rng = np.random.default_rng(seed + sum(xs))
    x = rng.standard_normal(xs, dtype=np.float32)
    w = (rng.standard_normal((m, xs[1], 3, 3)) / np.sqrt(9 * xs[1])).astype(np.float32)
    return x, w, rng.standard_normal(m, dtype=np.float32) if bias else None


def prepared(x, w, b, attrs):
    ctx = conv_context(x, w, b)
    if not team.gemm_address():
        pytest.skip("numpy's BLAS has no cblas_sgemm callable from compiled code here")
    assert winograd.applies(ctx, attrs)
    return winograd.conv.prepared(ctx, attrs)


@pytest.mark.parametrize("xs, m, attrs, bias", CASES)
def test_matches_the_reference_conv(xs, m, attrs, bias):
    """On one thread and on two, the Winograd conv gives onnx's reference Conv within float32 rounding of its
    transforms, pads of every kind and odd output sizes included."""
    x, w, b = case(xs, m, bias)
    run = prepared(x, w, b, attrs)
    want = onnx_conv(x, w, b, attrs)
    for threads in (1, 2):
        with using_threads(threads):
            np.testing.assert_allclose(run(x), want, rtol=1e-4, atol=1e-4)


def _relu(shape):
    ctx = KernelContext("act", "Relu", 22, (TensorType(np.dtype(np.float32), shape),), (None,), (None,), 1)
    return activation.relu.prepared(ctx, {})


@pytest.mark.parametrize("xs, m, attrs, bias", CASES[:2] + CASES[-2:])
@pytest.mark.parametrize("residual", [False, True])
def test_team_path_gives_the_parallel_for_bits_with_the_epilogue(monkeypatch, xs, m, attrs, bias, residual):
    """Over a native team the conv gives the bits of its parallel_for path (its units come from the shape alone),
    bias, residual and activation applied in compiled code, and matches the reference plus that epilogue."""
    if not team.available():
        pytest.skip("no native team here: numba's threading layer is not OpenMP or TBB, or MINFER_NUMBA_TEAM=0")
    x, w, b = case(xs, m, bias)
    run = prepared(x, w, b, attrs)
    shape = run(x).shape
    z = np.random.default_rng(3).standard_normal(shape, dtype=np.float32) if residual else None
    epilogue = fused_epilogue("Relu", (), z, _relu(shape))
    got, want = team_and_split_runs(monkeypatch, winograd, run, x, shape, epilogue)
    np.testing.assert_array_equal(got, want)
    ref = onnx_conv(x, w, b, attrs) + (0 if z is None else z)
    np.testing.assert_allclose(got, np.maximum(ref, 0), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_an_epilogue_without_compiled_form_sees_each_output_once_after_its_sum(threads):
    """An epilogue that does not describe itself (no ``spec``) runs once on every output element, after the whole
    sum (bias included) is in it."""
    x, w, b = case((1, 32, 10, 12), 16)
    run = prepared(x, w, b, {"pads": [1, 1, 1, 1]})
    assert_epilogue_once(run, x, onnx_conv(x, w, b, {"pads": [1, 1, 1, 1]}), threads)


def test_units_hold_enough_tiles_and_small_images_go_together():
    """A unit holds at least MIN_TILES tiles where the image has them (a band of tile rows), small images go
    several to a unit, and there are PLAN_PARTS units at least when the input has the tile rows for them."""
    found, _ = winograd.plan(1, 64, 64, 56, 56)
    assert len(found) >= winograd.PLAN_PARTS and all((r1 - r0) * 28 >= winograd.MIN_TILES for _, _, r0, r1 in found[:-1])
    found, _ = winograd.plan(8, 512, 512, 7, 7)  # 16 tiles an image
    assert len(found) > 1 and all(i1 - i0 > 1 and (r0, r1) == (0, 4) for i0, i1, r0, r1 in found)
    assert sorted(i for i0, i1, _, _ in found for i in range(i0, i1)) == list(range(8))


def test_applies_only_to_3x3_stride_1_group_1_convs_of_enough_channels():
    """It takes float32 3x3 convs at stride 1 and dilation 1, group 1, from MIN_CHANNELS input and
    MIN_OUT_CHANNELS output channels, with constant weights; it refuses every other conv."""
    x, w, b = case((1, 32, 8, 8), 16)
    if not team.gemm_address():
        pytest.skip("numpy's BLAS has no cblas_sgemm callable from compiled code here")
    assert winograd.applies(conv_context(x, w, b), {"pads": [1, 1, 1, 1]})
    assert winograd.applies(conv_context(x, w, None), {})
    few_in, few_out = case((1, 16, 8, 8), 16), case((1, 32, 8, 8), 8)
    refused = [
        (conv_context(x, w, b), {"strides": [2, 2]}),
        (conv_context(x, w, b), {"dilations": [2, 2]}),
        (conv_context(x, w[:, :16], b), {"group": 2}),
        (conv_context(x, np.ascontiguousarray(w[:, :, :1, :1]), b), {}),  # 1x1
        (conv_context(*few_in), {}),
        (conv_context(*few_out), {}),
        (conv_context(x, w, b, constant=False), {}),
        (conv_context(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)), {}),
    ]
    for ctx, attrs in refused:
        assert not winograd.applies(ctx, attrs), attrs
