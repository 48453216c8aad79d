"""minfer-ops-basic's small-tensor paths (Concat's wide-item copies, per-shape Split/Slice/Pad geometry, the
column-wise row maxima of Softmax and LogSoftmax) give the results of the plain numpy formulas."""

from __future__ import annotations

import numpy as np
import pytest

from minfer_core import KernelContext, kernels_in
from minfer_core.testing.ops import call_kernel
from minfer_ops_basic import activation, indexing, pad, shape

KERNELS = kernels_in(shape, indexing, pad)
RNG = np.random.default_rng(0)


@pytest.mark.parametrize("dtype", [np.float32, np.float64, np.int8, np.int16, np.bool_, np.complex64])
@pytest.mark.parametrize("widths", [(2, 2, 1, 4), (1, 1), (4, 3), (8,)])
def test_concat_of_narrow_pieces_is_numpys(dtype, widths):
    """Many rows of narrow pieces (copied as wide items where the width allows) join as np.concatenate does, into
    out= and a fresh array alike, bit for bit."""
    xs = [(RNG.standard_normal((2, 40, w)) * 100).astype(dtype) for w in widths]
    want = np.concatenate(xs, axis=-1)
    got = call_kernel(KERNELS, "Concat", 13, *xs, axis=-1)
    assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
    out = np.empty_like(want)
    assert shape.concat_4.fn(*xs, axis=2, out=out) is out and out.tobytes() == want.tobytes()


def test_concat_of_strided_inputs_and_nan_bits():
    """Non-contiguous inputs fall back to numpy; NaN payloads and -0.0 are copied, not canonicalised."""
    a = np.full((64, 2), np.nan, np.float32)
    a.view(np.uint32)[:, 0] = 0x7FC00001  # a NaN with a payload
    a[:, 1] = -0.0
    b = RNG.standard_normal((64, 6)).astype(np.float32)[:, ::2]
    got = shape.concat_4.fn(a, b, axis=1)
    assert got.tobytes() == np.concatenate([a, b], axis=1).tobytes()
    c = np.ascontiguousarray(b)
    assert shape.concat_4.fn(a, c, axis=-1).tobytes() == np.concatenate([a, c], axis=1).tobytes()


def test_concat_mismatched_shapes_still_fail():
    """Inputs that cannot be joined raise as before, rather than being copied as pieces."""
    with pytest.raises(ValueError):
        shape.concat_4.fn(np.zeros((64, 2), np.float32), np.zeros((63, 2), np.float32), axis=1)


def test_split_sizes_from_a_runtime_input_change_between_calls():
    """Split's per-shape index tuples are keyed by the sizes it is given at run time, not only the shape."""
    x = np.arange(2 * 9, dtype=np.float32).reshape(2, 9)
    ctx = KernelContext("s", "Split", 13, (None, None), (None, None), (None, None), 2)
    run = shape.split_13.prepared(ctx, {"axis": 1})
    first = run(x, np.array([4, 5]))
    second = run(x, np.array([7, 2]))
    assert [p.shape for p in first] == [(2, 4), (2, 5)] and [p.shape for p in second] == [(2, 7), (2, 2)]
    np.testing.assert_array_equal(second[1], x[:, 7:])
    with pytest.raises(ValueError):
        run(x, np.array([4, 4]))


def test_split_from_a_constant_input():
    """A split input that is an initializer is read at build; outputs stay views of the input."""
    x = np.arange(3 * 9, dtype=np.float32).reshape(1, 3, 9)
    ctx = KernelContext("s", "Split", 13, (None, None), (None,) * 3, (None, np.array([4, 1, 4])), 3)
    parts = shape.split_13.prepared(ctx, {"axis": -1})(x, np.array([4, 1, 4]))
    assert [p.shape for p in parts] == [(1, 3, 4), (1, 3, 1), (1, 3, 4)]
    assert all(np.shares_memory(p, x) for p in parts)


def test_slice_bounds_change_between_calls():
    """Slice's per-shape index is keyed by the bounds' values: new bounds on the same shape slice anew."""
    x = np.arange(10 * 4, dtype=np.float32).reshape(10, 4)
    one = call_kernel(KERNELS, "Slice", 13, x, np.array([1]), np.array([3]), np.array([0]))
    two = call_kernel(KERNELS, "Slice", 13, x, np.array([2]), np.array([9]), np.array([0]), np.array([3]))
    np.testing.assert_array_equal(one, x[1:3])
    np.testing.assert_array_equal(two, x[2:9:3])
    three = call_kernel(KERNELS, "Slice", 13, x, np.array([1], np.int32), np.array([3], np.int32))
    np.testing.assert_array_equal(three, x[1:3])


def test_pad_pads_change_between_calls():
    """Pad's per-shape geometry is keyed by the pads' values, into out= and fresh arrays alike."""
    x = RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)
    for pads in ([0, 0, 1, 1, 0, 0, 1, 1], [0, 0, 0, 2, 0, 0, 1, 0]):
        p = np.array(pads)
        want = np.pad(x, list(zip(p[:4], p[4:])), mode="reflect")
        got = call_kernel(KERNELS, "Pad", 13, x, p, mode="reflect")
        np.testing.assert_array_equal(got, want)
        out = np.empty_like(want)
        assert pad.pad_11.fn(x, p, np.array(2.0, np.float32), mode="constant", out=out) is out
        np.testing.assert_array_equal(out, np.pad(x, list(zip(p[:4], p[4:])), constant_values=2.0))


@pytest.mark.parametrize("cols", [1, 4, 16, 17])
def test_row_max_is_np_max(cols):
    """Softmax's row maxima column by column are np.max's, NaN included."""
    x = RNG.standard_normal((50, cols)).astype(np.float32)
    x[3, -1] = np.nan
    np.testing.assert_array_equal(activation._row_max(x), np.max(x, axis=1))


@pytest.mark.parametrize("shape_", [(1, 768, 4), (1, 16, 37), (1, 2), (3, 1)])
def test_log_softmax_rows_match_the_formula(shape_):
    """LogSoftmax along the last axis is (x - max) - log(sum(exp(x - max))) within float32 rounding."""
    x = (RNG.standard_normal(shape_) * 5).astype(np.float32)
    run = next(k for k in activation.KERNELS if k.op_type == "LogSoftmax" and k.since == 13).fn
    s = x.astype(np.float64) - x.max(axis=-1, keepdims=True)
    want = s - np.log(np.exp(s).sum(axis=-1, keepdims=True))
    np.testing.assert_allclose(run(x, axis=-1), want, rtol=1e-6, atol=1e-6)
    y = x.copy()
    np.testing.assert_allclose(run(y, axis=-1, out=y), want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("coord,rule", [("half_pixel", "round_prefer_floor"), ("asymmetric", "floor"),
                                        ("align_corners", "round_prefer_ceil"), ("pytorch_half_pixel", "ceil")])
@pytest.mark.parametrize("scales", [(1, 1, 2, 2), (1, 1, 3, 1), (1, 1, 1.5, 2), (1, 1, 0.5, 2)])
def test_resize_nearest_by_repeats_is_the_gather(coord, rule, scales):
    """Resize's cached plans (an integer nearest up-scale as one broadcast copy) give the per-axis gather's result,
    and a second call with other scales on the same shape is not served the first one's plan."""
    from minfer_ops_conv import resize

    x = RNG.standard_normal((1, 3, 4, 6)).astype(np.float32)
    sc = np.array(scales, np.float32)
    attrs = {"mode": "nearest", "coordinate_transformation_mode": coord, "nearest_mode": rule}
    got = resize.resize_11.fn(x, None, sc, **attrs)
    sizes = [int(np.floor(n * s)) for n, s in zip(x.shape, sc.tolist())]
    want = resize.resize_nd(x, sc.tolist(), sizes, None, mode="nearest", coord_mode=coord, nearest_mode=rule)
    assert got.shape == want.shape and got.flags.c_contiguous
    np.testing.assert_array_equal(got, want)
    other = resize.resize_11.fn(x, None, np.array([1, 1, 2, 3], np.float32), **attrs)
    assert other.shape == (1, 3, 8, 18)
