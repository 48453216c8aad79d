"""minfer-ops-numba's DequantGemm/DequantMatMul of one row (the 8-bit weight read as it lies) against minfer-passes'
kernel (the weight dequantized into float32, then the float GEMM): the float GEMM's values within its rounding,
the same grid after the node's rounding but where a sum falls within rounding of a half step."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import KernelContext, TensorType  # noqa: E402
from minfer_ops_numba import dequant_linear  # noqa: E402
from minfer_passes import qdq_ops  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py

ROUNDING = {"activation": "QuantizeDequantize", "activation_params": [0.0139, -148.0, 107.0]}


def _node(op, x, w, ws, wz, c=None, m=None, attrs=None):
    inputs = [x, w, ws, wz, c, m]
    types = tuple(None if v is None else TensorType(v.dtype, v.shape) for v in inputs)
    consts = (None, w, ws, wz, c, m)
    out = (x.shape[:-1] + ((w.shape[0] if (attrs or {}).get("transB") else w.shape[1]),))
    return KernelContext("n", op, 1, types, (TensorType(np.float32, out),), consts, 1), attrs or {}


def _weights(rng, k, n, trans, per_column, zero, dtype=np.int8):
    info = np.iinfo(dtype)
    w = rng.integers(info.min, info.max + 1, (n, k) if trans else (k, n)).astype(dtype)
    ws = rng.uniform(0.001, 0.003, n if per_column else 1).astype(np.float32).reshape(-1 if per_column else ())
    wz = np.full(ws.shape, zero, dtype)
    return w, ws, wz


@pytest.mark.parametrize("trans", [0, 1])
@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("zero", [0, 3])
@pytest.mark.parametrize("bias", [None, "column", "row", "one"])
def test_dequant_gemm_row_is_the_float_gemm(trans, per_column, zero, bias):
    """One row of x times the dequantized weight (+ C): minfer-passes' values within float32 rounding of the sum
    (K = 1283: the four-k steps and the k left after them)."""
    rng = np.random.default_rng(trans * 8 + per_column * 4 + zero)
    k, n = 1283, 300
    x = (rng.standard_normal((1, k)) * 2).astype(np.float32)
    w, ws, wz = _weights(rng, k, n, trans, per_column, zero)
    c = {None: None, "column": rng.standard_normal(n), "row": rng.standard_normal((1, n)),
         "one": np.asarray([0.75])}[bias]
    c = None if c is None else c.astype(np.float32)
    ctx, attrs = _node("DequantGemm", x, w, ws, wz, c, attrs={"transB": trans, "axis": 0 if trans else 1})
    assert dequant_linear.dequant_gemm.applies(ctx, attrs)
    got = dequant_linear.dequant_gemm.prepared(ctx, attrs)(x)
    want = qdq_ops.dequant_gemm.prepared(ctx, attrs)(x)
    exact = x.astype(np.float64) @ (((w.T if trans else w).astype(np.float64) - zero) * ws.astype(np.float64))
    exact = exact + (0 if c is None else c.astype(np.float64))
    assert got.shape == want.shape == (1, n) and got.dtype == np.float32
    bound = 1e-5 * np.abs(x).sum() * 130 * ws.max()  # float32 rounding of K products' sum
    assert np.max(np.abs(got - exact)) < bound and np.max(np.abs(want - exact)) < bound
    assert not np.array_equal(got, np.zeros_like(got))


def test_dequant_gemm_row_rounds_on_the_nodes_grid():
    """With the node's rounding (activation QuantizeDequantize): the same grid values as minfer-passes' kernel, an
    element apart by one step only where the float sums differ across a half step; out= is written in place."""
    rng = np.random.default_rng(7)
    k, n = 1280, 1000
    x = (np.rint(rng.uniform(0, 255, (1, k))) * np.float32(0.005)).astype(np.float32)
    w, ws, wz = _weights(rng, k, n, 1, True, 0)
    c = rng.standard_normal(n).astype(np.float32)
    ctx, attrs = _node("DequantGemm", x, w, ws, wz, c, attrs={"transB": 1, "axis": 0, **ROUNDING})
    assert dequant_linear.dequant_gemm.applies(ctx, attrs)
    out = np.full((1, n), np.nan, np.float32)
    got = dequant_linear.dequant_gemm.prepared(ctx, attrs)(x, out=out)
    want = qdq_ops.dequant_gemm.prepared(ctx, attrs)(x)
    step = np.float32(ROUNDING["activation_params"][0])
    assert got is out
    np.testing.assert_allclose(np.rint(got / step), np.clip(np.rint(got / step), -148, 107))  # on the grid, bounded
    apart = np.abs(got - want)
    assert np.all(apart <= step * 1.0001) and np.count_nonzero(apart) <= n // 100
    assert len(np.unique(got)) > 50  # not saturated


def test_dequant_matmul_row_of_a_3d_input():
    """DequantMatMul with x (1, 1, K), a uint8 weight with a zero point per column: shape and values of the numpy
    kernel's."""
    rng = np.random.default_rng(3)
    k, n = 96, 130
    x = rng.standard_normal((1, 1, k)).astype(np.float32)
    w, ws, wz = _weights(rng, k, n, 0, True, 0, np.uint8)
    wz = rng.integers(100, 150, n).astype(np.uint8)
    ctx, attrs = _node("DequantMatMul", x, w, ws, wz, attrs={"axis": 1})
    assert dequant_linear.dequant_matmul.applies(ctx, attrs)
    got = dequant_linear.dequant_matmul.prepared(ctx, attrs)(x)
    want = qdq_ops.dequant_matmul.prepared(ctx, attrs)(x)
    assert got.shape == want.shape == (1, 1, n)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * float(np.abs(want).max()))


def test_dequant_linear_declines_what_it_does_not_compute():
    """Two rows, alpha or beta not 1, transA, a per-row (axis of K) scale, an M input, another activation, a second
    rounding: left to minfer-passes' kernel."""
    rng = np.random.default_rng(1)
    k, n = 64, 32
    x = rng.standard_normal((1, k)).astype(np.float32)
    w, ws, wz = _weights(rng, k, n, 0, True, 0)
    base = {"transB": 0, "axis": 1}
    assert dequant_linear.dequant_gemm.applies(*_node("DequantGemm", x, w, ws, wz, attrs=base))
    two = rng.standard_normal((2, k)).astype(np.float32)
    assert not dequant_linear.dequant_gemm.applies(*_node("DequantGemm", two, w, ws, wz, attrs=base))
    for change in ({"alpha": 2.0}, {"beta": 0.5}, {"transA": 1}, {"axis": 0}, {"activation": "Relu"},
                   {**ROUNDING, "post_activation": "QuantizeDequantize", "post_activation_params": [0.1, 0.0, 255.0]}):
        assert not dequant_linear.dequant_gemm.applies(*_node("DequantGemm", x, w, ws, wz, attrs={**base, **change}))
    m = np.ones(n, np.float32)
    assert not dequant_linear.dequant_gemm.applies(*_node("DequantGemm", x, w, ws, wz, m=m, attrs=base))


def test_dequant_gemm_row_rejects_another_width():
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 40)).astype(np.float32)
    w, ws, wz = _weights(rng, 40, 8, 0, False, 0)
    ctx, attrs = _node("DequantGemm", x, w, ws, wz, attrs={"transB": 0})
    run = dequant_linear.dequant_gemm.prepared(ctx, attrs)
    with pytest.raises(ValueError, match="one row of 40"):
        run(np.zeros((1, 41), np.float32))
