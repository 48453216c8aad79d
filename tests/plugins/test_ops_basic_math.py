"""minfer-ops-basic math kernels, part 1: elementwise, activations, logic and Cast.

ONNX-specific corner rules are checked on the kernels directly against
hand-derived values; where onnxruntime implements the op, the same one-node
model is also run by minfer's backend and compared with it.
"""

from __future__ import annotations

import inspect
import math

import ml_dtypes
import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from onnx import TensorProto, helper

from minfer_core import KernelContext, kernels_in
from minfer_core.testing.ops import assert_node_matches_onnxruntime, call_kernel
from minfer_ops_basic import activation, cast, elementwise, linalg, logic, nn, recurrent, reduce

ort = pytest.importorskip("onnxruntime")
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
MODULES = (elementwise, activation, reduce, logic, cast, linalg, nn, recurrent)
KERNELS = kernels_in(*MODULES)


def call(op_type, opset, *inputs, **attrs):
    """Call the kernel the engine would pick for this opset."""
    return call_kernel(KERNELS, op_type, opset, *inputs, **attrs)


def assert_matches_ort(op_type, opset, inputs, attrs=None, num_outputs=1, rtol=1e-5, atol=1e-6):
    """minfer and onnxruntime agree on every output (dtype, shape, values)."""
    assert_node_matches_onnxruntime(op_type, opset, inputs, attrs, num_outputs, rtol=rtol, atol=atol)


RNG = np.random.default_rng(0)
X = RNG.standard_normal((2, 3, 4)).astype(np.float32)


# --- declarations ------------------------------------------------------------


def _schema_defaults(schema):
    out = {}
    for a in schema.attributes.values():
        v = helper.get_attribute_value(a.default_value) if a.default_value.name else None
        if isinstance(v, list):
            v = [e.decode() if isinstance(e, bytes) else e for e in v]
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


def test_kernel_attributes_match_every_covered_onnx_version():
    """Each kernel accepts exactly the attributes of every opset version it covers, with ONNX's defaults."""
    schemas = {}
    for s in onnx.defs.get_all_schemas_with_history():
        if s.domain == "":
            schemas.setdefault(s.name, []).append(s)
    by_op = {}
    for k in KERNELS:
        by_op.setdefault(k.op_type, []).append(k)
    for op_type, kernels in by_op.items():
        kernels.sort(key=lambda k: k.since)
        assert kernels[0].since == min(s.since_version for s in schemas[op_type]), op_type
        for k, nxt in zip(kernels, kernels[1:] + [None]):
            for s in schemas[op_type]:
                if not (k.since <= s.since_version < (nxt.since if nxt else 10**6)):
                    continue
                want = _schema_defaults(s)
                got = {n: (None if v is inspect.Parameter.empty else v) for n, v in k.attribute_defaults.items()}
                assert set(got) == set(want), (op_type, s.since_version, sorted(got), sorted(want))
                for name, w in want.items():
                    g = got[name]
                    same = np.float32(g) == np.float32(w) if isinstance(w, float) else g == w
                    assert same, (op_type, s.since_version, name, g, w)


def test_kernels_have_a_docstring_naming_op_and_version():
    """Every kernel's one-line docstring starts with '<OpType>-<version>'."""
    for k in KERNELS:
        doc = k.fn.__doc__ or ""
        assert doc.startswith(f"{k.op_type}-"), (k.op_type, k.since, doc)


# --- arithmetic --------------------------------------------------------------


def test_integer_div_truncates_toward_zero():
    """Div on integers rounds the quotient toward zero, like C, not toward -inf like numpy's //."""
    a = np.array([7, -7, 7, -7, 6, 0], dtype=np.int32)
    b = np.array([2, 2, -2, -2, -3, -5], dtype=np.int32)
    got = call("Div", 14, a, b)
    np.testing.assert_array_equal(got, [3, -3, -3, 3, -2, 0])
    assert got.dtype == np.int32
    assert_matches_ort("Div", 14, [a, b])


def test_mod_sign_follows_divisor_or_dividend():
    """Mod fmod=0 takes the divisor's sign (floor); fmod=1 takes the dividend's (truncate)."""
    a = np.array([-4, 7, 5, -3], dtype=np.int64)
    b = np.array([3, -3, 2, -2], dtype=np.int64)
    np.testing.assert_array_equal(call("Mod", 13, a, b), [2, -2, 1, -1])
    np.testing.assert_array_equal(call("Mod", 13, a, b, fmod=1), [-1, 1, 1, -1])
    f = np.array([-4.5, 7.25], dtype=np.float32)
    g = np.array([2.0, -2.0], dtype=np.float32)
    np.testing.assert_array_equal(call("Mod", 13, f, g, fmod=1), np.fmod(f, g))
    assert_matches_ort("Mod", 13, [a, b])
    assert_matches_ort("Mod", 13, [f, g], {"fmod": 1})


def test_legacy_broadcast_aligns_b_at_axis():
    """Add-6 with broadcast=1, axis=1 lines B's dims up with A's from axis 1, not from the tail."""
    a = np.zeros((2, 3, 4, 5), dtype=np.float32)
    b = np.arange(3 * 4, dtype=np.float32).reshape(3, 4)
    got = call("Add", 6, a, b, broadcast=1, axis=1)
    np.testing.assert_array_equal(got, np.broadcast_to(b[None, :, :, None], a.shape))
    # without axis the suffix rule applies (numpy's)
    c = np.arange(5, dtype=np.float32)
    np.testing.assert_array_equal(call("Mul", 1, a + 1, c, broadcast=1, consumed_inputs=[0]), np.broadcast_to(c, a.shape))


def test_pow_keeps_the_base_dtype_for_mixed_types():
    """Pow's result has X's dtype whatever Y's dtype is."""
    x = np.array([2, 3, 4], dtype=np.int32)
    y = np.array([2.0, 0.5, 1.0], dtype=np.float32)
    got = call("Pow", 15, x, y)
    assert got.dtype == np.int32
    np.testing.assert_array_equal(got, [4, 1, 4])
    xf = np.array([1.5, 2.0], dtype=np.float32)
    got = call("Pow", 15, xf, np.array([2, 3], dtype=np.int64))
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, [2.25, 8.0])
    assert_matches_ort("Pow", 15, [xf, np.array([2, 3], dtype=np.int64)])


def test_variadic_ops_broadcast_and_keep_dtype():
    """Sum/Mean/Max/Min take any number of inputs, broadcast them, and keep float32."""
    a, b, c = X, X[0, :, :1], np.float32(2) * np.ones((4,), np.float32)
    for op in ("Sum", "Mean", "Max", "Min"):
        assert_matches_ort(op, 13, [a, b, c])
        assert call(op, 13, a).dtype == np.float32


def test_zero_dim_results_are_arrays():
    """0-d inputs give 0-d ndarrays, never numpy scalars."""
    s = np.array(2.0, dtype=np.float32)
    for op in ("Add", "Mul", "Div", "Pow", "Max"):
        out = call(op, 14, s, s)
        assert type(out) is np.ndarray and out.shape == () and out.dtype == np.float32


@SETTINGS
@given(
    shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=4, max_side=4),
    op=st.sampled_from(["Add", "Sub", "Mul", "Div", "Greater", "Equal"]),
)
def test_binary_broadcasting_matches_onnxruntime(shapes, op):
    """Binary ops broadcast any numpy-compatible pair of shapes exactly as onnxruntime does."""
    a = np.asarray(RNG.standard_normal(shapes.input_shapes[0]), dtype=np.float32)
    b = np.asarray(RNG.standard_normal(shapes.input_shapes[1]) + 3, dtype=np.float32)
    assert_matches_ort(op, 14 if op not in ("Greater", "Equal") else 13, [a, b])


# --- unary math and activations -------------------------------------------------

UNARY_ORT = [
    ("Abs", 13, {}), ("Neg", 13, {}), ("Floor", 13, {}), ("Ceil", 13, {}), ("Exp", 13, {}),
    ("Sin", 7, {}), ("Cos", 7, {}), ("Tan", 7, {}), ("Atan", 7, {}), ("Sinh", 9, {}), ("Cosh", 9, {}),
    ("Asinh", 9, {}), ("Sign", 13, {}), ("Round", 11, {}), ("Erf", 13, {}), ("Relu", 14, {}),
    ("Sigmoid", 13, {}), ("Tanh", 13, {}), ("Elu", 6, {"alpha": 0.7}), ("Selu", 6, {}),
    ("Celu", 12, {"alpha": 2.0}), ("LeakyRelu", 16, {"alpha": 0.2}), ("HardSigmoid", 6, {"alpha": 0.3, "beta": 0.4}),
    ("HardSwish", 14, {}), ("Mish", 18, {}), ("Softplus", 1, {}), ("Softsign", 1, {}),
    ("ThresholdedRelu", 10, {"alpha": 0.5}), ("Shrink", 9, {"bias": 0.2, "lambd": 0.3}),
    ("Gelu", 20, {}), ("Gelu", 20, {"approximate": "tanh"}),
]  # fmt: skip


@pytest.mark.parametrize(("op", "opset", "attrs"), UNARY_ORT, ids=[f"{u[0]}{u[2] or ''}" for u in UNARY_ORT])
def test_unary_ops_match_onnxruntime(op, opset, attrs):
    """Unary math and activations agree with onnxruntime in value and keep float32."""
    x = np.concatenate([X.ravel() * 3, [0.0, -0.0, 0.5, -0.5, 1.5, 2.5, -2.5, 40.0, -40.0]]).astype(np.float32)
    assert_matches_ort(op, opset, [x], attrs)


@pytest.mark.parametrize("dtype", [np.float16, np.float64, ml_dtypes.bfloat16])
def test_activations_keep_the_input_dtype(dtype):
    """float16, float64 and bfloat16 inputs come back in their own dtype (no float64 upcasts)."""
    x = X.astype(dtype)
    for op, opset, attrs in UNARY_ORT:
        out = call(op, opset, x, **attrs)
        assert out.dtype == np.dtype(dtype), (op, out.dtype)
    for op in ("Softmax", "LogSoftmax", "Hardmax"):
        assert call(op, 13, x).dtype == np.dtype(dtype)


def test_erf_is_accurate_to_float32_rounding():
    """erf matches math.erf to ~1 ulp in float32 and ~1e-13 relative in float64, over the whole range."""
    x64 = np.concatenate([np.linspace(-7, 7, 20001), np.geomspace(1e-30, 1, 200), [0.0, -0.0, np.inf, -np.inf]])
    want = np.array([math.erf(v) for v in x64])
    got64 = elementwise.erf(x64)
    np.testing.assert_allclose(got64, want, rtol=1e-13, atol=0)
    got32 = call("Erf", 13, x64.astype(np.float32))
    want32 = np.array([math.erf(v) for v in x64.astype(np.float32).astype(np.float64)])
    np.testing.assert_allclose(got32, want32, rtol=1.2e-7, atol=0)
    assert np.isnan(call("Erf", 13, np.array([np.nan], np.float32)))[0]


def test_round_is_half_to_even():
    """Round sends halves to the nearest even integer."""
    x = np.array([0.5, 1.5, 2.5, -0.5, -1.5, 2.4, 2.6], dtype=np.float32)
    np.testing.assert_array_equal(call("Round", 11, x), [0, 2, 2, -0, -2, 2, 3])


def test_sigmoid_does_not_overflow():
    """Sigmoid of large magnitudes saturates to 0 and 1 without producing NaN."""
    x = np.array([-1000, -90, 0, 90, 1000], dtype=np.float32)
    np.testing.assert_allclose(call("Sigmoid", 13, x), [0, 0, 0.5, 1, 1], atol=1e-30)


def test_clip_forms():
    """Clip-1 leaves missing bounds open, Clip-6 defaults to the float range, Clip-11 takes optional inputs."""
    x = np.array([-5, -1, 0, 1, 5], dtype=np.float32)
    np.testing.assert_array_equal(call("Clip", 1, x, min=-2.0), [-2, -1, 0, 1, 5])
    np.testing.assert_array_equal(call("Clip", 6, x, max=1.0), [-5, -1, 0, 1, 1])
    np.testing.assert_array_equal(call("Clip", 13, x, None, np.array(0.5, np.float32)), [-5, -1, 0, 0.5, 0.5])
    # min > max gives max everywhere
    np.testing.assert_array_equal(call("Clip", 13, x, np.array(2, np.float32), np.array(1, np.float32)), [1] * 5)
    scalar = call("Clip", 13, np.array(5.0, np.float32), np.array(-1.0, np.float32), np.array(1.0, np.float32))
    assert type(scalar) is np.ndarray and scalar.shape == () and scalar == 1
    i8 = np.array([-128, 0, 127], dtype=np.int8)
    out = call("Clip", 13, i8, np.array(-3, np.int8))
    assert out.dtype == np.int8
    np.testing.assert_array_equal(out, [-3, 0, 127])
    assert_matches_ort("Clip", 13, [x, np.array(-2, np.float32), np.array(3, np.float32)])


def test_prelu_broadcasts_slope():
    """PRelu multiplies negatives by a slope broadcast from the tail (per channel here)."""
    x = RNG.standard_normal((2, 3, 4, 4)).astype(np.float32)
    slope = np.array([0.1, 0.2, 0.3], dtype=np.float32).reshape(3, 1, 1)
    assert_matches_ort("PRelu", 16, [x, slope])


# --- softmax family ------------------------------------------------------------


@pytest.mark.parametrize("op", ["Softmax", "LogSoftmax", "Hardmax"])
@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_softmax_before_13_flattens_at_axis(op, axis):
    """Before opset 13 the op normalizes over all dims from axis on (x coerced to 2-D), matching onnxruntime."""
    assert_matches_ort(op, 11, [X], {"axis": axis})
    x2 = X.reshape(math.prod(X.shape[: axis % 3]), -1)
    want = call(op, 13, x2, axis=1).reshape(X.shape)
    np.testing.assert_allclose(call(op, 11, X, axis=axis), want, rtol=1e-6)


def test_softmax_defaults_differ_before_and_from_13():
    """Softmax-1 defaults to axis 1 over the flattened tail; Softmax-13 to the last axis alone."""
    old, new = call("Softmax", 11, X), call("Softmax", 13, X)
    np.testing.assert_allclose(old.reshape(2, -1).sum(axis=1), [1, 1], rtol=1e-6)
    np.testing.assert_allclose(new.sum(axis=-1), np.ones((2, 3)), rtol=1e-6)
    assert_matches_ort("Softmax", 11, [X])
    assert_matches_ort("Softmax", 13, [X])


def test_softmax_is_stable_for_large_logits():
    """Softmax and LogSoftmax shift by the maximum so huge logits neither overflow nor give NaN."""
    x = np.array([[1000.0, 1001.0, 1002.0]], dtype=np.float32)
    assert_matches_ort("Softmax", 13, [x])
    assert_matches_ort("LogSoftmax", 13, [x])


def test_hardmax_picks_the_first_maximum():
    """Hardmax one-hots the first of tied maxima."""
    x = np.array([[1, 3, 3, 2]], dtype=np.float32)
    np.testing.assert_array_equal(call("Hardmax", 13, x), [[0, 1, 0, 0]])


# --- logic ---------------------------------------------------------------------


def test_comparisons_and_logic_match_onnxruntime():
    """Comparisons return bool with broadcasting; And/Or/Xor/Not are logical."""
    a, b = X, X[:, :1, :]
    for op, opset in (("Less", 13), ("LessOrEqual", 16), ("GreaterOrEqual", 16), ("Equal", 19)):
        assert_matches_ort(op, opset, [a, b])
    p = RNG.random((3, 4)) > 0.5
    q = RNG.random((4,)) > 0.5
    for op in ("And", "Or", "Xor"):
        assert_matches_ort(op, 7, [p, q])
    assert_matches_ort("Not", 1, [p])


def test_bitshift_out_of_range_gives_the_sign_fill():
    """BitShift by >= the type width gives 0, or -1 for a right shift of a negative signed value."""
    x = np.array([1, -8, -8, 3, 255], dtype=np.int16)
    y = np.array([16, 1, 20, 40, 4], dtype=np.int16)
    np.testing.assert_array_equal(call("BitShift", 28, x, y, direction="LEFT"), [0, -16, 0, 0, 4080])
    np.testing.assert_array_equal(call("BitShift", 28, x, y, direction="RIGHT"), [0, -4, -1, 0, 15])
    u = np.array([16, 4, 1], dtype=np.uint8)
    assert_matches_ort("BitShift", 11, [u, np.array([1, 2, 3], np.uint8)], {"direction": "RIGHT"})


def test_bitwise_ops_match_onnxruntime():
    """BitwiseAnd/Or/Xor/Not act on the two's complement bits."""
    a = np.array([5, -3, 127], dtype=np.int32)
    b = np.array([3, 6, -1], dtype=np.int32)
    for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor"):
        assert_matches_ort(op, 18, [a, b])
    assert_matches_ort("BitwiseNot", 18, [a])


def test_isinf_flags_select_the_sign():
    """IsInf detects +inf and/or -inf as detect_positive/detect_negative say."""
    x = np.array([np.inf, -np.inf, np.nan, 1.0], dtype=np.float32)
    np.testing.assert_array_equal(call("IsInf", 20, x), [1, 1, 0, 0])
    np.testing.assert_array_equal(call("IsInf", 20, x, detect_negative=0), [1, 0, 0, 0])
    np.testing.assert_array_equal(call("IsInf", 20, x, detect_positive=0), [0, 1, 0, 0])
    np.testing.assert_array_equal(call("IsNaN", 20, x), [0, 0, 1, 0])


# --- Cast ----------------------------------------------------------------------


def test_cast_saturates_float8_only_when_asked():
    """Cast to float8e4m3fn clamps out-of-range values with saturate=1 and gives NaN with saturate=0."""
    x = np.array([1000.0, -1000.0, np.inf, 3.0], dtype=np.float32)
    sat = call("Cast", 19, x, to=TensorProto.FLOAT8E4M3FN)
    assert sat.dtype == ml_dtypes.float8_e4m3fn
    np.testing.assert_array_equal(sat.astype(np.float32), [448, -448, 448, 3])
    raw = call("Cast", 19, x, to=TensorProto.FLOAT8E4M3FN, saturate=0).astype(np.float32)
    assert np.isnan(raw[:3]).all() and raw[3] == 3


def test_cast_rules_for_plain_types():
    """Cast wraps integers, maps non-zero to True, and Cast-1 accepts a type name string."""
    np.testing.assert_array_equal(call("Cast", 13, np.array([200, -1], np.int16), to=TensorProto.INT8), [-56, -1])
    np.testing.assert_array_equal(call("Cast", 13, np.array([0.0, -0.0, 0.1, np.nan], np.float32), to=TensorProto.BOOL), [0, 0, 1, 1])
    out = call("Cast", 1, np.array([1.5], np.float64), to="FLOAT16")
    assert out.dtype == np.float16
    like = call("CastLike", 15, np.array([1.7, -2.2], np.float32), np.zeros(1, np.int64))
    assert like.dtype == np.int64
    np.testing.assert_array_equal(like, [1, -2])
    assert_matches_ort("Cast", 13, [X], {"to": TensorProto.FLOAT16}, rtol=1e-3)


def test_cast_to_float8e8m0_rounds_the_exponent():
    """Cast to float8e8m0 picks a power of two: up, down, or the nearest by round_mode."""
    x = np.array([0.3, 1.0, 1.4, 1.6, 3.0], dtype=np.float32)

    def e8m0(mode):
        return call("Cast", 24, x, to=TensorProto.FLOAT8E8M0, round_mode=mode).astype(np.float32)

    np.testing.assert_array_equal(e8m0("up"), [0.5, 1, 2, 2, 4])
    np.testing.assert_array_equal(e8m0("down"), [0.25, 1, 1, 1, 2])
    np.testing.assert_array_equal(e8m0("nearest"), [0.25, 1, 1, 2, 4])


def test_bitcast_reinterprets_bytes_without_copying():
    """BitCast keeps the bit pattern (1.0f is 0x3f800000) and returns a view of the input."""
    x = np.array([1.0, -0.0], dtype=np.float32)
    out = call("BitCast", 26, x, to=TensorProto.INT32)
    np.testing.assert_array_equal(out, [0x3F800000, -(2**31)])
    assert np.shares_memory(out, x)


# --- memory-planner declarations (out= / inplace) ----------------------------------

W45 = RNG.standard_normal((4, 5)).astype(np.float32)
ERF_X = np.concatenate([np.linspace(-5, 5, 40), [0.0, -0.0, np.inf, -np.inf, np.nan]]).astype(np.float32).reshape(5, 9)

# (op, opset, inputs, attrs[, constants]): constants are what a preparing kernel's ctx sees
OUT_CASES = [
    ("Add", 14, [X, X[0, :1]], {}),
    ("Sub", 14, [X, X[:, :1]], {}),
    ("Mul", 14, [X[:1], X], {}),
    ("Div", 14, [np.array([7, -7, 9], np.int32), np.array([2, 2, -4], np.int32)], {}),
    ("Div", 14, [X, X + 3], {}),
    ("Pow", 15, [np.abs(X), X], {}),
    ("Pow", 15, [np.arange(6, dtype=np.int32), np.array(2, np.int64)], {}),
    ("Pow", 15, [X, np.array(2, np.int64)], {}),
    ("Less", 13, [X, X[:, :1]], {}),
    ("And", 7, [X > 0, X < 0.5], {}),
    ("BitwiseAnd", 18, [np.arange(6, dtype=np.int16), np.int16(3) * np.ones(6, np.int16)], {}),
    ("Sum", 13, [X, X[0, :1], X + 1], {}),
    ("Sum", 13, [X[:, :1], X], {}),
    ("Sum", 13, [X], {}),
    ("Max", 13, [X, X[0], -X], {}),
    ("Min", 13, [X, X[:1]], {}),
    ("Relu", 14, [X], {}),
    ("Sigmoid", 13, [X], {}),
    ("Sigmoid", 6, [np.array(-0.3, np.float32)], {}),
    ("Tanh", 13, [X], {}),
    ("Erf", 13, [ERF_X], {}),
    ("Erf", 13, [ERF_X.astype(np.float16)], {}),
    ("Erf", 13, [X.astype(np.float64)], {}),
    ("Erf", 13, [np.array(0.7, np.float32)], {}),
    ("Gelu", 20, [X * 3], {}),
    ("Gelu", 20, [X * 3], {"approximate": "tanh"}),
    ("Gelu", 20, [(X * 3).astype(np.float16)], {}),
    ("Gelu", 20, [X.astype(np.float64)], {}),
    ("Add", 7, [np.array(1.5, np.float32), np.array(2.0, np.float32)], {}),
    ("Exp", 13, [X], {}),
    ("Clip", 13, [X, np.array(-0.5, np.float32), np.array(0.5, np.float32)], {}),
    ("Clip", 6, [X], {"min": 0.0}),
    ("LeakyRelu", 16, [X], {"alpha": 0.1}),
    ("Softmax", 13, [X], {"axis": 1}),
    ("Softmax", 11, [X], {"axis": 1}),
    ("LogSoftmax", 13, [X], {}),
    ("LogSoftmax", 11, [X], {}),
    ("Hardmax", 11, [X], {}),
    ("MatMul", 13, [X, X.transpose(0, 2, 1)], {}),
    ("MatMul", 13, [X.astype(np.float16), X.astype(np.float16).transpose(0, 2, 1)], {}),
    ("MatMul", 13, [X, W45], {}, (None, W45)),
    ("MatMul", 13, [X.astype(np.float16), W45.astype(np.float16)], {}, (None, W45.astype(np.float16))),
    ("MatMul", 13, [X[0, 0], W45], {}, (None, W45)),
    ("MatMul", 13, [X.transpose(1, 0, 2), W45], {}, (None, W45)),
    ("Gemm", 13, [X[0], W45, W45[0]], {"alpha": 0.5, "beta": 2.0}, (None, W45, W45[0])),
    ("Gemm", 13, [X[0].T, W45.T], {"transA": 1, "transB": 1}, (None, W45.T, None)),
    ("Cast", 21, [X], {"to": TensorProto.INT32}),
    ("Cast", 21, [X], {"to": TensorProto.BFLOAT16}),
]


def _kernel(op_type, opset):
    return max((k for k in KERNELS if k.op_type == op_type and k.since <= opset), key=lambda k: k.since)


def _callable(k, case):
    """The run callable the engine would get: through the factory (with the case's constants) when the kernel prepares."""
    op, opset, inputs, attrs = case[:4]
    if not k.prepare:
        return lambda *xs, **kw: k.fn(*xs, **attrs, **kw)
    consts = case[4] if len(case) > 4 else (None,) * len(inputs)
    ctx = KernelContext("n", op, opset, (None,) * len(inputs), (None,), tuple(consts), 1)
    return k.fn(ctx, **attrs)


def _case_id(case):
    return f"{case[0]}-{case[1]}" + ("-const" if len(case) > 4 else "")


@pytest.mark.parametrize("case", OUT_CASES, ids=[_case_id(c) for c in OUT_CASES])
def test_out_kernels_write_into_the_planned_buffer(case):
    """A kernel declaring out=True returns the very buffer it was given, holding exactly the usual result."""
    op, opset, inputs = case[:3]
    k = _kernel(op, opset)
    assert k.out, f"{op}-{opset} should declare out=True"
    run = _callable(k, case)
    want = run(*inputs)
    assert isinstance(want, np.ndarray)
    buf = np.full(want.shape, 7, dtype=want.dtype)
    got = run(*inputs, out=buf)
    assert got is buf
    np.testing.assert_array_equal(got.astype(np.float64), want.astype(np.float64))


@pytest.mark.parametrize("case", OUT_CASES, ids=[_case_id(c) for c in OUT_CASES])
def test_inplace_kernels_may_overwrite_their_input(case):
    """When out is the declared in-place input itself, the result is still exactly right."""
    op, opset, inputs = case[:3]
    k = _kernel(op, opset)
    run = _callable(k, case)
    want = run(*inputs)
    for i in k.inplace:
        if i >= len(inputs) or inputs[i].shape != want.shape or inputs[i].dtype != want.dtype:
            continue
        args = [x.copy() for x in inputs]
        got = run(*args, out=args[i])
        assert got is args[i]
        np.testing.assert_array_equal(got, want)


def test_the_cases_cover_the_declarations_asked_for():
    """The ops the runtime benchmark named declare out= (and inplace where elementwise), and each has a case above."""
    inplace = {"Sum": (0, 1), "Add": (0, 1), "Sub": (0, 1), "Mul": (0, 1), "Div": (0, 1), "Relu": (0,), "Softmax": (0,),
               "LogSoftmax": (0,), "Erf": (0,), "Gelu": (0,), "Tanh": (0,), "Sigmoid": (0,), "Pow": (0,)}  # fmt: skip
    for op, want in inplace.items():
        for k in (k for k in KERNELS if k.op_type == op and k.out):
            assert k.inplace == want, (op, k.since, k.inplace)
    for op in (*inplace, "MatMul", "Gemm"):
        newest = max((k for k in KERNELS if k.op_type == op), key=lambda k: k.since)
        assert newest.out, op
        assert op in {c[0] for c in OUT_CASES}, op
    assert {k.packed for k in KERNELS if k.op_type == "Gemm"} == {(1, 2)}
    assert {k.packed for k in KERNELS if k.op_type == "MatMul"} == {(1,)}


@pytest.mark.parametrize("op", ["Gemm", "MatMul"])
def test_packed_kernels_work_without_the_constants_and_drop_the_context(op):
    """packed=(...): once prepared, the callable works with None in place of the constants and keeps no ctx.

    The weights themselves may be held as given (Gemm/MatMul read them in place rather than copy them);
    that each is held once is tests/plugins/test_linalg_parallel.py::test_constant_weights_are_held_once.
    """
    import gc
    import weakref

    a = RNG.standard_normal((3, 4)).astype(np.float32)
    b = RNG.standard_normal((4, 5)).astype(np.float32)
    c = RNG.standard_normal((5,)).astype(np.float32)
    inputs, attrs = ([a, b, c], {"alpha": 1.0, "beta": 1.0}) if op == "Gemm" else ([a, b], {})
    want = a @ b + (c if op == "Gemm" else 0)
    k = _kernel(op, 13)
    ctx = KernelContext("n", op, 13, (None,) * len(inputs), (None,), tuple([None] + inputs[1:]), 1)
    ctx_ref = weakref.ref(ctx)
    run = k.fn(ctx, **attrs)
    del ctx, inputs, b, c
    gc.collect()
    assert ctx_ref() is None, "the prepared callable keeps its KernelContext (and so every constant) alive"
    nones = [None] * (2 if op == "Gemm" else 1)
    got = run(a, *nones)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    buf = np.empty_like(got)
    assert run(a, *nones, out=buf) is buf
    np.testing.assert_array_equal(buf, got)


def test_erf32_blocks_and_in_place_agree_with_one_pass():
    """The float32 erf gives the same bits whether it runs in blocks, into a buffer, or over its own input."""
    x = RNG.standard_normal(3 * elementwise._ERF32_BLOCK + 17).astype(np.float32) * 2
    want = elementwise.erf32(x)
    one = np.concatenate([elementwise.erf32(x[i : i + 1000]) for i in range(0, x.size, 1000)])
    np.testing.assert_array_equal(one, want)
    y = x.copy()
    assert elementwise.erf32(y, y) is y
    np.testing.assert_array_equal(y, want)
    strided = np.repeat(x, 2)[::2]
    np.testing.assert_array_equal(elementwise.erf32(strided), want)


def test_gemm_writes_into_the_planned_buffer():
    """The prepared Gemm callable accepts out= with a constant or a runtime B."""
    a = RNG.standard_normal((4, 3)).astype(np.float32)
    b = RNG.standard_normal((3, 5)).astype(np.float32)
    c = RNG.standard_normal((5,)).astype(np.float32)
    want = 1.5 * a @ b + 0.5 * c
    for consts in ((None, None, None), (None, b, c)):
        ctx = KernelContext("g", "Gemm", 13, (None,) * 3, (None,), consts, 1)
        run = linalg.gemm.fn(ctx, alpha=1.5, beta=0.5)
        buf = np.empty((4, 5), np.float32)
        assert run(a, b, c, out=buf) is buf
        # atol: an element near zero (cancellation) may differ by an ulp of the terms, not of the result
        np.testing.assert_allclose(buf, want, rtol=1e-5, atol=1e-6)


def test_engine_runs_a_chain_of_planned_kernels_like_onnxruntime():
    """Through the engine (memory plan, buffer reuse, in-place) a MatMul-Add-Relu-Softmax chain matches onnxruntime."""
    from minfer_core import InferenceSession

    w = helper.make_tensor("w", TensorProto.FLOAT, (4, 6), RNG.standard_normal(24).astype(np.float32))
    bias = helper.make_tensor("b", TensorProto.FLOAT, (6,), RNG.standard_normal(6).astype(np.float32))
    nodes = [
        helper.make_node("MatMul", ["x", "w"], ["h"]),
        helper.make_node("Add", ["h", "b"], ["h2"]),
        helper.make_node("Relu", ["h2"], ["h3"]),
        helper.make_node("Sigmoid", ["h3"], ["h4"]),
        helper.make_node("Mul", ["h4", "h3"], ["h5"]),
        helper.make_node("Softmax", ["h5"], ["y"], axis=-1),
    ]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, (2, 3, 4))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, bias],
    )  # fmt: skip
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    x = RNG.standard_normal((2, 3, 4)).astype(np.float32)
    sess = InferenceSession(model)
    for _ in range(2):  # the second run reuses the planned buffers
        got = sess.run(None, {"x": x})[0]
        want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
