"""minfer-ops-basic tensor kernels, part 1: shape/view ops, generators and Pad.

Rules are checked on the kernels directly (views, ONNX-specific corner rules)
and, where a reference helps, the same single-node model is run by minfer's
backend and by onnxruntime.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper

from minfer_core import kernels_in
from minfer_core.testing.ops import assert_node_matches_onnxruntime, call_kernel
from minfer_ops_basic import generate, pad, shape

ort = pytest.importorskip("onnxruntime")
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
KERNELS = kernels_in(shape, generate, pad)


def call(op_type, opset, *inputs, num_outputs=1, **attrs):
    """Call the kernel the engine would pick for this opset."""
    return call_kernel(KERNELS, op_type, opset, *inputs, num_outputs=num_outputs, **attrs)


def assert_matches_ort(op_type, opset, inputs, attrs=None, num_outputs=1):
    """minfer and onnxruntime agree on every output (dtype, shape, values)."""
    assert_node_matches_onnxruntime(op_type, opset, inputs, attrs, num_outputs)


X = np.arange(24, dtype=np.float32).reshape(2, 3, 4)


# --- zero-copy views ----------------------------------------------------------------------


@pytest.mark.parametrize(
    "op_type, opset, extra, attrs",
    [
        ("Reshape", 13, [np.array([4, -1], np.int64)], {}),
        ("Reshape", 1, [], {"shape": [6, 4]}),
        ("Flatten", 13, [], {"axis": 2}),
        ("Squeeze", 13, [], {}),
        ("Unsqueeze", 13, [np.array([0, -1], np.int64)], {}),
        ("Unsqueeze", 11, [], {"axes": [1]}),
        ("Identity", 19, [], {}),
    ],
)
def test_view_ops_share_memory_with_their_input(op_type, opset, extra, attrs):
    """Reshape, Flatten, Squeeze, Unsqueeze and Identity return views of a contiguous input."""
    x = X.reshape(1, 2, 3, 4) if op_type == "Squeeze" else X
    out = call(op_type, opset, x, *extra, **attrs)
    assert np.shares_memory(out, x)


@pytest.mark.parametrize("opset", [1, 7, 10, 13, 22])
def test_inference_dropout_is_a_view_with_an_all_true_mask(opset):
    """Inference Dropout returns a view and a keep-everything mask (bool from opset 10, data's dtype before)."""
    y, mask = call("Dropout", opset, X, num_outputs=2)
    assert np.shares_memory(y, X) and np.array_equal(y, X)
    assert mask.dtype == (np.bool_ if opset >= 10 else X.dtype) and mask.all()


def test_dropout_without_a_mask_output_builds_no_mask():
    """A Dropout node with one output gets just the view back, no full-size mask array."""
    y = call("Dropout", 13, X, np.array(0.3, np.float32), num_outputs=1)
    assert isinstance(y, np.ndarray) and np.shares_memory(y, X)


def test_training_dropout_scales_kept_values_and_is_seeded():
    """Dropout-12 in training mode zeroes dropped entries, scales kept ones by 1/(1-ratio), and a seed repeats the mask."""
    x = np.ones((50, 40), np.float32)
    args = (x, np.array(0.25, np.float32), np.array(True))
    y, mask = call("Dropout", 13, *args, num_outputs=2, seed=3)
    assert set(np.unique(y)) <= {0.0, np.float32(1 / 0.75)}
    assert np.array_equal(y != 0, mask) and 0.6 < mask.mean() < 0.9
    assert np.array_equal(call("Dropout", 13, *args, num_outputs=2, seed=3)[1], mask)


def test_view_ops_never_write_their_input():
    """Shape kernels leave their input untouched."""
    x = X.copy()
    for op_type, extra, attrs in [("Reshape", [np.array([0, -1], np.int64)], {}), ("Transpose", [], {}), ("Expand", [np.array([2, 2, 3, 4], np.int64)], {})]:
        call(op_type, 13, x, *extra, **attrs)
    assert np.array_equal(x, X)


# --- Reshape / Flatten / Squeeze / Unsqueeze rules ------------------------------------------


def test_reshape_zero_copies_the_input_dim():
    """Reshape: a 0 in shape copies the input's dim at that position, -1 takes what is left."""
    assert call("Reshape", 13, X, np.array([0, -1], np.int64)).shape == (2, 12)
    assert call("Reshape", 13, X, np.array([0, 0, -1, 2], np.int64)).shape == (2, 3, 2, 2)


def test_reshape_allowzero_makes_zero_a_real_dim():
    """Reshape-14 with allowzero=1: 0 is an empty dim, not a copy."""
    empty = np.zeros((0, 4), np.float32)
    assert call("Reshape", 14, empty, np.array([4, 0], np.int64), allowzero=1).shape == (4, 0)
    with pytest.raises(ValueError):
        call("Reshape", 14, X, np.array([0, -1], np.int64), allowzero=1)


@pytest.mark.parametrize("axis, want", [(0, (1, 24)), (1, (2, 12)), (2, (6, 4)), (3, (24, 1)), (-1, (6, 4)), (-2, (2, 12)), (-3, (1, 24))])
def test_flatten_splits_dims_at_axis(axis, want):
    """Flatten: output is (prod(dims[:axis]), prod(dims[axis:])), negative axis counting from the back."""
    assert call("Flatten", 13, X, axis=axis).shape == want


def test_flatten_handles_zero_sized_dims():
    """Flatten of a tensor with a zero dim keeps the other factor exact."""
    assert call("Flatten", 13, np.zeros((0, 3, 4), np.float32), axis=1).shape == (0, 12)
    assert call("Flatten", 13, np.zeros((2, 0, 4), np.float32), axis=1).shape == (2, 0)


def test_squeeze_without_axes_drops_all_ones_and_checks_given_axes():
    """Squeeze drops every size-1 dim by default, and refuses to squeeze a dim that is not 1."""
    x = np.zeros((1, 3, 1, 2), np.float32)
    assert call("Squeeze", 13, x).shape == (3, 2)
    assert call("Squeeze", 13, x, np.array([-2], np.int64)).shape == (1, 3, 2)
    with pytest.raises(ValueError):
        call("Squeeze", 13, x, np.array([1], np.int64))


def test_unsqueeze_axes_refer_to_the_output():
    """Unsqueeze axes (negative too) index the output's dims."""
    assert call("Unsqueeze", 13, X, np.array([0, 4], np.int64)).shape == (1, 2, 3, 4, 1)
    assert call("Unsqueeze", 13, X, np.array([-1, 1], np.int64)).shape == (2, 1, 3, 4, 1)
    assert call("Unsqueeze", 13, np.float32(3).reshape(()), np.array([0], np.int64)).shape == (1,)


# --- Split / Shape / Concat / Expand / Tile ---------------------------------------------------


def test_split_uneven_num_outputs_makes_the_last_chunk_smaller():
    """Split-18 with num_outputs: chunks of ceil(n/k), the last one smaller."""
    parts = call("Split", 18, np.arange(7), num_outputs=3, axis=0)
    assert [p.tolist() for p in parts] == [[0, 1, 2], [3, 4, 5], [6]]


def test_split_sizes_from_input_or_attribute_and_equal_default():
    """Split takes sizes from the attribute (2-11) or input (13+), else equal parts per output."""
    x = np.arange(12).reshape(2, 6)
    assert [p.shape for p in call("Split", 11, x, axis=1, split=[1, 5])] == [(2, 1), (2, 5)]
    assert [p.shape for p in call("Split", 13, x, np.array([2, 0, 4], np.int64), axis=-1)] == [(2, 2), (2, 0), (2, 4)]
    assert [p.shape for p in call("Split", 13, x, num_outputs=3, axis=1)] == [(2, 2)] * 3


@pytest.mark.parametrize("start, end", [(0, None), (1, None), (-1, None), (0, -1), (-10, 10), (2, 1)])
def test_shape_start_end_clamp_like_python_slices(start, end):
    """Shape-15: dims [start, end) with negatives counted from the back and clamped, always int64."""
    attrs = {"start": start} if end is None else {"start": start, "end": end}
    out = call("Shape", 15, X, **attrs)
    assert out.dtype == np.int64 and out.tolist() == list(X.shape[start:end])
    assert_matches_ort("Shape", 15, [X], attrs)


def test_size_is_a_0d_int64_array():
    """Size returns a real 0-d int64 ndarray, never a Python or numpy scalar."""
    out = call("Size", 13, X)
    assert type(out) is np.ndarray and out.shape == () and out.dtype == np.int64 and out == 24


def test_expand_broadcasts_both_ways():
    """Expand is bidirectional: a 1 in shape keeps the input dim."""
    out = call("Expand", 13, np.arange(3).reshape(3, 1), np.array([2, 1, 4], np.int64))
    assert out.shape == (2, 3, 4) and out.flags.writeable


def test_concat_1_defaults_to_axis_1_and_tile_1_repeats_one_axis():
    """Concat-1 joins along axis 1 by default; Tile-1 repeats one axis given as an input."""
    assert call("Concat", 1, X, X).shape == (2, 6, 4)
    assert call("Tile", 1, X, np.array(3), np.array(2)).shape == (2, 3, 12)


@st.composite
def reshape_cases(draw):
    """A random tensor and a target shape with some 0s (copies) and at most one -1."""
    dims = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4))
    total = int(np.prod(dims))
    target = list(reversed(dims)) if draw(st.booleans()) else [total]
    if draw(st.booleans()):
        target[draw(st.integers(0, len(target) - 1))] = -1
    for i in range(min(len(target), len(dims))):
        if target[i] == dims[i] and draw(st.booleans()):
            target[i] = 0
    return np.arange(total, dtype=np.float32).reshape(dims), np.array(target, np.int64)


@SETTINGS
@given(reshape_cases(), st.sampled_from([5, 13, 14]))
def test_reshape_matches_onnxruntime(case, opset):
    """Reshape with 0 and -1 entries agrees with onnxruntime."""
    x, target = case
    assert_matches_ort("Reshape", opset, [x, target])


@SETTINGS
@given(hnp.array_shapes(min_dims=1, max_dims=5, max_side=3), st.data())
def test_transpose_matches_onnxruntime(dims, data):
    """Transpose with a random (or absent) perm agrees with onnxruntime."""
    x = np.random.default_rng(0).standard_normal(dims).astype(np.float32)
    attrs = {} if data.draw(st.booleans()) else {"perm": data.draw(st.permutations(range(len(dims))))}
    assert_matches_ort("Transpose", 13, [x], attrs)


@st.composite
def layout_cases(draw):
    """A random tensor, an axis, broadcastable Expand target, Tile repeats (zeros included)."""
    dims = draw(hnp.array_shapes(min_dims=1, max_dims=4, min_side=1, max_side=4))
    x = np.arange(int(np.prod(dims)), dtype=np.float32).reshape(dims)
    axis = draw(st.integers(-len(dims), len(dims) - 1))
    target = [d if draw(st.booleans()) else 1 for d in dims]
    small = x[tuple(slice(0, t) for t in target)]
    lead = draw(st.lists(st.integers(1, 3), max_size=2))
    expand_to = lead + [d if t == 1 and draw(st.booleans()) else t for d, t in zip(dims, target)]
    repeats = [draw(st.integers(0, 3)) for _ in dims]
    return x, axis, small, np.array(expand_to, np.int64), np.array(repeats, np.int64)


@SETTINGS
@given(layout_cases())
def test_expand_tile_concat_split_match_onnxruntime(case):
    """Expand, Tile, Concat and Split-13 (equal parts) agree with onnxruntime on random shapes and axes."""
    x, axis, small, expand_to, repeats = case
    assert_matches_ort("Expand", 13, [small, expand_to])
    assert_matches_ort("Tile", 13, [x, repeats])
    assert_matches_ort("Concat", 13, [x, x[:1] if axis % x.ndim == 0 else x], {"axis": axis})
    parts = next(n for n in (3, 2, 1) if x.shape[axis] % n == 0)
    assert_matches_ort("Split", 13, [x], {"axis": axis}, num_outputs=parts)


# --- generators ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "attrs, want",
    [
        ({"value_float": 1.5}, np.array(1.5, np.float32)),
        ({"value_floats": [1.0, 2.0]}, np.array([1, 2], np.float32)),
        ({"value_int": 7}, np.array(7, np.int64)),
        ({"value_ints": [3]}, np.array([3], np.int64)),
        ({"value": np.arange(4, dtype=np.int32).reshape(2, 2)}, np.arange(4, dtype=np.int32).reshape(2, 2)),
    ],
)
def test_constant_value_attributes_have_onnx_types(attrs, want):
    """Constant-13: value_float(s) are float32, value_int(s) int64, scalars 0-d, lists 1-D."""
    out = call("Constant", 13, **attrs)
    assert out.dtype == want.dtype and out.shape == want.shape and np.array_equal(out, want)


def test_constant_of_shape_fills_with_value_dtype():
    """ConstantOfShape uses the value tensor's dtype (default float32 zero); an empty shape gives a scalar."""
    assert call("ConstantOfShape", 9, np.array([2, 3], np.int64)).dtype == np.float32
    out = call("ConstantOfShape", 20, np.array([], np.int64), value=np.array([5], np.int32))
    assert out.shape == () and out.dtype == np.int32 and out == 5


@pytest.mark.parametrize(
    "start, limit, delta", [(0, 10, 3), (10, 4, -2), (5, 5, 1), (1, 0, 1), (0.5, 2.0, 0.25), (-3.0, 3.0, 0.7)]
)
def test_range_counts_ceil_of_span_over_delta(start, limit, delta):
    """Range has max(ceil((limit-start)/delta), 0) elements start + i*delta, in start's dtype."""
    dtype = np.float32 if isinstance(start, float) else np.int64
    args = [np.array(v, dtype) for v in (start, limit, delta)]
    assert_matches_ort("Range", 11, args)


def test_onehot_wraps_negative_indices_and_ignores_out_of_range():
    """OneHot: index -1 means depth-1; indices outside [-depth, depth) give all off values."""
    out = call("OneHot", 11, np.array([0, -1, 5]), np.array(3), np.array([2.0, 9.0], np.float32), axis=0)
    assert out.dtype == np.float32 and out.T.tolist() == [[9, 2, 2], [2, 2, 9], [2, 2, 2]]


def test_eyelike_dtype_and_offset():
    """EyeLike places ones on diagonal k in the requested dtype (TensorProto code)."""
    out = call("EyeLike", 9, np.zeros((3, 4), np.float32), dtype=TensorProto.INT32, k=1)
    assert out.dtype == np.int32 and out.tolist() == np.eye(3, 4, 1, dtype=np.int32).tolist()


@pytest.mark.parametrize("k", [-5, -1, 0, 2, 9, 2**62])
@pytest.mark.parametrize("upper", [0, 1])
def test_trilu_matches_onnxruntime(k, upper):
    """Trilu keeps one triangle of the last two dims from diagonal k, even for extreme k."""
    x = np.arange(2 * 3 * 5, dtype=np.float32).reshape(2, 3, 5)
    assert_matches_ort("Trilu", 14, [x, np.array(k, np.int64)], {"upper": upper})


# --- Pad ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
def test_pad_modes_match_numpy(mode):
    """Pad-19 modes constant/reflect/edge/wrap mean what numpy's pad modes mean."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = call("Pad", 19, x, np.array([1, 2, 2, 1], np.int64), np.array(7, np.float32), mode=mode)
    extra = {"constant_values": 7} if mode == "constant" else {}
    assert np.array_equal(out, np.pad(x, [(1, 2), (2, 1)], mode=mode, **extra))


def test_pad_negative_pads_crop():
    """Negative pads remove entries from that side."""
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    out = call("Pad", 13, x, np.array([-1, 1, 0, -2], np.int64))
    assert np.array_equal(out, np.pad(x[1:, :2], [(0, 0), (1, 0)]))


def test_pad_axes_input_limits_pads_to_those_axes():
    """Pad-18 axes: pads hold begins then ends for the listed axes only (negative axes allowed)."""
    out = call("Pad", 18, X, np.array([1, 2], np.int64), None, np.array([-1], np.int64))
    assert out.shape == (2, 3, 7) and out[..., 0].sum() == 0


def test_pad_attribute_forms():
    """Pad-1 reads `paddings`, Pad-2 `pads`, both with a `value` attribute."""
    x = np.ones((2, 2), np.float32)
    assert call("Pad", 1, x, paddings=[0, 1, 0, 0], value=3.0)[0, 0] == 3
    assert call("Pad", 2, x, pads=[1, 0, 0, 0], mode="edge").shape == (3, 2)


@st.composite
def pad_cases(draw):
    """A random tensor, per-axis pads in [-1, 3] (negative ones crop first), a mode.

    Positive pads stay within what the cropped axis can reflect or wrap.
    """
    dims = draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=3, max_side=5))
    mode = draw(st.sampled_from(["constant", "reflect", "edge", "wrap"]))
    begins, ends = [], []
    for d in dims:
        b, e = draw(st.integers(-1, 3)), draw(st.integers(-1, 3))
        kept = d - max(-b, 0) - max(-e, 0)
        cap = {"reflect": kept - 1, "wrap": kept}.get(mode, 3)
        begins.append(min(b, cap))
        ends.append(min(e, cap))
    x = np.arange(int(np.prod(dims)), dtype=np.float32).reshape(dims)
    return x, np.array(begins + ends, np.int64), mode


@SETTINGS
@given(pad_cases())
def test_pad_matches_onnxruntime(case):
    """Pad in every mode agrees with onnxruntime on random shapes and pads."""
    x, pads, mode = case
    assert_matches_ort("Pad", 19, [x, pads, np.array(2.5, np.float32)], {"mode": mode})
