"""minfer-ops-numba's 8-bit integer GEMM: exact against numpy's int64 product, whatever the shape and signedness."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_ops_numba import igemm as ig  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py

KINDS = [(np.uint8, np.int8), (np.uint8, np.uint8), (np.int8, np.int8), (np.int8, np.uint8)]
# M, K, N: not multiples of the 4-row blocks, of K's steps of 4 nor of the 64-column panels; K < 4 (or 0); one panel
SHAPES = [(1, 1, 1), (3, 0, 5), (5, 3, 7), (4, 4, 64), (7, 9, 65), (13, 261, 130), (3, 1030, 17), (130, 64, 200)]


def _random(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def _reference(a, b, za=0, zb=0):
    za = np.asarray(za, np.int64).reshape(-1, 1) if np.ndim(za) else np.int64(za)
    return (a.astype(np.int64) - za) @ (b.astype(np.int64) - np.asarray(zb, np.int64))


@pytest.mark.parametrize("kinds", KINDS, ids=lambda k: f"{np.dtype(k[0])}x{np.dtype(k[1])}")
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_exact_for_every_shape_and_signedness(kinds, shape):
    """int32 results equal numpy's int64 product, with scalar zero points, per-row (A) and per-column (B) ones."""
    rng = np.random.default_rng(sum(shape))
    m, k, n = shape
    a, b = _random(rng, kinds[0], (m, k)), _random(rng, kinds[1], (k, n))
    packed = ig.pack_b(b)
    for za, zb in ((0, 0), (_random(rng, kinds[0], ()), _random(rng, kinds[1], ())),
                   (_random(rng, kinds[0], (m,)), _random(rng, kinds[1], (n,)))):
        out = np.empty((m, n), np.int32)
        np.testing.assert_array_equal(ig.igemm(a, packed, out, za, zb), _reference(a, b, za, zb))


@pytest.mark.parametrize("kinds", KINDS, ids=lambda k: f"{np.dtype(k[0])}x{np.dtype(k[1])}")
def test_extreme_values(kinds):
    """Operands all at their type's ends (0/255, -128/127), every combination of them: still exact."""
    m, k, n = 9, 517, 70  # the largest sums of this K (255 * 255 * 517 < 2**31)
    out = np.empty((m, n), np.int32)
    for av in (np.iinfo(kinds[0]).min, np.iinfo(kinds[0]).max):
        for bv in (np.iinfo(kinds[1]).min, np.iinfo(kinds[1]).max):
            a, b = np.full((m, k), av, kinds[0]), np.full((k, n), bv, kinds[1])
            for za, zb in ((0, 0), (np.iinfo(kinds[0]).max, np.iinfo(kinds[1]).min)):
                want = _reference(a, b, za, zb)
                assert np.abs(want).max() < 2**31
                np.testing.assert_array_equal(ig.igemm(a, ig.pack_b(b), out, za, zb), want)


def test_scaled_float32_output_is_cast_then_mul_then_add():
    """With a scale (and bias), out is float32(int32 product) * scale + bias, each a float32 operation."""
    rng = np.random.default_rng(3)
    a, b = _random(rng, np.uint8, (37, 300)), _random(rng, np.int8, (300, 90))
    scale = np.float32(0.0123)
    bias = rng.standard_normal(90).astype(np.float32)
    packed, acc = ig.pack_b(b), _reference(a, b, 7, 3).astype(np.int32)
    got = ig.igemm(a, packed, np.empty((37, 90), np.float32), 7, 3, scale, bias)
    np.testing.assert_array_equal(got, acc.astype(np.float32) * scale + bias)
    got = ig.igemm(a, packed, np.empty((37, 90), np.float32), 7, 3, scale)
    np.testing.assert_array_equal(got, acc.astype(np.float32) * scale)


def test_rows_split_over_threads_give_the_same_result():
    """Two intra-op threads (the rows split in blocks of 4) give the exact product, as one thread does."""
    from minfer_core.parallel import using_threads

    rng = np.random.default_rng(5)
    a, b = _random(rng, np.uint8, (203, 333)), _random(rng, np.int8, (333, 250))  # above the split's 2**24 MACs
    assert a.size * b.shape[1] >= ig.SPLIT_MACS
    with using_threads(2):
        got = ig.igemm(a, ig.pack_b(b), np.empty((203, 250), np.int32), 5, 0)
    np.testing.assert_array_equal(got, _reference(a, b, 5))


@pytest.mark.parametrize("kinds", KINDS, ids=lambda k: f"{np.dtype(k[0])}x{np.dtype(k[1])}")
@pytest.mark.parametrize("shape", [(70, 64, 300), (200, 101, 60), (33, 130, 250)], ids=str)
def test_fixed_product_is_igemms_chain_on_a_team(kinds, shape):
    """`Fixed` (a constant A's arguments made once) gives igemm's bits through a conv's chain, on a team of two
    cutting the columns or (one panel) the rows, with per-row zero points, and as B's zero point changes between
    calls (a dynamic input's) and back."""
    rng = np.random.default_rng(sum(shape))
    m, k, n = shape
    a, za = _random(rng, kinds[0], (m, k)), _random(rng, kinds[0], (m,))
    params = np.array([-128, 127, 0.05, 0, 6, 0, 0, 0, 0], np.float32)
    chain = ig.Chain(rng.uniform(1e-4, 1e-3, m).astype(np.float32), np.zeros(0, np.float32),
                     np.zeros(0, np.float32), rng.standard_normal(m).astype(np.float32), params, 2)
    fixed = ig.Fixed(a, za)
    assert fixed.team_applies(n, 2) and not fixed.team_applies(n, 1)
    for zb in (3, 200, 3):
        b = _random(rng, kinds[1], (k, n))
        packed = ig.pack_b(b)
        want = ig.igemm(a, packed, np.empty((m, n), np.float32), za, zb, chain=chain)
        assert np.unique(want).size > 10  # not all clipped
        got = np.full((m, n), np.nan, np.float32)
        fixed(packed.b, packed.colsum, packed.beta, zb, got, chain, 2)
        np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_a_batch_of_matrices():
    """A (batch, M, K) A times one B per matrix (or one for all), and a strided A: each the exact product."""
    rng = np.random.default_rng(6)
    a, b = _random(rng, np.int8, (3, 10, 23)), _random(rng, np.uint8, (3, 23, 17))
    out = np.empty((3, 10, 17), np.int32)
    np.testing.assert_array_equal(ig.igemm(a, ig.pack_b(b), out, 2, 9), _reference(a, b, 2, 9))
    np.testing.assert_array_equal(ig.igemm(a, ig.pack_b(b[1]), out, 2, 9), _reference(a, b[1], 2, 9))
    strided = a[:, ::2].transpose(1, 0, 2).reshape(15, 23)[::2]  # rows not 23 bytes apart
    want = _reference(strided, b[0])
    np.testing.assert_array_equal(ig.igemm(strided, ig.pack_b(b[0]), np.empty((8, 17), np.int32)), want)


def test_misfit_operands_are_refused():
    """An A whose K is not B's, or an out of the wrong shape, is an error naming both shapes."""
    packed = ig.pack_b(np.zeros((8, 3), np.int8))
    with pytest.raises(ValueError, match=r"\(8, 3\)"):
        ig.igemm(np.zeros((2, 7), np.uint8), packed, np.empty((2, 3), np.int32))
    with pytest.raises(TypeError, match="int8"):
        ig.pack_b(np.zeros((8, 3), np.float32))


def test_an_llvm_with_typed_pointers_declines_the_kernel(monkeypatch):
    """Under an LLVM before 17 (typed pointers: the masked load's name is spelt otherwise) the VNNI kernel is off,
    so the op kernels decline and numpy computes the nodes."""
    import llvmlite.binding as llvm

    monkeypatch.setattr(ig, "_VNNI", None)
    monkeypatch.setattr(llvm, "llvm_version_info", (14, 0, 6))
    assert not ig.vnni()


def test_portable_kernel_without_vnni(tmp_path):
    """Compiled for a CPU without AVX-512 VNNI (numba's generic target), the portable micro-kernel is exact too."""
    code = (
        "import numpy as np\n"
        "from minfer_ops_numba import igemm as ig\n"
        "assert not ig.vnni()\n"
        "rng = np.random.default_rng(1)\n"
        "for ta, tb in ((np.uint8, np.int8), (np.int8, np.uint8)):\n"
        "    a = rng.integers(np.iinfo(ta).min, np.iinfo(ta).max + 1, (9, 70)).astype(ta)\n"
        "    b = rng.integers(np.iinfo(tb).min, np.iinfo(tb).max + 1, (70, 67)).astype(tb)\n"
        "    got = ig.igemm(a, ig.pack_b(b), np.empty((9, 67), np.int32), 3, 4)\n"
        "    assert np.array_equal(got, (a.astype(np.int64) - 3) @ (b.astype(np.int64) - 4))\n"
    )
    env = dict(os.environ, NUMBA_CPU_NAME="generic", MINFER_CACHE=str(tmp_path))
    env.pop("NUMBA_CACHE_DIR", None)
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def _ctx(op, types, consts):
    from minfer_core import KernelContext, TensorType

    inputs = tuple(None if t is None else TensorType(t[0], t[1]) for t in types)
    return KernelContext("n", op, 13, inputs, (None,), tuple(consts), 1)


def _both(op, types, consts, **attrs):
    """The numba kernel's and minfer-ops-basic's run callables for one node (the numba one must apply to it)."""
    from minfer_ops_basic import linalg, qmatmul as basic
    from minfer_ops_numba import qmatmul

    record = {"ScaledMatMulInteger": qmatmul.scaled_matmul_integer, "MatMulInteger": qmatmul.matmul_integer,
              "QLinearMatMul": qmatmul.qlinear_matmul}[op]
    ref = {"ScaledMatMulInteger": basic.scaled_matmul_integer, "MatMulInteger": linalg.matmul_integer,
           "QLinearMatMul": linalg.qlinear_matmul}[op]
    ctx = _ctx(op, types, consts)
    if not ig.vnni():
        pytest.skip("the op kernels apply only on AVX-512 VNNI")
    assert record.applies(ctx, attrs)
    return record.fn(ctx, **attrs), ref.fn(_ctx(op, types, consts), **attrs)


def _same(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("case", ["dynamic", "dynamic-nan", "uint8-percolumn", "int8", "big-sums", "bias-2d"])
def test_scaled_matmul_integer_bit_for_bit_as_numpy(case):
    """ScaledMatMulInteger on VNNI gives minfer-ops-basic's float32 outputs bit for bit (DynamicQuantizeLinear
    inside, NaN, per-column zero points, int8 operands, products beyond 2**24, a bias of shape (1, N))."""
    rng = np.random.default_rng(11)
    k, n = (1024, 70) if case == "big-sums" else (300, 90)
    bt = np.uint8 if case == "uint8-percolumn" else np.int8
    b = _random(rng, bt, (k, n))
    zb = _random(rng, bt, (n,)) if case == "uint8-percolumn" else np.array(3, bt)
    scale = np.array([0.0123], np.float32)
    bias = rng.standard_normal((1, n) if case == "bias-2d" else (n,)).astype(np.float32)
    dynamic = case.startswith("dynamic")
    if dynamic:
        a = (rng.standard_normal((2, 37, k)) * 3).astype(np.float32)
        if case == "dynamic-nan":
            a[1, 5, 7] = np.nan
        za = None
    else:
        at = np.int8 if case == "int8" else np.uint8
        a = np.full((37, k), np.iinfo(at).max, at) if case == "big-sums" else _random(rng, at, (37, k))
        b = np.full((k, n), 127, np.int8) if case == "big-sums" else b
        za = np.array(0 if case == "big-sums" else 5, at)
    types = [(a.dtype, a.shape), (b.dtype, b.shape), None if za is None else (za.dtype, ()), (zb.dtype, zb.shape),
             (np.float32, (1,)), (np.float32, bias.shape)]
    mine, numpy_run = _both("ScaledMatMulInteger", types, [None, b, None, zb, None, None], dynamic_input=int(dynamic))
    for with_bias in (bias, None):
        with np.errstate(invalid="ignore"):
            want = numpy_run(a, None, za, None, scale, with_bias)
            _same(mine(a, None, za, None, scale, with_bias), want)
            out = np.empty_like(want)
            assert mine(a, None, za, None, scale, with_bias, out=out) is out
        _same(out, want)


@pytest.mark.parametrize("threads", [1, 2], ids=["serial", "team"])
@pytest.mark.parametrize("case", ["one-row", "three-rows-percolumn", "bias-2d", "nan", "infinity"])
def test_a_dynamic_scaled_matmul_of_few_rows_is_numpys_bits(case, threads, monkeypatch):
    """A dynamic ScaledMatMulInteger of fewer than FEW_ROWS rows (a classifier at batch 1) runs in one compiled call
    on the weight as held (qmatmul.py's `FewRows`), alone or in a run of two threads: minfer-ops-basic's float32
    outputs bit for bit, with or without a bias; NaN or an infinity in x goes igemm's way, the same as numpy's too."""
    from minfer_core.parallel import using_threads
    from minfer_ops_numba import qmatmul

    rng = np.random.default_rng(21)
    k, n = 700, 500
    bt = np.uint8 if case == "three-rows-percolumn" else np.int8
    b = _random(rng, bt, (k, n))
    zb = _random(rng, bt, (n,)) if case == "three-rows-percolumn" else np.array(3, bt)
    a = (rng.standard_normal((1, 3, k) if case == "three-rows-percolumn" else (1, k)) * 3 - 1).astype(np.float32)
    if case in ("nan", "infinity"):
        a[0, 9] = np.nan if case == "nan" else -np.inf
    bias = rng.standard_normal((1, n) if case == "bias-2d" else (n,)).astype(np.float32)
    scale = np.array([0.0123], np.float32)
    types = [(a.dtype, a.shape), (b.dtype, b.shape), None, (zb.dtype, zb.shape), (np.float32, (1,)),
             (np.float32, bias.shape)]
    mine, numpy_run = _both("ScaledMatMulInteger", types, [None, b, None, zb, None, None], dynamic_input=1)
    assert a.size < qmatmul.FEW_ROWS * k
    calls, real = [], qmatmul._dynamic_few
    monkeypatch.setattr(qmatmul, "_dynamic_few", lambda *args: calls.append(1) or real(*args))
    for with_bias in (bias, None):
        with np.errstate(invalid="ignore"), using_threads(threads):
            want = numpy_run(a, None, None, None, scale, with_bias)
            got = mine(a, None, None, None, scale, with_bias)
        _same(got, want)
        assert case in ("nan", "infinity") or np.unique(got).size > n // 2
    assert calls == [1, 1], calls


def test_matmul_integer_bit_for_bit_as_numpy():
    """MatMulInteger on VNNI: minfer-ops-basic's int32 product, for a 3-D A with a zero point per row."""
    rng = np.random.default_rng(12)
    a, b = _random(rng, np.uint8, (5, 3, 70)), _random(rng, np.int8, (70, 33))
    za, zb = _random(rng, np.uint8, (3,)), np.array(-2, np.int8)
    types = [(a.dtype, a.shape), (b.dtype, b.shape), (za.dtype, za.shape), (zb.dtype, ())]
    mine, numpy_run = _both("MatMulInteger", types, [None, b, None, zb])
    _same(mine(a, None, za, None), numpy_run(a, None, za, None))
    _same(mine(a, None, None, None), numpy_run(a, None, None, None))


@pytest.mark.parametrize("dtypes", [(np.uint8, np.int8), (np.int8, np.int8), (np.uint8, np.uint8)], ids=str)
def test_qlinear_matmul_bit_for_bit_as_numpy(dtypes):
    """QLinearMatMul on VNNI: minfer-ops-basic's rescaled, rounded, saturated outputs, per-column weight scales."""
    rng = np.random.default_rng(13)
    at, bt = dtypes
    a, b = _random(rng, at, (45, 200)), _random(rng, bt, (200, 77))
    sa, za = np.array(0.02, np.float32), _random(rng, at, ())
    sb, zb = rng.uniform(0.001, 0.01, 77).astype(np.float32), _random(rng, bt, (77,))
    sy, zy = np.array(0.9, np.float32), _random(rng, at, ())
    types = [(at, a.shape), (np.float32, ()), (at, ()), (bt, b.shape), (np.float32, sb.shape), (bt, zb.shape),
             (np.float32, ()), (at, ())]
    mine, numpy_run = _both("QLinearMatMul", types, [None, None, None, b, sb, zb, None, None])
    args = (a, sa, za, None, sb, None, sy, zy)
    _same(mine(*args), numpy_run(*args))


def test_op_kernels_leave_computed_weights_to_numpy():
    """A weight computed at run (not a constant) or a float32 A where 8 bits are due: the numba kernels decline."""
    from minfer_ops_numba import qmatmul

    b = np.zeros((8, 3), np.int8)
    types = [(np.uint8, (2, 8)), (np.int8, (8, 3))]
    assert not qmatmul.matmul_integer.applies(_ctx("MatMulInteger", types, [None, None]), {})
    assert not qmatmul.matmul_integer.applies(_ctx("MatMulInteger", [(np.float32, (2, 8))] + types[1:], [None, b]), {})


@pytest.mark.parametrize("dtypes", [(np.uint8, np.uint8), (np.int8, np.int8)], ids=str)
def test_qlinear_matmul_of_computed_operands_bit_for_bit_as_numpy(dtypes):
    """QLinearMatMul of two computed tensors (attention's heads: a transposed, broadcast batch) on VNNI gives
    minfer-ops-basic's outputs; so does a per-row a_scale (requantized through the int32 product)."""
    rng = np.random.default_rng(14)
    at, bt = dtypes
    a, b = _random(rng, at, (1, 4, 33, 70)), _random(rng, bt, (4, 45, 70)).transpose(0, 2, 1)  # (4, 70, 45)
    za, zb, zy = _random(rng, at, ()), _random(rng, bt, ()), _random(rng, at, ())
    sa, sb, sy = np.array(0.03, np.float32), np.array(0.02, np.float32), np.array(0.5, np.float32)
    types = [(at, a.shape), (np.float32, ()), (at, ()), (bt, b.shape), (np.float32, ()), (bt, ()), (np.float32, ()),
             (at, ())]
    mine, numpy_run = _both("QLinearMatMul", types, [None] * 8)
    args = [a, sa, za, b, sb, zb, sy, zy]
    _same(mine(*args), numpy_run(*args))
    out = np.empty((1, 4, 33, 45), at)
    assert mine(*args, out=out) is out
    _same(out, numpy_run(*args))
    args[0], args[1] = a[0, 0], rng.uniform(0.01, 0.05, 33).astype(np.float32)  # 2-D A, an a_scale per row
    _same(mine(*args), numpy_run(*args))
