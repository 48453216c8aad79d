"""minfer-ops-basic math kernels, part 2: reductions, linear algebra and transformer blocks."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto

from test_ops_basic_math import RNG, SETTINGS, X, assert_matches_ort, call

ort = pytest.importorskip("onnxruntime")

REDUCE_OPS = [
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare",
]  # fmt: skip
AXES_INPUT_SINCE = {op: 13 if op == "ReduceSum" else 18 for op in REDUCE_OPS}
POS = np.abs(X) + 0.5  # keeps ReduceLogSum finite


# --- reductions ----------------------------------------------------------------


@pytest.mark.parametrize("op", REDUCE_OPS)
@pytest.mark.parametrize("keepdims", [0, 1])
def test_reduce_axes_as_input_and_attribute_agree_with_onnxruntime(op, keepdims):
    """Reduce* over axes given as an input (new opsets) or an attribute (old) matches onnxruntime."""
    axes = np.array([0, -1], dtype=np.int64)
    assert_matches_ort(op, 18, [POS, axes], {"keepdims": keepdims})
    assert_matches_ort(op, 11, [POS], {"keepdims": keepdims, "axes": [0, -1]})


@pytest.mark.parametrize("op", REDUCE_OPS)
def test_reduce_with_no_axes_reduces_everything_or_nothing(op):
    """Missing or empty axes reduce all dims, unless noop_with_empty_axes=1 makes the op an identity."""
    since = AXES_INPUT_SINCE[op]
    empty = np.array([], dtype=np.int64)
    everything = call(op, since, POS, keepdims=0)
    assert everything.shape == ()
    np.testing.assert_allclose(call(op, since, POS, empty, keepdims=0), everything, rtol=1e-6)
    np.testing.assert_array_equal(call(op, since, POS, empty, noop_with_empty_axes=1), POS)
    np.testing.assert_array_equal(call(op, since, POS, noop_with_empty_axes=1), POS)
    np.testing.assert_allclose(call(op, 1, POS, keepdims=0), everything, rtol=1e-6)
    assert_matches_ort(op, 18 if op != "ReduceSum" else 13, [POS], {"keepdims": 1})


def test_reduce_over_an_empty_set_gives_the_identity():
    """Reducing a zero-length axis gives each op's identity: 0, 1, -inf, +inf, or -inf for logs."""
    x = np.zeros((2, 0, 3), dtype=np.float32)
    axis = np.array([1], dtype=np.int64)
    want = {
        "ReduceSum": 0, "ReduceProd": 1, "ReduceMax": -np.inf, "ReduceMin": np.inf, "ReduceL1": 0, "ReduceL2": 0,
        "ReduceSumSquare": 0, "ReduceLogSum": -np.inf, "ReduceLogSumExp": -np.inf,
    }  # fmt: skip
    for op, value in want.items():
        out = call(op, AXES_INPUT_SINCE[op], x, axis)
        assert out.shape == (2, 1, 3) and out.dtype == np.float32, op
        np.testing.assert_array_equal(out, np.full((2, 1, 3), value, np.float32), err_msg=op)
    ints = call("ReduceMax", 20, np.zeros((0, 2), np.int32), np.array([0], np.int64), keepdims=0)
    np.testing.assert_array_equal(ints, [np.iinfo(np.int32).min] * 2)


def test_reduce_keeps_integer_dtypes():
    """ReduceSum/Prod/Mean on int32 return int32 (numpy would widen sums to int64)."""
    x = np.arange(1, 7, dtype=np.int32).reshape(2, 3)
    for op in ("ReduceSum", "ReduceProd", "ReduceMean", "ReduceMax"):
        out = call(op, AXES_INPUT_SINCE[op], x, np.array([1], np.int64), keepdims=0)
        assert out.dtype == np.int32, op
    np.testing.assert_array_equal(call("ReduceMean", 18, x, np.array([1], np.int64), keepdims=0), [2, 5])
    assert_matches_ort("ReduceSum", 13, [x, np.array([1], np.int64)])


@SETTINGS
@given(
    x=hnp.arrays(np.float32, hnp.array_shapes(min_dims=1, max_dims=4, max_side=4), elements=st.floats(-3, 3, width=32)),
    data=st.data(),
)
def test_reduce_sum_and_mean_match_onnxruntime_for_any_axes(x, data):
    """ReduceSum/ReduceMean over any subset of axes (negative allowed) match onnxruntime."""
    axes = data.draw(st.lists(st.integers(-x.ndim, x.ndim - 1), min_size=1, max_size=x.ndim, unique_by=lambda a: a % x.ndim))
    keep = data.draw(st.sampled_from([0, 1]))
    axes_arr = np.array(axes, dtype=np.int64)
    assert_matches_ort("ReduceSum", 13, [x, axes_arr], {"keepdims": keep}, rtol=1e-5, atol=1e-5)
    assert_matches_ort("ReduceMean", 18, [x, axes_arr], {"keepdims": keep}, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("op", ["ArgMax", "ArgMin"])
def test_argmax_select_last_index_and_keepdims(op):
    """ArgMax/ArgMin return int64 indices of the first (or last) extreme, with or without the kept dim."""
    x = np.array([[2, 5, 5, 1], [1, 1, 0, 0]], dtype=np.float32)
    first = call(op, 13, x, axis=1, keepdims=0)
    last = call(op, 13, x, axis=1, keepdims=0, select_last_index=1)
    assert first.dtype == np.int64
    if op == "ArgMax":
        np.testing.assert_array_equal(first, [1, 0])
        np.testing.assert_array_equal(last, [2, 1])
    else:
        np.testing.assert_array_equal(first, [3, 2])
        np.testing.assert_array_equal(last, [3, 3])
    assert call(op, 13, x, axis=0).shape == (1, 4)
    assert_matches_ort(op, 13, [x], {"axis": -1, "select_last_index": 1})


# --- linear algebra --------------------------------------------------------------


@pytest.mark.parametrize(
    "attrs",
    [{}, {"transA": 1}, {"transB": 1}, {"alpha": 0.5, "beta": 2.0}, {"transA": 1, "transB": 1, "alpha": -1.5}],
)
@pytest.mark.parametrize("c_shape", [None, (5,), (1, 5), (4, 1), (4, 5)])
def test_gemm_attributes_match_onnxruntime(attrs, c_shape):
    """Gemm honours alpha, beta, transA, transB, and a missing or broadcast C."""
    a = RNG.standard_normal((3, 4) if attrs.get("transA") else (4, 3)).astype(np.float32)
    b = RNG.standard_normal((5, 3) if attrs.get("transB") else (3, 5)).astype(np.float32)
    inputs = [a, b] + ([] if c_shape is None else [RNG.standard_normal(c_shape).astype(np.float32)])
    assert_matches_ort("Gemm", 13, inputs, attrs)


def test_gemm_prepares_a_constant_b_once():
    """With B (and C) known at build time, the prepared Gemm gives the same result as the plain path."""
    from minfer_core import KernelContext
    from minfer_ops_basic import linalg

    a = RNG.standard_normal((4, 3)).astype(np.float32)
    b = RNG.standard_normal((5, 3)).astype(np.float32)
    c = RNG.standard_normal((5,)).astype(np.float32)
    ctx = KernelContext("g", "Gemm", 13, (None,) * 3, (None,), (None, b, c), 1)
    run = linalg.gemm.fn(ctx, alpha=2.0, beta=0.5, transB=1)
    want = 2.0 * a @ b.T + 0.5 * c
    np.testing.assert_allclose(run(a, b, c), want, rtol=1e-5)
    np.testing.assert_allclose(run(a, b, c), want, rtol=1e-5)  # pre-packed state is not mutated


@pytest.mark.parametrize(("sa", "sb"), [((3,), (3,)), ((2, 3), (3,)), ((3,), (3, 4)), ((2, 1, 3, 4), (5, 4, 2)), ((4, 3), (3, 2))])
def test_matmul_follows_numpy_rank_rules(sa, sb):
    """MatMul promotes 1-D operands and broadcasts batch dims like numpy.matmul (and onnxruntime)."""
    a, b = RNG.standard_normal(sa).astype(np.float32), RNG.standard_normal(sb).astype(np.float32)
    assert_matches_ort("MatMul", 13, [a, b])


def test_matmul_half_precision_stays_half():
    """float16 MatMul is computed through float32 but returns float16."""
    a, b = RNG.standard_normal((8, 16)).astype(np.float16), RNG.standard_normal((16, 4)).astype(np.float16)
    out = call("MatMul", 13, a, b)
    assert out.dtype == np.float16
    np.testing.assert_allclose(out, (a.astype(np.float32) @ b.astype(np.float32)), rtol=2e-3, atol=2e-3)


def test_matmul_integer_subtracts_zero_points():
    """MatMulInteger computes (A - a_zp) @ (B - b_zp) exactly in int32, with per-row/per-column zero points."""
    a = RNG.integers(0, 255, (3, 4), dtype=np.uint8)
    b = RNG.integers(-128, 127, (4, 2), dtype=np.int8)
    a_zp, b_zp = np.array(12, np.uint8), np.array([3, -4], np.int8)
    out = call("MatMulInteger", 10, a, b, a_zp, b_zp)
    want = (a.astype(np.int32) - 12) @ (b.astype(np.int32) - b_zp.astype(np.int32))
    assert out.dtype == np.int32
    np.testing.assert_array_equal(out, want)
    assert_matches_ort("MatMulInteger", 10, [a, b, a_zp])


@pytest.mark.parametrize("eq", ["ij,jk->ik", "bij,bjk->bik", "ii->i", "ij->", "i,j", "...ij,...jk", "Ab,bC->AC"])
def test_einsum_matches_numpy(eq):
    """Einsum evaluates explicit, implicit, diagonal and ellipsis equations."""
    shapes = {
        "ij,jk->ik": [(2, 3), (3, 4)], "bij,bjk->bik": [(2, 2, 3), (2, 3, 2)], "ii->i": [(3, 3)], "ij->": [(2, 3)],
        "i,j": [(2,), (3,)], "...ij,...jk": [(2, 2, 3), (2, 3, 4)], "Ab,bC->AC": [(2, 3), (3, 2)],
    }[eq]  # fmt: skip
    xs = [RNG.standard_normal(s).astype(np.float32) for s in shapes]
    out = call("Einsum", 12, *xs, equation=eq)
    assert out.dtype == np.float32
    np.testing.assert_allclose(out, np.einsum(eq, *xs), rtol=1e-5, atol=1e-6)
    assert_matches_ort("Einsum", 12, xs, {"equation": eq})


def test_det_of_a_batch():
    """Det returns one determinant per trailing square matrix."""
    x = RNG.standard_normal((2, 3, 3)).astype(np.float32)
    assert_matches_ort("Det", 11, [x], rtol=1e-4)


# --- transformer blocks ------------------------------------------------------------


@pytest.mark.parametrize("axis", [-1, -2, 1])
def test_layer_normalization_returns_mean_and_inv_std(axis):
    """LayerNormalization's Y, Mean and InvStdDev over axes [axis, rank) match onnxruntime."""
    shape = X.shape[axis % 3 :]
    scale, bias = RNG.standard_normal(shape).astype(np.float32), RNG.standard_normal(shape).astype(np.float32)
    assert_matches_ort("LayerNormalization", 17, [X, scale, bias], {"axis": axis, "epsilon": 1e-3}, num_outputs=3)
    y, mean, inv = call("LayerNormalization", 17, X, scale, axis=axis)
    assert mean.shape == X.shape[: axis % 3] + (1,) * len(shape)
    assert y.dtype == mean.dtype == inv.dtype == np.float32


def test_layer_normalization_half_input_stashes_float32():
    """With stash_type=1 a float16 input is normalized in float32: Y is float16, Mean/InvStdDev float32."""
    x = X.astype(np.float16)
    y, mean, inv = call("LayerNormalization", 17, x, np.ones(4, np.float16))
    assert (y.dtype, mean.dtype, inv.dtype) == (np.float16, np.float32, np.float32)
    _, mean32, _ = call("LayerNormalization", 17, x.astype(np.float32), np.ones(4, np.float32))
    np.testing.assert_allclose(mean, mean32, rtol=1e-6)


def test_rms_normalization_matches_the_formula():
    """RMSNormalization divides by sqrt(mean(x^2) + epsilon) over the trailing axes, then scales."""
    scale = RNG.standard_normal((3, 4)).astype(np.float32)
    out = call("RMSNormalization", 23, X, scale, axis=1, epsilon=1e-4)
    rms = np.sqrt(np.mean(X.astype(np.float64) ** 2, axis=(1, 2), keepdims=True) + 1e-4)
    np.testing.assert_allclose(out, X / rms * scale, rtol=1e-5)
    assert out.dtype == np.float32


def _rope_reference(x, cos, sin, interleaved):
    """Rotation of each (x1, x2) pair by hand, for a (batch, heads, seq, dim) input and (batch, seq, dim/2) caches."""
    half = x.shape[-1] // 2
    if interleaved:
        x1, x2 = x[..., 0::2], x[..., 1::2]
    else:
        x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None], sin[:, None]
    r1, r2 = c * x1 - s * x2, s * x1 + c * x2
    out = np.empty_like(x)
    if interleaved:
        out[..., 0::2], out[..., 1::2] = r1, r2
    else:
        out[..., :half], out[..., half:] = r1, r2
    return out


@pytest.mark.parametrize("interleaved", [0, 1])
def test_rotary_embedding_rotates_pairs_by_position(interleaved):
    """RotaryEmbedding rotates (i, i+d/2) pairs, or (2i, 2i+1) when interleaved, by the cached angle of each position."""
    x = RNG.standard_normal((2, 3, 5, 8)).astype(np.float32)
    theta = RNG.standard_normal((10, 4)).astype(np.float32)
    pos = np.array([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9]], dtype=np.int64)
    cos, sin = np.cos(theta), np.sin(theta)
    out = call("RotaryEmbedding", 23, x, cos, sin, pos, interleaved=interleaved)
    np.testing.assert_allclose(out, _rope_reference(x, cos[pos], sin[pos], interleaved), rtol=1e-5, atol=1e-6)
    # 3-D input: (batch, seq, heads * dim) with num_heads
    x3 = x.transpose(0, 2, 1, 3).reshape(2, 5, 24)
    out3 = call("RotaryEmbedding", 23, x3, cos, sin, pos, interleaved=interleaved, num_heads=3)
    np.testing.assert_allclose(out3, out.transpose(0, 2, 1, 3).reshape(2, 5, 24), rtol=1e-6)


def test_rotary_embedding_partial_rotation_leaves_the_tail():
    """With rotary_embedding_dim < head size only the leading features rotate."""
    x = RNG.standard_normal((1, 2, 3, 8)).astype(np.float32)
    cos = RNG.standard_normal((1, 3, 2)).astype(np.float32)
    sin = RNG.standard_normal((1, 3, 2)).astype(np.float32)
    out = call("RotaryEmbedding", 23, x, cos, sin, rotary_embedding_dim=4)
    np.testing.assert_array_equal(out[..., 4:], x[..., 4:])
    np.testing.assert_allclose(out[..., :4], _rope_reference(x[..., :4], cos, sin, 0), rtol=1e-6)


def _sdpa(q, k, v, mask=None, scale=None):
    """Plain scaled dot-product attention in float64, for 4-D inputs with equal head counts."""
    scale = 1 / np.sqrt(q.shape[-1]) if scale is None else scale
    s = (q.astype(np.float64) @ k.astype(np.float64).swapaxes(-1, -2)) * scale
    if mask is not None:
        s = s + mask
    s = s - s.max(-1, keepdims=True)
    p = np.exp(s)
    return (p / p.sum(-1, keepdims=True)) @ v


def test_attention_causal_with_past_matches_the_formula():
    """Attention with a KV cache aligns the causal mask bottom-right: query i sees keys up to past + i."""
    q = RNG.standard_normal((1, 2, 3, 4)).astype(np.float32)
    k, v = RNG.standard_normal((2, 1, 2, 3, 4)).astype(np.float32)
    pk, pv = RNG.standard_normal((2, 1, 2, 2, 4)).astype(np.float32)
    y, present_k, present_v, _ = call("Attention", 23, q, k, v, None, pk, pv, is_causal=1)
    kk, vv = np.concatenate([pk, k], 2), np.concatenate([pv, v], 2)
    np.testing.assert_array_equal(present_k, kk)
    mask = np.where(np.arange(5)[None, :] <= 2 + np.arange(3)[:, None], 0, -np.inf)
    np.testing.assert_allclose(y, _sdpa(q, kk, vv, mask), rtol=1e-5, atol=1e-6)
    assert y.dtype == np.float32


def test_attention_grouped_query_with_3d_inputs():
    """3-D Q/K/V with q_num_heads > kv_num_heads share each kv head across its query-head group."""
    q = RNG.standard_normal((2, 3, 4 * 2)).astype(np.float32)
    k = RNG.standard_normal((2, 5, 2 * 2)).astype(np.float32)
    v = RNG.standard_normal((2, 5, 2 * 3)).astype(np.float32)
    y = call("Attention", 23, q, k, v, q_num_heads=4, kv_num_heads=2, scale=0.3)[0]
    assert y.shape == (2, 3, 4 * 3)
    q4 = q.reshape(2, 3, 4, 2).transpose(0, 2, 1, 3)
    k4 = np.repeat(k.reshape(2, 5, 2, 2).transpose(0, 2, 1, 3), 2, axis=1)
    v4 = np.repeat(v.reshape(2, 5, 2, 3).transpose(0, 2, 1, 3), 2, axis=1)
    want = _sdpa(q4, k4, v4, scale=0.3).transpose(0, 2, 1, 3).reshape(2, 3, 12)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def test_attention_fully_masked_row_is_zero_not_nan():
    """A query row whose boolean mask blocks every key outputs zeros, in Y and in the mode-3 probabilities."""
    q, k, v = RNG.standard_normal((3, 1, 1, 2, 4)).astype(np.float32)
    mask = np.array([[True, False], [False, False]])
    y, _, _, probs = call("Attention", 23, q, k, v, mask, qk_matmul_output_mode=3)
    np.testing.assert_array_equal(y[0, 0, 1], 0)
    np.testing.assert_array_equal(probs[0, 0, 1], 0)
    np.testing.assert_allclose(y[0, 0, 0], v[0, 0, 0], rtol=1e-6)


def test_attention_sliding_window_and_softcap():
    """left/right_window_size bound the visible keys around each query; softcap squashes logits with tanh."""
    q, k, v = RNG.standard_normal((3, 1, 1, 6, 4)).astype(np.float32)
    y = call("Attention", 25, q, k, v, left_window_size=1, right_window_size=0, softcap=2.0)[0]
    i, j = np.arange(6)[:, None], np.arange(6)[None, :]
    mask = np.where((j <= i) & (j >= i - 1), 0, -np.inf)
    s = (q.astype(np.float64) @ k.swapaxes(-1, -2)) / 2
    s = 2.0 * np.tanh(s / 2.0) + mask
    p = np.exp(s - s.max(-1, keepdims=True))
    np.testing.assert_allclose(y, (p / p.sum(-1, keepdims=True)) @ v, rtol=1e-5, atol=1e-6)


def test_attention_matches_onnxruntime():
    """Attention-23 with a float mask and causal flag agrees with onnxruntime."""
    q, k, v = RNG.standard_normal((3, 2, 2, 4, 8)).astype(np.float32)
    mask = RNG.standard_normal((4, 4)).astype(np.float32)
    try:
        assert_matches_ort("Attention", 23, [q, k, v, mask], {"is_causal": 1})
    except Exception as exc:  # onnxruntime builds without Attention-23 cannot serve as the oracle
        if "NOT_IMPLEMENTED" in str(exc) or "not implemented" in str(exc).lower():
            pytest.skip(str(exc)[:100])
        raise


def test_swiglu_gates_with_swish():
    """SwiGLU is swish_alpha(A) * B."""
    a, b = RNG.standard_normal((2, 2, 5)).astype(np.float32)
    out = call("SwiGLU", 28, a, b, alpha=1.5)
    np.testing.assert_allclose(out, a / (1 + np.exp(-1.5 * a)) * b, rtol=1e-5, atol=1e-7)
    assert out.dtype == np.float32 and call("Cast", 13, out, to=TensorProto.FLOAT16).dtype == np.float16


# --- quantization ----------------------------------------------------------------


def test_quantize_rounds_half_to_even_and_saturates():
    """QuantizeLinear rounds x/scale half to even, adds the zero point, and clamps to the target range."""
    x = np.array([0.5, 1.5, 2.5, -1.0, 1000.0, -1000.0], dtype=np.float32)
    out = call("QuantizeLinear", 13, x, np.array(1.0, np.float32), np.array(10, np.uint8))
    assert out.dtype == np.uint8
    np.testing.assert_array_equal(out, [10, 12, 12, 9, 255, 0])
    assert call("QuantizeLinear", 13, x, np.array(1.0, np.float32)).dtype == np.uint8  # no zero point: uint8
    assert_matches_ort("QuantizeLinear", 13, [x, np.array(0.5, np.float32), np.array(-3, np.int8)])


def test_quantize_per_axis_and_per_block():
    """A 1-D scale applies along axis; a blocked scale repeats every block_size elements along axis."""
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    scale, zp = np.array([0.1, 0.2, 0.3], np.float32), np.array([1, 2, 3], np.int8)
    assert_matches_ort("QuantizeLinear", 13, [x, scale, zp], {"axis": 1})
    q = call("QuantizeLinear", 13, x, scale, zp, axis=1)
    assert_matches_ort("DequantizeLinear", 13, [q, scale, zp], {"axis": 1})
    blocked = np.array([[[0.1, 0.2]] * 3] * 2, np.float32).reshape(2, 3, 2)  # blocks of 2 along the last axis
    got = call("QuantizeLinear", 21, x, blocked, None, axis=-1, block_size=2)
    np.testing.assert_array_equal(got, np.clip(np.rint(x / np.repeat(blocked, 2, axis=-1)), 0, 255).astype(np.uint8))


def test_dequantize_int32_has_no_precision_loss():
    """DequantizeLinear of int32 accumulators keeps values beyond float32's 24-bit mantissa exact before scaling."""
    x = np.array([2**25 + 1, -(2**25) - 1], dtype=np.int32)
    out = call("DequantizeLinear", 13, x, np.array(1.0, np.float32))
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, x.astype(np.float64).astype(np.float32))


def test_dynamic_quantize_linear_matches_onnxruntime():
    """DynamicQuantizeLinear picks a uint8 range that contains zero; y, scale and zero point match onnxruntime."""
    x = (RNG.standard_normal((3, 5)) * 4 + 1).astype(np.float32)
    assert_matches_ort("DynamicQuantizeLinear", 11, [x], num_outputs=3)


def test_qlinear_matmul_matches_onnxruntime():
    """QLinearMatMul equals quantize(dequantize(a) @ dequantize(b)) with exact integer accumulation."""
    a = RNG.integers(0, 255, (3, 8), dtype=np.uint8)
    b = RNG.integers(0, 255, (8, 4), dtype=np.uint8)
    f32 = lambda v: np.array(v, np.float32)  # noqa: E731
    u8 = lambda v: np.array(v, np.uint8)  # noqa: E731
    inputs = [a, f32(0.02), u8(120), b, f32(0.03), u8(130), f32(0.5), u8(128)]
    assert_matches_ort("QLinearMatMul", 10, inputs, atol=1)


# --- recurrent ---------------------------------------------------------------------


def _recurrent_inputs(op, num_dir, gates, hidden=3, seq=4, batch=2, size=5, layout=0, lens=None, peephole=False):
    """X, W, R, B, sequence_lens, initial_h (and initial_c, P for LSTM) with the shapes ONNX expects."""
    x = RNG.standard_normal((batch, seq, size) if layout else (seq, batch, size)).astype(np.float32)
    w = RNG.standard_normal((num_dir, gates * hidden, size)).astype(np.float32) * 0.5
    r = RNG.standard_normal((num_dir, gates * hidden, hidden)).astype(np.float32) * 0.5
    b = RNG.standard_normal((num_dir, 2 * gates * hidden)).astype(np.float32) * 0.1
    state = (batch, num_dir, hidden) if layout else (num_dir, batch, hidden)
    lens = np.array(lens if lens is not None else [seq] * batch, dtype=np.int32)
    inputs = [x, w, r, b, lens, RNG.standard_normal(state).astype(np.float32)]
    if op == "LSTM":
        inputs.append(RNG.standard_normal(state).astype(np.float32))
        inputs.append(RNG.standard_normal((num_dir, 3 * hidden)).astype(np.float32) if peephole else None)
    return inputs


@pytest.mark.parametrize(("op", "gates", "outputs"), [("RNN", 1, 2), ("GRU", 3, 2), ("LSTM", 4, 3)])
@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_recurrent_ops_with_ragged_sequences_match_onnxruntime(op, gates, outputs, direction):
    """RNN/GRU/LSTM in every direction honour sequence_lens (zero padding output, state held) like onnxruntime."""
    num_dir = 2 if direction == "bidirectional" else 1
    inputs = _recurrent_inputs(op, num_dir, gates, lens=[4, 2], peephole=True)
    if op == "LSTM" and inputs[-1] is None:
        inputs = inputs[:-1]
    assert_matches_ort(op, 14, inputs, {"hidden_size": 3, "direction": direction}, num_outputs=outputs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(
    ("op", "gates", "attrs"),
    [
        ("RNN", 1, {"activations": ["Relu"]}),
        ("RNN", 1, {"clip": 0.5, "activations": ["Affine"], "activation_alpha": [0.7], "activation_beta": [0.1]}),
        ("GRU", 3, {"linear_before_reset": 1}),
        ("GRU", 3, {"activations": ["HardSigmoid", "LeakyRelu"], "activation_alpha": [0.3, 0.2], "activation_beta": [0.4]}),
        ("LSTM", 4, {"input_forget": 1, "clip": 1.0}),
    ],
)
def test_recurrent_attributes_match_onnxruntime(op, gates, attrs):
    """clip, custom activations with alpha/beta, linear_before_reset and input_forget agree with onnxruntime."""
    inputs = _recurrent_inputs(op, 1, gates)
    if op == "LSTM":
        inputs = inputs[:-1]
    outputs = 3 if op == "LSTM" else 2
    assert_matches_ort(op, 14, inputs, {"hidden_size": 3, **attrs}, num_outputs=outputs, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize(("op", "gates"), [("RNN", 1), ("GRU", 3), ("LSTM", 4)])
def test_recurrent_layout_1_is_the_batch_major_transpose(op, gates):
    """layout=1 gives exactly the layout=0 results with batch and sequence (or direction) axes swapped."""
    seq_major = _recurrent_inputs(op, 2, gates, lens=[4, 3])[: 7 if op == "LSTM" else 6]
    batch_major = [seq_major[0].swapaxes(0, 1), *seq_major[1:5], *(s.swapaxes(0, 1) for s in seq_major[5:])]
    want = call(op, 14, *seq_major, hidden_size=3, direction="bidirectional")
    got = call(op, 14, *batch_major, hidden_size=3, direction="bidirectional", layout=1)
    np.testing.assert_allclose(got[0], want[0].transpose(2, 0, 1, 3), rtol=1e-6)
    for g, w in zip(got[1:], want[1:]):
        np.testing.assert_allclose(g, w.swapaxes(0, 1), rtol=1e-6)


# --- losses ----------------------------------------------------------------------


def test_nll_loss_mean_counts_only_non_ignored_weight():
    """NegativeLogLikelihoodLoss 'mean' divides by the summed weights of the targets that are not ignored."""
    x = np.log(np.array([[0.2, 0.8], [0.6, 0.4], [0.5, 0.5]], dtype=np.float32))
    target = np.array([1, 0, 1], dtype=np.int64)
    weight = np.array([2.0, 1.0], dtype=np.float32)
    out = call("NegativeLogLikelihoodLoss", 13, x, target, weight, ignore_index=1)
    np.testing.assert_allclose(out, -x[1, 0])  # only sample 1 counts: (2 * -x[1,0]) / 2
    none = call("NegativeLogLikelihoodLoss", 13, x, target, reduction="none")
    np.testing.assert_allclose(none, -x[[0, 1, 2], target])


@pytest.mark.parametrize("reduction", ["none", "sum", "mean"])
def test_softmax_cross_entropy_matches_onnxruntime(reduction):
    """SoftmaxCrossEntropyLoss over (N, C, d) scores returns the loss and the log-probabilities like onnxruntime."""
    scores = RNG.standard_normal((3, 4, 2)).astype(np.float32)
    labels = np.array([[0, 3], [2, -1], [1, 1]], dtype=np.int64)
    weights = np.array([0.5, 1.0, 2.0, 1.5], dtype=np.float32)
    attrs = {"reduction": reduction, "ignore_index": -1}
    assert_matches_ort("SoftmaxCrossEntropyLoss", 13, [scores, labels, weights], attrs, num_outputs=2)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("keep", [0, 1])
def test_reduce_mean_over_trailing_axes_matches_onnxruntime(dtype, keep):
    """ReduceMean over H and W of an NCHW tensor (a global average pool, summed as one product) matches onnxruntime."""
    x = RNG.standard_normal((2, 96, 7, 7)).astype(dtype)
    assert_matches_ort("ReduceMean", 18, [x, np.array([2, 3], np.int64)], {"keepdims": keep}, rtol=1e-6, atol=1e-6)
    strided = x[:, ::2]  # not contiguous: numpy's reduction
    assert_matches_ort("ReduceMean", 18, [strided, np.array([-2, -1], np.int64)], {"keepdims": keep}, rtol=1e-6, atol=1e-6)
