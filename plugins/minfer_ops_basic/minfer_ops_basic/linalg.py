"""Kernels: MatMul, Gemm, Einsum, Det, MatMulInteger, QLinearMatMul.

MatMul and Gemm split a large product over the session's intra-op threads
(numpy's BLAS runs one thread per call during a run): by independent matrices
of a batch, by rows when A is the larger operand, else by columns, each part
written straight into its slice of the output. Constant weights are held as
given whenever BLAS can read them in place (Gemm's ``transB`` weight as a
transposed view), so the process holds each weight once, with no packing copy.
(Measured with 2 threads: B^T read in place is ~8% faster than a packed
copy at one row, ~12% slower at 8 rows; the copy cost vgg19 392 MB of build
peak.)
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from minfer_core import intra_op_threads, kernel, parallel_for, scratch, spmd

from . import streaming
from .elementwise import arr, into, is_exotic

Region = tuple[slice, ...]
Finish = Callable[[Region], None]

# K*N*(M + 8) estimates a product's cost: M*K*N multiply-adds, plus streaming the K*N operand, which
# dominates when M is small (measured on one core: 1x4096x4096 ~2 ms, 128x256x1024 ~0.6 ms, so 1 << 24
# is ~250 us). A 2-way hand-over measured ~50 us round trip here, so smaller products run whole.
SPLIT_WORK = 1 << 24
COLUMN_BLOCK = 16  # column splits fall on whole BLAS micro-tiles


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


def _held(value: np.ndarray) -> np.ndarray:
    """A constant as BLAS reads it: the array itself when it already can (aligned, strided by rows or
    columns, a BLAS dtype), else our own C-contiguous copy. Holding the original costs nothing: once every
    reader packed it the engine drops its own reference (packed=), so the weight stays in memory once."""
    w = _blas(value)
    if w is value and w.flags.aligned and (w.flags.c_contiguous or w.flags.f_contiguous):
        return w
    return np.array(w, order="C", copy=True)


# --- splitting a product over threads ------------------------------------------


def _split_axis(shape: tuple[int, ...], k: int, shared_b: bool) -> tuple[int, int] | None:
    """(the output axis to split a product of output ``shape`` along, into how many parts), or None to
    compute it whole.

    With one B for every row (``shared_b``) the product is one GEMM: split its rows (the first
    non-unit axis before the last) when A is the larger operand, else B's columns. With a batch
    of B's, split the batch; a single matrix splits rows or columns likewise. A few rows
    against a large B (a fully-connected layer: streaming B is the work) are cut finer than
    one part per thread, which balances the threads when another process takes a core for a
    while (measured: 8x25088 @ 25088x4096 in 8 parts 20.8 ms, in 2 parts 23.8); more rows
    are not, since every column part packs all of A again.
    """
    *batch, m, n = shape
    threads = intra_op_threads()
    work = math.prod(batch) * k * n * (m + 8)
    if threads < 2 or work < SPLIT_WORK:
        return None
    rows = math.prod(batch) * m if shared_b else m
    parts = threads * (4 if rows <= 32 and work >= 8 * SPLIT_WORK else 1)
    if not shared_b:
        big = [ax for ax, size in enumerate(batch) if size > 1]
        if big:
            return big[0], parts
    if rows <= n:
        return len(shape) - 1, parts
    return next(ax for ax, size in enumerate(shape[:-1]) if size > 1), parts


def _parts(y: np.ndarray, split: tuple[int, int], part: Callable[[int, int], None]) -> None:
    """part(lo, hi) over disjoint ranges of y's split axis (whole column blocks for the last axis)."""
    axis, parts = split
    size = y.shape[axis]
    step = COLUMN_BLOCK if axis == y.ndim - 1 else 1
    parallel_for(-(-size // step), lambda lo, hi: part(lo * step, min(hi * step, size)), parts=parts,
                 outputs_only=True)


def _alone(fn: Callable[[], Any]) -> None:
    """fn() as a single range that writes only the output: in a process team one process computes it
    (the `spmd` contract: a shared step writes its output only inside such ranges)."""
    parallel_for(1, lambda lo, hi: fn(), parts=1, outputs_only=True)


def _region(axis: int, lo: int, hi: int) -> Region:
    return (slice(None),) * axis + (slice(lo, hi),)


def product_into(y: np.ndarray, a: np.ndarray, b: np.ndarray, finish: Finish | None = None) -> np.ndarray:
    """y = a @ b (numpy matmul of operands of rank >= 2, y their broadcast product in their dtype), split
    over the intra-op threads when large; ``finish(region)`` runs on each finished part of y."""
    whole = (slice(None),) * y.ndim
    shared_b = b.ndim == 2
    split = _split_axis(y.shape, a.shape[-1], shared_b)
    if shared_b and (a.ndim == 2 or (a.flags.c_contiguous and y.flags.c_contiguous)):
        _gemm_into(y, a, b, split, finish)  # all rows of a against one B: one GEMM, split by rows or columns
        return y
    if split is None:

        def whole_product() -> None:
            np.matmul(a, b, out=y)
            if finish is not None:
                finish(whole)

        _alone(whole_product)
        return y
    big_a = np.broadcast_to(a, y.shape[:-2] + a.shape[-2:])
    big_b = np.broadcast_to(b, y.shape[:-2] + b.shape[-2:])
    last, axis = y.ndim - 1, split[0]

    def part(lo: int, hi: int) -> None:
        region = _region(axis, lo, hi)
        np.matmul(big_a if axis == last else big_a[region], big_b if axis == last - 1 else big_b[region],
                  out=y[region])
        if finish is not None:
            finish(region)

    _parts(y, split, part)
    return y


def _gemm_into(y: np.ndarray, a: np.ndarray, b: np.ndarray, split: tuple[int, int] | None,
               finish: Finish | None) -> None:
    """y = a @ b for a 2-D b, with a's (and y's) leading axes merged into the rows of one GEMM."""
    a2, y2 = a.reshape(-1, a.shape[-1]), y.reshape(-1, y.shape[-1])
    if split is None and streaming.applies(a2, b):
        split = streaming.split(y, a2, b, y2, _parts)
    if split is None:

        def whole_gemm() -> None:
            streaming.product(a2, b, y2)
            if finish is not None:
                finish((slice(None),) * y.ndim)

        _alone(whole_gemm)
        return
    axis = split[0]
    inner = math.prod(y.shape[axis + 1 : -1]) if axis < y.ndim - 1 else 1

    def part(lo: int, hi: int) -> None:
        if axis == y.ndim - 1:
            streaming.product(a2, b[:, lo:hi], y2[:, lo:hi])
        else:  # rows lo*inner .. hi*inner of the merged GEMM are y[..., lo:hi, ...] along axis
            np.matmul(a2[lo * inner : hi * inner], b, out=y2[lo * inner : hi * inner])
        if finish is not None:
            finish(_region(axis, lo, hi))

    _parts(y, split, part)


# --- MatMul ------------------------------------------------------------------


def _matmul_into(a: np.ndarray, b: np.ndarray, out: np.ndarray | None, epilogue: Any) -> np.ndarray:
    """a @ b into out (or a new array), split over threads when large; epilogue(y, region) per finished part."""
    if a.ndim < 2 or b.ndim < 2 or _blas(a) is not a or _blas(b) is not b or a.dtype != b.dtype:
        done: list[np.ndarray] = []

        def whole() -> None:  # vectors, and dtypes BLAS computes in float32: whole, as before
            y = matmul(a, b, out)
            if epilogue is not None:
                epilogue(y, (slice(None),) * y.ndim)
            done.append(y)

        _alone(whole)
        return done[0] if done else out  # type: ignore[return-value]  # (the other process of a team: out)
    if out is None:
        batch = np.broadcast_shapes(a.shape[:-2], b.shape[:-2])
        out = np.empty(batch + (a.shape[-2], b.shape[-1]), dtype=a.dtype)
    y = out
    return product_into(y, a, b, None if epilogue is None else lambda region: epilogue(y, region))


@kernel("MatMul", since=1, prepare=True, out=True, views=False, packed=(1,), epilogue=True)
def matmul_1(ctx):
    """MatMul-1: numpy-style matrix product with batch broadcasting, split over threads when large."""
    b_const = ctx.constants[1] if len(ctx.constants) > 1 else None
    w = None if b_const is None else _held(b_const)  # the callable closes over w only, never ctx

    def run(a, b=None, *, out=None, epilogue=None):
        return _matmul_into(a, w if w is not None else b, out, epilogue)

    return spmd(run)  # writes out only in ranges (`_parts`, `_alone`)


# --- Gemm --------------------------------------------------------------------


def _scaled(value: np.ndarray, factor: float) -> np.ndarray:
    """value * factor in value's dtype, skipping the pass when factor is 1."""
    if factor == 1.0:
        return value
    return value * np.asarray(factor, dtype=value.dtype)


def _gemm(ctx: Any, alpha: float, beta: float, trans_a: int, trans_b: int) -> Callable[..., np.ndarray]:
    """Y = alpha * A' @ B' + beta * C, with a constant B (and C) scaled once and read in place."""
    b_const = ctx.constants[1] if len(ctx.constants) > 1 else None
    c_const = ctx.constants[2] if len(ctx.constants) > 2 else None
    # packed=(1, 2): run never reads the inputs given for these, and closes over neither them nor ctx
    w = None if b_const is None else _held(_scaled(_blas(b_const), alpha))
    w = w.T if w is not None and trans_b else w  # a transposed view: BLAS reads B' in B's own layout
    c_held = None if c_const is None else _held(_scaled(_blas(c_const), beta))

    def run(a, b, c=None, *, out=None, epilogue=None):
        if w is not None:
            bp, scale = w, 1.0
        else:
            bp, scale = (b.T if trans_b else b), alpha
        cc = c_held if c_const is not None else (None if c is None or beta == 0 else _scaled(_blas(c), beta))
        return _gemm_run(a.T if trans_a else a, bp, scale, cc, out, epilogue)

    return spmd(run)  # writes out only in ranges (`_parts`, `_alone`)


def _gemm_run(a: np.ndarray, b: np.ndarray, scale: float, c: np.ndarray | None, out: np.ndarray | None,
              epilogue: Any) -> np.ndarray:
    """scale * a @ b + c (c broadcast to the product) into out, in parts over threads when large."""
    if _blas(a) is not a or _blas(b) is not b or a.dtype != b.dtype:
        done: list[np.ndarray] = []

        def whole() -> None:
            y = np.matmul(_blas(a), _blas(b))  # half floats: computed in float32, rounded once at the end
            if scale != 1.0:
                y *= np.asarray(scale, y.dtype)
            if c is not None:
                y += _blas(c)
            y = into(out, arr(y, a.dtype))
            if epilogue is not None:
                epilogue(y, (slice(None), slice(None)))
            done.append(y)

        _alone(whole)
        return done[0] if done else out  # type: ignore[return-value]  # (the other process of a team: out)
    y = out if out is not None else np.empty((a.shape[0], b.shape[1]), dtype=a.dtype)
    factor = np.asarray(scale, y.dtype)
    full_c = None if c is None else np.broadcast_to(c, y.shape)

    def finish(region: Region) -> None:
        part = y[region]
        if scale != 1.0:
            np.multiply(part, factor, out=part)
        if full_c is not None:
            np.add(part, full_c[region], out=part)
        if epilogue is not None:
            epilogue(y, region)

    plain = scale == 1.0 and c is None and epilogue is None
    return product_into(y, a, b, None if plain else finish)


@kernel("Gemm", since=7, prepare=True, out=True, views=False, packed=(1, 2), epilogue=True)
def gemm(ctx, *, alpha=1.0, beta=1.0, transA=0, transB=0):
    """Gemm-7: alpha * A' @ B' + beta * C, C broadcast to (M, N) and optional from 11."""
    return _gemm(ctx, alpha, beta, transA, transB)


@kernel("Gemm", since=1, prepare=True, out=True, views=False, packed=(1, 2), epilogue=True)
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


def _exact_product(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """a @ b of float64 operands (numpy matmul semantics), split over threads when large."""
    if a.ndim < 2 or b.ndim < 2:
        return np.matmul(a, b)
    shape = np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])
    if a.shape[-1] != b.shape[-2]:
        return np.matmul(a, b)  # numpy's own error message
    return product_into(np.empty(shape, np.float64), a, b)


def _exact_product_f32(a: np.ndarray, b: np.ndarray, a_zp: np.ndarray | None, b_zp: np.ndarray | None) -> np.ndarray:
    """(a - a_zp) @ (b - b_zp) for (..., K) 8-bit a and (K, N) 8-bit b with scalar zero points, exact, as float64.

    Each float32 GEMM sums at most ``chunk`` products of integers below 256 in magnitude: every partial sum
    is then below 2**24, exact in float32 whatever the order (sgemm, half float64's bytes); chunks add in float64.
    """
    a2 = a.reshape(-1, a.shape[-1]).astype(np.float32)
    a2 -= np.float32(0 if a_zp is None else a_zp)
    b2 = b.astype(np.float32)
    b2 -= np.float32(0 if b_zp is None else b_zp)
    chunk = max(1, (2**24 - 1) // (255 * 255))
    acc = np.zeros((a2.shape[0], b2.shape[1]), np.float64)
    for k0 in range(0, b2.shape[0], chunk):
        acc += a2[:, k0 : k0 + chunk] @ b2[k0 : k0 + chunk]
    return acc.reshape(a.shape[:-1] + (b.shape[1],))


@kernel("MatMulInteger", since=10, prepare=True, out=True, views=False, packed=(1, 3))
def matmul_integer(ctx):
    """MatMulInteger-10: (A - a_zp) @ (B - b_zp) accumulated exactly, as int32."""
    held = _HeldB.of(ctx, 1, 3)
    # a constant zero point is packed even when B is computed: the engine passes None for it then, so keep it here
    zp_held = _constant(ctx, 3)
    del ctx  # packed=(1, 3): the closure must not keep the originals alive through ctx.constants

    def run(a, b=None, a_zero_point=None, b_zero_point=None, *, out=None):
        acc = held.product(a, a_zero_point) if held is not None and b_zero_point is None else None
        if acc is None:
            if held is not None:  # B packed: the engine passes None for it (and for its zero point when constant)
                b = held.b
            b_zero_point = zp_held if b_zero_point is None else b_zero_point
            acc = np.rint(_integer_product(a, b, a_zero_point, b_zero_point))
        if out is None:
            return arr(acc, np.int32)  # exact integers in range
        np.copyto(out, acc, casting="unsafe")  # into the planned buffer: no fresh pages to fault in
        return out

    return run


EXACT_F32 = 2**24  # float32 holds every integer below this exactly


def _constant(ctx: Any, index: int) -> np.ndarray | None:
    """Input ``index`` when it is a constant, else None."""
    consts = tuple(ctx.constants)
    return consts[index] if index < len(consts) else None


class _HeldB:
    """A constant 2-D 8-bit B of MatMulInteger/QLinearMatMul and its zero point, held as given (8-bit).

    ``l1``: the largest column L1 norm of B - b_zp. Every partial sum of an output's products is at most
    max|A - a_zp| * l1; below 2**24 one float32 GEMM (any order of summation) gives the exact integers, half the
    bytes and none of the float64 chunks that the worst-case bound (|A|, |B| up to 255) needs from K = 259 on.
    """

    def __init__(self, b: np.ndarray, b_zp: np.ndarray | None) -> None:
        self.b, self.b_zp = b, b_zp
        self.zp = np.float32(0 if b_zp is None else np.asarray(b_zp).reshape(-1)[0])
        self.l1 = np.inf  # a B of another rank or a per-column zero point: always the general product
        if b.ndim == 2 and (b_zp is None or b_zp.size == 1):
            self.l1 = float(np.abs(b.astype(np.float32) - self.zp).sum(axis=0, dtype=np.float64).max(initial=0.0))

    @classmethod
    def of(cls, ctx: Any, b_index: int, zp_index: int) -> _HeldB | None:
        """The held B when it is a constant (the engine then passes None for it: packed), with its zero point when
        that is one (a zero point computed at run is passed to run: see its use)."""
        consts = tuple(ctx.constants) + (None,) * (zp_index + 1)
        return None if consts[b_index] is None else cls(consts[b_index], consts[zp_index])

    def product(self, a: np.ndarray, a_zp: np.ndarray | None, out: np.ndarray | None = None,
                finish: Finish | None = None) -> np.ndarray | None:
        """(A - a_zp) @ (B - b_zp) as float32 when one float32 GEMM is exact for this A, else None (``out`` and
        ``finish``: see `centered_product`)."""
        if self.l1 == np.inf or a.ndim < 2 or (a_zp is not None and np.asarray(a_zp).size != 1) or not a.size:
            return None
        if a.shape[-1] != self.b.shape[0]:
            return None
        z = np.float32(0 if a_zp is None else np.asarray(a_zp).reshape(-1)[0])
        am = scratch("minfer_ops_basic-int-a", (a.size // a.shape[-1], a.shape[-1]), np.float32)
        np.subtract(a.reshape(am.shape), z, out=am, dtype=np.float32)  # converted and centered in one pass: exact
        # an 8-bit A's range bounds |A - a_zp|: the two passes finding its extremes only when that bound is too wide
        widest = None
        if a.dtype.kind in "iu" and a.dtype.itemsize == 1:
            info = np.iinfo(a.dtype)
            widest = max(abs(float(info.min) - float(z)), abs(float(info.max) - float(z)))
            widest = widest if widest * self.l1 < EXACT_F32 else None
        return self.centered_product(am, a.shape[:-1], out, finish, widest)

    def centered_product(self, am: np.ndarray, lead: tuple[int, ...], out: np.ndarray | None = None,
                         finish: Finish | None = None, widest: float | None = None) -> np.ndarray | None:
        """(A - a_zp) @ (B - b_zp) as float32 from the 2-D float32 A - a_zp ``am`` (rows ``lead``) when one float32
        GEMM is exact for it, else None (ScaledMatMulInteger quantizes A straight into such an array, and has the
        product written into its C-contiguous float32 ``out``, ``finish`` run on each finished part; ``widest``: a
        bound of max|am| known without reading am (a clip's bounds, an 8-bit type's range), saving two passes)."""
        if self.l1 == np.inf or am.shape[-1] != self.b.shape[0]:
            return None
        if widest is None:
            widest = max(float(am.max(initial=0.0)), -float(am.min(initial=0.0)))
        if widest * self.l1 >= EXACT_F32:
            return None
        bf = scratch("minfer_ops_basic-int-b", self.b.shape, np.float32)
        np.copyto(bf, self.b, casting="unsafe")
        if self.zp:
            np.subtract(bf, self.zp, out=bf)
        # the product in scratch too: every caller converts it into its own output at once
        shape = (am.shape[0], bf.shape[1])
        y = scratch("minfer_ops_basic-int-y", shape, np.float32) if out is None else out.reshape(shape)
        return product_into(y, am, bf, finish).reshape(lead + (bf.shape[1],))


def _integer_product(a: np.ndarray, b: np.ndarray, a_zp: np.ndarray | None, b_zp: np.ndarray | None) -> np.ndarray:
    """(A - a_zp) @ (B - b_zp) of 8-bit operands, exact, as float64: by float32 GEMMs for a 2-D B and scalar zero
    points, else in float64 (which holds every int8*int8 partial sum exactly for K < 2**37, at BLAS speed)."""
    if a.ndim >= 2 and b.ndim == 2 and (a_zp is None or a_zp.size == 1) and (b_zp is None or b_zp.size == 1):
        return _exact_product_f32(a, b, a_zp, b_zp)
    return _exact_product(_centered(a, a_zp, True), _centered(b, b_zp, False))


@kernel("QLinearMatMul", since=10, prepare=True, out=True, views=False, packed=(3, 5))
def qlinear_matmul(ctx):
    """QLinearMatMul-10: exact integer product of the centered operands, rescaled once, rounded, saturated."""
    held = _HeldB.of(ctx, 3, 5)
    # a constant zero point is packed even when B is computed: the engine passes None for it then, so keep it here
    zp_held = _constant(ctx, 5)
    del ctx  # packed=(3, 5): the closure must not keep the originals alive through ctx.constants

    def run(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, *, out=None):
        acc = held.product(a, a_zero_point) if held is not None and b_zero_point is None else None
        if acc is None:
            if held is not None:  # B packed: the engine passes None for it (and for its zero point when constant)
                b = held.b
            b_zero_point = zp_held if b_zero_point is None else b_zero_point
            acc = _integer_product(a, b, a_zero_point, b_zero_point)
        return _requantized(acc, a, a_scale, b_scale, y_scale, y_zero_point, out)

    return run


def _requantized(acc: np.ndarray, a: np.ndarray, a_scale, b_scale, y_scale, y_zero_point,
                 out: np.ndarray | None = None) -> np.ndarray:
    """QLinearMatMul's output from the exact integer product ``acc``: rescaled in float64, rounded, saturated (into
    ``out`` when given)."""
    sa = np.asarray(a_scale, dtype=np.float64)
    sa = sa.reshape(-1, 1) if sa.ndim == 1 else sa  # a 1-D a_scale is per row
    factor = sa * np.asarray(b_scale, dtype=np.float64) / np.asarray(y_scale, dtype=np.float64)
    shape = np.broadcast_shapes(acc.shape, factor.shape)
    # in place in one float64 buffer of this thread's scratch: the same steps as whole-array expressions, without
    # their four allocations (each of fresh pages the kernel must fault in and zero: ~1 MB for an FFN layer)
    y = np.multiply(acc, factor, out=scratch("minfer_ops_basic-requantized", shape, np.float64), dtype=np.float64)
    target = a.dtype if y_zero_point is None else y_zero_point.dtype
    if y_zero_point is not None:
        y += y_zero_point.astype(np.float64)
    info = np.iinfo(target)
    np.rint(y, out=y)
    np.clip(y, info.min, info.max, out=y)
    if out is None or out.shape != y.shape:
        return y.astype(target)
    np.copyto(out, y, casting="unsafe")  # integers in range: exact
    return out


