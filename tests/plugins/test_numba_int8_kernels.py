"""minfer-ops-numba's one-pass Lookup, DequantizeLinear, QLinearAdd/QLinearMul and QLinearSoftmax against the numpy
kernels: the same bits."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import KernelContext, TensorType, get_registry  # noqa: E402
from minfer_ops_basic.cast import dequantize as numpy_dequantize  # noqa: E402
from minfer_ops_numba import dequantize, lookup, qlinear_binary, qlinear_softmax  # noqa: E402
from minfer_passes import qdq_ops  # noqa: E402
from minfer_passes.lookup import lookup as numpy_lookup  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


def _ctx(op_type, *arrays):
    types = tuple(None if a is None else TensorType(a.dtype, a.shape) for a in arrays)
    return KernelContext("n", op_type, 1, types, (None,), (None,) * len(arrays), 1)


@pytest.mark.parametrize("shape", [(7,), (3, 70_000)])  # one span, then blocks over the threads
def test_grid_lookup_is_numpys_bits(shape):
    """Float X: T[clip(rint(X / scale), low, high) - low] as the numpy kernel indexes it: ties to even, values beyond
    the bounds, infinities, NaN (its own entry), -0.0."""
    rng = np.random.default_rng(0)
    scale, low, high = 0.0371, -100.0, 120.0
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    flat = x.reshape(-1)
    flat[:7] = [np.nan, np.inf, -np.inf, -0.0, 2.5 * np.float32(scale), 1e6, -1e6]
    table = rng.standard_normal(int(high - low) + 2).astype(np.float32)
    attrs = {"scale": scale, "low": low, "high": high}
    fn = lookup.lookup.prepared(_ctx("Lookup", x, table), attrs)
    np.testing.assert_array_equal(fn(x, table), numpy_lookup.fn(x, table, **attrs))


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
def test_value_lookup_is_numpys_bits(dtype):
    """8-bit X: T[X - low] over every value, into a table of another dtype."""
    info = np.iinfo(dtype)
    x = np.random.default_rng(1).permutation(np.resize(np.arange(info.min, info.max + 1), 3000)).astype(dtype)
    table = np.arange(256, dtype=np.int8)[::-1].copy()
    attrs = {"scale": 0.0, "low": float(info.min), "high": float(info.max)}
    fn = lookup.lookup.prepared(_ctx("Lookup", x, table), attrs)
    np.testing.assert_array_equal(fn(x, table), numpy_lookup.fn(x, table, **attrs))


@pytest.mark.parametrize("shape,axis,per_axis", [((5, 300), 1, True), ((300, 5), 0, True), ((4, 3, 2, 2), 0, True),
                                                 ((4, 3, 5), 1, True), ((64, 64), 1, False)])
@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("with_zero", [True, False])
def test_dequantize_linear_is_numpys_bits(shape, axis, per_axis, dtype, with_zero):
    """DequantizeLinear of 8-bit x, per tensor or along an axis (innermost or not), with or without a zero point:
    the numpy kernel's float32 (x - zp) * scale, bit for bit."""
    rng = np.random.default_rng(2)
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, shape).astype(dtype)
    n = shape[axis] if per_axis else 1
    scale = (rng.random(n) * 0.02 + 1e-3).astype(np.float32).reshape((n,) if per_axis else ())
    zero = rng.integers(info.min // 2, info.max // 2 + 1, n).astype(dtype).reshape(scale.shape) if with_zero else None
    fn = dequantize.dequantize_linear_13.prepared(_ctx("DequantizeLinear", x, scale, zero), {"axis": axis})
    want = numpy_dequantize(x, scale, zero, axis=axis)
    np.testing.assert_array_equal(fn(x, scale, zero), want)
    out = np.empty(shape, np.float32)
    assert fn(x, scale, zero, out=out) is out
    np.testing.assert_array_equal(out, want)


def test_dequantize_linear_keeps_its_constants_layout_only_for_them():
    """With the scale and zero point constants of the node, the kernel works their layout out once per x shape; given
    other arrays (a slice of them, computed ones) it works them out each call: the numpy kernel's bits every time."""
    rng = np.random.default_rng(4)
    x = rng.integers(-128, 128, (6, 40)).astype(np.int8)
    scale, zero = (rng.random(6) * 0.02 + 1e-3).astype(np.float32), rng.integers(-9, 9, 6).astype(np.int8)
    ctx = _ctx("DequantizeLinear", x, scale, zero)
    ctx = type(ctx)(ctx.node_name, ctx.op_type, ctx.opset, ctx.input_types, ctx.output_types, (None, scale, zero), 1)
    fn = dequantize.dequantize_linear_13.prepared(ctx, {"axis": 0})
    for xs, s, z in ((x, scale, zero), (x[:, :7], scale, zero), (x[:3], scale[:3], zero[:3]),
                     (x, scale * 2, zero), (x, scale, np.zeros(6, np.int8)), (x, scale, zero)):
        np.testing.assert_array_equal(fn(xs, s, z), numpy_dequantize(xs, s, z, axis=0))


def test_dequant_matmul_dequantizes_through_the_registered_kernel():
    """DequantMatMul's per-run weight dequantization takes the registered DequantizeLinear kernel when it writes into
    out (this plugin's), row ranges included, and gets the numpy steps' bits."""
    rng = np.random.default_rng(3)
    wq = rng.integers(-127, 128, (600, 512)).astype(np.int8)  # above qdq_ops.SPLIT_WEIGHTS: split by rows
    for axis, n in ((1, 512), (0, 600)):
        ws = (rng.random(n) * 0.01 + 1e-3).astype(np.float32)
        wz = rng.integers(-5, 6, n).astype(np.int8)
        kern = get_registry().select_kernel("", "DequantizeLinear", 13, "numpy", _ctx("DequantizeLinear", wq, ws, wz),
                                            {"axis": axis})
        assert kern.fn in (dequantize.dequantize_linear_13.fn, dequantize.dequantize_linear_23.fn)
        assert qdq_ops._registered_dequantize(wq, ws, wz, axis, "t") is not None
        got = qdq_ops._dequantizer(wq, ws, wz, axis, "t-dq")().copy()
        np.testing.assert_array_equal(got, numpy_dequantize(wq, ws, wz, axis=axis))


@pytest.mark.parametrize("op_type", ["QLinearAdd", "QLinearMul"])
@pytest.mark.parametrize("a_shape,b_shape", [((3, 4, 64), (64,)), ((64,), (3, 4, 64)), ((3, 4, 64), (3, 4, 64)),
                                             ((3, 4, 64), (1, 4, 64)), ((2, 5), ())])
@pytest.mark.parametrize("dtype,zc", [(np.uint8, np.uint8(131)), (np.int8, np.int8(-3)), (np.uint8, None)])
def test_qlinear_binary_is_numpys_bits(op_type, a_shape, b_shape, dtype, zc):
    """QLinearAdd/QLinearMul of 8-bit operands (either the output's shape, the other its last axes): minfer-ops-conv's
    numpy kernel's bits, ties (values k + 0.5 before the rounding) and saturation included."""
    from minfer_ops_conv import qlinear

    rng = np.random.default_rng(7)
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max + 1, a_shape).astype(dtype)
    b = np.asarray(rng.integers(info.min, info.max + 1, b_shape), dtype)
    # scales whose ratios make many exact halves: ties must go to the even output, as the numpy kernel rounds
    args = [a, np.float32(0.25), np.asarray(3, dtype), b, np.float32(0.125), np.asarray(7, dtype), np.float32(0.5), zc]
    numba_kernel = qlinear_binary.qlinear_add if op_type == "QLinearAdd" else qlinear_binary.qlinear_mul
    numpy_kernel = qlinear.qlinear_add if op_type == "QLinearAdd" else qlinear.qlinear_mul
    types = tuple(TensorType(np.asarray(v).dtype, np.shape(v)) if v is not None else None for v in args)

    def ctx(constant):  # scales and zero points given at run, or constants the kernel reads once at build
        consts = tuple(None if i in (0, 3) or v is None else np.asarray(v) for i, v in enumerate(args))
        return KernelContext("n", op_type, 1, types, (None,), consts if constant else (None,) * 8, 1)

    assert numba_kernel.applies(ctx(False), {})
    want = numpy_kernel.fn(*args)
    for constant in (False, True):
        got = numba_kernel.prepared(ctx(constant), {})(*args)
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, want)
    args[1], args[4], args[6] = np.float32(0.0371), np.float32(0.0123), np.float32(0.0517)  # generic scales too
    for constant in (False, True):
        np.testing.assert_array_equal(numba_kernel.prepared(ctx(constant), {})(*args), numpy_kernel.fn(*args))


def test_qlinear_binary_leaves_other_broadcasts_to_numpy():
    """Operands broadcasting along other axes (a column against a row) are not this kernel's."""
    types = (TensorType(np.dtype(np.uint8), (4, 1)), None, None, TensorType(np.dtype(np.uint8), (1, 5))) + (None,) * 4
    ctx = KernelContext("n", "QLinearAdd", 1, types, (None,), (None,) * 8, 1)
    assert not qlinear_binary.qlinear_add.applies(ctx, {})


@pytest.mark.parametrize("shape", [(2, 4, 16, 128), (3, 7), (5, 1)])
@pytest.mark.parametrize("dtype,zp", [(np.uint8, None), (np.int8, np.int8(-128)), (np.uint8, np.uint8(3))])
@pytest.mark.parametrize("y_scale", [1 / 256, 0.0037, 1e-5, 1e-9])  # the last ones saturate (1e-9: e * inv overflows)
def test_qlinear_softmax_is_numpys_bits(shape, dtype, zp, y_scale):
    """QLinearSoftmax over the last axis: minfer-ops-conv's numpy kernel's bits (its exp table, left-to-right float32
    sum, floor(1 / y_scale), ties, saturation), for opset 13 and the flattening older opsets alike."""
    from minfer_ops_conv import qlinear

    info = np.iinfo(dtype)
    x = np.random.default_rng(8).integers(info.min, info.max + 1, shape).astype(dtype)
    args = [x, np.float32(0.0625), np.asarray(0, dtype), np.float32(y_scale), zp]
    for opset in (13, 11):
        attrs = {"axis": -1 if opset == 13 else len(shape) - 1, "opset": opset}
        types = tuple(None if v is None else TensorType(np.asarray(v).dtype, np.shape(v)) for v in args)
        ctx = KernelContext("n", "QLinearSoftmax", 1, types, (None,), (None,) * 5, 1)
        assert qlinear_softmax.qlinear_softmax.applies(ctx, attrs)
        got = qlinear_softmax.qlinear_softmax.prepared(ctx, attrs)(*args)
        with np.errstate(over="ignore", invalid="ignore"):
            np.testing.assert_array_equal(got, qlinear.qlinear_softmax.fn(*args, **attrs))


@pytest.mark.parametrize("rows", [64, 100, 512])
def test_qlinear_softmax_on_two_threads_is_the_same(rows):
    """Rows shared over a native team (groups of 16, an uneven last one): the numpy kernel's bits."""
    from minfer_core.parallel import using_threads
    from minfer_ops_conv import qlinear

    x = np.random.default_rng(rows).integers(0, 256, (rows, 77)).astype(np.uint8)
    args = [x, np.float32(0.0625), np.asarray(0, np.uint8), np.float32(1 / 256), np.uint8(3)]
    attrs = {"axis": -1, "opset": 13}
    types = tuple(None if v is None else TensorType(np.asarray(v).dtype, np.shape(v)) for v in args)
    ctx = KernelContext("n", "QLinearSoftmax", 1, types, (None,), (None,) * 5, 1)
    run = qlinear_softmax.qlinear_softmax.prepared(ctx, attrs)
    with using_threads(2):
        got = run(*args)
    np.testing.assert_array_equal(got, qlinear.qlinear_softmax.fn(*args, **attrs))


def test_qlinear_softmax_leaves_other_axes_to_numpy():
    """A softmax over another axis than the last is not this kernel's."""
    types = (TensorType(np.dtype(np.uint8), (2, 3, 4)),) + (None,) * 4
    ctx = KernelContext("n", "QLinearSoftmax", 1, types, (None,), (None,) * 5, 1)
    assert not qlinear_softmax.qlinear_softmax.applies(ctx, {"axis": 1, "opset": 13})


@pytest.mark.parametrize("a_type,b_type", [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8)])
@pytest.mark.parametrize("trans", [(0, 0), (1, 1), (0, 1)])
@pytest.mark.parametrize("per_column,bias,float_output", [(False, True, False), (True, True, False), (True, False, True),
                                                          (False, False, True)])
@pytest.mark.parametrize("m", [1, 5])
def test_qgemm_is_numpys_bits(a_type, b_type, trans, per_column, bias, float_output, m):
    """com.microsoft QGemm of a constant weight (a row or two: compiled int64 sums over B as it lies; more: igemm):
    minfer-ops-conv's numpy kernel's bits (exact sums, + C and float32 in float64, the float32 scale product in its
    order, rounding half to even, saturation), transposed operands, per-column B scale and zero point, an int32
    bias, quantized or float output, alpha."""
    from minfer_ops_conv import qlinear
    from minfer_ops_numba import igemm, qmatmul

    if not igemm.vnni():
        pytest.skip("the kernel applies only on AVX-512 VNNI")
    rng = np.random.default_rng(sum(trans) + 3 * per_column + 5 * bias + m)
    k, n = 300, 37
    ai, bi = np.iinfo(a_type), np.iinfo(b_type)
    a = rng.integers(ai.min, ai.max + 1, (k, m) if trans[0] else (m, k)).astype(a_type)
    b = rng.integers(bi.min, bi.max + 1, (n, k) if trans[1] else (k, n)).astype(b_type)
    cols = (n,) if per_column else ()
    middle = lambda info: (int(info.min) + int(info.max) + 1) // 2  # noqa: E731 (zero points near the middle: sums
    # of both signs, outputs inside the 8-bit range and at its ends)
    inputs = [a, np.float32(0.013), np.asarray(middle(ai) + 3, a_type), b,
              rng.uniform(0.002, 0.05, cols).astype(np.float32),
              (middle(bi) + rng.integers(-9, 10, cols)).astype(b_type),
              rng.integers(-5000, 5000, n).astype(np.int32) if bias else None]
    if not float_output:
        inputs += [np.float32(0.9), np.asarray(3, a_type)]
    attrs = {"alpha": 0.75, "transA": trans[0], "transB": trans[1]}
    types = tuple(None if v is None else TensorType(np.asarray(v).dtype, np.shape(v)) for v in inputs)
    consts = tuple(None if i in (0, 1, 2) or v is None else np.asarray(v) for i, v in enumerate(inputs))
    ctx = KernelContext("n", "QGemm", 1, types, (None,), consts, 1)
    assert qmatmul.qgemm.applies(ctx, attrs)
    args = [None if i in (3, 5) else v for i, v in enumerate(inputs)]  # packed: the engine passes None there
    got = qmatmul.qgemm.prepared(ctx, attrs)(*args)
    want = qlinear.qgemm.prepared(ctx, attrs)(*inputs)
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)
    if not float_output:
        info = np.iinfo(got.dtype)
        assert np.any((got > info.min) & (got < info.max))  # not all saturated: the scaling is seen


def test_qgemm_declines_a_computed_weight_and_sums_past_int32():
    """A weight given at run, or one whose exact sums could pass int32 (igemm's accumulator), stays numpy's."""
    from minfer_ops_numba import igemm, qmatmul

    if not igemm.vnni():
        pytest.skip("the kernel applies only on AVX-512 VNNI")
    a, b = np.zeros((2, 70000), np.uint8), np.full((70000, 3), 127, np.int8)  # 255 * 127 * 70000 > 2**31
    inputs = [a, np.float32(1), np.asarray(0, np.uint8), b, np.float32(1), np.asarray(0, np.int8)]
    types = tuple(TensorType(np.asarray(v).dtype, np.shape(v)) for v in inputs)
    big = KernelContext("n", "QGemm", 1, types, (None,), (None, None, None, b, None, inputs[5]), 1)
    computed = KernelContext("n", "QGemm", 1, types, (None,), (None,) * 6, 1)
    assert not qmatmul.qgemm.applies(big, {}) and not qmatmul.qgemm.applies(computed, {})


def test_qgemm_few_rows_of_a_long_product_sum_in_int64():
    """Past 33k inner values the uncentered partial sums could pass int32: a row's sums go in int64 (the weight's own
    centered sums still fit int32, so the kernel applies); numpy's bits."""
    from minfer_ops_conv import qlinear
    from minfer_ops_numba import igemm, qmatmul

    if not igemm.vnni():
        pytest.skip("the kernel applies only on AVX-512 VNNI")
    rng = np.random.default_rng(3)
    k, n = 34000, 6
    a = rng.integers(0, 256, (1, k)).astype(np.uint8)
    b = rng.integers(126, 131, (k, n)).astype(np.uint8)  # near its zero point 128: small centered sums
    inputs = [a, np.float32(0.01), np.asarray(0, np.uint8), b, np.float32(0.001), np.asarray(128, np.uint8)]
    types = tuple(TensorType(np.asarray(v).dtype, np.shape(v)) for v in inputs)
    ctx = KernelContext("n", "QGemm", 1, types, (None,), (None, None, None, b, inputs[4], inputs[5]), 1)
    assert qmatmul.qgemm.applies(ctx, {}) and k * 255 * 255 >= 2**31
    got = qmatmul.qgemm.prepared(ctx, {})(a, inputs[1], inputs[2], None, inputs[4], None)
    np.testing.assert_array_equal(got, qlinear.qgemm.prepared(ctx, {})(*inputs))
