"""The fast pooling and LRN paths: phased 2-D pools, separable N-D pools, chunking and the two-thread split."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import helper

from minfer_core import KernelContext, TensorType, release_scratch
from minfer_core.parallel import using_threads
from minfer_ops_conv import norm, pool
from minfer_ops_conv.plugin import KERNELS

ort = pytest.importorskip("onnxruntime")

SETTINGS = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def make_kernel(op_type: str, opset: int, x: np.ndarray, attrs: dict):
    """The run callable the engine would build for a one-output node (plain kernels as they are)."""
    k = max((k for k in KERNELS if k.op_type == op_type and k.since <= opset), key=lambda k: k.since)
    if not k.prepare:
        return lambda x, out=None: k.fn(x, **attrs, out=out)
    ctx = KernelContext("n", op_type, opset, (TensorType(x.dtype, x.shape),), (None,), (None,), 1)
    return k.fn(ctx, **attrs)


def run_ort(op_type: str, opset: int, x: np.ndarray, attrs: dict) -> np.ndarray:
    """The same single node through onnxruntime."""
    dtype = helper.np_dtype_to_tensor_dtype(x.dtype)
    node = helper.make_node(op_type, ["x"], ["y"], **attrs)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", dtype, x.shape)],
                              [helper.make_tensor_value_info("y", dtype, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10
    so = ort.SessionOptions()
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


def reference_pool(x: np.ndarray, attrs: dict, reduce: str, count_include_pad: int = 0) -> np.ndarray:
    """Pools the slow obvious way: a padded copy and one strided view per kernel tap (the old kernel)."""
    from minfer_ops_conv import _geometry as geo

    w = geo.window(x.shape[2:], attrs["kernel_shape"], strides=attrs.get("strides"), dilations=attrs.get("dilations"),
                   pads=attrs.get("pads"), auto_pad=attrs.get("auto_pad", "NOTSET"), ceil_mode=attrs.get("ceil_mode", 0))
    fill = (-np.inf if x.dtype.kind == "f" else np.iinfo(x.dtype).min) if reduce == "max" else 0
    xp = geo.pad(x, w, fill)
    views = [xp[(slice(None), slice(None)) + taps] for taps in w.taps()]
    if reduce == "max":
        return np.maximum.reduce(views)
    total = np.add.reduce([v.astype(np.float64) for v in views])
    with np.errstate(invalid="ignore"):  # a window on no data averages to NaN
        return (total / geo.tap_counts(w, bool(count_include_pad))).astype(x.dtype)


@st.composite
def pools(draw, ranks=(1, 2, 2, 2, 3)):
    """A random pool: any rank, kernel, stride, dilation, pads (up to kernel - 1), auto_pad, ceil_mode, batch."""
    rank = draw(st.sampled_from(ranks))
    kernel = [draw(st.integers(1, 4)) for _ in range(rank)]
    dil = [draw(st.sampled_from([1, 1, 2])) for _ in range(rank)]
    strides = [draw(st.sampled_from([1, 1, 2, 3])) for _ in range(rank)]
    spatial = [draw(st.integers((k - 1) * d + 1, (k - 1) * d + 9)) for k, d in zip(kernel, dil)]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto_pad.startswith("SAME"):
        dil = [1] * rank  # onnxruntime pads dilated SAME pools against the spec's output size
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dil}
    if auto_pad == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel * 2]
        attrs["ceil_mode"] = draw(st.sampled_from([0, 1]))
    else:
        attrs["auto_pad"] = auto_pad
    shape = [draw(st.integers(1, 3)), draw(st.integers(1, 5))] + spatial
    x = np.random.default_rng(draw(st.integers(0, 2**31))).standard_normal(shape).astype(np.float32)
    return x, attrs


@pytest.fixture
def tiny_chunks(monkeypatch):
    """Chunks of one plane and a split whatever the size: the multi-chunk, two-thread path on small inputs."""
    monkeypatch.setattr(pool, "_CHUNK_BYTES", 1)
    monkeypatch.setattr(pool, "_SPLIT_BYTES", 0)
    monkeypatch.setattr(pool, "_SPLIT_WORK", 0)
    monkeypatch.setattr(norm, "_LRN_CHUNK_BYTES", 1)
    monkeypatch.setattr(norm, "_LRN_SPLIT_BYTES", 0)


def negative_same_pads(attrs: dict) -> bool:
    """SAME padding with a stride wider than the kernel (onnxruntime's MaxPool refuses the negative pads)."""
    return "auto_pad" in attrs and any(s > k for s, k in zip(attrs["strides"], attrs["kernel_shape"]))


@SETTINGS
@given(pools())
def test_max_pool_equals_onnxruntime(case):
    """One-output MaxPool equals onnxruntime exactly for any rank, stride, dilation, pads, auto_pad and ceil_mode."""
    x, attrs = case
    assume(not negative_same_pads(attrs))
    want = run_ort("MaxPool", 12, x, attrs)
    np.testing.assert_array_equal(make_kernel("MaxPool", 12, x, attrs)(x), want)


@SETTINGS
@given(pools(), st.sampled_from([0, 1]))
def test_average_pool_equals_onnxruntime(case, count_include_pad):
    """AveragePool equals onnxruntime for any window, pads, ceil_mode and count_include_pad."""
    x, attrs = case
    assume(not negative_same_pads(attrs))
    attrs["count_include_pad"] = count_include_pad
    want = run_ort("AveragePool", 19, x, attrs)
    np.testing.assert_allclose(make_kernel("AveragePool", 19, x, attrs)(x), want, rtol=1e-5, atol=1e-6)


@SETTINGS
@given(pools(), st.sampled_from([0, 1]))
def test_pools_equal_the_tap_by_tap_reference(case, count_include_pad):
    """MaxPool and AveragePool equal the padded tap-by-tap reference, negative SAME pads included."""
    x, attrs = case
    np.testing.assert_array_equal(make_kernel("MaxPool", 12, x, attrs)(x), reference_pool(x, attrs, "max"))
    got = make_kernel("AveragePool", 19, x, {**attrs, "count_include_pad": count_include_pad})(x)
    np.testing.assert_allclose(got, reference_pool(x, attrs, "avg", count_include_pad), rtol=1e-5, atol=1e-6)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(pools(ranks=(1, 2, 2, 3)), st.sampled_from([0, 1]))
def test_pools_split_in_chunks_over_two_threads_match_serial(tiny_chunks, case, count_include_pad):
    """Chunked pools run over two threads write exactly what one serial pass writes, into the given out."""
    x, attrs = case
    for op, opset, extra in (("MaxPool", 12, {}), ("AveragePool", 19, {"count_include_pad": count_include_pad})):
        fn = make_kernel(op, opset, x, {**attrs, **extra})
        serial = fn(x)
        out = np.full_like(serial, np.nan)
        with using_threads(2):
            assert fn(x, out=out) is out
        np.testing.assert_array_equal(out, serial)


@pytest.mark.parametrize("kernel,dil", [((3, 3), (1, 1)), ((2, 5), (1, 1)), ((3, 2), (2, 1)), ((1, 4), (1, 2)), ((5, 1), (1, 1))])
@pytest.mark.parametrize("spatial", [(1, 1), (2, 3), (4, 9), (11, 6)])
def test_same_size_stride_1_pools(kernel, dil, spatial):
    """Stride-1 pools whose output keeps the input size (the edge-recomputing path), asymmetric pads, tiny inputs."""
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dil)]
    pads = [(s - 1) // 2 for s in span] + [s - 1 - (s - 1) // 2 for s in span]
    x = np.random.default_rng(sum(spatial)).standard_normal((2, 3) + spatial).astype(np.float32)
    for include in (0, 1):
        attrs = {"kernel_shape": list(kernel), "dilations": list(dil), "pads": pads}
        got = make_kernel("MaxPool", 12, x, attrs)(x)
        assert got.shape == x.shape
        np.testing.assert_array_equal(got, reference_pool(x, attrs, "max"))
        got = make_kernel("AveragePool", 19, x, {**attrs, "count_include_pad": include})(x)
        np.testing.assert_allclose(got, reference_pool(x, attrs, "avg", include), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kernel", [(2, 2), (3, 3), (2, 1), (1, 3), (3, 2), (1, 1)])
@pytest.mark.parametrize("spatial", [(1, 3), (4, 6), (7, 8), (9, 9)])
def test_tiling_pools(kernel, spatial):
    """Pools whose windows tile the input (kernel = stride, no pads), remainders dropped, tiny inputs."""
    x = np.random.default_rng(sum(spatial)).standard_normal((2, 3) + spatial).astype(np.float32)
    attrs = {"kernel_shape": list(kernel), "strides": list(kernel)}
    if any(s < k for s, k in zip(spatial, kernel)):
        return  # no window fits
    with using_threads(2):
        np.testing.assert_array_equal(make_kernel("MaxPool", 12, x, attrs)(x), reference_pool(x, attrs, "max"))
        got = make_kernel("AveragePool", 19, x, attrs)(x)
    np.testing.assert_allclose(got, reference_pool(x, attrs, "avg"), rtol=1e-5, atol=1e-6)


def test_scratch_of_huge_planes_is_not_kept(monkeypatch):
    """A plane too large for a chunk gets scratch for that call only; chunk-sized scratch is reused."""
    monkeypatch.setattr(pool, "_CHUNK_BYTES", 4096)
    release_scratch(pool.SCRATCH)
    x = np.random.default_rng(5).standard_normal((1, 2, 60, 60)).astype(np.float32)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    np.testing.assert_array_equal(make_kernel("MaxPool", 12, x, attrs)(x), reference_pool(x, attrs, "max"))
    assert release_scratch(pool.SCRATCH) == 0
    small = x[:, :, :8, :8].copy()
    np.testing.assert_array_equal(make_kernel("MaxPool", 12, small, attrs)(small), reference_pool(small, attrs, "max"))
    assert 0 < release_scratch(pool.SCRATCH) <= 2 * 4096


@pytest.mark.parametrize("dtype", [np.float16, np.float64, np.int8, np.uint8])
def test_max_pool_keeps_other_dtypes(dtype):
    """MaxPool on float16, float64 and 8-bit integers pads with the dtype's lowest value and keeps the dtype."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((2, 3, 9, 7)) * 50).astype(dtype)
    attrs = {"kernel_shape": [3, 2], "strides": [2, 1], "pads": [1, 1, 2, 0], "ceil_mode": 1}
    got = make_kernel("MaxPool", 12, x, attrs)(x)
    assert got.dtype == dtype
    np.testing.assert_array_equal(got, reference_pool(x, attrs, "max"))


@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_average_pool_keeps_other_dtypes(dtype):
    """AveragePool on float16 and float64 keeps the dtype and counts pads only when asked."""
    x = np.random.default_rng(2).standard_normal((1, 4, 8, 8)).astype(dtype)
    for include in (0, 1):
        attrs = {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1], "count_include_pad": include}
        got = make_kernel("AveragePool", 19, x, attrs)(x)
        assert got.dtype == dtype
        tol = 5e-3 if dtype == np.float16 else 1e-12  # float16 sums round at each tap, as the old kernel's did
        np.testing.assert_allclose(got, reference_pool(x, attrs, "avg", include), rtol=tol, atol=tol)


def test_pool_at_model_shapes_matches_reference():
    """The model-zoo pools (3x3 s2 with and without ceil_mode, 3x3 s1 p1, 7x7 global-like) at batch 2."""
    rng = np.random.default_rng(3)
    cases = [
        ((2, 8, 112, 112), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}),
        ((2, 8, 109, 109), {"kernel_shape": [3, 3], "strides": [2, 2], "ceil_mode": 1}),
        ((2, 8, 56, 56), {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [0, 0, 1, 1]}),
        ((2, 8, 14, 14), {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]}),
        ((2, 8, 6, 6), {"kernel_shape": [7, 7], "pads": [0, 0, 1, 1]}),
        ((2, 8, 7, 7), {"kernel_shape": [7, 7]}),
    ]
    for shape, attrs in cases:
        x = rng.standard_normal(shape).astype(np.float32)
        with using_threads(2):
            np.testing.assert_array_equal(make_kernel("MaxPool", 12, x, attrs)(x), reference_pool(x, attrs, "max"))
            got = make_kernel("AveragePool", 19, x, attrs)(x)
        np.testing.assert_allclose(got, reference_pool(x, attrs, "avg"), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("shape,split", [
    ((1, 24, 112, 112), False),  # shufflenet's stem pool: 301k cells
    ((1, 320, 28, 28), False),  # lost 4% split: each thread's numpy calls too short for the GIL hand-overs
    ((2, 1024, 7, 7), False),  # 100k cells, narrow planes: lost 45%
    ((8, 1024, 7, 7), True),  # gained 55%
    ((2, 576, 14, 14), True),
    ((1, 128, 55, 55), False),  # work 557k: lost 15% in squeezenet
    ((1, 64, 112, 112), True),
])
def test_windowed_pools_split_by_work(shape, split, monkeypatch):
    """A windowed pool is handed to the threads when its cells, weighted for narrow planes, pass the line
    (else it runs as one part: in a process team, one process computes it)."""
    calls = []
    real = pool.parallel_for

    def spy(n, fn, *, parts=None, outputs_only=False):
        calls.append((n, parts, outputs_only))
        real(n, fn, parts=parts, outputs_only=outputs_only)

    monkeypatch.setattr(pool, "parallel_for", spy)
    x = np.random.default_rng(8).standard_normal(shape).astype(np.float32)
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}
    with using_threads(2):
        got = make_kernel("AveragePool", 19, x, attrs)(x)
    assert calls == [(shape[0] * shape[1], None if split else 1, True)]
    np.testing.assert_allclose(got, reference_pool(x, attrs, "avg"), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("shape", [(1, 3, 1, 1), (2, 5, 13, 13), (3, 40, 20, 20), (2, 3, 7)])
def test_global_pools(dtype, shape):
    """GlobalAveragePool and GlobalMaxPool reduce each plane to one value, serially and over two threads."""
    x = np.random.default_rng(4).standard_normal(shape).astype(dtype)
    axes = tuple(range(2, x.ndim))
    mean = np.mean(x.astype(np.float64), axis=axes, keepdims=True)
    for threads in (1, 2):
        with using_threads(threads):
            avg = make_kernel("GlobalAveragePool", 1, x, {})(x)
            out = np.empty_like(avg)
            assert make_kernel("GlobalMaxPool", 1, x, {})(x, out=out) is out
        assert avg.dtype == dtype and avg.shape == mean.shape
        np.testing.assert_allclose(avg, mean, rtol=1e-3 if dtype == np.float16 else 1e-5, atol=1e-3 if dtype == np.float16 else 1e-6)
        np.testing.assert_array_equal(out, np.max(x, axis=axes, keepdims=True))


def reference_lrn(x: np.ndarray, size: int, alpha: float, beta: float, bias: float) -> np.ndarray:
    """LRN in float64 straight from the spec: channels [c - (size-1)//2, c + ceil((size-1)/2)]."""
    sq = np.square(x.astype(np.float64))
    c = x.shape[1]
    window = np.stack([sq[:, max(0, i - (size - 1) // 2) : i + size // 2 + 1].sum(axis=1) for i in range(c)], axis=1)
    return x / (bias + alpha / size * window) ** beta


@pytest.mark.parametrize("size", [1, 2, 3, 4, 5, 6, 7, 11])
@pytest.mark.parametrize("beta", [0.75, 0.5, 1.0, 0.6])
def test_lrn_matches_spec(size, beta):
    """LRN equals the float64 spec formula for odd and even window sizes and any beta (sqrt paths included)."""
    x = np.random.default_rng(size).standard_normal((2, 9, 5, 3)).astype(np.float32) * 4
    got = make_kernel("LRN", 13, x, {"size": size, "alpha": 0.3, "beta": beta, "bias": 1.5})(x)
    np.testing.assert_allclose(got, reference_lrn(x, size, 0.3, beta, 1.5), rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("size", [3, 5])
def test_lrn_equals_onnxruntime_at_model_settings(size):
    """LRN with inception_v1's settings equals onnxruntime on a 1x64x55x55 input."""
    x = np.random.default_rng(7).standard_normal((1, 64, 55, 55)).astype(np.float32) * 10
    attrs = {"size": size, "alpha": 1e-4, "beta": 0.75, "bias": 1.0}
    np.testing.assert_allclose(make_kernel("LRN", 13, x, attrs)(x), run_ort("LRN", 13, x, attrs), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype,rtol", [(np.float16, 2e-3), (np.float64, 1e-12)])
def test_lrn_keeps_other_dtypes(dtype, rtol):
    """LRN on float16 (computed in float32) and float64 keeps the dtype."""
    x = np.random.default_rng(8).standard_normal((1, 6, 4, 4)).astype(dtype)
    got = make_kernel("LRN", 13, x, {"size": 3, "alpha": 0.5})(x)
    assert got.dtype == dtype
    np.testing.assert_allclose(got, reference_lrn(x, 3, 0.5, 0.75, 1.0), rtol=rtol, atol=rtol)


def test_lrn_split_in_chunks_over_two_threads_matches_serial(tiny_chunks):
    """LRN cut into one-channel chunks across images and two threads writes what one serial pass writes."""
    x = np.random.default_rng(9).standard_normal((3, 7, 6, 5)).astype(np.float32)
    fn = make_kernel("LRN", 13, x, {"size": 5, "alpha": 0.2})
    want = reference_lrn(x, 5, 0.2, 0.75, 1.0)
    out = np.full_like(x, np.nan)
    with using_threads(2):
        assert fn(x, out=out) is out
    np.testing.assert_allclose(out, want, rtol=2e-6, atol=1e-6)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64, np.int8, np.uint8, np.int32])
@pytest.mark.parametrize("spatial,pads,ceil", [((9, 11), [0, 0, 0, 0], 0), ((10, 12), [1, 1, 1, 1], 0),
                                                ((7, 9), [0, 0, 1, 1], 1), ((6, 4), [0, 1, 0, 0], 1)])
def test_stride_2_column_picks_keep_every_dtype(dtype, spatial, pads, ceil):
    """Stride-2 pools (whose kept columns are read as pairs of cells) equal the reference bit for bit in every
    dtype, odd and even widths, pads and ceil_mode, serially and over two threads."""
    rng = np.random.default_rng(11)
    x = (rng.standard_normal((2, 5) + spatial) * 50).astype(dtype)
    if dtype == np.float32:
        x[0, 0, 0, :2] = [-0.0, np.nan]  # signs of zero and NaNs survive the pick
    attrs = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": pads, "ceil_mode": ceil}
    fn = make_kernel("MaxPool", 12, x, attrs)
    want = reference_pool(x, attrs, "max")
    np.testing.assert_array_equal(fn(x), want)
    assert np.array_equal(np.signbit(fn(x)), np.signbit(want))
    with using_threads(2):
        out = np.empty_like(want)
        fn(x, out=out)
    np.testing.assert_array_equal(out, want)


@pytest.mark.parametrize("dtype,tol", [(np.float16, 5e-3), (np.float32, 1e-5), (np.float64, 1e-12)])
@pytest.mark.parametrize("attrs", [
    {"kernel_shape": [3, 3], "pads": [1, 1, 1, 1]},  # the same-size path
    {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "ceil_mode": 1},  # the phased path
    {"kernel_shape": [2, 3], "strides": [1, 2], "pads": [0, 1, 1, 0], "dilations": [2, 1]},
])
def test_average_pool_scales_by_a_tiled_run_in_blocks(dtype, tol, attrs, monkeypatch):
    """AveragePool's per-cell 1/count, tiled over fewer cells than a chunk holds, is applied block by block:
    pads counted or not, batch > 1, odd sizes, every float dtype, 1 and 2 threads alike."""
    monkeypatch.setattr(pool, "_TILE_CELLS", 50)  # one plane of outputs per block: every chunk takes several
    monkeypatch.setattr(pool, "_SPLIT_WORK", 0)
    x = np.random.default_rng(12).standard_normal((3, 7, 9, 10)).astype(dtype)
    for include in (0, 1):
        a = {**attrs, "count_include_pad": include}
        fn = make_kernel("AveragePool", 19, x, a)
        want = reference_pool(x, a, "avg", include)
        got = fn(x)
        assert got.dtype == dtype
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol)
        with using_threads(2):
            out = np.full_like(got, np.nan)
            fn(x, out=out)
        np.testing.assert_array_equal(out, got)


def test_average_pool_holds_no_more_scales_than_its_output_has_cells():
    """A small pool's tiled 1/count run stops at its own output: each plan keeps it, and a model has many
    (a 1 MB run per pool put shufflenet's peak memory above onnxruntime's)."""
    import tracemalloc

    x = np.random.default_rng(3).standard_normal((1, 8, 14, 14)).astype(np.float32)
    a = {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1]}  # pads not counted: scales vary
    tracemalloc.start()
    try:
        fn = make_kernel("AveragePool", 19, x, a)
        got = fn(x)
        held = tracemalloc.get_traced_memory()[0]
    finally:
        tracemalloc.stop()
    assert held < 64 * 1024, held  # the output (1.5 KB), its scales and the plan, not a 1 MB run
    np.testing.assert_allclose(got, reference_pool(x, {**a, "count_include_pad": 0}, "avg", 0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("kernel,strides,dil", [
    ((1, 3), (2, 2), (1, 1)),  # one kernel row: the row result is the phase itself
    ((3, 3), (3, 3), (1, 1)),  # three phases, each read by one tap
    ((4, 2), (2, 2), (1, 1)),  # every phase read twice: the row result gets its own buffer
    ((3, 3), (2, 1), (2, 1)),  # dilated rows land on one phase
    ((2, 3), (1, 2), (1, 1)),  # one phase read twice
    ((3, 2), (2, 3), (1, 2)),
])
def test_phased_pools_reuse_dead_buffers_correctly(kernel, strides, dil, tiny_chunks):
    """Strided pools whose row and column results overwrite phase buffers equal the reference, with pads and
    ceil_mode, in one-plane chunks over two threads as serially."""
    x = np.random.default_rng(13).standard_normal((2, 3, 13, 11)).astype(np.float32)
    attrs = {"kernel_shape": list(kernel), "strides": list(strides), "dilations": list(dil), "pads": [1, 0, 0, 1],
             "ceil_mode": 1}
    for op, reduce in (("MaxPool", "max"), ("AveragePool", "avg")):
        fn = make_kernel(op, 19 if op == "AveragePool" else 12, x, attrs)
        want = reference_pool(x, attrs, reduce)
        serial = fn(x)
        with using_threads(2):
            out = np.full_like(serial, np.nan)
            fn(x, out=out)
        np.testing.assert_array_equal(out, serial)
        if op == "MaxPool":
            np.testing.assert_array_equal(serial, want)
        else:
            np.testing.assert_allclose(serial, want, rtol=1e-5, atol=1e-6)
