"""minfer-ops-numba's row kernels (Softmax, LogSoftmax, LayerNormalization) against the numpy kernels, and MaskedSoftmax
over a timed choice."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import KernelContext, TensorType, get_registry  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_core.tuning import Choice  # noqa: E402
from minfer_ops_basic import activation, nn  # noqa: E402
from minfer_ops_numba import rows as numba_rows  # noqa: E402
from minfer_passes import softmax as masked  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py

SHAPES = [(1, 768, 4), (1, 16, 37), (1, 2), (2, 3, 1), (3, 130), (2, 1000)]


def _ctx(op, shape, opset=13):
    t = TensorType(np.float32, shape)
    return KernelContext("s", op, opset, (t,), (t,), (None,), 1)


def _numpy(op, since):
    return next(k for k in activation.KERNELS if k.op_type == op and k.since == since)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_rows_match_the_numpy_kernel(op, shape):
    """Short rows (column by column) and long ones (row by row) are within a few ulps of the numpy kernel."""
    x = (np.random.default_rng(len(shape)).standard_normal(shape) * 4).astype(np.float32)
    record = numba_rows.softmax_13 if op == "Softmax" else numba_rows.log_softmax_13
    got = record.prepared(_ctx(op, shape), {})(x, out=np.empty_like(x))
    want = _numpy(op, 13).fn(x, axis=-1)
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6 if op == "LogSoftmax" else 1e-7)


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_opset_1_coerces_to_2d_at_axis(op):
    """Before opset 13 the rows are the 2-D coercion at axis, as in the numpy kernel."""
    x = np.random.default_rng(3).standard_normal((2, 3, 4, 5)).astype(np.float32)
    record = numba_rows.softmax_1 if op == "Softmax" else numba_rows.log_softmax_1
    got = record.prepared(_ctx(op, x.shape, 11), {"axis": 2})(x)
    np.testing.assert_allclose(got, _numpy(op, 1).fn(x, axis=2), rtol=2e-6, atol=2e-6)


@pytest.mark.parametrize("cols", [4, 40])
def test_nan_and_infinite_rows_as_numpy(cols):
    """A NaN, an inf or a row of -inf makes the row NaN, as numpy's shifted formula does; huge logits don't overflow."""
    x = np.random.default_rng(4).standard_normal((5, cols)).astype(np.float32)
    x[0, 1], x[1, 2], x[2] = np.nan, np.inf, -np.inf
    x[3] *= 1e30
    for record, op in ((numba_rows.softmax_13, "Softmax"), (numba_rows.log_softmax_13, "LogSoftmax")):
        got = record.prepared(_ctx(op, x.shape), {})(x)
        want = _numpy(op, 13).fn(x, axis=-1)
        np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
        np.testing.assert_allclose(got[3:], want[3:], rtol=2e-6, atol=2e-6)


def test_softmax_in_place_and_log_softmax_into_its_input():
    """Softmax may write over its input; LogSoftmax given its input as out still reads the original values."""
    x = np.random.default_rng(5).standard_normal((6, 20)).astype(np.float32)
    for record, op in ((numba_rows.softmax_13, "Softmax"), (numba_rows.log_softmax_13, "LogSoftmax")):
        y = x.copy()
        got = record.prepared(_ctx(op, x.shape), {})(y, out=y)
        assert got is y
        np.testing.assert_allclose(got, _numpy(op, 13).fn(x, axis=-1), rtol=2e-6, atol=2e-6)


def test_two_threads_give_the_one_thread_bits():
    """Split over the intra-op threads by whole rows, each row is computed as in one call."""
    x = np.random.default_rng(6).standard_normal((numba_rows.SPLIT_ELEMENTS // 64 + 3, 64)).astype(np.float32)
    run = numba_rows.softmax_13.prepared(_ctx("Softmax", x.shape), {})
    one = run(x)
    with using_threads(2):
        two = run(x)
    np.testing.assert_array_equal(one, two)


def test_applies_to_float32_rows_only():
    """The compiled kernel takes float32 along the last axis (any axis before opset 13), not float64 or axis 1."""
    t = TensorType(np.float32, (2, 3, 4))
    assert numba_rows._last_axis(_ctx("Softmax", (2, 3, 4)), {"axis": 2})
    assert not numba_rows._last_axis(_ctx("Softmax", (2, 3, 4)), {"axis": 1})
    assert numba_rows._last_axis(KernelContext("s", "Softmax", 11, (t,), (t,), (None,), 1), {"axis": 1})
    t64 = TensorType(np.float64, (2, 3))
    assert not numba_rows._last_axis(KernelContext("s", "Softmax", 13, (t64,), (t64,), (None,), 1), {})


def test_masked_softmax_over_a_timed_choice_softmaxes_once():
    """With two Softmax kernels timed against each other, MaskedSoftmax's first call (the timing) gives the same
    result as later ones: the candidates read the masked scores from scratch, not from the output they overwrite."""
    shape = (1, 2, 5, 8)
    t = TensorType(np.float32, shape)
    m = TensorType(np.bool_, (1, 1, 1, 8))
    ctx = KernelContext("ms", "MaskedSoftmax", 1, (t, m), (t,), (None, None), 1)
    attrs = {"op": "Mul", "scalar": np.asarray(0.25, np.float32), "fill": np.asarray(-np.inf, np.float32)}
    inner = masked._softmax(ctx)[1]
    if not isinstance(inner, Choice):
        pytest.skip("only one Softmax kernel applies (tuning off or a preference set)")
    kern = get_registry().select_kernel("ai.minfer", "MaskedSoftmax", 1)
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    cond = np.zeros((1, 1, 1, 8), bool)
    cond[..., 6:] = True
    want = _numpy("Softmax", 13).fn(np.where(cond, np.float32(-np.inf), x * np.float32(0.25)), axis=-1)
    run = kern.prepared(ctx, attrs)
    first = run(x, cond, out=np.empty(shape, np.float32))
    np.testing.assert_allclose(first, want, rtol=2e-6, atol=1e-7)
    np.testing.assert_allclose(run(x, cond, out=np.empty(shape, np.float32)), want, rtol=2e-6, atol=1e-7)


def _norm_ctx(shape, inner, consts):
    t, p = TensorType(np.float32, shape), TensorType(np.float32, inner)
    return KernelContext("ln", "LayerNormalization", 17, (t, p, p), (t, None, None), consts, 3)


@pytest.mark.parametrize("shape,axis", [((1, 128, 64), -1), ((2, 3, 5), -1), ((2, 3, 4, 6), 2), ((4, 1), -1)])
@pytest.mark.parametrize("constant", [True, False])
@pytest.mark.parametrize("bias", [True, False])
def test_layer_norm_matches_the_numpy_kernel(shape, axis, constant, bias):
    """Y, Mean and InvStdDev are within a few float32 ulps of the numpy kernel's, with scale and bias constant
    (laid out at build) or not, with and without a bias, over the last axes from ``axis``."""
    rng = np.random.default_rng(8)
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    inner = shape[axis % len(shape):]
    g = rng.standard_normal(inner).astype(np.float32)
    b = rng.standard_normal(inner).astype(np.float32) if bias else None
    consts = (None, g, b) if constant else (None, None, None)
    run = numba_rows.layer_normalization.prepared(_norm_ctx(shape, inner, consts), {"axis": axis})
    args = (x, g) if b is None else (x, g, b)
    got = run(*args, out=np.empty_like(x))
    want = nn.layer_normalization.fn(*args, axis=axis)
    for a, w in zip(got, want):
        assert a.shape == w.shape and a.dtype == np.float32
        np.testing.assert_allclose(a, w, rtol=2e-6, atol=2e-6)


def test_layer_norm_two_threads_give_the_one_thread_bits():
    """Split over the intra-op threads by whole rows, each row is computed as in one call."""
    x = np.random.default_rng(9).standard_normal((numba_rows.SPLIT_ELEMENTS // 32 + 5, 32)).astype(np.float32)
    g = np.ones(32, np.float32)
    run = numba_rows.layer_normalization.prepared(_norm_ctx(x.shape, (32,), (None, g, None)), {})
    one = run(x, g)
    with using_threads(2):
        two = run(x, g)
    for a, b in zip(one, two):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("op", ["AveragePool", "MaxPool"])
def test_pools_with_a_one_wide_stride_1_axis_are_compiled_with_numpys_values(op):
    """A pool whose stride-1 axis has a window 1 wide (an OCR recognizer's 7x1 AveragePool) is the compiled
    kernel's, with the numpy kernel's values; a real stride-1 window stays with numpy."""
    from minfer_ops_conv import pool as numpy_pool
    from minfer_ops_numba import pool

    x = np.random.default_rng(10).standard_normal((1, 48, 7, 16)).astype(np.float32)
    attrs = {"kernel_shape": [7, 1], "strides": [7, 1]}
    t = TensorType(np.float32, x.shape)
    ctx = KernelContext("p", op, 19, (t,), (None,), (None,), 1)
    fast, ref = (pool.average_pool_19, numpy_pool.average_pool_19) if op == "AveragePool" else (
        pool.max_pool_10, numpy_pool.max_pool_10)
    assert fast.applies(ctx, attrs)
    assert not fast.applies(ctx, {"kernel_shape": [7, 2], "strides": [7, 1]})
    want = ref.prepared(ctx, attrs)(x)
    np.testing.assert_array_equal(fast.prepared(ctx, attrs)(x, out=np.empty_like(want)), want)
