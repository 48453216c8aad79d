"""minfer-ops-numba's FusedMatMulBias (linear.py): bias, residual and activation in each block's write-out.

Its product is linear.py's MatMul (the same blocks, so the same BLAS calls, or the same micro-kernel tiles) and its
epilogue the same float32 operations in minfer-passes' order: where the product is BLAS's it gives the bits of
minfer-passes' kernel running on that MatMul, where it is the micro-kernel's (`_tiled`) the same within float32
rounding; the blocks come from the product's shape alone (tests/plugins/test_team.py checks a team's bits against
one thread).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from onnx import helper, numpy_helper

import minfer_core
from minfer_core import tuning

pytest.importorskip("numba")
from minfer_ops_numba import linear, team  # noqa: E402

from modelkit import make_model, ort_run, tensor  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")

K, N = 64, 96


def _model(activation: str, residual: bool):
    """x [B, 128, K] @ w + b (+ r) (+ activation) as an exporter writes it; B symbolic, so the node keeps both
    kernels (a node of one static shape drops the one not chosen)."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array((rng.standard_normal((K, N)) * 0.2).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(N).astype(np.float32), "b"),
             numpy_helper.from_array(np.asarray(math.sqrt(2), np.float32), "r2"),
             numpy_helper.from_array(np.asarray(1.0, np.float32), "one"),
             numpy_helper.from_array(np.asarray(0.5, np.float32), "half")]
    n = helper.make_node
    nodes, last = [n("MatMul", ["x", "w"], ["m"]), n("Add", ["m", "b"], ["h"])], "h"
    inputs = [tensor("x", ["B", 128, K])]
    if residual:
        nodes.append(n("Add", ["h", "r"], ["hr"]))
        inputs.append(tensor("r", ["B", 128, N]))
        last = "hr"
    if activation == "Gelu":
        nodes += [n("Div", [last, "r2"], ["g0"]), n("Erf", ["g0"], ["g1"]), n("Add", ["g1", "one"], ["g2"]),
                  n("Mul", [last, "g2"], ["g3"]), n("Mul", ["g3", "half"], ["y"])]
    elif activation:
        nodes.append(n(activation, [last], ["y"]))
    else:
        nodes.append(n("Identity", [last], ["y"]))
    return make_model(nodes, inputs, [tensor("y", ["B", 128, N])], inits, opset=17)


@pytest.mark.parametrize("activation", ["", "Relu", "HardSwish", "Gelu"])
@pytest.mark.parametrize("residual", [False, True])
def test_the_compiled_epilogue_gives_minfer_passes_bits(monkeypatch, activation, residual):
    """The numba kernel and minfer-passes' kernel, both candidates of the fused node, give the same bits on the
    same inputs with BLAS's product (the same within float32 rounding with the micro-kernel's), with one thread and
    with two (the numba kernel's bits the same on both), and the session matches onnxruntime."""
    monkeypatch.setattr(tuning, "choose", lambda key, names, time_one, prior=None: 0)  # no timing: the first
    model = _model(activation, residual)
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((2, 128, K)).astype(np.float32)}
    if residual:
        feeds["r"] = rng.standard_normal((2, 128, N)).astype(np.float32)
    tiled, results = K <= linear.TILED_DEPTH and linear.pointwise.available(), []
    for threads in (1, 2):
        session = minfer_core.InferenceSession(model, threads=threads)
        (step,) = [s for s in session.program.specs if s.kernel.op_type == linear.FUSED]
        names = [name.split(":")[1] for name in step.fn.names]
        assert names == ["minfer_ops_numba.linear.fused_matmul_bias", "minfer_passes.linear.fused_matmul_bias"]
        got = session.run(None, feeds)[0]
        np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)
        args = [feeds.get(name, session.program.template[slot]) if name else None
                for name, slot in zip(session.program.step_nodes[session.program.specs.index(step)].inputs, step.ins)]
        with minfer_core.parallel.using_threads(threads):
            ours, theirs = (np.array(fn(*args)) for fn in step.fn.fns)
        if tiled:
            np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-5)
        else:
            np.testing.assert_array_equal(ours, theirs)
        np.testing.assert_array_equal(got, ours)
        results.append(ours)
    np.testing.assert_array_equal(*results)


@pytest.mark.parametrize("m,n,k", [(128, 256, 256), (128, 1024, 256), (1024, 256, 256), (100, 200, 96)])
def test_blocks_cut_the_longer_side_in_blocks_that_pack_little(m, n, k):
    """Past 32 rows a product is cut along its longer side (a block of rows repacks B, of columns A), in blocks of
    at least 64 rows or 128 columns (two blocks at least), covering the output once."""
    blocks = linear.plan(m, n, k)
    cover = np.zeros((m, n), np.int64)
    for r0, r1, c0, c1 in blocks:
        cover[r0:r1, c0:c1] += 1
    assert (cover == 1).all() and len(blocks) >= 2
    rows = bool((blocks[:, 3] - blocks[:, 2] == n).all()) and len(blocks) > 1
    assert rows == (m > n)
    least = min((blocks[:, 1] - blocks[:, 0]) if rows else (blocks[:, 3] - blocks[:, 2]))
    assert least >= min(linear.MIN_ROWS if rows else linear.MIN_COLUMNS, (m if rows else n) // 2 - 16)


def test_gelu_in_the_write_out_is_the_gelu_kernels_formula():
    """`_blocks` with the GELU op writes gelu.py's value of (product + bias) at every element, NaN kept."""
    if not team.gemm_address():
        pytest.skip("numpy's BLAS has no cblas_sgemm here: linear.py does not apply")
    from minfer_ops_numba import gelu

    rng = np.random.default_rng(2)
    a = rng.standard_normal((40, 16)).astype(np.float32)
    a[3, 5] = np.nan
    w, c = rng.standard_normal((16, 48)).astype(np.float32), rng.standard_normal(48).astype(np.float32)
    y, plain = np.empty(40 * 48, np.float32), np.empty(40 * 48, np.float32)
    blocks = linear.plan(40, 48, 16)
    for out, op in ((y, linear.GELU), (plain, team.NONE)):
        linear._blocks(team.gemm_address(), a, w, 48, out, 48, c, team.NOTHING, blocks, 0, len(blocks), op,
                       np.float32(0), np.float32(0))
    expect = np.empty_like(plain)
    gelu._gelu(plain, expect, 0, plain.size)
    np.testing.assert_array_equal(y, expect)
    assert np.isnan(y.reshape(40, 48)[3]).all()


# ---- MatMul of two run-time operands (attention's products) ----------------------------------------------------


def _batched_ctx(a, b):
    from minfer_core import KernelContext, TensorType

    return KernelContext("mm", "MatMul", 13, (TensorType(a.dtype, a.shape), TensorType(b.dtype, b.shape)), (None,),
                         (None, None), 1)


def _attention_operands(seed=0, batch=1):
    """Q (batch, 4, 128, 64) as a transposed head split gives it, K^T and V as transposed views of (batch, 128, 4,
    64)."""
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((batch, 128, 4, 64), dtype=np.float32).transpose(0, 2, 1, 3)
    kt = rng.standard_normal((batch, 128, 4, 64), dtype=np.float32).transpose(0, 2, 3, 1)
    v = rng.standard_normal((batch, 128, 4, 64), dtype=np.float32).transpose(0, 2, 1, 3)
    p = rng.standard_normal((batch, 4, 128, 128), dtype=np.float32)
    return q, kt, p, v


@pytest.mark.parametrize("threads", [1, 2])
def test_batched_products_give_numpys_bits_on_a_team_or_not(monkeypatch, threads):
    """Q @ K^T (K^T read as cblas' transposed B in K's layout) and P @ V (V's rows strided) give numpy's matmul's
    bits (the same BLAS call a matrix), the matrices over a native team on two threads; odd shapes and batch
    dims alike; an A whose rows are not unit-stride goes to numpy's matmul as a whole."""
    q, kt, p, v = _attention_operands()
    q3, kt3, p3, v3 = _attention_operands(batch=3)  # batch and head axes that do not merge into one
    rng = np.random.default_rng(1)
    strided = rng.standard_normal((2, 9, 16), dtype=np.float32)[:, :, ::2]
    pairs = [(q, kt), (p, v), (q3, kt3), (p3, v3), (rng.standard_normal((3, 2, 13, 7), dtype=np.float32),
                                rng.standard_normal((3, 2, 7, 70), dtype=np.float32)),
             (strided, rng.standard_normal((2, 8, 5), dtype=np.float32))]
    calls: list[int] = []
    real = linear.team_products
    monkeypatch.setattr(linear, "team_products", lambda *args: calls.append(1) or real(*args))
    from minfer_core.parallel import using_threads

    for a, b in pairs:
        assert linear._applies_batched(_batched_ctx(a, b), {})
        run = linear.batched_matmul.prepared(_batched_ctx(a, b), {})
        with using_threads(threads):
            got = run(a, b)
            y = np.full(got.shape, np.nan, np.float32)
            assert run(a, b, out=y) is y
        np.testing.assert_array_equal(got, np.matmul(a, b))
        np.testing.assert_array_equal(y, got)
    if threads == 2 and team.available():
        assert calls, "the team driver never ran"


def test_batched_products_read_each_matrix_where_it_lies():
    """Heads split by a Transpose over several batches (axes whose strides merge into no single batch stride):
    each matrix is read at its own address in the operand (no copy of the operand: at batch 8 the copies of Q and
    K^T took longer than the products), K^T as cblas' transposed B in K's layout."""
    q, kt, _, _ = _attention_operands(batch=3)
    ops_q, ops_kt = (linear._operand(x.shape, x.strides, rows) for x, rows in ((q, True), (kt, False)))
    assert ops_q[0] == 4 * 64 and ops_kt[0] == -(4 * 64)  # leading dimensions; negative: read transposed
    for x, ops in ((q, ops_q), (kt, ops_kt)):  # each matrix's offset in the operand, batch dims row-major
        assert list(ops[1:]) == [i * x.strides[0] + j * x.strides[1] for i in range(3) for j in range(4)]
    assert linear._operand(kt.shape, kt.strides, True) is None  # an A is never read transposed


def test_batched_products_apply_to_run_time_operands_of_the_same_batch_dims_only():
    """A constant B is `matmul`'s; broadcast batch dims, rank 2, an unknown K and float64 go to numpy's kernel."""
    q, kt, _, _ = _attention_operands()
    from minfer_core import KernelContext, TensorType

    assert linear._applies_batched(_batched_ctx(q, kt), {})
    refused = [
        _batched_ctx(q, kt[:, :1]),  # B broadcast over the heads
        _batched_ctx(q[0, 0], kt[0, 0]),  # rank 2
        _batched_ctx(q.astype(np.float64), kt.astype(np.float64)),
        KernelContext("mm", "MatMul", 13, (TensorType(np.dtype(np.float32), (1, 4, 128, 64)),
                                           TensorType(np.dtype(np.float32), (1, 4, 64, 128))), (None,),
                      (None, np.ascontiguousarray(kt)), 1),  # a constant B
        KernelContext("mm", "MatMul", 13, (TensorType(np.dtype(np.float32), (1, 4, 128, None)),
                                           TensorType(np.dtype(np.float32), (1, 4, None, 128))), (None,),
                      (None, None), 1),  # K unknown
    ]
    for ctx in refused:
        assert not linear._applies_batched(ctx, {})


# ---- the micro-kernel's product (`_tiled`) ----------------------------------------------------------------------


def _tiled_or_skip():
    if not linear.pointwise.available():
        pytest.skip("the micro-kernel needs AVX-512F and LLVM >= 17")


@pytest.mark.parametrize("m,k,n", [(1, 1024, 1000), (7, 33, 130), (128, 256, 1024), (130, 64, 64), (9, 1, 5),
                                   (300, 100, 70)])
@pytest.mark.parametrize("op", ["", "Relu", "Gelu"])
def test_tiled_product_matches_numpy_with_its_epilogue_and_the_same_bits_on_any_thread_count(m, k, n, op):
    """A MatMul by a constant B of at most TILED_DEPTH rows runs on the micro-kernel (`_tiled`: rows not a multiple
    of its 4, columns not of its 64, one row, one input channel), + bias, + residual, then the activation, within
    float32 rounding of numpy's product and the same bits on one thread and two (its blocks from the shape alone,
    each output's K products added in order)."""
    _tiled_or_skip()
    from minfer_core import KernelContext, TensorType
    from minfer_core.parallel import using_threads

    rng = np.random.default_rng(m + k + n)
    a = rng.standard_normal((m, k), dtype=np.float32)
    w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
    c, z = rng.standard_normal(n, dtype=np.float32), rng.standard_normal((m, n), dtype=np.float32)
    types = tuple(TensorType(v.dtype, v.shape) for v in (a, w, c, z))
    ctx = KernelContext("fmm", linear.FUSED, 1, types, (None,), (None, w, c, None), 1)
    attrs = {"activation": op}
    assert linear._applies_fused(ctx, attrs)
    run = linear.fused_matmul_bias.prepared(ctx, attrs)
    calls = []
    real = linear._tiled
    linear._tiled = lambda *args: calls.append(1) or real(*args)
    try:
        with using_threads(1):
            one = run(a, None, None, z)
    finally:
        linear._tiled = real
    assert calls, "the micro-kernel's product did not run"
    want = a.astype(np.float64) @ w.astype(np.float64) + c + z
    if op == "Relu":
        want = np.maximum(want, 0)
    elif op == "Gelu":
        from math import erf

        want = want * 0.5 * (1 + np.vectorize(erf)(want / np.sqrt(2)))
    np.testing.assert_allclose(one, want, rtol=1e-4, atol=1e-4)
    with using_threads(2):
        two = run(a, None, None, z, out=np.full((m, n), np.nan, np.float32))
    np.testing.assert_array_equal(one, two)


def test_blocks_of_columns_are_whole_panels_of_the_micro_kernel():
    """Cut for the micro-kernel, every block of columns but the last is a multiple of its 64-column panel."""
    for m, n, k in ((8, 300, 512), (64, 200, 96), (1, 1000, 1024), (128, 1024, 256)):
        blocks = linear.plan(m, n, k, linear.W)
        widths = blocks[:, 3] - blocks[:, 2]
        assert (widths[:-1] % linear.W == 0).all() and widths.sum() == n * len(set(map(tuple, blocks[:, :2])))


def test_a_deep_b_is_read_in_parts_with_the_uncut_products_bits(monkeypatch):
    """Past TILED_DEPTH rows of B the micro-kernel reads it in parts, each adding to the tile: the bits of the
    uncut product (each output's sum continues from the float32 value stored), on one thread and two, numpy's
    within float32 rounding; a product of few rows (at most linear.ROWS) against such a B stays BLAS's."""
    _tiled_or_skip()
    from minfer_core import KernelContext, TensorType
    from minfer_core.parallel import using_threads

    def run_of(m, k, n):
        rng = np.random.default_rng(m + k)
        a = rng.standard_normal((m, k), dtype=np.float32)
        w = (rng.standard_normal((k, n)) / np.sqrt(k)).astype(np.float32)
        ctx = KernelContext("mm", "MatMul", 13, (TensorType(a.dtype, a.shape), TensorType(w.dtype, w.shape)),
                            (None,), (None, w), 1)
        return a, w, linear.matmul.prepared(ctx, {})  # (built: numba's dispatchers now hold the module's names)

    def counted():
        calls = []
        real = linear._tiled
        monkeypatch.setattr(linear, "_tiled", lambda *args: calls.append(args[-1]) or real(*args))
        return calls

    a, w, run = run_of(40, 2500, 70)
    calls = counted()
    with using_threads(1):
        parts = run(a)
    assert calls and set(calls) == {linear.TILED_DEPTH}
    np.testing.assert_allclose(parts, a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    with using_threads(2):
        np.testing.assert_array_equal(run(a), parts)
    monkeypatch.setattr(linear, "TILED_DEPTH", 4096)  # one part: the uncut product
    run = run_of(40, 2500, 70)[2]
    calls = counted()
    with using_threads(1):
        np.testing.assert_array_equal(run(a), parts)
    assert calls and set(calls) == {4096}
    monkeypatch.setattr(linear, "TILED_DEPTH", 1024)
    a, w, run = run_of(8, 1500, 100)
    calls = counted()
    np.testing.assert_allclose(run(a), a.astype(np.float64) @ w, rtol=1e-4, atol=1e-4)
    assert not calls


@pytest.mark.parametrize("m", [40, 1])
def test_empty_products_are_the_bias_alone(m):
    """A MatMul by a constant (0, N) B, + bias: the bias alone (no product to sum: the micro-kernel's loop, which
    sums at least one row, is not used; the blocks' cut divided by the depth); an A of no rows: no rows."""
    from minfer_core import KernelContext, TensorType

    def run(a, w, c):
        types = tuple(TensorType(v.dtype, v.shape) for v in (a, w, c))
        ctx = KernelContext("fmm", linear.FUSED, 1, types, (None,), (None, w, c), 1)
        assert linear._applies_fused(ctx, {})
        out = np.full((a.shape[0], w.shape[1]), np.nan, np.float32)
        return linear.fused_matmul_bias.prepared(ctx, {})(a, None, None, out=out)

    c = np.arange(70, dtype=np.float32)
    np.testing.assert_array_equal(run(np.ones((m, 0), np.float32), np.ones((0, 70), np.float32), c),
                                  np.broadcast_to(c, (m, 70)))
    assert run(np.ones((0, 8), np.float32), np.ones((8, 70), np.float32), c).shape == (0, 70)
