"""Kernels: MatMul, Gemm, Einsum, Det, MatMulInteger, QLinearMatMul."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from minfer_core import kernel

from .elementwise import arr, into, is_exotic


def _blas(x: np.ndarray) -> np.ndarray:
    """numpy has no BLAS path for half floats (and none at all for ml_dtypes): use float32."""
    if is_exotic(x.dtype) or (x.dtype.kind == "f" and x.dtype.itemsize < 4):
        return x.astype(np.float32)
    return x


def matmul(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """numpy.matmul semantics (1-D promotion, batch broadcasting) in a's dtype."""
    wa, wb = _blas(a), _blas(b)
    if out is not None and wa is a and wb is b:
        return np.matmul(a, b, out=out)
    return into(out, arr(np.matmul(wa, wb), a.dtype))


def _own_copy(value: np.ndarray) -> np.ndarray:
    """A C-contiguous array that shares no memory with value (so the engine may free the original)."""
    return np.array(value, order="C", copy=True)


def _matmul_const(b: np.ndarray) -> Callable[..., np.ndarray]:
    """MatMul by a constant B, kept as our own contiguous copy (in the dtype BLAS computes in)."""
    w = _own_copy(_blas(b))
    k_n = w.shape if w.ndim == 2 else None

    def run(a, b=None, *, out=None):
        # a C-contiguous [..., M, K] stack times a 2-D weight is one [M*, K] x [K, N] GEMM,
        # not one BLAS call per matrix of the stack
        if k_n is not None and a.ndim > 2 and a.flags.c_contiguous and a.shape[-1] == k_n[0]:
            wa = _blas(a).reshape(-1, k_n[0])
            shape = a.shape[:-1] + (k_n[1],)
            if out is not None and wa.dtype == out.dtype:
                np.matmul(wa, w, out=out.reshape(-1, k_n[1]))
                return out
            return into(out, arr(np.matmul(wa, w).reshape(shape), a.dtype))
        return matmul(a, w, out)

    return run


@kernel("MatMul", since=1, prepare=True, out=True, views=False, packed=(1,))
def matmul_1(ctx):
    """MatMul-1: numpy-style matrix product with batch broadcasting; a constant B is packed once."""
    b_const = ctx.constants[1] if len(ctx.constants) > 1 else None
    if b_const is not None:
        return _matmul_const(b_const)  # the callable closes over the copy only, never ctx

    def run(a, b, *, out=None):
        return matmul(a, b, out)

    return run


# --- Gemm --------------------------------------------------------------------


def _scaled(value: np.ndarray, factor: float) -> np.ndarray:
    """value * factor in value's dtype, skipping the pass when factor is 1."""
    if factor == 1.0:
        return value
    return value * np.asarray(factor, dtype=value.dtype)


def _gemm(ctx: Any, alpha: float, beta: float, trans_a: int, trans_b: int) -> Callable[..., np.ndarray]:
    """Y = alpha * A' @ B' + beta * C, with a constant B (and C) scaled and laid out once."""
    b_const = ctx.constants[1] if len(ctx.constants) > 1 else None
    c_const = ctx.constants[2] if len(ctx.constants) > 2 else None
    # our own copies (packed=(1, 2)): run never reads the originals, and closes over neither them nor ctx
    if b_const is not None:
        b_const = _blas(b_const)
        b_const = _own_copy(_scaled(b_const.T if trans_b else b_const, alpha))
    c_const = None if c_const is None else _own_copy(_scaled(_blas(c_const), beta))

    def run(a, b, c=None, *, out=None):
        out_dtype = a.dtype
        a = _blas(a)
        if trans_a:
            a = a.T
        # the product lands in the planned buffer when the dtypes allow; y is then ours to update
        direct = out if out is not None and a.dtype == out_dtype else None
        if b_const is not None:
            y = np.matmul(a, b_const, out=direct)
        else:
            b = _blas(b)
            y = np.matmul(a, b.T if trans_b else b, out=direct)
            if alpha != 1.0:
                y *= np.asarray(alpha, y.dtype)
        if c_const is not None:
            y += c_const
        elif c is not None and beta != 0:
            y += _scaled(_blas(c), beta)
        return y if y is out else into(out, arr(y, out_dtype))

    return run


@kernel("Gemm", since=7, prepare=True, out=True, views=False, packed=(1, 2))
def gemm(ctx, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """Gemm-7: alpha * A' @ B' + beta * C, C broadcast to (M, N) and optional from 11."""
    return _gemm(ctx, alpha, beta, transA, transB)


@kernel("Gemm", since=1, prepare=True, out=True, views=False, packed=(1, 2))
def gemm_1(ctx, *, alpha=1.0, beta=1.0, broadcast=0, transA=0, transB=0):
    """Gemm-1: as Gemm-7; numpy broadcasting of C also covers the ``broadcast`` flag."""
    return _gemm(ctx, alpha, beta, transA, transB)


# --- the rest ----------------------------------------------------------------


@kernel("Einsum", since=12, prepare=True)
def einsum(ctx, *, equation):
    """Einsum-12: Einstein summation along a contraction path searched once per input shapes."""
    eq = equation.replace(" ", "")
    paths: dict[tuple, Any] = {}  # the path search costs more than a small einsum itself

    def run(*inputs):
        xs = [_blas(x) for x in inputs]
        if len(xs) < 2:
            return arr(np.einsum(eq, *xs), inputs[0].dtype)
        key = tuple(x.shape for x in xs)
        if key not in paths:
            if len(paths) > 64:
                paths.clear()
            paths[key] = np.einsum_path(eq, *xs, optimize="greedy")[0]
        return arr(np.einsum(eq, *xs, optimize=paths[key]), inputs[0].dtype)

    return run


@kernel("Det", since=11)
def det(x):
    """Det-11: determinant of each square matrix in the trailing two dims."""
    return arr(np.linalg.det(_blas(x)), x.dtype)


def _centered(x: np.ndarray, zero_point: np.ndarray | None, per_row: bool) -> np.ndarray:
    """x - zero_point in float64; a 1-D zero point of A is per row, of B per column."""
    v = x.astype(np.float64)
    if zero_point is None:
        return v
    zp = np.asarray(zero_point, dtype=np.float64)
    if per_row and zp.ndim == 1:
        zp = zp.reshape(-1, 1)
    return v - zp


@kernel("MatMulInteger", since=10)
def matmul_integer(a, b, a_zero_point=None, b_zero_point=None):
    """MatMulInteger-10: (A - a_zp) @ (B - b_zp) accumulated exactly, as int32."""
    # float64 holds every int8*int8 partial sum exactly for K < 2**37, and gets BLAS speed
    y = np.matmul(_centered(a, a_zero_point, True), _centered(b, b_zero_point, False))
    return arr(np.rint(y), np.int32)


@kernel("QLinearMatMul", since=10)
def qlinear_matmul(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point):
    """QLinearMatMul-10: exact integer product of the centered operands, rescaled once, rounded, saturated."""
    acc = np.matmul(_centered(a, a_zero_point, True), _centered(b, b_zero_point, False))
    sa = np.asarray(a_scale, dtype=np.float64)
    sa = sa.reshape(-1, 1) if sa.ndim == 1 else sa  # a 1-D a_scale is per row
    y = acc * (sa * np.asarray(b_scale, dtype=np.float64) / np.asarray(y_scale, dtype=np.float64))
    target = a.dtype if y_zero_point is None else y_zero_point.dtype
    if y_zero_point is not None:
        y = y + y_zero_point.astype(np.float64)
    info = np.iinfo(target)
    return arr(np.clip(np.rint(y), info.min, info.max), target)


KERNELS: list = [matmul_1, gemm, gemm_1, einsum, det, matmul_integer, qlinear_matmul]
