"""minfer-ops-numba's DynamicQuantizeLinear gives minfer-ops-basic's results, and competes with it per node."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import KernelContext, TensorType, get_registry  # noqa: E402
from minfer_ops_basic import cast  # noqa: E402
from minfer_ops_numba import dynamic_quant  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


def _ctx(shape, dtype=np.float32):
    t = TensorType(dtype, shape)
    return KernelContext("dq", "DynamicQuantizeLinear", 11, (t,), (None, None, None), (None,), 3)


def _inputs():
    rng = np.random.default_rng(4)
    yield rng.standard_normal((2, 3, 17, 19)).astype(np.float32) * 5
    yield np.abs(rng.standard_normal((1000,))).astype(np.float32)  # all positive: zero point 0
    yield -np.abs(rng.standard_normal((7, 9))).astype(np.float32)  # all negative: zero point 255
    yield np.zeros((4, 4), np.float32)  # hi == lo: scale 1/255
    steps = np.float32(0.02)
    yield (np.arange(-300, 300, dtype=np.float32) + 0.5) * steps  # many values near .5 of a step: ties
    yield np.array([-0.0, 0.0, -0.0], np.float32)


@pytest.mark.parametrize("size", [1, 15, 16, 63, 64, 65, 129, 1000, 100_003])
def test_value_range_is_numpys_min_and_max(size):
    """`value_range`'s one pass gives np.min's and np.max's values at every length around its vectors (16 lanes,
    four in flight: 64 a step) and its tail; a NaN anywhere (first, middle, a vector's last lane, the tail's last)
    is NaN in both; an infinity is the min or the max; a non-contiguous array is read as its values."""
    rng = np.random.default_rng(size)
    x = (rng.standard_normal(size) * 100).astype(np.float32)
    assert dynamic_quant.value_range(x) == (x.min(), x.max())
    for at in sorted({0, size // 2, min(size - 1, 63), size - 1}):
        for special in (np.nan, np.inf, -np.inf):
            y = x.copy()
            y[at] = special
            mn, mx = dynamic_quant.value_range(y)
            if np.isnan(special):
                assert np.isnan(mn) and np.isnan(mx)
            else:
                assert (mn, mx) == (y.min(), y.max()) and np.inf in (abs(mn), abs(mx))
    if size > 2:
        grid = x[: size - size % 2].reshape(-1, 2)[:, ::-1]  # a strided view
        assert dynamic_quant.value_range(grid) == (grid.min(), grid.max())


@pytest.mark.parametrize("x", list(_inputs()), ids=["normal", "positive", "negative", "zeros", "ties", "signed-zeros"])
def test_same_results_as_minfer_ops_basic(x):
    """y, scale and zero point equal minfer-ops-basic's kernel's exactly."""
    run = dynamic_quant.dynamic_quantize_linear.prepared(_ctx(x.shape), {})
    for got, want in zip(run(x), cast.dynamic_quantize_linear.fn(x)):
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
def test_nan_and_infinities_take_the_numpy_formula(special):
    """A tensor holding NaN or an infinity gives what minfer-ops-basic's kernel gives (its formula, not the loop)."""
    x = np.array([1.0, -2.0, special, 3.0], np.float32)
    run = dynamic_quant.dynamic_quantize_linear.prepared(_ctx(x.shape), {})
    with np.errstate(invalid="ignore"):
        want = cast.dynamic_quantize_linear.fn(x)
    for got, expected in zip(run(x), want):
        np.testing.assert_array_equal(got, expected)


def test_an_empty_tensor():
    """No element: scale and zero point as minfer-ops-basic's kernel makes them, y empty."""
    x = np.zeros((0, 3), np.float32)
    run = dynamic_quant.dynamic_quantize_linear.prepared(_ctx(x.shape), {})
    for got, want in zip(run(x), cast.dynamic_quantize_linear.fn(x)):
        np.testing.assert_array_equal(got, want)


def test_applies_to_float32_and_is_timed_against_numpy():
    """float32 nodes offer the compiled kernel and numpy's; a float16 node only numpy's."""
    found = get_registry().kernel_candidates("", "DynamicQuantizeLinear", 11, "numpy", _ctx((2, 2)), {})
    assert [k.fn for k in found] == [dynamic_quant.dynamic_quantize_linear.fn, cast.dynamic_quantize_linear.fn]
    assert not dynamic_quant.dynamic_quantize_linear.applies(_ctx((2, 2), np.float16), {})


def test_scale_and_zero_point_is_minfer_ops_basic_s():
    """The formula the quantized conv kernels use for a dynamic input's [min, max] (instead of a ~26 us kernel call on
    the two values) gives minfer-ops-basic's kernel's scale and zero point, bit for bit: all-negative ranges (where
    the zero point's float32 quotient can pass 255 before the clip), all-positive, empty ones and random ones."""
    from minfer_ops_basic.cast import dynamic_quantize_linear as basic
    from minfer_ops_numba.dynamic_quant import scale_and_zero_point

    rng = np.random.default_rng(9)
    pairs = [(-3.0, -1.0), (-1e-3, -1e-7), (-7.77, 0.0), (0.0, 0.0), (2.0, 5.0), (0.0, 1e-30), (-1e30, 1e30)]
    pairs += [tuple(sorted(rng.standard_normal(2) * 10 ** rng.uniform(-6, 6, 2))) for _ in range(500)]
    for mn, mx in pairs:
        x = np.array([mn, mx], np.float32)
        _, scale, zp = basic(x)
        got = scale_and_zero_point(x.min(), x.max())
        assert got[0].tobytes() == np.float32(scale).tobytes() and float(got[1]) == float(zp), (mn, mx)


def test_grid_operands_compiled_are_the_formulas():
    """The compiled scale, zero point and factor the dynamic quantized convs take (`grid_operands`, qdepthwise.py's
    `dynamic_operands`) are `scale_and_zero_point`'s and the float32 product's, bit for bit, on the same ranges."""
    from minfer_ops_numba.dynamic_quant import grid_operands, scale_and_zero_point

    rng = np.random.default_rng(10)
    pairs = [(-3.0, -1.0), (-1e-3, -1e-7), (-7.77, 0.0), (0.0, 0.0), (2.0, 5.0), (0.0, 1e-30), (-1e30, 1e30)]
    pairs += [tuple(sorted(rng.standard_normal(2) * 10 ** rng.uniform(-6, 6, 2))) for _ in range(500)]
    for mn, mx in pairs:
        lo, hi = np.float32(mn), np.float32(mx)
        weight = np.float32(rng.uniform(1e-5, 1.0))
        quant, m = np.full(4, np.nan, np.float32), np.full(1, np.nan, np.float32)
        grid_operands(lo, hi, weight, quant, m)
        scale, zp = scale_and_zero_point(lo, hi)
        want = np.array([scale, -zp, np.float32(255) - zp, 0], np.float32)
        assert quant.tobytes() == want.tobytes() and m.tobytes() == np.float32(scale * weight).tobytes(), (mn, mx)


@pytest.mark.parametrize("special", [None, np.nan, -np.inf], ids=["finite", "nan", "minus-infinity"])
def test_value_range_on_a_team_is_the_one_pass_range(monkeypatch, special):
    """From TEAM_RANGE values, inside a run's two threads, the range is taken in two parts by a native team and
    folded: np.min's and np.max's values, the extreme or a NaN found in the second part as in the first."""
    from minfer_core.parallel import using_threads
    from minfer_ops_numba import team

    if not team.available():
        pytest.skip("no native team here (MINFER_NUMBA_TEAM=0, or numba's threading layer is not OpenMP/TBB)")
    rng = np.random.default_rng(9)
    x = (rng.standard_normal(dynamic_quant.TEAM_RANGE + 1001) * 4).astype(np.float32)
    x[-7] = -50.0 if special is None else special  # in the second part
    x[3] = 60.0
    dynamic_quant.warm_range()
    calls = []
    real = dynamic_quant._range_team
    monkeypatch.setattr(dynamic_quant, "_range_team", lambda *a: calls.append(1) or real(*a))
    with using_threads(2):
        mn, mx = dynamic_quant.value_range(x)
    assert calls == [1]
    if special is np.nan:
        assert np.isnan(mn) and np.isnan(mx)
    else:
        assert (mn, mx) == (x.min(), x.max()) == (np.float32(-50.0 if special is None else special), 60.0)


@pytest.mark.parametrize("size", [1, 2], ids=["one-thread", "team-of-two"])
@pytest.mark.parametrize("special", [None, np.nan, np.inf], ids=["finite", "nan", "infinity"])
def test_dynamic_grid_is_the_range_then_its_grid(size, special):
    """`dynamic_grid` (the range and its grid in one compiled call, on one thread or a team's two parts) gives the
    bytes `value_range` then `grid_operands` give, and None where the range is not finite (a NaN or an infinity in
    either part), whatever the values' sizes and signs."""
    from minfer_ops_numba.dynamic_quant import dynamic_grid, grid_operands

    rng = np.random.default_rng(11)
    dynamic_quant.warm_range()
    for count, at in ((1, 0), (37, 20), (dynamic_quant.TEAM_RANGE + 999, -5), (dynamic_quant.TEAM_RANGE * 2, 3)):
        for spread in (1e-3, 1.0, 300.0):
            x = (rng.standard_normal(count) * spread + rng.uniform(-spread, spread)).astype(np.float32)
            if special is not None:
                x[at] = special
            weight = np.float32(rng.uniform(1e-4, 0.1))
            got = dynamic_grid(x, weight, size)
            mn, mx = dynamic_quant.value_range(x)
            if special is not None:
                assert got is None
                continue
            quant, m = np.empty(4, np.float32), np.empty(1, np.float32)
            grid_operands(mn, mx, weight, quant, m)
            assert got[0].tobytes() == quant.tobytes() and got[1].tobytes() == m.tobytes(), (count, spread)
            assert not got[0].flags.writeable and not got[1].flags.writeable


@pytest.mark.parametrize("size", [1, 2], ids=["one-thread", "team-of-two"])
@pytest.mark.parametrize("special", [None, np.nan, -np.inf], ids=["finite", "nan", "infinity"])
def test_dynamic_quantized_is_the_grid_then_x_quantized_on_it(size, special):
    """qconv_gemm.py's `dynamic_quantized` (the range, its grid and x quantized on it in one compiled call, on one
    thread or a team's two parts) gives the bytes of `dynamic_grid` then `quantized` on that grid: the uint8 input,
    its zero point and the sums' factor; None where the range is not finite."""
    from minfer_ops_numba import qconv_gemm
    from minfer_ops_numba.dynamic_quant import dynamic_grid

    rng = np.random.default_rng(12)
    dynamic_quant.warm_range()
    qconv_gemm.compile_for(np.dtype(np.uint8))
    for shape, at in (((1, 1, 1, 1), 0), ((1, 3, 5, 7), 20), ((1, 17, 61, 67), -5), ((2, 16, 64, 64), 3)):
        for spread in (1e-3, 1.0, 300.0):
            x = (rng.standard_normal(shape) * spread + rng.uniform(-spread, spread)).astype(np.float32)
            if special is not None:
                x.reshape(-1)[at] = special
            weight = np.float32(rng.uniform(1e-4, 0.1))
            got = qconv_gemm.dynamic_quantized(x, weight, size)
            grid = dynamic_grid(x, weight, size)
            if special is not None:
                assert got is None and grid is None
                continue
            quant, m = grid
            zero, q = int(-quant[1]), got[0].copy()  # this thread's scratch, which `quantized` writes next
            want, bad = qconv_gemm.quantized(x, (quant[0], quant[1], quant[2]), np.dtype(np.uint8), zero, size)
            assert bad == 0 and got[1] == zero and got[2].tobytes() == m.tobytes(), (shape, spread)
            assert q.dtype == np.uint8 and q.shape == x.shape and q.tobytes() == want.tobytes()
            assert not got[0].flags.writeable and not got[2].flags.writeable
            assert x.size < 100 or np.unique(q).size > 20
