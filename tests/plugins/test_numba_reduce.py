"""minfer-ops-numba's ReduceMean over trailing axes and GlobalAveragePool (reduce.py): numpy's means within float32
rounding, the shapes ONNX gives, and the nodes it leaves to the numpy kernels."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import KernelContext, TensorType  # noqa: E402
from minfer_ops_numba import reduce  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


def _ctx(op, x, opset, axes=None):
    types = (TensorType(x.dtype, x.shape),) + (() if axes is None else (TensorType(np.int64, axes.shape),))
    return KernelContext("r", op, opset, types, (None,), (None,) + (() if axes is None else (axes,)), 1)


@pytest.mark.parametrize("shape, axes", [((1, 1280, 7, 7), [2, 3]), ((8, 960, 7, 7), [-1, -2]), ((3, 5, 37), [2]),
                                         ((2, 3, 4, 5), [1, 2, 3]), ((6,), [0]), ((2, 4, 0), [2]), ((0, 3, 2), [2])])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("opset", [13, 18])
def test_reduce_mean_over_trailing_axes_is_numpys_mean(shape, axes, keepdims, opset):
    """ReduceMean-13 (axes attribute) and -18 (axes input) over x's last axes: np.mean's shape, its values within
    float32 rounding (NaN for an empty mean), into a fresh array or the planned buffer."""
    rng = np.random.default_rng(len(shape) + sum(shape))
    x = (rng.standard_normal(shape) * 4 + 1).astype(np.float32)
    axes_arr = np.asarray(axes, np.int64)
    ctx = _ctx("ReduceMean", x, opset, axes_arr if opset >= 18 else None)
    attrs = {"keepdims": keepdims} | ({"axes": axes} if opset < 18 else {})
    record = reduce.reduce_mean_18 if opset >= 18 else reduce.reduce_mean_1
    assert record.applies(ctx, attrs)
    run = record.prepared(ctx, attrs)
    with warnings.catch_warnings():  # numpy's mean of nothing warns
        warnings.simplefilter("ignore", RuntimeWarning)
        want = np.mean(x.astype(np.float64), axis=tuple(axes), keepdims=bool(keepdims)).astype(np.float32)
    got = run(x, axes_arr) if opset >= 18 else run(x)
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)
    out = np.full(want.shape, 9.0, np.float32)
    assert (run(x, axes_arr, out=out) if opset >= 18 else run(x, out=out)) is out
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=2e-6)
    assert want.size < 10 or np.unique(got).size > want.size // 2


def test_global_average_pool_is_numpys_mean_kept_as_ones():
    """GlobalAveragePool of a 4-D and a 3-D input: the spatial means as (N, C, 1, ...), NaN where a window holds one."""
    rng = np.random.default_rng(3)
    for shape in ((2, 2048, 7, 7), (3, 4, 11)):
        x = rng.standard_normal(shape).astype(np.float32)
        x.reshape(-1)[5] = np.nan
        ctx = _ctx("GlobalAveragePool", x, 1)
        assert reduce.global_average_pool.applies(ctx, {})
        got = reduce.global_average_pool.prepared(ctx, {})(x)
        want = np.mean(x.astype(np.float64), axis=tuple(range(2, x.ndim)), keepdims=True).astype(np.float32)
        assert got.shape == want.shape and np.isnan(got.reshape(-1)[0]) and np.isnan(want.reshape(-1)[0])
        np.testing.assert_allclose(got, want, rtol=2e-6, atol=2e-6)


def test_reduce_mean_leaves_other_axes_and_types_to_numpy():
    """Axes that are not the last ones, absent or computed at run, repeated or out of range, and non-float32 inputs:
    the numpy kernels keep the node."""
    x = np.zeros((2, 3, 4), np.float32)
    assert reduce.reduce_mean_1.applies(_ctx("ReduceMean", x, 13), {"axes": [1, 2]})
    for axes in ([0], [1], [0, 2], None, [2, 2], [3], [-4]):
        assert not reduce.reduce_mean_1.applies(_ctx("ReduceMean", x, 13), {"axes": axes}), axes
    runtime = KernelContext("r", "ReduceMean", 18, (TensorType(np.float32, x.shape), TensorType(np.int64, (1,))),
                            (None,), (None, None), 1)
    assert not reduce.reduce_mean_18.applies(runtime, {})
    assert not reduce.reduce_mean_18.applies(_ctx("ReduceMean", x, 18), {})
    assert not reduce.reduce_mean_1.applies(_ctx("ReduceMean", x.astype(np.float64), 13), {"axes": [2]})
    assert not reduce.global_average_pool.applies(_ctx("GlobalAveragePool", np.zeros((2, 3), np.float32), 1), {})
