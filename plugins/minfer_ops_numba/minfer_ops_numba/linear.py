"""MatMul and Gemm of a constant float32 B on a native team: blocks of B's columns (or A's rows) over numba's threads.

minfer-ops-basic's kernels split a large product over minfer's pool, and a classifier head's few rows against a
large B by a timed choice (its streaming.py); both hand over in ~60 us here, and once a native team has claimed
a run's threads (team.py) their `parallel_for` runs serially. Here the product is cut into blocks from its shape
alone (`plan`): up to 32 rows, blocks of B's columns (each thread streams its share of a head's weights), more
rows, blocks of A's rows. Each block is one ``cblas_sgemm`` call (`team.gemm`) then its epilogue in compiled
code: Gemm's C (one value a column), the fused op's residual and activation (`team.native`), in numpy's order.
A team's threads take contiguous runs of blocks; without a team (one thread, claims refused, a process team,
MINFER_NUMBA_TEAM=0) the same blocks go through `parallel_for`. The same BLAS calls whatever the threads, so the
same bits; against numpy's kernel, which makes other calls, the last bits may differ where OpenBLAS picks another
micro-kernel for another call shape (tests/plugins/test_team.py). Where B is not transposed and pointwise.py's
AVX-512 micro-kernel builds, each block is its tiles instead of a BLAS call (`_tiled`; B read `TILED_DEPTH` rows
at a time, and past that depth only for more than ROWS rows of A: `_tiles`): OpenBLAS packs both operands at each
call and ran the transformer block's products at 45-58 GMAC/s a thread, 68 on two; the micro-kernel 55-58 and
108-114 (onnxruntime's MLAS 56 and 105). Its sums are each output's K products in order: the same bits on any
thread count, numpy's within float32 rounding.

A MatMul of two run-time operands with the same batch dims (attention's Q @ K^T and its weights @ V) is one
``cblas_sgemm`` call a matrix (`products_of`; K^T as cblas' transposed B, read in K's own layout), the matrices
over a native team (`batched_matmul`): numpy's matmul ran them one after another once a team had claimed the
threads. The transformer block's two attention products (4 heads of 128x64 @ 64x128, then 128x128 @ 128x64)
138-144 -> 95 us and 100 -> 65, the block 2.0 -> 1.7 ms (two threads, per-step timing in one process).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minfer_core import kernel, parallel_for, spmd

from . import pointwise, team
from ._jit import F32, PRIORITY, input_type, is_float32, jit, readonly, uintp  # noqa: F401 (uintp: numba's type at compile)
from .activation import _value  # noqa: F401 (compiled code calls it)
from .gelu import gelu_value  # noqa: F401 (compiled code calls it)
from .pointwise import W, column_tiles  # noqa: F401 (compiled code calls column_tiles)
from .team import NONE, NOTHING, _activate, prange  # noqa: F401 (_activate: compiled code calls it)

SPLIT_MACS = 1 << 17  # below this many multiply-adds (a few microseconds) one thread computes the product
BLOCK_MACS = 1 << 18  # a block's least work when a product is cut (a team thread takes whole runs of blocks)
MAX_BLOCKS = 8
COLUMN_BLOCK = 16  # column shares fall on whole BLAS micro-tiles, as minfer-ops-basic's
ROWS = 32  # at most this many rows: B's columns are shared (every row share would stream all of B)
# OpenBLAS (0.3.31, SkylakeX) computes a product of at most ~5 * 10**5 multiply-adds with its small-matrix kernel,
# larger ones by packing B first: for a few rows against a large B the packing is most of the time (1x1280 @
# 1280x1000: 553 us in one call, 56 in calls of 256 columns, numpy's gemv 50; 8x2048 @ 2048x1000 B transposed
# 1033 -> 260 us, B as given 391 -> 224), so few-row shares are cut so, in calls of 32 columns or more
SMALL_CALL = 1 << 19
# a block of A's rows repacks all of B in its BLAS call, a block of B's columns all of A: thin blocks pack more than
# they multiply (the transformer block's 128x256 @ 256x1024, one thread: 8 blocks of 16 rows 597 us, 2 of 64 257,
# one call 216), so blocks of rows are 64 or more, of columns (past ROWS rows) 128 or more, and the product is cut
# along the longer side, which repacks the smaller operand (the block at b1, 2 threads: 0.93 -> 0.83 ms a run)
MIN_ROWS, MIN_COLUMNS = 64, 128
GELU = 100  # `_blocks`' op for minfer-passes' ai.minfer::Gelu (activation.py's ops are 0-3)
FUSED = "FusedMatMulBias"  # minfer-passes' ai.minfer op: MatMul by a constant, + bias, [+ residual], [activation]
# B (K, N) not transposed: the product by pointwise.py's micro-kernel instead of BLAS (`_tiled`, where it can be
# built; 0: never), B's rows this many at a time. Each tile re-reads its part of B's K x W panel (K * 256 bytes)
# from L2, where it stays up to here. OpenBLAS packs both operands at each call and scaled poorly on two threads:
# the transformer block's 128x256 @ 256x1024 took 752 us on one thread, 491 on two (44.6 and 68.4 GMAC/s), the
# micro-kernel 608 and 311 (55.1 and 108; onnxruntime's MLAS 595 and 319); 128x1024 @ 1024x256 582 and 294 (57.7,
# 114)
TILED_DEPTH = 1024


@jit
def _write_out(yf, n, c, z, r0, r1, c0, c1, op, p, q):  # pragma: no cover - compiled
    """Block (r0, r1, c0, c1) of y (flat, n columns) after its product: + c (a column's value, when c has elements),
    + z (the residual, flat like y, when it has elements), then the activation ``op``, in numpy's order."""
    has_c, has_z, act, gelu = c.size > 0, z.size > 0, op != NONE and op != GELU, op == GELU
    for r in range(r0, r1):  # each step its own loop over the row's block (in cache), as team.finish's
        at = r * n
        if has_c or has_z:
            for j in range(c0, c1):
                v = yf[uintp(at + j)]
                if has_c:
                    v = v + c[uintp(j)]
                if has_z:
                    v = v + z[uintp(at + j)]
                yf[uintp(at + j)] = v
        if act:
            _activate(yf, at + c0, at + c1, op, p, q)
        elif gelu:  # the Gelu kernel's formula (its bits)
            for j in range(at + c0, at + c1):
                yf[uintp(j)] = gelu_value(yf[uintp(j)])


@jit
def _blocks(address, a, w, ldw, yf, n, c, z, blocks, lo, hi, op, p, q):  # pragma: no cover - compiled
    """For blocks lo..hi, each (r0, r1, c0, c1): y[r0:r1, c0:c1] = a[r0:r1] @ B[:, c0:c1] in one BLAS call, then
    `_write_out`. B is ``w`` (K, N), or (N, K) read transposed when ``ldw`` < 0 (cblas' transB)."""
    k = a.shape[1]  # y flat, n columns: a reshape here left GELU's write-out unvectorized (its table read)
    a0, w0, y0 = np.int64(a.ctypes.data), np.int64(w.ctypes.data), np.int64(yf.ctypes.data)
    for b in range(lo, hi):
        r0, r1, c0, c1 = blocks[b, 0], blocks[b, 1], blocks[b, 2], blocks[b, 3]
        gemm(address, r1 - r0, c1 - c0, k, a0 + 4 * r0 * k, k, w0 + 4 * c0 * (k if ldw < 0 else 1), ldw,
             y0 + 4 * (r0 * n + c0), n, np.float32(0))
        _write_out(yf, n, c, z, r0, r1, c0, c1, op, p, q)


@jit
def _tiled(a, w, yf, n, c, z, blocks, lo, hi, op, p, q, depth):  # pragma: no cover - compiled
    """`_blocks` by pointwise.py's micro-kernel instead of BLAS, B ``w`` (K, N) as it lies: per block, for each W
    of its columns the tiles of A's rows (`column_tiles`: their values broadcast) on B's panel, ``depth`` rows of
    it at a time (K x W floats stay in L2 up to TILED_DEPTH rows; each later part adds to the tile: the same sums),
    each output's K products added in order by fused multiply-adds; then `_write_out`."""
    k = a.shape[1]
    a0, w0, y0 = np.int64(a.ctypes.data), np.int64(w.ctypes.data), np.int64(yf.ctypes.data)
    for b in range(lo, hi):
        r0, r1, c0, c1 = blocks[b, 0], blocks[b, 1], blocks[b, 2], blocks[b, 3]
        for n0 in range(c0, c1, W):
            for k0 in range(0, k, depth):
                column_tiles(a0 + np.int64(4 * (r0 * k + k0)), np.int64(4 * k), np.int64(min(depth, k - k0)),
                             np.int64(r1 - r0), w0 + np.int64(4 * (k0 * n + n0)), np.int64(4 * n),
                             y0 + np.int64(4 * (r0 * n + n0)), np.int64(4 * n), np.int64(min(W, c1 - n0)), k0 > 0)
        _write_out(yf, n, c, z, r0, r1, c0, c1, op, p, q)


@jit(parallel=True)
def _on_team(address, a, w, ldw, yf, n, c, z, blocks, parts, op, p, q):  # pragma: no cover - compiled
    """`_blocks` in ``parts`` contiguous runs of blocks, one a team thread."""
    count = blocks.shape[0]
    for t in prange(parts):
        _blocks(address, a, w, ldw, yf, n, c, z, blocks, count * t // parts, count * (t + 1) // parts, op, p, q)


@jit(parallel=True)
def _tiled_team(a, w, yf, n, c, z, blocks, parts, op, p, q, depth):  # pragma: no cover - compiled
    """`_tiled` in ``parts`` contiguous runs of blocks, one a team thread."""
    count = blocks.shape[0]
    for t in prange(parts):
        _tiled(a, w, yf, n, c, z, blocks, count * t // parts, count * (t + 1) // parts, op, p, q, depth)


@jit
def products_of(address, pa, a, pb, b, y, m, k, n, lo, hi):  # pragma: no cover - compiled
    """Matrices lo..hi of a batched product, y[h] = a[h] @ b[h], one BLAS call each (`team.gemm`). ``pa``, ``pb``:
    the operands' addresses; ``a``, ``b``: (leading dimension in elements: negative for a B read transposed, as
    `team.gemm` takes it; then each matrix's offset in bytes, `_operand`); y (batch, m, n) C-contiguous."""
    py = np.int64(y.ctypes.data)
    for h in range(lo, hi):
        gemm(address, m, n, k, pa + a[h + 1], a[0], pb + b[h + 1], b[0], py + np.int64(h * m * n * 4), n,
             np.float32(0))


@jit(parallel=True)
def team_products(address, pa, a, pb, b, y, m, k, n, parts):  # pragma: no cover - compiled
    """`products_of` over a native team: part t of the matrices on team thread t."""
    count = y.shape[0]
    for t in prange(parts):
        products_of(address, pa, a, pb, b, y, m, k, n, count * t // parts, count * (t + 1) // parts)


def plan(m: int, n: int, k: int, column: int = COLUMN_BLOCK) -> np.ndarray:
    """The product's blocks (r0, r1, c0, c1), from its shape alone: any thread count computes the same BLAS
    calls, so the same bits (docs/kernel-contract.md). Up to ROWS rows: B's columns, in calls OpenBLAS takes with
    its small-matrix kernel where those are 32 columns or more; more rows: along the longer side, A's rows (MIN_ROWS
    or more a block) or B's columns (MIN_COLUMNS or more), in two blocks at least. One block below SPLIT_MACS, else
    2 to MAX_BLOCKS of about BLOCK_MACS multiply-adds or more, so that threads have shares to take. Blocks of
    columns are multiples of ``column`` wide (`_tiled`'s W: a narrower panel's lanes are masked, wasted work); a
    product of at most ``column`` columns is cut in rows."""
    work = m * n * k
    count = 1 if work < SPLIT_MACS else max(2, min(MAX_BLOCKS, work // BLOCK_MACS))
    if m > ROWS and (m > n or n <= column):  # along the longer side: a block of rows repacks B, of columns A
        height = -(-m // min(count, max(2, m // MIN_ROWS)))
        return np.array([[r, min(m, r + height), 0, n] for r in range(0, m, height)], np.int64)
    if m > ROWS:
        count = min(count, max(2, n // MIN_COLUMNS))
    width = -(-n // (count * column)) * column
    small = SMALL_CALL // max(1, m * k) // column * column  # (an empty A or B: no rows or depth)
    if small >= 2 * column and m <= ROWS:  # narrower calls lost (8x4096 @ 4096x4096 as given: 3.6x)
        width = min(width, small)
    return np.array([[0, m, c, min(n, c + width)] for c in range(0, n, width)], np.int64)


def _product(held: np.ndarray | None, transposed: bool, c: np.ndarray, shape: tuple[int, int] | None = None,
             act: tuple[int, np.float32, np.float32] | None = None) -> Any:
    """The run callable for y = a @ B (+ c) with B held as ``held`` ((N, K) when ``transposed``), or, when it is
    None, B given with each run, of ``shape`` (`gemm_live`). With ``act`` (op, p, q) the activation is the
    node's own (FusedMatMulBias: its residual is the fourth input), not an epilogue's."""
    address = team.gemm_address()
    shape = held.shape if held is not None else shape
    k, n = (shape[1], shape[0]) if transposed else shape
    ldw = -k if transposed else n
    # the micro-kernel's product as `_tiles` says (not for K = 0: its loop sums at least one row; BLAS writes zeros)
    tiled = TILED_DEPTH > 0 and k > 0 and not transposed and pointwise.available()
    plans: dict[int, tuple[np.ndarray, bool]] = {}
    globals()["gemm"] = team.install()  # before the first compile: compiled code looks the name up here
    if tiled:
        pointwise._ensure_kernels()  # its intrinsics, before _tiled (which calls `_tile`) compiles
    stand_in = held if held is not None else readonly(np.zeros(shape, np.float32))  # not kept: warming only
    warm = (readonly(np.zeros((1, k), np.float32)), stand_in, np.zeros(n, np.float32), n, c, NOTHING,
            plan(1, n, k)[:1])
    rest = (NONE, np.float32(0), np.float32(0))
    if tiled:  # compile (or load) now, not in a run
        _tiled(*warm, 0, 1, *rest, TILED_DEPTH)
        if team.available():
            _tiled_team(*warm, 1, *rest, TILED_DEPTH)
    if not tiled or k > TILED_DEPTH:  # (BLAS's then, for a product of few rows)
        _blocks(address, *warm[:2], ldw, *warm[2:], 0, 1, *rest)
        if team.available():
            _on_team(address, *warm[:2], ldw, *warm[2:], 1, *rest)
    del stand_in, warm

    def blocks_of(a2, w, yf, zf, blocks, lo, hi, op, p, q, micro):
        if micro:
            _tiled(a2, w, yf, n, c, zf, blocks, lo, hi, op, p, q, TILED_DEPTH)
        else:
            _blocks(address, a2, w, ldw, yf, n, c, zf, blocks, lo, hi, op, p, q)

    def run(a, b=None, c_in=None, z_in=None, *, out=None, epilogue=None):
        w = held if held is not None else readonly(np.ascontiguousarray(b, np.float32))
        y = out if out is not None else np.empty(a.shape[:-1] + (n,), np.float32)
        rows = a.size // k if k else math.prod(a.shape[:-1])  # (pixel_conv's a is (N, C, 1, 1): its rows by size)
        a2, yf = readonly(np.ascontiguousarray(a)).reshape(rows, k), y.reshape(-1)
        if act is not None:
            fused = (*act, None if z_in is None else np.ascontiguousarray(z_in))
        else:
            fused = team.PLAIN if epilogue is None else team.native(epilogue)
        if fused is not None and not team.fits(fused[3], y.shape):
            fused = None  # the epilogue as it is given, once the product (and C) is done
        op, p, q, z = team.PLAIN if fused is None else fused
        zf = NOTHING if z is None else readonly(z.reshape(-1))
        m = a2.shape[0]
        if m not in plans:
            micro = tiled and _tiles(m, k)
            plans[m] = plan(m, n, k, W if micro else COLUMN_BLOCK), micro
        blocks, micro = plans[m]
        size = team.size() if len(blocks) > 1 else 1
        if size > 1 and micro:
            _tiled_team(a2, w, yf, n, c, zf, blocks, min(size, len(blocks)), op, p, q, TILED_DEPTH)
        elif size > 1:
            _on_team(address, a2, w, ldw, yf, n, c, zf, blocks, min(size, len(blocks)), op, p, q)
        elif len(blocks) == 1:  # one block (a small product): parallel_for would make it here, after ~0.5 us
            blocks_of(a2, w, yf, zf, blocks, 0, 1, op, p, q, micro)
        else:
            # the same blocks on the pool's threads (claims refused, a process team) or this one
            parallel_for(len(blocks), lambda lo, hi: blocks_of(a2, w, yf, zf, blocks, lo, hi, op, p, q, micro),
                         parts=None if len(blocks) > 1 else 1)
        if fused is None:
            epilogue(y, (slice(None),) * y.ndim)
        return y

    return run


def _tiles(m: int, k: int) -> bool:
    """Whether a product of m rows and depth k takes the micro-kernel (where B's layout lets it): up to TILED_DEPTH
    rows of B always; deeper, in parts of TILED_DEPTH rows, past ROWS rows of A (a few rows against a deep B stream
    it from memory whatever computes them, and OpenBLAS's small-matrix kernel does so as fast)."""
    return k <= TILED_DEPTH or m > ROWS


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


def _applies_gemm_live(ctx: Any, attrs: dict[str, Any]) -> bool:
    """Gemm of a float32 A not transposed, a 2-D float32 B of static shape given with each run (minfer-passes'
    DequantGemm dequantizes its 8-bit weight so), alpha 1 and C absent or one value a column."""
    b = input_type(ctx, 1)
    if _constant_b(ctx) is not None or b is None or b.dtype != F32 or b.shape is None or len(b.shape) != 2:
        return False
    if not b.is_static or not is_float32(ctx, 0, rank=2) or int(attrs.get("transA", 0)) or not team.gemm_address():
        return False
    n = b.shape[0] if int(attrs.get("transB", 0)) else b.shape[1]
    return float(attrs.get("alpha", 1.0)) == 1.0 and _c_vector(ctx, n, float(attrs.get("beta", 1.0))) is not None


def _bias(ctx: Any, n: int) -> np.ndarray | None:
    """FusedMatMulBias's C as one value a column, None unless a float32 constant of N elements along the last axis."""
    c = ctx.constants[2] if len(ctx.constants) > 2 else None
    if c is None or c.dtype != np.float32 or c.ndim < 1 or c.shape[-1] != n or c.size != n:
        return None
    return readonly(np.ascontiguousarray(c.reshape(-1)))


def _activation(name: str, params: Any) -> tuple[int, np.float32, np.float32] | None:
    """FusedMatMulBias's activation as `_blocks`' (op, p, q), None when it has no compiled form here."""
    if name == "Gelu":
        return GELU, np.float32(0), np.float32(0)
    return team.activation_form(name, tuple(float(v) for v in params or ()))


def _applies_fused(ctx: Any, attrs: dict[str, Any]) -> bool:
    """A float32 A times a constant 2-D float32 W, C one value a column, a float32 residual if any, and an
    activation with a compiled form (none, Relu, Clip, LeakyRelu, HardSigmoid, HardSwish, Gelu)."""
    b = _constant_b(ctx)
    z = input_type(ctx, 3) if len(ctx.input_types) > 3 else None
    act = _activation(attrs.get("activation", ""), attrs.get("activation_params"))
    return (_applies_matmul(ctx, attrs) and _bias(ctx, b.shape[1]) is not None and act is not None
            and (len(ctx.input_types) < 4 or (z is not None and z.dtype == F32)))


@kernel(FUSED, domain="ai.minfer", since=1, priority=PRIORITY, prepare=True, out=True, views=False, packed=(1, 2),
        applies=_applies_fused)
def fused_matmul_bias(ctx, *, activation="", activation_params=None):
    """ai.minfer::FusedMatMulBias-1: its bias, residual and activation (GELU too) in each block's compiled
    write-out, while the block is in cache, instead of numpy passes over the whole output after the product."""
    w = readonly(np.ascontiguousarray(_constant_b(ctx)))
    act = _activation(activation, activation_params)
    return _product(w, False, _bias(ctx, w.shape[1]), act=act)


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


@kernel("Gemm", since=7, priority=PRIORITY, prepare=True, out=True, views=False, packed=(2,), epilogue=True,
        applies=_applies_gemm_live)
def gemm_live(ctx, *, alpha=1.0, beta=1.0, transA=0, transB=0):  # noqa: N803 - ONNX attribute names
    """Gemm-7 of a B given with each run (DequantGemm's dequantized weight), alpha 1: the same blocks as `gemm_7`."""
    shape = tuple(input_type(ctx, 1).shape)
    return _product(None, bool(transB), _c_vector(ctx, shape[0] if transB else shape[1], beta), shape)


def _applies_pixel_conv(ctx: Any, attrs: dict[str, Any]) -> bool:
    """A float32 Conv of a 1x1 kernel, group 1 and no pads on a 1x1 map (squeeze-excite's two, a head's): constant
    float32 weights, a constant float32 bias or none, numpy's BLAS reachable. Any stride or dilation: one output."""
    w = ctx.constants[1] if len(ctx.constants) > 1 else None
    t, b = input_type(ctx), ctx.constants[2] if len(ctx.constants) > 2 else None
    if w is None or w.dtype != F32 or w.ndim != 4 or w.shape[2:] != (1, 1) or not is_float32(ctx, 0, rank=4):
        return False
    if t.shape is None or tuple(t.shape[2:]) != (1, 1) or t.shape[1] != w.shape[1] or int(attrs.get("group", 1)) != 1:
        return False
    if any(int(v) for v in attrs.get("pads") or ()) or not team.gemm_address():
        return False
    absent = len(ctx.input_types) < 3 or ctx.input_types[2] is None
    return absent or (b is not None and b.dtype == F32 and b.shape == (w.shape[0],))


# above the conv kernels that also take such a node (smallconv.py's, pointwise.py's, numpy's): the core still times
# them, but this one is the usual best (and MINFER_TUNE=0's)
@kernel("Conv", since=1, priority=PRIORITY + 1, prepare=True, out=True, views=False, packed=(1, 2), epilogue=True,
        applies=_applies_pixel_conv)
def pixel_conv(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv-1/11/22 of a 1x1 kernel on a 1x1 map (see `_applies_pixel_conv`): per image y = x @ W^T (+ b), Gemm's
    blocks of W's rows over a native team with the epilogue in their write-out. The conv kernels took such a
    layer as a conv (smallconv.py's, numpy's GEMM on one thread): 55-130 us a layer in MobileNetV3-large, 2-3x
    onnxruntime's."""
    w = ctx.constants[1]
    b = ctx.constants[2] if len(ctx.constants) > 2 else None
    m = w.shape[0]
    product = _product(readonly(np.ascontiguousarray(w.reshape(m, -1))), True,
                       NOTHING if b is None else readonly(np.ascontiguousarray(b, np.float32)))

    def run(x, w_in=None, b_in=None, *, out=None, epilogue=None):
        y = out if out is not None else np.empty((x.shape[0], m, 1, 1), np.float32)
        return product(x, out=y, epilogue=epilogue)  # x's (N, K, 1, 1) is (N, K), y's (N, M, 1, 1) is (N, M)

    return run


def _applies_batched(ctx: Any, attrs: dict[str, Any]) -> bool:
    """A float32 MatMul of two run-time operands of one rank >= 3 and the same batch dims (attention's QK^T and
    its weights times V), K known, with numpy's BLAS reachable from compiled code; a constant B is `matmul`'s."""
    a, b = input_type(ctx, 0), input_type(ctx, 1)
    if a is None or b is None or a.dtype != F32 or b.dtype != F32 or a.shape is None or b.shape is None:
        return False
    if len(ctx.constants) > 1 and ctx.constants[1] is not None:
        return False
    k = a.shape[-1] if len(a.shape) >= 3 else None
    if len(a.shape) != len(b.shape) or a.shape[:-2] != b.shape[:-2] or not isinstance(k, int) or b.shape[-2] != k:
        return False
    return 0 < k and bool(team.gemm_address())


def _operand(shape: tuple[int, ...], strides: tuple[int, ...], rows: bool) -> np.ndarray | None:
    """[leading dimension in elements (negative when read transposed), then each matrix's offset in bytes] of an
    array of this shape (batch dims, r, c) and strides as cblas reads its matrices (one of their two axes
    unit-stride, whatever the batch axes' strides: attention's heads split by a Transpose are read where they
    lie), int64 for `products_of`; None when neither axis is. ``rows``: an A (never passed transposed)."""
    s1, s2 = strides[-2:]
    if s2 == 4 and s1 % 4 == 0 and s1 >= 4 * shape[-1]:
        ld = s1 // 4
    elif not rows and s1 == 4 and s2 % 4 == 0 and s2 >= 4 * shape[-2]:
        ld = -(s2 // 4)
    else:
        return None
    offsets = np.zeros(1, np.int64)
    for d, stride in zip(shape[:-2], strides[:-2]):  # row-major over the batch dims, as y's matrices lie
        offsets = (offsets[:, None] + np.arange(d, dtype=np.int64) * stride).reshape(-1)
    return readonly(np.concatenate(([ld], offsets)).astype(np.int64))


@kernel("MatMul", since=1, priority=PRIORITY, prepare=True, out=True, views=False, applies=_applies_batched)
def batched_matmul(ctx):
    """MatMul-1 of run-time operands with the same batch dims: one BLAS call a matrix, from compiled code, the
    matrices over a native team (numpy's matmul runs them serially once a team claimed the run's threads)."""
    address = team.gemm_address()
    globals()["gemm"] = team.install()  # before products_of compiles: it looks the name up here
    _warm_products(address)

    layouts: dict[tuple[Any, ...], Any] = {}  # per (shapes, strides): `_operand`'s offsets (the same each run)

    def layout(a: np.ndarray, b: np.ndarray) -> Any:
        key = (a.shape, a.strides, b.shape, b.strides)
        found = layouts.get(key)
        if found is None:
            batch, k = a.shape[:-2], a.shape[-1]
            same = b.shape[:-2] == batch and b.shape[-2] == k and k and a.ndim == b.ndim
            if len(layouts) > 64:  # inputs of ever new shapes (a sequence length that varies) would pile up here
                layouts.clear()
            found = layouts[key] = (_operand(a.shape, a.strides, True), _operand(b.shape, b.strides, False)) \
                if same else (None, None)
        return found

    def run(a, b, *, out=None):
        batch, (m, k), n = a.shape[:-2], a.shape[-2:], b.shape[-1]
        count = int(np.prod(batch))
        ops_a, ops_b = layout(a, b)
        if ops_a is None or ops_b is None:  # not what applies saw, or strides cblas cannot read: numpy's
            return _whole(lambda: np.matmul(a, b, out=out), out)
        y = out if out is not None else np.empty(batch + (m, n), np.float32)
        if y.size == 0:
            return y
        ops = (address, np.int64(a.ctypes.data), ops_a, np.int64(b.ctypes.data), ops_b, y.reshape(count, m, n), m, k,
               n)
        threads = team.size() if count > 1 else 1
        if threads > 1:
            team_products(*ops, min(threads, count))
        else:
            parallel_for(count, lambda lo, hi: products_of(*ops, lo, hi), outputs_only=True)  # y[h] a range's own
        return y  # a and b alive until here: products_of read them by address

    return spmd(run)


def _whole(fn: Any, out: np.ndarray | None) -> Any:
    """fn() in one outputs-only range (under a process team one rank computes it, into ``out``: spmd's promise),
    its result (the other rank's: ``out``)."""
    done: list[Any] = []
    parallel_for(1, lambda lo, hi: done.append(fn()), parts=1, outputs_only=True)
    return done[0] if done else out


def _warm_products(address: int) -> None:
    """`products_of` and its team driver compiled (or loaded) at build with a run's argument types."""
    a, b = np.ones((1, 1, 1), np.float32), np.ones((1, 1, 1), np.float32)
    y = np.zeros((1, 1, 1), np.float32)
    ops = (address, np.int64(a.ctypes.data), _operand(a.shape, a.strides, True), np.int64(b.ctypes.data),
           _operand(b.shape, b.strides, False), y, 1, 1, 1)
    products_of(*ops, 0, 1)
    if team.available():
        team_products(*ops, 1)
