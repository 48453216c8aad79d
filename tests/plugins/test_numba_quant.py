"""minfer-ops-numba's one-pass QuantizeDequantize against minfer-passes' numpy kernel: the same bits, on tiles too."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import KernelContext, TensorType, get_registry  # noqa: E402
from minfer_ops_numba import quant  # noqa: E402
from minfer_passes.qdq_ops import quantize_dequantize as numpy_kernel  # noqa: E402

QDQ = ("ai.minfer", "QuantizeDequantize")
ROUND = {"scale": 0.0401, "low": -128.0, "high": 127.0}
POST = {"post_scale": 0.0365, "post_low": 0.0, "post_high": 255.0}


pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


def _ctx(*shapes):
    types = tuple(None if s is None else TensorType(np.float32, s) for s in shapes) + (None,) * (3 - len(shapes))
    return KernelContext("q", "QuantizeDequantize", 1, types, types[:1], (None,) * 3, 1)


def _output(shape, seed=0):
    """Values around the grid: ties (k + 0.5) * scale, saturating ones, NaN, -0.0."""
    rng = np.random.default_rng(seed)
    y = (rng.standard_normal(shape) * 4).astype(np.float32)
    flat = y.reshape(-1)
    ties = ((np.arange(flat.size // 4) % 300 - 150 + 0.5) * np.float32(ROUND["scale"])).astype(np.float32)
    flat[: ties.size] = ties
    flat[-3:] = [np.nan, -0.0, 1e9]
    return y


def _part(c, region, ndim):
    """An operand's part that meets an output region (as the Dequant* epilogue slices it)."""
    if c is None:
        return None
    full = c.reshape((1,) * (ndim - c.ndim) + c.shape)
    return full[tuple(r if d > 1 else slice(None) for r, d in zip(region, full.shape))]


REGIONS = [
    (slice(None),) * 4,  # the whole output
    (slice(1, 2), slice(8, 40), slice(3, 9), slice(None)),  # a conv tile: some channels and rows of one image
    (slice(0, 2), slice(8, 40), slice(3, 9), slice(2, 7)),  # dims that do not merge: a copy
]


@pytest.mark.parametrize("region", REGIONS)
@pytest.mark.parametrize("mul,add,post", [("channel", "channel", True), ("", "channel", False),
                                          ("scalar", "", True), ("", "", False), ("channel", "scalar", False)])
def test_one_pass_rounding_is_numpys_bits(region, mul, add, post):
    """rounding, * M, + A, rounding in one compiled pass writes numpy's bits (ties to even, saturation, NaN, -0.0)."""
    rng = np.random.default_rng(1)
    shapes = {"channel": (64, 1, 1), "scalar": (1,), "": None}
    m, a = ((rng.random(shapes[k]) + 0.5).astype(np.float32) if k else None for k in (mul, add))
    attrs = {**ROUND, **(POST if post else {})}
    ctx = _ctx((2, 64, 20, 24), shapes[mul], shapes[add])
    kern = get_registry().select_kernel(*QDQ, 1, "numpy", ctx, attrs)
    assert kern is not None and kern.fn is quant.quantize_dequantize.fn
    got, want = _output((2, 64, 20, 24)), _output((2, 64, 20, 24))
    for y, fn in ((got, kern.prepared(ctx, attrs)), (want, numpy_kernel.prepared(ctx, attrs))):
        part = y[region]
        fn(part, _part(m, region, 4), _part(a, region, 4), out=part)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("shape,operand", [((5, 48), (48,)), ((2, 7, 48), (48,)), ((3, 10), (3, 1))])
def test_one_pass_rounding_follows_the_operands_axis(shape, operand):
    """A Gemm's or MatMul's bias along the last axis (or along the first) is applied along that axis."""
    a = np.linspace(-1, 1, int(np.prod(operand)), dtype=np.float32).reshape(operand)
    ctx = _ctx(shape, None, operand)
    x = _output(shape, seed=3)
    got = quant.quantize_dequantize.prepared(ctx, {**ROUND, **POST})(x, None, a)
    want = numpy_kernel.prepared(ctx, {**ROUND, **POST})(x, None, a)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_one_pass_rounding_leaves_other_operands_to_numpy():
    """The kernel applies only to float32 with operands that vary along one axis at most: numpy's takes the rest."""
    assert not quant.applies(_ctx((2, 8, 4, 4), (8, 4, 1)), {})
    assert not quant.applies(_ctx((2, 8, 4, 4), (8, 1, 1), (1, 4, 1)), {})
    assert quant.applies(_ctx((2, 8, 4, 4), (8, 1, 1), (1,)), {})
    assert not quant.applies(KernelContext("q", "QuantizeDequantize", 1, (TensorType(np.float64, (4,)),), (None,),
                                           (None,), 1), {})


@pytest.mark.parametrize("shape", [(), (1000,), (3, 5, 7)])
def test_one_pass_rounding_of_a_whole_tensor(shape):
    """Without M and A, a whole tensor of any rank (a standalone node's input) gets numpy's bits, into out or in place."""
    ctx = _ctx(shape)
    x = _output(shape, seed=4) if shape else np.array(0.7, np.float32)
    fn, ref = quant.quantize_dequantize.prepared(ctx, ROUND), numpy_kernel.prepared(ctx, ROUND)
    want = ref(x.copy())
    np.testing.assert_array_equal(fn(x).view(np.int32), want.view(np.int32))
    y = x.copy()
    fn(y, out=y)
    np.testing.assert_array_equal(y.view(np.int32), want.view(np.int32))
