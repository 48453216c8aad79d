"""The fast paths of squeeze-excite blocks' and classifier heads' small ops equal their numpy references.

ReduceMean/ReduceSum over trailing axes and GlobalAveragePool run as one BLAS matrix-vector product, a
one-image 1x1 conv on a small map as one GEMM straight from the call, FusedConv passes its inputs straight to
the base kernel, and a one-row product with a large constant B splits over the threads: each is checked on
edge shapes (batches, non-contiguous inputs, keepdims 0 and 1, empty axes and tensors) against numpy in float64.
"""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from minfer_core import KernelContext, TensorType, get_registry
from minfer_core.parallel import using_threads
from minfer_ops_basic import linalg, reduce, streaming
from minfer_ops_conv import conv, pool
from modelkit import spy_parallel_for

RNG = np.random.default_rng(11)
SINCE = {"ReduceSum": 13, "ReduceMean": 18}  # the opset from which axes are an input


def _types(*values):
    return tuple(None if v is None else TensorType(v.dtype, v.shape) for v in values)


def _reduce(op: str, opset: int, x: np.ndarray, axes, keepdims: int, noop: int = 0, constant: bool = True):
    """The run callable of op's kernel for opset, as the engine builds it, called on x."""
    k = max((k for k in reduce.KERNELS if k.op_type == op and k.since <= opset), key=lambda k: k.since)
    if opset < SINCE[op]:
        ctx = KernelContext("n", op, opset, _types(x), (None,), (None,), 1)
        return k.prepared(ctx, {"keepdims": keepdims} | ({"axes": list(axes)} if axes else {}))(x)
    given = None if axes is None else np.array(axes, dtype=np.int64)
    ctx = KernelContext("n", op, opset, _types(x, given), (None,), (None, given if constant else None), 1)
    run = k.prepared(ctx, {"keepdims": keepdims, "noop_with_empty_axes": noop})
    return run(x) if given is None else run(x, given)


def _reference(op: str, x: np.ndarray, axes, keepdims: int) -> np.ndarray:
    fn = np.mean if op == "ReduceMean" else np.sum
    with warnings.catch_warnings(), np.errstate(all="ignore"):  # the mean of nothing: NaN, as specified
        warnings.simplefilter("ignore", RuntimeWarning)
        return fn(x.astype(np.float64), axis=tuple(axes) if axes else None, keepdims=bool(keepdims))


CASES = [
    ((1, 1280, 7, 7), (2, 3)),   # a classifier head's mean
    ((3, 5, 4, 4), (2, 3)),      # a batch
    ((3, 5, 4, 4), (-1, -2)),    # negative, unsorted
    ((2, 3, 4), (2,)),
    ((4, 6), (1,)),
    ((3, 5, 4, 4), (1, 2, 3)),
    ((2, 3, 64, 65), (2, 3)),    # rows longer than ROW_CELLS: numpy's reduction
    ((3, 5, 4, 4), (1,)),        # not trailing: numpy's reduction
    ((3, 5, 4, 4), (0, 3)),
    ((2, 0, 3, 3), (2, 3)),      # no rows
    ((2, 3, 0, 4), (2, 3)),      # empty rows
]


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum"])
@pytest.mark.parametrize("opset", [11, 18])
@pytest.mark.parametrize("keepdims", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape,axes", CASES)
@pytest.mark.filterwarnings("ignore:Mean of empty slice")  # numpy's, from the kernel's np.mean: the NaN is specified
def test_sums_and_means_equal_numpy(op, opset, keepdims, dtype, shape, axes):
    """Every axes/keepdims/opset form gives numpy's result, shape and dtype, fast path or not."""
    x = RNG.standard_normal(shape).astype(dtype)
    got = _reduce(op, opset, x, axes, keepdims)
    want = _reference(op, x, axes, keepdims)
    assert got.dtype == dtype and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum"])
@pytest.mark.parametrize("view", ["every other channel", "transposed", "sliced rows"])
def test_non_contiguous_inputs_reduce_like_numpy(op, view):
    """A strided or transposed input gives numpy's result (the rows are copied, never read wrongly in place)."""
    base = RNG.standard_normal((2, 12, 6, 7)).astype(np.float32)
    x = {"every other channel": base[:, ::2], "transposed": base.transpose(0, 1, 3, 2),
         "sliced rows": base[:, :, 1:5, 2:]}[view]
    for keepdims in (0, 1):
        got = _reduce(op, 18, x, (2, 3), keepdims)
        np.testing.assert_allclose(got, _reference(op, x, (2, 3), keepdims), rtol=1e-5, atol=1e-5)


def test_the_trailing_axes_of_float_rows_take_the_blas_plan():
    """The plan is the product for trailing axes of float32/64 rows up to ROW_CELLS, and numpy's otherwise."""
    assert reduce._rows_plan((1, 1280, 7, 7), np.dtype(np.float32), (2, 3), True, True) is not None
    assert reduce._rows_plan((4, 6), np.dtype(np.float64), (1,), False, False) is not None
    assert reduce._rows_plan((3, 5, 4, 4), np.dtype(np.float32), (1,), True, True) is None  # not trailing
    assert reduce._rows_plan((3, 5, 4, 4), np.dtype(np.float32), (0, 1, 2, 3), True, True) is None  # no rows
    assert reduce._rows_plan((2, 3, 64, 65), np.dtype(np.float32), (2, 3), True, True) is None  # rows too long
    assert reduce._rows_plan((1, 8, 7, 7), np.dtype(np.float16), (2, 3), True, True) is None
    assert reduce._rows_plan((1, 8, 7, 7), np.dtype(np.int32), (2, 3), True, True) is None


@pytest.mark.parametrize("op", ["ReduceMean", "ReduceSum"])
def test_empty_and_run_time_axes(op):
    """Empty axes reduce everything, or nothing with noop_with_empty_axes; axes computed at run time still apply."""
    x = RNG.standard_normal((2, 3, 5)).astype(np.float32)
    np.testing.assert_allclose(_reduce(op, 18, x, [], 1), _reference(op, x, None, 1), rtol=1e-5)
    np.testing.assert_allclose(_reduce(op, 18, x, None, 0), _reference(op, x, None, 0), rtol=1e-5)
    assert _reduce(op, 18, x, [], 1, noop=1) is x
    for axes in ([2], [1, 2], [0]):
        got = _reduce(op, 18, x, axes, 0, constant=False)
        np.testing.assert_allclose(got, _reference(op, x, axes, 0), rtol=1e-5, atol=1e-6)


def test_a_plan_per_input_shape():
    """One node's run callable meets several shapes: each gets its own plan and numpy's result."""
    run = None
    for shape in ((1, 16, 7, 7), (3, 16, 7, 7), (1, 16, 5, 5), (1, 16, 7, 7)):
        x = RNG.standard_normal(shape).astype(np.float32)
        if run is None:
            k = max((k for k in reduce.KERNELS if k.op_type == "ReduceMean" and k.since <= 18), key=lambda k: k.since)
            axes = np.array([2, 3], np.int64)
            run = k.prepared(KernelContext("n", "ReduceMean", 18, _types(x, axes), (None,), (None, axes), 1),
                             {"keepdims": 1, "noop_with_empty_axes": 0})
        np.testing.assert_allclose(run(x, axes), _reference("ReduceMean", x, (2, 3), 1), rtol=1e-5, atol=1e-6)


# --- GlobalAveragePool -----------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 576, 7, 7), (3, 40, 5, 5), (2, 6, 9), (2, 4, 3, 3, 3), (1, 3, 1, 1)])
@pytest.mark.parametrize("threads", [1, 2])
def test_global_average_pool_equals_the_mean(dtype, shape, threads):
    """The product with a vector of 1/count gives each plane's mean, into out= or a new array, on 1 or 2 threads."""
    x = RNG.standard_normal(shape).astype(dtype)
    want = np.mean(x.astype(np.float64), axis=tuple(range(2, x.ndim)), keepdims=True)
    out = np.full(want.shape, np.nan, dtype)
    with using_threads(threads):
        got = pool.global_average_pool.fn(x)
        assert pool.global_average_pool.fn(x, out=out) is out
    for y in (got, out):
        assert y.dtype == dtype and y.shape == want.shape
        np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_global_average_pool_of_a_strided_input():
    """A non-contiguous input (every other channel) is averaged plane by plane like a contiguous one."""
    x = RNG.standard_normal((2, 16, 7, 7)).astype(np.float32)[:, ::2]
    got = pool.global_average_pool.fn(x)
    np.testing.assert_allclose(got, np.mean(x.astype(np.float64), axis=(2, 3), keepdims=True), rtol=1e-5, atol=1e-6)


# --- the one-image 1x1 conv on a small map ---------------------------------------------------------


def _conv_run(w: np.ndarray, b: np.ndarray | None, x: np.ndarray, constant: bool = True):
    consts = (None, w, b) if constant else (None, None, None)
    ctx = KernelContext("n", "Conv", 13, _types(x, w, b), (None,), consts, 1)
    return conv.conv.fn(ctx, kernel_shape=list(w.shape[2:]))


def _conv_reference(x: np.ndarray, w: np.ndarray, b: np.ndarray | None) -> np.ndarray:
    y = np.einsum("mc,nc...->nm...", w.reshape(w.shape[:2]).astype(np.float64), x.astype(np.float64))
    return y if b is None else y + b.reshape((-1,) + (1,) * (x.ndim - 2))


@pytest.mark.parametrize("xs,m", [((1, 576, 1, 1), 144), ((1, 144, 1, 1), 576), ((1, 16, 1, 1), 8),
                                  ((1, 96, 7, 7), 40), ((2, 576, 1, 1), 144), ((3, 96, 7, 7), 40),
                                  ((1, 8, 5), 4), ((1, 4, 2, 2, 2), 6)])
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("constant", [True, False])
@pytest.mark.parametrize("threads", [1, 2])
def test_small_pointwise_conv_equals_the_reference(xs, m, bias, constant, threads):
    """W @ x + b, one image or a batch, constant or run-time weights, 1 or 2 threads: the epilogue once per element."""
    x = RNG.standard_normal(xs).astype(np.float32)
    w = (RNG.standard_normal((m, xs[1]) + (1,) * (len(xs) - 2)) / np.sqrt(xs[1])).astype(np.float32)
    b = RNG.standard_normal(m).astype(np.float32) if bias else None
    run = _conv_run(w, b, x, constant)
    want = _conv_reference(x, w, b)
    seen = np.zeros(want.shape, int)
    y = np.full(want.shape, np.nan, np.float32)

    def negate(out, region):
        assert out is y
        seen[region] += 1
        np.negative(out[region], out=out[region])

    args = (x, None, None) if constant else (x, w, b)
    with using_threads(threads):
        for _ in range(2):  # the first call of a shape makes its plan (and times the batch methods)
            seen[...] = 0
            assert run(*args, out=y, epilogue=negate) is y
            assert (seen == 1).all()
            np.testing.assert_allclose(-y, want, rtol=1e-4, atol=1e-4)


def test_small_pointwise_conv_of_one_image_is_one_range(monkeypatch):
    """A one-image SE 1x1 conv is one parallel_for range; wide maps, pads, strides and groups take other paths."""
    ranges = spy_parallel_for(monkeypatch, conv)
    x = RNG.standard_normal((1, 576, 1, 1)).astype(np.float32)
    w = RNG.standard_normal((144, 576, 1, 1)).astype(np.float32)
    run = _conv_run(w, None, x)
    run(x, None, None)
    ranges.clear()
    run(x, None, None, out=np.empty((1, 144, 1, 1), np.float32))
    assert ranges == [1]
    p = conv.pack(w, 1, build_time=True)
    assert conv._small_pointwise(conv.geo.window((7, 7), (1, 1), clamp_same=True), p)
    assert not conv._small_pointwise(conv.geo.window((17, 17), (1, 1), clamp_same=True), p)
    assert not conv._small_pointwise(conv.geo.window((7, 7), (1, 1), strides=[2, 2], clamp_same=True), p)
    assert not conv._small_pointwise(conv.geo.window((7, 7), (1, 1), pads=[1, 1, 1, 1], clamp_same=True), p)
    assert not conv._small_pointwise(conv.geo.window((1, 1), (1, 1), clamp_same=True), conv.pack(w[:, :288], 2))


@pytest.mark.parametrize("residual", [False, True])
@pytest.mark.parametrize("activation,params", [("Relu", []), ("HardSigmoid", [0.2, 0.5]), ("", [])])
def test_fused_conv_of_a_squeeze_excite_block(residual, activation, params):
    """FusedConv (W, B constant) of a 1x1 map: act(W @ x + b [+ z]), whether the inputs pass straight or not."""
    x = RNG.standard_normal((1, 96, 1, 1)).astype(np.float32)
    w = (RNG.standard_normal((24, 96, 1, 1)) / 10).astype(np.float32)
    b = RNG.standard_normal(24).astype(np.float32)
    z = RNG.standard_normal((1, 24, 1, 1)).astype(np.float32) if residual else None
    consts = (None, w, b) + ((None,) if residual else ())
    ctx = KernelContext("n", "FusedConv", 1, _types(x, w, b, z) if residual else _types(x, w, b), (None,), consts, 1)
    k = get_registry().select_kernel("ai.minfer", "FusedConv", 1)
    attrs = {"kernel_shape": [1, 1]} | ({"activation": activation, "activation_params": params} if activation else {})
    run = k.prepared(ctx, attrs)
    want = _conv_reference(x, w, b) + (0 if z is None else z)
    if activation == "Relu":
        want = np.maximum(want, 0)
    elif activation == "HardSigmoid":
        want = np.clip(want * 0.2 + 0.5, 0, 1)
    for _ in range(2):
        out = np.empty(want.shape, np.float32)
        got = run(x, None, None, *((z,) if residual else ()), out=out)
        assert got is out
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


# --- the one-row product with large weights ---------------------------------------------------------


def _spy_parts(monkeypatch) -> list[int | None]:
    """The ``parts`` of every parallel_for call linalg makes (the calls still run)."""
    parts: list[int | None] = []
    real = linalg.parallel_for

    def spy(n, fn, **kw):
        parts.append(kw.get("parts"))
        return real(n, fn, **kw)

    monkeypatch.setattr(linalg, "parallel_for", spy)
    return parts


def _forced(monkeypatch, winner: int) -> list[list[float]]:
    """streaming's timed choice answers ``winner`` after timing both candidates (their seconds are recorded)."""
    timed: list[list[float]] = []

    def choose(key, names, time_one):
        assert names == ["whole", "columns"]
        timed.append([time_one(0), time_one(1)])
        return winner

    monkeypatch.setattr(streaming, "choose", choose)
    monkeypatch.setattr(streaming, "_CHOSEN", {})
    return timed


@pytest.mark.parametrize("rows,k,n", [(1, 1280, 1000), (1, 960, 1280), (3, 1024, 600), (1, 1000, 1001)])
@pytest.mark.parametrize("winner", [0, 1])
def test_one_row_gemm_with_a_large_b_splits_over_threads_when_timed_faster(monkeypatch, rows, k, n, winner):
    """A classifier head times whole against split columns once, then runs the winner, equal to numpy either way."""
    timed = _forced(monkeypatch, winner)
    a = RNG.standard_normal((rows, k)).astype(np.float32)
    w = (RNG.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
    c = RNG.standard_normal(n).astype(np.float32)
    run = linalg.gemm.prepared(KernelContext("n", "Gemm", 13, _types(a, w, c), (None,), (None, w, c), 1), {"transB": 1})
    want = a.astype(np.float64) @ w.T.astype(np.float64) + c
    with using_threads(2):
        for _ in range(2):
            parts = _spy_parts(monkeypatch)
            out = np.full((rows, n), np.nan, np.float32)
            assert run(a, None, None, out=out) is out
            np.testing.assert_allclose(out, want, rtol=1e-4, atol=1e-4)
            assert parts[-1] == (2 if winner else 1)
    assert len(timed) == 1


def test_one_row_products_run_whole_on_one_thread_or_with_a_small_b(monkeypatch):
    """One thread, or a B below streaming.ELEMENTS: nothing is timed and the product is one range."""
    timed = _forced(monkeypatch, 1)
    parts = _spy_parts(monkeypatch)
    for k, n, threads in ((1280, 1000, 1), (256, 1000, 2)):
        a = RNG.standard_normal((1, k)).astype(np.float32)
        b = RNG.standard_normal((k, n)).astype(np.float32)
        run = linalg.matmul_1.prepared(KernelContext("n", "MatMul", 13, _types(a, b), (None,), (None, b), 1), {})
        with using_threads(threads):
            np.testing.assert_allclose(run(a, None), a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert timed == [] and parts == [1, 1]


def test_one_row_matmul_with_a_large_constant_b_equals_numpy(monkeypatch):
    """MatMul (1, 1, K) @ (K, N) with a large constant B: both timed candidates and the chosen split equal numpy."""
    timed = _forced(monkeypatch, 1)
    a = RNG.standard_normal((1, 1, 768)).astype(np.float32)
    b = RNG.standard_normal((768, 1000)).astype(np.float32)
    run = linalg.matmul_1.prepared(KernelContext("n", "MatMul", 13, _types(a, b), (None,), (None, b), 1), {})
    with using_threads(2):
        got = run(a, None)
    np.testing.assert_allclose(got, a.astype(np.float64) @ b, rtol=1e-4, atol=1e-4)
    assert len(timed) == 1 and all(t > 0 for t in timed[0])


def test_global_average_pool_of_empty_planes_is_nan():
    """Planes of no cells average to NaN (numpy's mean of nothing), not a division error."""
    with np.errstate(all="ignore"):
        got = pool.global_average_pool.fn(np.zeros((2, 3, 0, 4), np.float32))
    assert got.shape == (2, 3, 1, 1) and np.isnan(got).all()
