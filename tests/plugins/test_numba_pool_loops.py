"""pool_loops.py: the flat MaxPool and AveragePool loops (strides of 2) give loops.pool_rows' bits."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_ops_numba import loops, pool, pool_loops  # noqa: E402
from minfer_ops_numba._jit import readonly  # noqa: E402
from minfer_ops_numba.window import window  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")

NO_SCALE = readonly(np.zeros((0, 0), np.float32))
SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf], np.float32)


def planes(shape, rng, nan_plane=None):
    """Planes full of ties (signed zeros, infinities), where only the tie order decides the bits; one plane with
    a NaN when asked."""
    x = rng.choice(SPECIALS, size=shape).astype(np.float32)
    if nan_plane is not None:
        x[nan_plane, 5, 21] = np.nan
    return readonly(x)


def pooled(fn, x, geometry):
    """y from one of the loops for geometry (kh, kw, sh, pads, dh, ceil_mode), over all planes."""
    (kh, kw), sh, pads, dh, ceil = geometry
    w = window(x.shape[1:], (kh, kw), (sh, 2), (dh, 1), pads, "NOTSET", ceil)
    y = np.full((x.shape[0],) + w.out_shape, 7.0, np.float32)
    args = (kh, kw, sh, 2, w.begin[0], w.begin[1], dh, 1)
    if fn is loops.pool_rows:
        fn(x, y, True, 0, x.shape[0], *args)
    else:
        fn(x, y, True, NO_SCALE, 0, x.shape[0], *args)
    return y


GEOMETRIES = [((kh, kw), sh, [ph, pw, ph + e, pw + e], dh, ceil)
              for kh, kw, sh, ph, pw, e, dh, ceil in itertools.product(
                  (1, 2, 3, 5), (1, 2, 3, 4), (1, 2, 3), (0, 1), (0, 1, 2), (0, 1), (1, 2), (0, 1))
              if ph < kh and pw < kw]


@pytest.mark.parametrize("size", [(5, 7), (9, 11), (12, 40), (13, 67)])
def test_flat_max_gives_pool_rows_bits(size):
    """Every geometry with a column stride of 2 (kernels 1-5, row strides 1-3, pads, ceil_mode, row dilation, odd
    and even sizes, rows shorter and longer than a vector, the array's first and last rows) gives pool_rows'
    bits, signed zeros included (the earlier tap wins a tie): max_flat's, and pool_rows' own where it leaves
    them."""
    rng = np.random.default_rng(sum(size))
    x = planes((3,) + size, rng)
    for geometry in GEOMETRIES:
        got, want = pooled(pool_loops.pool_planes, x, geometry), pooled(loops.pool_rows, x, geometry)
        assert got.tobytes() == want.tobytes(), geometry


@pytest.mark.parametrize("plane", [0, 2])
def test_flat_max_lets_nan_win(plane):
    """A NaN in a window makes its max NaN, as np.maximum (the plane is pooled again NaN-aware); the other planes
    keep their bits."""
    x = planes((3, 12, 23), np.random.default_rng(plane), nan_plane=plane)
    geometry = ((3, 3), 2, [1, 1, 1, 1], 1, 0)
    got = pooled(pool_loops.pool_planes, x, geometry)
    assert np.isnan(got[plane]).sum() == 4  # x[5, 21] is in the windows of outputs (2 and 3, 10 and 11)
    assert got.tobytes() == pooled(loops.pool_rows, x, geometry).tobytes()


def averaged(fn, x, geometry, include_pad):
    """y from one of the loops for an AveragePool of geometry (as `pooled`), its 1/count as pool.py makes it."""
    (kh, kw), sh, pads, dh, ceil = geometry
    w = window(x.shape[1:], (kh, kw), (sh, 2), (dh, 1), pads, "NOTSET", ceil)
    scale = pool._scale(pool._counts(x.shape[1:], w, (kh, kw), (sh, 2), (dh, 1), include_pad))
    y = np.full((x.shape[0],) + w.out_shape, 7.0, np.float32)
    args = (kh, kw, sh, 2, w.begin[0], w.begin[1], dh, 1)
    if fn is loops.pool_rows:
        fn(x, y, False, 0, x.shape[0], *args)
        loops.scale_planes(y, scale, 0, x.shape[0])
    else:
        fn(x, y, False, scale, 0, x.shape[0], *args)
    return y


@pytest.mark.parametrize("size", [(5, 7), (9, 11), (12, 40), (13, 67)])
@pytest.mark.parametrize("include_pad", [False, True])
def test_flat_mean_gives_pool_rows_bits(size, include_pad):
    """AveragePool gives pool_rows' then scale_planes' bits for every geometry (as the max's test), infinities
    included: the same sums in the same order, the pads' taps adding +0. NaN where they give NaN (LLVM may swap
    an addition's operands, so which NaN comes out of inf - inf + NaN is neither's promise)."""
    rng = np.random.default_rng(sum(size) + include_pad)
    x = rng.standard_normal((3,) + size).astype(np.float32)
    x.reshape(-1)[::23] = rng.choice(SPECIALS, size=x.reshape(-1)[::23].size)
    x.reshape(-1)[::97] = np.nan
    x = readonly(x)
    for geometry in GEOMETRIES:
        got = averaged(pool_loops.pool_planes, x, geometry, include_pad)
        want = averaged(loops.pool_rows, x, geometry, include_pad)
        assert np.array_equal(np.isnan(got), np.isnan(want)), geometry
        assert got[~np.isnan(got)].tobytes() == want[~np.isnan(want)].tobytes(), geometry
