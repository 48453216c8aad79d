"""minfer-ops-basic tensor kernels, part 2: indexing, selection (TopK, NMS) and signal ops.

Rules are checked on the kernels directly and, where a reference helps, the
same single-node model is run by minfer's backend and by onnxruntime.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import helper

from minfer_core import kernels_in
from minfer_core.testing.ops import assert_node_matches_onnxruntime
from minfer_ops_basic import detection, indexing, signal

ort = pytest.importorskip("onnxruntime")
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KERNELS = kernels_in(indexing, detection, signal)


def call(op_type, opset, *inputs, **attrs):
    """Call the kernel the engine would pick for this opset."""
    k = max((k for k in KERNELS if k.op_type == op_type and k.since <= opset), key=lambda k: k.since)
    return k.fn(*inputs, **attrs)


def assert_matches_ort(op_type, opset, inputs, attrs=None, num_outputs=1, rtol=1e-5, atol=1e-6):
    """minfer and onnxruntime agree on every output of one node (dtype, shape, values)."""
    assert_node_matches_onnxruntime(op_type, opset, inputs, attrs, num_outputs, rtol=rtol, atol=atol)


def i64(*v):
    return np.array(v, np.int64)


X = np.arange(60, dtype=np.float32).reshape(3, 4, 5)


# --- Slice ------------------------------------------------------------------------------------


def test_slice_negative_step_walks_backwards_to_the_front():
    """Slice with step -1 and an end below -dim runs to index 0 inclusive."""
    out = call("Slice", 13, X, i64(-1), i64(-1000), i64(2), i64(-1))
    assert np.array_equal(out, X[:, :, ::-1])


def test_slice_clamps_out_of_range_starts_and_ends():
    """Slice clamps starts/ends to the axis (INT64 extremes included) instead of failing."""
    big = np.iinfo(np.int64)
    out = call("Slice", 13, X, i64(1, big.min), i64(big.max, 2), i64(0, -1))
    assert np.array_equal(out, X[1:, :, :2])
    assert call("Slice", 13, X, i64(10), i64(20), i64(1)).shape == (3, 0, 5)


def test_slice_is_a_view():
    """Slice returns a strided view of its input, not a copy."""
    assert np.shares_memory(call("Slice", 13, X, i64(0), i64(2), i64(2), i64(2)), X)


def test_slice_1_uses_attributes():
    """Slice-1 reads starts/ends/axes from attributes."""
    assert np.array_equal(call("Slice", 1, X, starts=[1], ends=[-1], axes=[1]), X[:, 1:-1])


@st.composite
def slice_cases(draw):
    """A random tensor, a subset of its axes, and starts/ends/steps that overshoot both ways."""
    dims = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=6))
    axes = draw(st.lists(st.integers(-len(dims), len(dims) - 1), min_size=1, max_size=len(dims), unique_by=lambda a: a % len(dims)))
    bound = st.integers(-8, 8) | st.sampled_from([2**62, -(2**62)])
    starts = [draw(bound) for _ in axes]
    ends = [draw(bound) for _ in axes]
    steps = [draw(st.sampled_from([1, 2, 3, -1, -2])) for _ in axes]
    x = np.arange(int(np.prod(dims)), dtype=np.float32).reshape(dims)
    return x, i64(*starts), i64(*ends), i64(*axes), i64(*steps)


@SETTINGS
@given(slice_cases())
def test_slice_matches_onnxruntime(case):
    """Slice with negative axes/steps and out-of-range bounds agrees with onnxruntime."""
    assert_matches_ort("Slice", 13, list(case))


# --- Gather / Scatter ---------------------------------------------------------------------------


def test_gather_negative_indices_count_from_the_back():
    """Gather index -1 selects the last entry along the axis; a 0-d index drops the axis."""
    assert np.array_equal(call("Gather", 13, X, i64(-1, 0), axis=1), X[:, [3, 0]])
    out = call("Gather", 13, np.arange(5), np.array(-2, np.int64))
    assert type(out) is np.ndarray and out.shape == () and out == 3


def test_gather_elements_indices_smaller_than_data():
    """GatherElements: output takes indices' shape, which may be smaller than data's."""
    idx = np.array([[0, -1], [1, 0]], np.int64)
    assert call("GatherElements", 13, X[0], idx, axis=1).tolist() == [[0, 4], [6, 5]]


def test_gather_nd_batch_dims_pairs_leading_dims():
    """GatherND batch_dims=1: each batch entry indexes only its own slice."""
    out = call("GatherND", 13, X, np.array([[[1, 2]], [[3, -1]], [[0, 0]]], np.int64), batch_dims=1)
    assert out.tolist() == [[X[0, 1, 2]], [X[1, 3, 4]], [X[2, 0, 0]]]


def test_gather_elements_rejects_out_of_range_indices():
    """GatherElements raises on an index outside [-dim, dim) instead of reading a neighbour row."""
    with pytest.raises(IndexError):
        call("GatherElements", 13, X[0], np.array([[5]], np.int64), axis=1)


@st.composite
def gather_cases(draw):
    """A random tensor, an axis, and in-range (possibly negative) indices of a random shape."""
    dims = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=5))
    axis = draw(st.integers(-len(dims), len(dims) - 1))
    n = dims[axis]
    x = np.random.default_rng(draw(st.integers(0, 99))).standard_normal(dims).astype(np.float32)
    idx_shape = draw(hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4))
    idx = draw(hnp.arrays(np.int64, idx_shape, elements=st.integers(-n, n - 1)))
    same_rank = tuple(draw(st.integers(1, d)) for d in dims)
    idx_el = draw(hnp.arrays(np.int64, same_rank, elements=st.integers(-n, n - 1)))
    return x, axis, idx, idx_el


@SETTINGS
@given(gather_cases())
def test_gather_and_gather_elements_match_onnxruntime(case):
    """Gather (any index shape) and GatherElements (indices smaller than data) agree with onnxruntime."""
    x, axis, idx, idx_el = case
    assert_matches_ort("Gather", 13, [x, idx], {"axis": axis})
    assert_matches_ort("GatherElements", 13, [x, idx_el], {"axis": axis})
    updates = np.ones(idx_el.shape, np.float32)
    assert_matches_ort("ScatterElements", 18, [x, idx_el, updates], {"axis": axis, "reduction": "add"})


@st.composite
def gather_nd_cases(draw):
    """A random tensor, batch_dims, and index tuples of depth k over the dims after the batch."""
    dims = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4))
    b = draw(st.integers(0, len(dims) - 1))
    k = draw(st.integers(1, len(dims) - b))
    inner = draw(hnp.array_shapes(min_dims=0, max_dims=2, min_side=1, max_side=3))
    rng = np.random.default_rng(draw(st.integers(0, 99)))
    cols = [rng.integers(-dims[b + j], dims[b + j], dims[:b] + inner) for j in range(k)]
    return rng.standard_normal(dims).astype(np.float32), np.stack(cols, -1).astype(np.int64), b


@SETTINGS
@given(gather_nd_cases())
def test_gather_nd_matches_onnxruntime(case):
    """GatherND with batch_dims and negative indices agrees with onnxruntime."""
    x, indices, b = case
    assert_matches_ort("GatherND", 13, [x, indices], {"batch_dims": b})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_elements_reductions_match_onnxruntime(reduction):
    """ScatterElements-18 reductions combine duplicate indices like onnxruntime."""
    data = np.arange(12, dtype=np.float32).reshape(3, 4)
    idx = np.array([[1, 1, -1], [0, 3, 3]], np.int64) if reduction != "none" else np.array([[1, 2, -1], [0, 3, 2]], np.int64)
    upd = np.array([[2, 3, 4], [5, 6, 7]], np.float32)
    assert_matches_ort("ScatterElements", 18, [data, idx, upd], {"axis": 1, "reduction": reduction})


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
def test_scatter_nd_reductions_match_onnxruntime(reduction):
    """ScatterND-18 writes or combines whole slices at index tuples like onnxruntime."""
    idx = np.array([[0, 1], [2, 3]], np.int64) if reduction == "none" else np.array([[0, 1], [0, 1], [2, 3]], np.int64)
    upd = np.arange(idx.shape[0] * 5, dtype=np.float32).reshape(-1, 5)
    assert_matches_ort("ScatterND", 18, [X, idx, upd], {"reduction": reduction})


def test_scatter_never_writes_its_input():
    """Scatter kernels return a new array and leave data untouched."""
    data = X.copy()
    call("ScatterND", 18, data, i64(0).reshape(1, 1), np.zeros((1, 4, 5), np.float32), reduction="add")
    call("ScatterElements", 18, data, np.zeros((1, 1, 1), np.int64), np.ones((1, 1, 1), np.float32))
    assert np.array_equal(data, X)


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter_writes_at_per_batch_offsets(mode):
    """TensorScatter writes each batch's update at its own sequence offset (wrapping when circular)."""
    cache = np.zeros((2, 1, 4, 2), np.float32)
    update = np.ones((2, 1, 2, 2), np.float32)
    out = call("TensorScatter", 24, cache, update, i64(0, 3 if mode == "circular" else 2), mode=mode)
    assert out[0, 0, :, 0].tolist() == [1, 1, 0, 0]
    assert out[1, 0, :, 0].tolist() == ([1, 0, 0, 1] if mode == "circular" else [0, 0, 1, 1])
    assert not cache.any()


# --- Selection -----------------------------------------------------------------------------------


def test_nonzero_is_int64_rank_by_count():
    """NonZero returns int64 coordinates shaped [rank, count], also for no hits."""
    out = call("NonZero", 13, np.array([[0, 2], [3, 0]]))
    assert out.dtype == np.int64 and out.tolist() == [[0, 1], [1, 0]]
    assert call("NonZero", 13, np.zeros((2, 3))).shape == (2, 0)


def test_unique_unsorted_keeps_first_occurrence_order():
    """Unique sorted=0 lists values by first occurrence, with matching indices, inverse and counts."""
    y, first, inverse, counts = call("Unique", 11, np.array([2, 1, 1, 3, 4, 3]), sorted=0)
    assert (y.tolist(), first.tolist(), inverse.tolist(), counts.tolist()) == ([2, 1, 3, 4], [0, 1, 3, 4], [0, 1, 1, 2, 3, 2], [1, 2, 2, 1])
    assert first.dtype == inverse.dtype == counts.dtype == np.int64


def test_unique_along_axis_sorts_slices():
    """Unique with axis compares whole slices along that axis."""
    y, first, inverse, counts = call("Unique", 11, np.array([[1, 0, 0], [1, 0, 0], [2, 3, 4]]), axis=0)
    assert y.tolist() == [[1, 0, 0], [2, 3, 4]] and inverse.tolist() == [0, 0, 1] and counts.tolist() == [2, 1]


def test_topk_ties_prefer_the_lower_index():
    """TopK breaks ties by lower index, for largest and smallest, on unsigned input too."""
    x = np.array([[3, 1, 3, 2, 1]], np.uint8)
    values, indices = call("TopK", 11, x, i64(3))
    assert values.tolist() == [[3, 3, 2]] and indices.tolist() == [[0, 2, 3]]
    values, indices = call("TopK", 11, x, i64(2), largest=0)
    assert indices.tolist() == [[1, 4]] and indices.dtype == np.int64


@SETTINGS
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=6), elements=st.integers(-3, 3).map(float)), st.data())
def test_topk_matches_onnxruntime(x, data):
    """TopK (many ties) agrees with onnxruntime for random axis, k and largest."""
    axis = data.draw(st.integers(-x.ndim, x.ndim - 1))
    k = data.draw(st.integers(0, x.shape[axis]))
    attrs = {"axis": axis, "largest": data.draw(st.sampled_from([0, 1]))}
    assert_matches_ort("TopK", 11, [x, i64(k)], attrs, num_outputs=2)


@SETTINGS
@given(st.integers(0, 2**16), st.integers(1, 40), st.sampled_from([0, 1]), st.sampled_from([2, 50, 10**6]))
def test_topk_small_k_on_long_rows_matches_onnxruntime(seed, k, largest, spread):
    """TopK's partition path (k much smaller than the axis) keeps onnxruntime's tie order at the cut."""
    x = np.random.default_rng(seed).integers(0, spread, (3, 400, 2)).astype(np.float32)
    assert_matches_ort("TopK", 11, [x, i64(k)], {"axis": 1, "largest": largest}, num_outputs=2)


def test_compress_and_where_and_reverse_sequence():
    """Compress keeps condition-true slices; Where broadcasts; ReverseSequence reverses per-batch prefixes."""
    assert call("Compress", 11, X, np.array([False, True]), axis=1).shape == (3, 1, 5)
    assert call("Compress", 11, X, np.array([True, False, True])).tolist() == [0, 2]
    assert call("Where", 16, np.array([True, False]), np.float32(1).reshape(()), np.zeros((3, 1), np.float32)).shape == (3, 2)
    x = np.arange(8).reshape(4, 2)  # time x batch
    assert call("ReverseSequence", 10, x, i64(4, 1)).tolist() == [[6, 1], [4, 3], [2, 5], [0, 7]]


@SETTINGS
@given(hnp.array_shapes(min_dims=2, max_dims=3, min_side=1, max_side=5), st.data())
def test_onehot_unique_compress_reverse_sequence_match_onnxruntime(dims, data):
    """OneHot (any axis, out-of-range indices), Unique (sorted or not, with axis), Compress and ReverseSequence agree with onnxruntime."""
    rng = np.random.default_rng(data.draw(st.integers(0, 999)))
    rank = len(dims)
    axis = data.draw(st.integers(-rank, rank - 1))
    depth = data.draw(st.integers(1, 4))
    indices = rng.integers(-depth - 1, depth + 1, dims)
    assert_matches_ort("OneHot", 11, [indices, i64(depth), np.array([0, 5], np.float32)], {"axis": data.draw(st.integers(-rank - 1, rank))})
    x = rng.integers(0, 3, dims).astype(np.float32)
    assert_matches_ort("Unique", 11, [x], {"sorted": data.draw(st.sampled_from([0, 1]))}, num_outputs=4)
    assert_matches_ort("Unique", 11, [x], {"axis": axis, "sorted": data.draw(st.sampled_from([0, 1]))}, num_outputs=4)
    cond = rng.random(data.draw(st.integers(1, dims[axis]))) < 0.5
    assert_matches_ort("Compress", 11, [x, cond], {"axis": axis})
    time_axis, batch_axis = data.draw(st.sampled_from([(0, 1), (1, 0)]))
    lens = rng.integers(1, dims[time_axis] + 1, dims[batch_axis]).astype(np.int64)
    assert_matches_ort("ReverseSequence", 10, [x, lens], {"time_axis": time_axis, "batch_axis": batch_axis})


@st.composite
def nms_cases(draw):
    """Random boxes (either corner order or center form), scores with ties, thresholds."""
    n, classes = draw(st.integers(1, 12)), draw(st.integers(1, 3))
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    boxes = rng.integers(0, 10, size=(2, n, 4)).astype(np.float32)
    scores = rng.integers(0, 5, size=(2, classes, n)).astype(np.float32) / 4
    inputs = [boxes, scores, i64(draw(st.integers(0, n + 1))), np.array([draw(st.sampled_from([0.0, 0.3, 0.5, 0.9]))], np.float32)]
    if draw(st.booleans()):
        inputs.append(np.array([0.4], np.float32))
    return inputs, {"center_point_box": draw(st.sampled_from([0, 1]))}


@SETTINGS
@given(nms_cases())
def test_nms_matches_onnxruntime(case):
    """NonMaxSuppression agrees with onnxruntime on random boxes, score ties and thresholds."""
    inputs, attrs = case
    assert_matches_ort("NonMaxSuppression", 11, inputs, attrs)


# --- Signal ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("exclusive", [0, 1])
@pytest.mark.parametrize("reverse", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int32])
def test_cumsum_matches_onnxruntime(exclusive, reverse, dtype):
    """CumSum exclusive/reverse along a negative axis agrees with onnxruntime and keeps the dtype."""
    x = np.arange(24).reshape(2, 3, 4).astype(dtype)
    assert_matches_ort("CumSum", 14, [x, np.array(-2, np.int32)], {"exclusive": exclusive, "reverse": reverse})


def test_cumprod_exclusive_reverse():
    """CumProd exclusive+reverse: each entry is the product of what follows it."""
    assert call("CumProd", 26, np.array([1, 2, 3, 4], np.int64), np.array(0), exclusive=1, reverse=1).tolist() == [24, 12, 4, 1]


@pytest.mark.parametrize("onesided", [0, 1])
@pytest.mark.parametrize("inverse", [0, 1])
def test_dft_20_matches_onnxruntime(onesided, inverse):
    """DFT-20 (axis input) forward/inverse, full/one-sided agrees with onnxruntime."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 5, 2 if inverse else 1)).astype(np.float32)
    if inverse and onesided:
        x = x[:, :4]  # a half spectrum of a length-6 signal
    assert_matches_ort("DFT", 20, [x, None, np.array(1, np.int64)], {"onesided": onesided, "inverse": inverse}, atol=1e-4, rtol=1e-4)


def test_stft_frames_and_windows():
    """STFT frames = (length - frame_length) // step + 1, one-sided bins = frame_length // 2 + 1."""
    signal_ = np.random.default_rng(2).standard_normal((1, 32, 1)).astype(np.float32)
    window = call("HannWindow", 17, np.array(8, np.int64))
    out = call("STFT", 17, signal_, i64(4), window)
    assert out.shape == (1, 7, 5, 2) and out.dtype == np.float32
    frame = signal_[0, 4:12, 0] * window
    np.testing.assert_allclose(out[0, 1, :, 0] + 1j * out[0, 1, :, 1], np.fft.rfft(frame), rtol=1e-4, atol=1e-4)


# --- a realistic graph ------------------------------------------------------------------------------


def _detector_postprocess_model():
    """Decode [1, 4+C, N] predictions, NMS, gather kept boxes and scores, top-5: dynamic N, data-dependent K."""
    from onnx import TensorProto
    from onnx import numpy_helper as nh

    n = helper.make_node
    nodes = [
        n("Transpose", ["pred"], ["p"], perm=[0, 2, 1]),
        n("Slice", ["p", "zero", "four", "last"], ["boxes"]),
        n("Slice", ["p", "four", "end", "last"], ["logits"]),
        n("Sigmoid", ["logits"], ["probs"]),
        n("Transpose", ["probs"], ["scores"], perm=[0, 2, 1]),
        n("NonMaxSuppression", ["boxes", "scores", "max_out", "iou", "floor"], ["sel"], center_point_box=1),
        n("Gather", ["sel", "col2"], ["box_idx"], axis=1),
        n("Gather", ["sel", "col1"], ["cls_idx"], axis=1),
        n("Squeeze", ["boxes", "zero"], ["boxes2"]),
        n("Gather", ["boxes2", "box_idx"], ["kept_boxes"]),
        n("Squeeze", ["scores", "zero"], ["scores2"]),
        n("Unsqueeze", ["cls_idx", "last"], ["ci"]),
        n("Unsqueeze", ["box_idx", "last"], ["bi"]),
        n("Concat", ["ci", "bi"], ["pairs"], axis=1),
        n("GatherND", ["scores2", "pairs"], ["kept_scores"]),
        n("TopK", ["kept_scores", "k"], ["top_scores", "top_idx"]),
        n("Gather", ["kept_boxes", "top_idx"], ["top_boxes"]),
        n("Shape", ["sel"], ["count"], end=1),
    ]
    consts = {"zero": [0], "four": [4], "end": [2**40], "last": [-1], "max_out": [20], "col2": 2, "col1": 1, "k": [5]}
    inits = [nh.from_array(np.array(v, np.int64), name) for name, v in consts.items()]
    inits += [nh.from_array(np.array([0.5], np.float32), "iou"), nh.from_array(np.array([0.3], np.float32), "floor")]
    outs = [helper.make_empty_tensor_value_info(o) for o in ("top_boxes", "top_scores", "count", "kept_scores")]
    pred = helper.make_tensor_value_info("pred", TensorProto.FLOAT, [1, 10, "N"])
    model = helper.make_model(helper.make_graph(nodes, "post", [pred], outs, inits), opset_imports=[helper.make_opsetid("", 18)])
    model.ir_version = 10
    return model


def test_detector_postprocessing_graph_matches_onnxruntime_across_input_sizes():
    """Views, NMS, gathers and TopK chained with dynamic and data-dependent shapes agree with onnxruntime on every run."""
    from minfer_core.testing import backend

    model = _detector_postprocess_model()
    rep = backend.prepare(model)
    sess = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(0)
    for n in (200, 500, 200):
        centers, sizes = rng.random((1, 2, n)) * 600, rng.random((1, 2, n)) * 60 + 10
        pred = np.concatenate([centers, sizes, rng.standard_normal((1, 6, n)) * 2], axis=1).astype(np.float32)
        for got, want in zip(rep.run({"pred": pred}), sess.run(None, {"pred": pred})):
            assert got.dtype == want.dtype and got.shape == want.shape
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
