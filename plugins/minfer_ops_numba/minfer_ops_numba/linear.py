"""MatMul and Gemm of a constant float32 B on a native team: B's columns (or A's rows) shared over numba's threads.

minfer-ops-basic's kernels split a large product over minfer's pool, and a classifier head's few rows against a
large B by a timed choice (its streaming.py); both hand over in ~60 us here, and once a native team has claimed
a run's threads (team.py) their `parallel_for` runs serially. Here the split runs on the team: each thread
takes one contiguous share of B's columns (few rows: each streams its share of B, the bulk of a head's bytes)
or of A's rows (many rows), one ``cblas_sgemm`` call (`team.gemm`), then the epilogue on its share in compiled
code: Gemm's C (one value a column), the fused op's residual and activation (`team.native`), in numpy's order.
The products are numpy's BLAS on shares of the operands, so the results may differ from numpy's kernel (and
between thread counts) in the last bits where OpenBLAS picks another micro-kernel for another call shape
(tests/plugins/test_team.py). Without a team (one thread, or MINFER_NUMBA_TEAM=0) the calling thread computes
the whole product the same way, with no team started.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import kernel

from . import team
from ._jit import F32, PRIORITY, input_type, is_float32, jit, readonly, uintp  # noqa: F401 (uintp: numba's type at compile)
from .activation import _value  # noqa: F401 (compiled code calls it)
from .team import NONE, NOTHING, prange

SPLIT_MACS = 1 << 17  # below this many multiply-adds (a few microseconds) one thread computes the product
COLUMN_BLOCK = 16  # column shares fall on whole BLAS micro-tiles, as minfer-ops-basic's
ROWS = 32  # at most this many rows: B's columns are shared (every row share would stream all of B)
# OpenBLAS (0.3.31, SkylakeX) computes a product of at most ~5 * 10**5 multiply-adds with its small-matrix kernel,
# larger ones by packing B first: for a few rows against a large B the packing is most of the time (1x1280 @
# 1280x1000: 553 us in one call, 56 in calls of 256 columns, numpy's gemv 50; 8x2048 @ 2048x1000 B transposed
# 1033 -> 260 us, B as given 391 -> 224), so few-row shares are cut so, in calls of 32 columns or more
SMALL_CALL = 1 << 19


@jit
def _share(address, a, w, ldw, y, c, z, lo, hi, by_rows, op, p, q):  # pragma: no cover - compiled
    """y[lo:hi] = a[lo:hi] @ B (``by_rows``), else y[:, lo:hi] = a @ B[:, lo:hi], then + c (a column's value, when
    c has elements), + z (the residual, flat like y, when it has elements) and the activation ``op`` there.
    B is ``w`` (K, N), or (N, K) read transposed when ``ldw`` < 0 (cblas' transB)."""
    m, k, n = a.shape[0], a.shape[1], y.shape[1]
    a0, w0, y0 = np.int64(a.ctypes.data), np.int64(w.ctypes.data), np.int64(y.ctypes.data)
    if by_rows:
        gemm(address, hi - lo, n, k, a0 + 4 * lo * k, k, w0, ldw, y0 + 4 * lo * n, n, np.float32(0))
        r0, r1, c0, c1 = lo, hi, 0, n
    else:  # in calls of at most SMALL_CALL multiply-adds: OpenBLAS's small-matrix kernel then takes them
        step = SMALL_CALL // (m * k) // COLUMN_BLOCK * COLUMN_BLOCK
        step = step if step >= 2 * COLUMN_BLOCK else hi - lo  # narrower calls lost (8x4096 @ 4096x4096: 3.6x)
        for j in range(lo, hi, step):
            cols = min(step, hi - j)
            gemm(address, m, cols, k, a0, k, w0 + 4 * j * (k if ldw < 0 else 1), ldw, y0 + 4 * j, n, np.float32(0))
        r0, r1, c0, c1 = 0, m, lo, hi
    yf = y.reshape(-1)
    has_c, has_z, act = c.size > 0, z.size > 0, op != NONE
    for r in range(r0, r1):
        at = r * n
        for j in range(c0, c1):  # the branches are the same for the whole loop (LLVM unswitches them)
            v = yf[uintp(at + j)]
            if has_c:
                v = v + c[uintp(j)]
            if has_z:
                v = v + z[uintp(at + j)]
            if act:
                v = _value(v, op, p, q)
            yf[uintp(at + j)] = v


@jit(parallel=True)
def _on_team(address, a, w, ldw, y, c, z, bounds, by_rows, op, p, q):  # pragma: no cover - compiled
    """`_share` for each share bounds[t]..bounds[t + 1], one a team thread."""
    for t in prange(bounds.size - 1):
        _share(address, a, w, ldw, y, c, z, bounds[t], bounds[t + 1], by_rows, op, p, q)


def _bounds(m: int, n: int, k: int, threads: int) -> tuple[np.ndarray, bool]:
    """The shares (as bounds) and whether they are rows of A, for an (m, k) @ (k, n) product on ``threads``."""
    if threads < 2 or m * n * k < SPLIT_MACS:
        return np.array([0, n], np.int64), False
    if m <= ROWS:
        blocks = -(-n // COLUMN_BLOCK)
        return np.array([min(n, blocks * t // threads * COLUMN_BLOCK) for t in range(threads + 1)], np.int64), False
    return np.array([m * t // threads for t in range(threads + 1)], np.int64), True


def _product(w: np.ndarray, transposed: bool, c: np.ndarray) -> Any:
    """The run callable for y = a @ B (+ c) with B held as ``w`` ((N, K) when ``transposed``)."""
    address = team.gemm_address()
    n = w.shape[0] if transposed else w.shape[1]
    ldw = -w.shape[1] if transposed else n
    shares: dict[tuple[int, int], tuple[np.ndarray, bool]] = {}
    globals()["gemm"] = team.install()  # before the first compile: compiled code looks the name up here
    _share(address, readonly(np.zeros((1, w.shape[1] if transposed else w.shape[0]), np.float32)), w, ldw,
           np.zeros((1, n), np.float32), c, NOTHING, 0, n, False, NONE, np.float32(0), np.float32(0))  # compile now

    def run(a, b=None, c_in=None, *, out=None, epilogue=None):
        k = a.shape[-1]
        y = out if out is not None else np.empty(a.shape[:-1] + (n,), np.float32)
        a2, y2 = readonly(np.ascontiguousarray(a)).reshape(-1, k), y.reshape(-1, n)
        fused = team.PLAIN if epilogue is None else team.native(epilogue)
        if fused is not None and not team.fits(fused[3], y.shape):
            fused = None  # the epilogue as it is given, once the product (and C) is done
        op, p, q, z = team.PLAIN if fused is None else fused
        zf = NOTHING if z is None else readonly(z.reshape(-1))
        size = team.size() if a2.shape[0] * n * k >= SPLIT_MACS else 1
        if size < 2:
            _share(address, a2, w, ldw, y2, c, zf, 0, n, False, op, p, q)
        else:
            key = (a2.shape[0], size)
            if key not in shares:
                shares[key] = _bounds(a2.shape[0], n, k, size)
            bounds, by_rows = shares[key]
            _on_team(address, a2, w, ldw, y2, c, zf, bounds, by_rows, op, p, q)
        if fused is None:
            epilogue(y, (slice(None),) * y.ndim)
        return y

    return run


def _constant_b(ctx: Any) -> np.ndarray | None:
    """Input 1 when it is a constant 2-D float32 matrix."""
    b = ctx.constants[1] if len(ctx.constants) > 1 else None
    return b if b is not None and b.ndim == 2 and b.dtype == np.float32 else None


def _applies_matmul(ctx: Any, attrs: dict[str, Any]) -> bool:
    """A float32 A of known rank >= 2 times a constant 2-D float32 B, with numpy's BLAS reachable."""
    t = input_type(ctx)
    return (t is not None and t.dtype == F32 and t.rank is not None and t.rank >= 2
            and _constant_b(ctx) is not None and team.gemm_address() != 0)


def _c_vector(ctx: Any, n: int, beta: float) -> np.ndarray | None:
    """Gemm's C as one value a column (beta applied as numpy's kernel applies it), NOTHING when absent, None when
    C is not a constant of shape (), (1,), (N,) or (1, N)."""
    c = ctx.constants[2] if len(ctx.constants) > 2 else None
    absent = len(ctx.input_types) < 3 or ctx.input_types[2] is None
    if c is None:
        return NOTHING if absent or beta == 0 else None
    if c.dtype != np.float32 or c.shape not in ((), (1,), (n,), (1, n)):
        return None
    scaled = c if beta == 1.0 else c * np.asarray(beta, np.float32)
    return readonly(np.ascontiguousarray(np.broadcast_to(scaled.reshape(-1), (n,)), np.float32))


def _applies_gemm(ctx: Any, attrs: dict[str, Any]) -> bool:
    """Gemm of a float32 A not transposed, a constant 2-D float32 B and C absent or one value a column."""
    b = _constant_b(ctx)
    if b is None or not is_float32(ctx, 0, rank=2) or int(attrs.get("transA", 0)) or not team.gemm_address():
        return False
    n = b.shape[0] if int(attrs.get("transB", 0)) else b.shape[1]
    return _c_vector(ctx, n, float(attrs.get("beta", 1.0))) is not None


@kernel("MatMul", since=1, priority=PRIORITY, prepare=True, out=True, views=False, packed=(1,), epilogue=True,
        applies=_applies_matmul)
def matmul(ctx):
    """MatMul-1 of a constant 2-D B: one GEMM over A's merged rows, shared over a native team."""
    return _product(readonly(np.ascontiguousarray(_constant_b(ctx))), False, NOTHING)


@kernel("Gemm", since=7, priority=PRIORITY, prepare=True, out=True, views=False, packed=(1, 2), epilogue=True,
        applies=_applies_gemm)
def gemm_7(ctx, *, alpha=1.0, beta=1.0, transA=0, transB=0):  # noqa: N803 - ONNX attribute names
    """Gemm-7 with a constant B (alpha folded into it once, as numpy's kernel does) and C one value a column."""
    b = _constant_b(ctx)
    w = b if alpha == 1.0 else b * np.asarray(alpha, np.float32)
    n = b.shape[0] if transB else b.shape[1]
    return _product(readonly(np.ascontiguousarray(w)), bool(transB), _c_vector(ctx, n, beta))
