"""minfer-ops-numba's lean paths for the small models' nodes give the bits of the general paths: 2-wide max pools
(`max_pairs`, `max_flat`'s last pass), narrow strided inputs copied as wide items (`_jit.contiguous`), Softmax rows
computed without asking for threads, small nearest Resizes compiled."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import KernelContext, TensorType, get_registry  # noqa: E402
from minfer_ops_numba import _jit, elementwise, loops, pool_loops, resize, rows  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py

RNG = np.random.default_rng(11)


def _odd_values(shape: tuple[int, ...]) -> np.ndarray:
    """Normal floats with signed zeros side by side (a max's ties) and a NaN with a payload in the second plane."""
    x = RNG.standard_normal(shape).astype(np.float32)
    x[:, :3, :4] = -1.0  # windows whose maxima are the zeros of their first row: +0 against -0 decides
    x[:, 0, :4] = [0.0, -0.0, -0.0, 0.0][: min(4, shape[2])]
    if shape[1] > 1:  # windows of zeros alone: +0 against -0 down the columns too
        x[:, 0:2, 4:8] = np.array([[0.0, -0.0, 0.0, -0.0], [-0.0, 0.0, 0.0, -0.0]])[:, : max(0, shape[2] - 4)]
    x.reshape(-1)[7::29] = -0.0
    if shape[0] > 1:
        x[1, 0, 1] = np.nan
        x.view(np.uint32)[1, 0, 1] = 0x7FC00123
    return x


MAX_2WIDE = [  # (planes, H, W), kh, ph, pw: 2-wide windows at stride 2 (`max_pairs` where 2x2 ones tile the rows)
    ((48, 14, 32), 2, 0, 0),  # an OCR recognizer's
    ((300, 8, 8), 2, 0, 0),  # more planes than `max_pairs` takes in one pass
    ((3, 4, 5), 2, 0, 0),  # a column no window reads
    ((3, 15, 33), 2, 0, 0),  # a row no window reads: `max_flat`
    ((4, 9, 9), 2, 1, 1),
    ((2, 10, 11), 3, 1, 0),
    ((5, 8, 40), 1, 0, 1),
    ((2, 2, 2), 2, 0, 0),
]


@pytest.mark.parametrize("shape, kh, ph, pw", MAX_2WIDE)
def test_two_wide_max_pool_gives_the_row_loops_bits(shape, kh, ph, pw):
    """A max pool two columns wide at stride 2 gives loops.pool_rows' bits: ties between +0 and -0 keep the
    earlier tap, a plane holding a NaN comes out as pool_rows makes it."""
    x = _jit.readonly(_odd_values(shape))
    oh, ow = (shape[1] + 2 * ph - kh) // 2 + 1, (shape[2] + 2 * pw - 2) // 2 + 1
    got, want = np.empty((shape[0], oh, ow), np.float32), np.empty((shape[0], oh, ow), np.float32)
    geo = (kh, 2, 2, 2, ph, pw, 1, 1)
    pool_loops.pool_planes(x, got, True, _jit.readonly(np.zeros((0, 0), np.float32)), 0, shape[0], *geo)
    loops.pool_rows(x, want, True, 0, shape[0], *geo)
    assert got.tobytes() == want.tobytes()
    got[:] = 7.0  # planes 1.. only: plane 0 untouched
    pool_loops.pool_planes(x, got, True, _jit.readonly(np.zeros((0, 0), np.float32)), 1, shape[0], *geo)
    assert got[1:].tobytes() == want[1:].tobytes() and (got[0] == 7.0).all()


@pytest.mark.parametrize("width, dtype", [(1, np.float32), (2, np.float32), (4, np.float32), (3, np.float32),
                                          (2, np.float64), (8, np.int16)])
def test_contiguous_copies_narrow_rows_bit_for_bit(width, dtype):
    """A view of a few columns (a Split's output) comes back C-contiguous with every bit, NaN payloads and -0 too;
    a C-contiguous array comes back as itself."""
    whole = (RNG.standard_normal((2, 50, 9)) * 100).astype(dtype)
    if dtype == np.float32:
        whole.view(np.uint32)[0, ::3, :] = 0x7FC00001
        whole[1, ::5, :] = -0.0
    for start in (0, 1, 9 - width):
        view = whole[:, :, start:start + width]
        got = _jit.contiguous(view)
        assert got.flags.c_contiguous and got.shape == view.shape and got.dtype == view.dtype
        assert got.tobytes() == np.ascontiguousarray(view).tobytes()
    same = np.ascontiguousarray(whole)
    assert _jit.contiguous(same) is same


def _context(op_type: str, x: np.ndarray, opset: int = 13) -> KernelContext:
    return KernelContext("node", op_type, opset, (TensorType(x.dtype, x.shape),), (None,), (None,), 1)


@pytest.mark.parametrize("op_type, kern", [("Softmax", rows.softmax_13), ("LogSoftmax", rows.log_softmax_13)])
@pytest.mark.parametrize("cols", [1, 2, 4, 15, 16, 37])
def test_softmax_of_a_narrow_view_gives_the_contiguous_rows_bits(op_type, kern, cols):
    """Softmax and LogSoftmax of a strided view (a detector's [1, 768, 4] of [1, 768, 9]) give the bits of the same
    rows made contiguous first."""
    whole = (RNG.standard_normal((1, 96, cols + 5)) * 4).astype(np.float32)
    view = whole[:, :, 3:3 + cols]
    run = kern.prepared(_context(op_type, view), {})
    contiguous = np.ascontiguousarray(view)
    assert run(view).tobytes() == run(contiguous).tobytes()
    out = np.empty(view.shape, np.float32)
    assert run(view, out=out) is out and out.tobytes() == run(contiguous).tobytes()


@pytest.mark.parametrize("op_type, kern, log", [("Softmax", rows.softmax_13, False),
                                                ("LogSoftmax", rows.log_softmax_13, True)])
def test_softmax_rows_on_either_side_of_the_split_size_give_the_same_bits(op_type, kern, log):
    """Below the least size that may split (computed at once, no thread asked) and from it on (through `_spread`),
    the rows give `_rows`' bits."""
    least = min(rows.TEAM_SPLIT_ELEMENTS, rows.SPLIT_ELEMENTS)
    for count in (least // 8 - 1, least // 8, least // 8 + 1, 1):
        x = RNG.standard_normal((count, 8)).astype(np.float32)
        want = np.empty(x.size, np.float32)
        rows._rows(_jit.readonly(x).reshape(-1), want, 8, 0, count, log)
        got = kern.prepared(_context(op_type, x), {})(x)
        assert got.tobytes() == want.tobytes()


def test_fused_elementwise_of_narrow_views_gives_the_contiguous_bits():
    """A fused program on a Split's narrow outputs (strided views) gives the bits it gives on contiguous copies."""
    whole = RNG.standard_normal((1, 768, 9)).astype(np.float32)
    a, b = whole[:, :, 0:2], whole[:, :, 2:4]
    types = (TensorType(a.dtype, a.shape), TensorType(b.dtype, b.shape))
    ctx = KernelContext("node", elementwise.OP, 1, types, (None,), (None, None), 1)
    attrs = dict(ops=["Mul", "Add"], args=[0, 1, -1, 2, 0, -1])
    run = elementwise.fused_elementwise.prepared(ctx, attrs)
    want = run(np.ascontiguousarray(a), np.ascontiguousarray(b))
    np.testing.assert_array_equal(want, a * b + a)
    assert run(a, b).tobytes() == want.tobytes()



NEAREST = [  # shape, scales, sizes
    ((1, 16, 8, 8), [1, 1, 2, 2], None),  # a detector's FPN upsampling
    ((2, 3, 7, 9), [1, 1, 3, 1.5], None),
    ((2, 3, 7, 9), [1, 1, 0.6, 0.5], None),  # down
    ((1, 4, 5, 6), None, [1, 4, 11, 4]),
    ((1, 2, 1, 5), None, [1, 2, 1, 1]),  # a length-1 output
]


@pytest.mark.parametrize("shape, scales, sizes", NEAREST)
@pytest.mark.parametrize("coordinates", ["asymmetric", "half_pixel", "align_corners", "pytorch_half_pixel"])
@pytest.mark.parametrize("rounding", ["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
def test_small_nearest_resize_gives_numpys_bits(shape, scales, sizes, coordinates, rounding):
    """A small nearest Resize, compiled, copies the cells the numpy kernel copies (NaN payloads and -0 too)."""
    x = RNG.standard_normal(shape).astype(np.float32)
    x.view(np.uint32).reshape(-1)[::7] = 0x7FC00321
    x.reshape(-1)[1::5] = -0.0
    sc = np.array(scales or [], np.float32)
    inputs = [x, None, sc] + ([] if sizes is None else [np.array(sizes, np.int64)])
    types = tuple(None if a is None else TensorType(a.dtype, a.shape) for a in inputs)
    ctx = KernelContext("node", "Resize", 13, types, (None,), (None, *inputs[1:]), 1)
    attrs = dict(mode="nearest", coordinate_transformation_mode=coordinates, nearest_mode=rounding)
    assert resize.resize_11.applies(ctx, attrs)
    numpy_kernel = [k for k in get_registry().kernel_candidates("", "Resize", 13, "numpy", ctx, attrs)
                    if k.plugin != "minfer-ops-numba"][0]
    want = numpy_kernel.prepared(ctx, attrs)(*inputs)
    got = resize.resize_11.prepared(ctx, attrs)(*inputs, out=np.empty_like(want))
    assert got.shape == want.shape and got.tobytes() == want.tobytes()
