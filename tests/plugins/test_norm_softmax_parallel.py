"""Softmax, LogSoftmax, LayerNormalization and RMSNormalization by blocks of rows over the intra-op threads.

The blocked row path must give the same bits with one thread and two, the same
values through ``out=`` (and in place) as allocating, and the float64 formula's
values within float tolerance, on odd shapes and on the rows the fast Softmax
hands back to the shifted formula (large, very negative, inf, nan).
"""

from __future__ import annotations

import numpy as np
import pytest

from minfer_core import get_registry
from minfer_core.parallel import using_threads
from minfer_ops_basic import activation, nn
from minfer_ops_basic.activation import SPLIT_ROWS
from minfer_ops_basic.elementwise import SPLIT_COSTLY, erf32
from modelkit import spy_parallel_for

RNG = np.random.default_rng(0)
SPLIT_SHAPE = (3, 5, 97, 91)  # 132k elements, past SPLIT_ROWS; 1455 rows, an odd count
assert np.prod(SPLIT_SHAPE) >= SPLIT_ROWS


@pytest.fixture
def splits(monkeypatch):
    """Records every parallel_for the row kernels make (how many blocks)."""
    return spy_parallel_for(monkeypatch, activation)


def _kernel(op: str, opset: int):
    return get_registry().select_kernel("", op, opset).fn


def _same_ways(run, x, *rest, inplace=False, **attrs):
    """run serially allocating, serially and with two threads into out= (and into x when inplace): same bits."""
    first = run(x, *rest, **attrs)
    y = first[0] if isinstance(first, tuple) else first
    for threads in (1, 2):
        with using_threads(threads):
            out = np.empty_like(y)
            got = run(x, *rest, out=out, **attrs)
            assert (got[0] if isinstance(got, tuple) else got) is out
            np.testing.assert_array_equal(out, y)
            if isinstance(first, tuple):
                for a, b in zip(got[1:], first[1:]):
                    np.testing.assert_array_equal(a, b)
            if inplace:
                own = x.copy()
                assert run(own, *rest, out=own, **attrs) is own
                np.testing.assert_array_equal(own, y)
    return first


def _softmax64(x, axis):
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / e.sum(axis=axis, keepdims=True)


def _flat_softmax64(x, axis, log=False):
    """The opset < 13 rule: softmax over the 2-D coercion at axis."""
    rows = x.reshape(int(np.prod(x.shape[:axis])), -1).astype(np.float64)
    y = _softmax64(rows, 1)
    return (np.log(y) if log else y).reshape(x.shape)


@pytest.mark.parametrize("scale", [1.0, 4.0, 60.0])
def test_softmax_rows_split_over_threads_match_float64(splits, scale):
    """Softmax-13 over the last axis of a large odd tensor: split, identical across threads and out=, accurate."""
    x = (RNG.standard_normal(SPLIT_SHAPE) * scale).astype(np.float32)
    y = _same_ways(_kernel("Softmax", 13), x, inplace=True)
    assert splits and all(n >= 2 for n in splits)
    np.testing.assert_allclose(y, _softmax64(x.astype(np.float64), -1), rtol=2e-6, atol=1e-9)


def test_softmax_rows_that_need_the_shift():
    """Rows with huge, very negative, -inf and nan scores give what the shifted formula gives, exactly."""
    x = RNG.standard_normal((6, 300, 75)).astype(np.float32)
    x[0, :7] += 200  # exp overflows unshifted
    x[1, 3] -= 300  # every exp underflows unshifted
    x[2, 5, ::2] = -np.inf  # masked keys: zeros, the rest still a distribution
    x[3, 9] = -np.inf  # a fully masked row: nan, as onnxruntime
    x[4, 11, 4] = np.nan
    x[5] -= 40  # every row sum of exp is below 1 (but a normal float)
    x[5, 17] += np.inf  # a row of +inf: nan
    y = _same_ways(_kernel("Softmax", 13), x, inplace=True)
    with np.errstate(invalid="ignore"):
        want = _softmax64(x.astype(np.float64), -1)
    np.testing.assert_allclose(y, want, rtol=2e-6, atol=1e-9)
    nan_rows = np.isnan(y).all(axis=-1)
    assert nan_rows[3, 9] and nan_rows[4, 11] and nan_rows[5, 17] and nan_rows.sum() == 3
    assert not np.isnan(y[5, :17]).any()
    assert (y[2, 5, ::2] == 0).all()


@pytest.mark.parametrize("opset", [1, 13])
def test_softmax_long_rows_shift_by_their_maximum(opset):
    """Classifier rows (1000 classes) with logits that overflow exp, -inf and nan rows: the float64 formula's values."""
    x = (RNG.standard_normal((4, 1000)) * 300).astype(np.float32)  # a random-weight classifier's logits
    x[1, ::3] = -np.inf
    x[2] = -np.inf  # nan, as onnxruntime
    x[3, 10] = np.nan
    assert x.shape[1] >= activation.LONG_ROW
    y = _same_ways(_kernel("Softmax", opset), x, inplace=True, axis=1)
    with np.errstate(invalid="ignore"):
        want = _softmax64(x.astype(np.float64), -1)
    np.testing.assert_allclose(y, want, rtol=2e-6, atol=1e-9)
    assert np.isnan(y[2]).all() and np.isnan(y[3]).all() and not np.isnan(y[:2]).any()


@pytest.mark.parametrize("shape,axis", [((7,), 0), ((2, 3), -1), ((4, 1, 5), 1), ((2, 3, 4, 5), 2), ((1, 1, 1), -1)])
def test_softmax_odd_shapes_and_axes(shape, axis):
    """Tiny tensors and axes that are not the last: same values as the float64 formula, out= as allocating."""
    x = RNG.standard_normal(shape).astype(np.float32)
    y = _same_ways(_kernel("Softmax", 13), x, inplace=True, axis=axis)
    np.testing.assert_allclose(y, _softmax64(x.astype(np.float64), axis), rtol=2e-6, atol=1e-9)


@pytest.mark.parametrize("axis", [0, 1, 2, 3])
@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax"])
def test_old_opset_coerces_to_2d(op, axis):
    """Softmax-1 / LogSoftmax-1 normalize over the 2-D coercion at axis (not along one axis), split or not."""
    x = RNG.standard_normal(SPLIT_SHAPE).astype(np.float32)
    y = _same_ways(_kernel(op, 11), x, inplace=True, axis=axis)
    want = _flat_softmax64(x, axis, log=op == "LogSoftmax")
    np.testing.assert_allclose(y, want, rtol=2e-6, atol=2e-6 if op == "LogSoftmax" else 1e-9)


def test_log_softmax_rows_split_over_threads(splits):
    """LogSoftmax-13 over the last axis of a large tensor goes by blocks too, with the serial bits."""
    x = (RNG.standard_normal(SPLIT_SHAPE) * 5).astype(np.float32)
    y = _same_ways(_kernel("LogSoftmax", 13), x, inplace=True)
    assert splits
    want = np.log(_softmax64(x.astype(np.float64), -1))
    np.testing.assert_allclose(y, want, rtol=2e-6, atol=4e-6)


@pytest.mark.parametrize("dtype,rtol", [(np.float64, 1e-13), (np.float16, 6e-3)])
def test_softmax_other_float_types(dtype, rtol):
    """float64 takes the row path at full precision; float16 keeps its native path; both keep their dtype."""
    x = RNG.standard_normal((40, 33, 100)).astype(dtype)
    y = _same_ways(_kernel("Softmax", 13), x, inplace=True)
    assert y.dtype == dtype
    np.testing.assert_allclose(y.astype(np.float64), _softmax64(x.astype(np.float64), -1), rtol=rtol, atol=1e-4 * rtol)


# --- LayerNormalization / RMSNormalization ------------------------------------------------


def _layer_norm64(x, scale, b, axis, eps):
    axes = tuple(range(axis % x.ndim, x.ndim))
    x = x.astype(np.float64)
    mean = x.mean(axis=axes, keepdims=True)
    inv = 1 / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + eps)
    y = (x - mean) * inv * scale.astype(np.float64)
    return (y if b is None else y + b.astype(np.float64)), mean, inv


@pytest.mark.parametrize("shape,axis,bias", [
    (SPLIT_SHAPE, -1, True), (SPLIT_SHAPE, 2, True), ((1100, 130), -1, False), ((2, 3, 4), 0, True),
    ((1, 1, 7), -1, True), ((5, 1), -1, True),
])  # fmt: skip
def test_layer_norm_rows_match_float64_and_threads(splits, monkeypatch, shape, axis, bias):
    """LayerNormalization's Y, Mean and InvStdDev: serial bits with two threads and out=, float64 values."""
    monkeypatch.setattr(nn, "SPLIT_NORM", SPLIT_ROWS)  # split from where Softmax splits, to test that path
    x = (RNG.standard_normal(shape) * 3 + 2).astype(np.float32)
    norm = shape[axis % len(shape):]
    scale = RNG.standard_normal(norm).astype(np.float32)
    b = RNG.standard_normal(norm).astype(np.float32) if bias else None
    args = (scale, b) if bias else (scale,)
    y, mean, inv = _same_ways(_kernel("LayerNormalization", 17), x, *args, axis=axis, epsilon=1e-3)
    want_y, want_mean, want_inv = _layer_norm64(x, scale, b, axis, 1e-3)
    assert mean.shape == inv.shape == want_mean.shape and mean.dtype == inv.dtype == np.float32
    np.testing.assert_allclose(y, want_y, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mean, want_mean, rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(inv, want_inv, rtol=1e-6)
    assert bool(splits) == (x.size >= SPLIT_ROWS)


def test_layer_norm_broadcast_scale_and_other_types():
    """A scale broadcast over the normalized axes, float64 input, float16 input (float32 stash) and a float64 stash."""
    x = RNG.standard_normal((6, 5, 8)).astype(np.float32)
    scale, b = RNG.standard_normal((1, 8)).astype(np.float32), RNG.standard_normal(8).astype(np.float32)
    ln = _kernel("LayerNormalization", 17)
    y, _, _ = _same_ways(ln, x, scale, b, axis=1)
    np.testing.assert_allclose(y, _layer_norm64(x, scale, b, 1, 1e-5)[0], rtol=1e-5, atol=1e-5)
    y64, mean64, _ = _same_ways(ln, x.astype(np.float64), scale.astype(np.float64), b.astype(np.float64), stash_type=11)
    assert y64.dtype == mean64.dtype == np.float64
    np.testing.assert_allclose(y64, _layer_norm64(x, scale, b, -1, 1e-5)[0], rtol=1e-12, atol=1e-12)
    y16, mean16, _ = _same_ways(ln, x.astype(np.float16), scale.astype(np.float16), b.astype(np.float16))
    assert (y16.dtype, mean16.dtype) == (np.float16, np.float32)
    np.testing.assert_allclose(y16, _layer_norm64(x.astype(np.float16), scale, b, -1, 1e-5)[0], rtol=5e-3, atol=5e-3)
    y_wide, mean_wide, _ = _same_ways(ln, x, scale[0], b, stash_type=11)  # float32 x, float64 stash
    assert (y_wide.dtype, mean_wide.dtype) == (np.float32, np.float64)
    np.testing.assert_allclose(y_wide, _layer_norm64(x, scale[0], b, -1, 1e-5)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape,axis", [(SPLIT_SHAPE, -1), ((1100, 130), 1), ((3, 4, 5), 1), ((1, 3), -1)])
def test_rms_norm_rows_match_float64_and_threads(splits, monkeypatch, shape, axis):
    """RMSNormalization-23 by blocks: serial bits with two threads and out=, the float64 formula's values."""
    monkeypatch.setattr(nn, "SPLIT_NORM", SPLIT_ROWS)
    x = RNG.standard_normal(shape).astype(np.float32)
    scale = RNG.standard_normal(shape[axis % len(shape):]).astype(np.float32)
    y = _same_ways(_kernel("RMSNormalization", 23), x, scale, axis=axis)
    axes = tuple(range(axis % len(shape), len(shape)))
    x64 = x.astype(np.float64)
    want = x64 / np.sqrt((x64 * x64).mean(axis=axes, keepdims=True) + 1e-5) * scale
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)
    assert bool(splits) == (x.size >= SPLIT_ROWS)


# --- Gelu ----------------------------------------------------------------------------------


@pytest.mark.parametrize("block", [1000, 1 << 18])
def test_gelu_blocks_give_the_erf32_formula_bits(monkeypatch, block):
    """Gelu-20 (float32) by blocks, split or not, in place or not: the bits of x * sqrt(1/2), erf32, +1, *x, *0.5."""
    monkeypatch.setattr(activation, "GELU_BLOCK", block)
    x = (RNG.standard_normal((3, SPLIT_COSTLY // 3 + 7)) * 3).astype(np.float32)
    x[0, :4] = [np.inf, -np.inf, np.nan, 0.0]
    want = np.multiply(x, np.float32(np.sqrt(0.5)))
    erf32(want, want)
    want += np.float32(1.0)
    with np.errstate(invalid="ignore"):  # -inf: erf + 1 is 0, times -inf is nan (the formula's own value)
        want *= x
    want *= np.float32(0.5)
    y = _same_ways(_kernel("Gelu", 20), x, inplace=True)
    np.testing.assert_array_equal(y, want)
    small = x[:, :37].copy()  # one short block, no split
    np.testing.assert_array_equal(_same_ways(_kernel("Gelu", 20), small, inplace=True), want[:, :37])


def test_strided_inputs_and_outputs_are_written_whole():
    """A transposed input and a strided out= (never from the engine, but legal to pass) give the contiguous result."""
    x = RNG.standard_normal((40, 64)).astype(np.float32)
    scale, b = RNG.standard_normal(40).astype(np.float32), RNG.standard_normal(40).astype(np.float32)
    cases = [(_kernel("Softmax", 13), (x.T,)), (_kernel("Gelu", 20), (x.T,)),
             (_kernel("LayerNormalization", 17), (x.T, scale, b)), (_kernel("RMSNormalization", 23), (x.T, scale))]
    for fn, args in cases:
        want = fn(*(np.ascontiguousarray(a) for a in args))
        want = want[0] if isinstance(want, tuple) else want
        out = np.zeros((64, 80), np.float32)[:, ::2]
        got = fn(*args, out=out)
        assert (got[0] if isinstance(got, tuple) else got) is out
        np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-6)  # (the whole-array path's rounding)
