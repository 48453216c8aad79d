"""An exact 8-bit integer GEMM (uint8/int8 A times uint8/int8 B into int32, or scaled into float32), compiled.

numpy has no integer GEMM: minfer-ops-basic converts 8-bit operands to float32 for OpenBLAS's sgemm (exact while
partial sums stay below 2**24), converting the weights at every run. Here A is multiplied by B with AVX-512
VNNI's ``vpdpbusd`` (64 uint8 x int8 products summed 4 by 4 into 16 int32 lanes per instruction, exact): 210-320
GMAC/s on one thread of this machine against sgemm's 70-105 on the transformer's and resnet50's shapes.

How: numba's loops neither keep accumulators in registers (its arrays may alias: LLVM reloads and stores C at
every k) nor emit ``vpdpbusd`` (register-blocked loops in plain numba ran 6-43 GMAC/s). The micro-kernel is
written in LLVM IR instead (numba ``intrinsic``s): for 1-4 rows of A and a panel of 64 columns of B it steps over
K by 4, loads the panel's four 64-byte vectors and one broadcast 4-byte word of each A row, and chains 16
``vpdpbusd`` on 16 accumulators held in registers; it stores the 4 x 64 int32 tile once, and a block of `RB`
rows' tiles goes to one compiled write-out call (`_write`: the rank-1 corrections, then the output's type or a
conv's epilogue, `Chain`). The panel is packed at
each call (4 rows of B, interleaved byte by byte by two rounds of shuffles: a pass over B in 1/4 of the bytes
minfer-ops-basic's float32 copy writes) into thread scratch, so a weight is held once, as given, whichever kernel
the core picks for its node (a packed copy held at build doubled a quantized model's weight bytes). Without
AVX-512 VNNI (`vnni` False) the same loop is built from portable IR (widen, multiply, add in fours): exact,
slower than sgemm; the op kernels then leave their nodes to numpy.

Signedness: ``vpdpbusd`` multiplies unsigned by signed bytes. An int8 A is read as A' = A + 128 (its bytes xor
0x80, in the micro-kernel), a uint8 B as B' = B - 128 (xor 0x80 when packed). With zero points za (per row) and
zb (per column), (A - za) @ (B - zb) = A' @ B' + (beta - zb[n]) * (rowsum(A)[m] - za * K) - (alpha + za) *
colsum(B')[n] (alpha, beta the offsets 0 or 128): the tile's exact integers plus two rank-1 terms, added as the
tile is written out. Every step wraps modulo 2**32 as int32 does: exact whenever the result fits in int32.

K need not be a multiple of 4: the micro-kernel takes the first 4 * (K // 4); the write-out adds the last K % 4
products. The rows of A (or a batch's matrices) split over a native team (team.py: `_on_team`, the same `_rows`
calls on the same ranges, so the same bits) when one runs, else over `parallel_for`, in blocks of `MR`. The IR
builders stay in this file: numba's on-disk cache of the compiled functions is invalidated by changes to their own
file only.
"""

from __future__ import annotations

import contextlib
import functools
import os
from typing import Any, Iterator, Sequence

import numpy as np

from minfer_core import intra_op_threads, parallel_for, scratch

from . import team
from ._jit import jit, readonly, uintp  # noqa: F401 (see _jit.uintp)
from .team import prange  # noqa: F401 (rebound to numba's at compile)

MR = 4  # rows of A per micro-kernel: 4 x 4 accumulators, 8 loads per 16 vpdpbusd (6 x 4, 8 x 2: the same speed)
# rows of A whose tiles are written out in one call: a call passes ~15 arrays, each counted in and out (~200 ns,
# the whole write-out of a 4-row tile of small K), so one call writes 32 tiles (a 32 KB block of int32 sums)
RB = 32 * MR
NR = 4  # 16-lane vectors per panel
W = 16 * NR  # columns of a panel
SPLIT_MACS = 1 << 24  # ~50 us on one thread: below it a second thread's ~60 us pool hand-over costs more than it saves
TEAM_SPLIT_MACS = 1 << 20  # a native team's ~1 us hand-over: from ~4 us of work a thread (see the team's figures)
_XOR = np.int32(-0x7F7F7F80)  # 0x80808080 as int32: each byte of an int8 A word + 128, read as uint8


class Packed:
    """A (K, N) 8-bit B ready for `igemm`, without a copy of it: ``b`` the same memory viewed as int8, ``colsum``
    the column sums of B' (int32), ``beta`` 128 for a uint8 B (B' = B - 128, its bytes xor 0x80), else 0."""

    __slots__ = ("b", "colsum", "k", "n", "beta")

    def __init__(self, b: np.ndarray, sums: np.ndarray | None = None) -> None:
        self.k, self.n = b.shape
        self.beta = 128 if b.dtype == np.uint8 else 0
        self.b = readonly(np.ascontiguousarray(b).view(np.int8))
        sums = b.sum(axis=0, dtype=np.int64) if sums is None else sums  # B's column sums, known for a batch
        self.colsum = readonly((sums - self.beta * self.k).astype(np.int32))

    @classmethod
    def shifted(cls, b: np.ndarray, colsum: np.ndarray, beta: int) -> "Packed":
        """B (K, N) already viewed as int8 (C-contiguous, read-only) with ``colsum`` already made: its column sums
        less ``beta`` * K, int32 (as a conv's compiled loops write them); ``beta`` 128 where B is uint8, else 0."""
        packed = cls.__new__(cls)
        packed.k, packed.n = b.shape
        packed.beta, packed.b, packed.colsum = beta, b, colsum
        return packed


def pack_b(b: np.ndarray) -> Packed | list[Packed]:
    """B (K, N), uint8 or int8, made ready once for `igemm` (a constant weight: at build); a (batch, K, N) B: one
    for each matrix. It holds B itself (a view when B is C-contiguous): the panels the micro-kernel reads are
    packed from it at each call into scratch."""
    b = np.asarray(b)
    if b.ndim not in (2, 3) or b.dtype not in (np.uint8, np.int8):
        raise TypeError(f"pack_b takes a 2-D or 3-D uint8 or int8 B, got {b.dtype} of shape {b.shape}")
    if b.ndim == 2:
        return Packed(b)
    b, sums = np.ascontiguousarray(b), b.sum(axis=1, dtype=np.int64)  # one numpy call for the whole batch
    return Batch(b, [Packed(matrix, column) for matrix, column in zip(b, sums)])


class Batch(list):
    """`pack_b`'s answer for a (batch, K, N) B: its matrices' `Packed`, and the whole batch as a native team's
    driver reads it (``b`` (batch, K, N) int8, ``colsum`` (batch, N) int32: the matrices' own memory, no copy)."""

    def __init__(self, b: np.ndarray, matrices: list[Packed]) -> None:
        super().__init__(matrices)
        self.b = readonly(b.view(np.int8))
        self.colsum = readonly(np.stack([p.colsum for p in matrices])) if matrices else None


def vnni() -> bool:
    """Whether the micro-kernel runs on AVX-512 VNNI here (the host CPU has it and numba compiles for the host).

    False under an LLVM before 17 (llvmlite's, older numba): the IR names a masked load as opaque pointers mangle
    it, which LLVMs with typed pointers spell otherwise; the op kernels then decline and numpy computes."""
    global _VNNI
    if _VNNI is None:
        import llvmlite.binding as llvm

        if llvm.llvm_version_info < (17,):
            _VNNI = False
            return _VNNI

        name, features = os.environ.get("NUMBA_CPU_NAME", "host"), os.environ.get("NUMBA_CPU_FEATURES")
        if features is not None:  # numba compiles for these features, not the host's
            _VNNI = name == "host" and "+avx512vnni" in features.split(",")
        else:
            _VNNI = name == "host" and bool(llvm.get_host_cpu_features().get("avx512vnni", False))
    return _VNNI


_VNNI: bool | None = None


def igemm(a: np.ndarray, packed: Packed | Sequence[Packed], out: np.ndarray, a_zero_point: Any = 0,
          b_zero_point: Any = 0, scale: Any = None, bias: np.ndarray | None = None, requantize: Any = None,
          chain: Any = None) -> np.ndarray:
    """(A - a_zero_point) @ (B - b_zero_point) for an (M, K) uint8/int8 A and a `pack_b` B, exact, into ``out``
    (M, N): int32; or float32, float32(product) * scale [+ bias] (each a float32 operation: the bits of Cast, Mul
    and Add) when ``scale`` (one value) is given; or int8/uint8 with ``requantize=(factor, y_zero_point)``:
    saturate(rint(float64(product) * factor[n] + y_zero_point)), float64 operations in QLinearMatMul's order
    (factor: one value or one per column); or float32 with ``chain``, a conv's requantizing epilogue applied to each
    tile as it is written (`Chain`: no sums written and read back). a_zero_point: one value or one per row; b_zero_point: one value or one
    per column; bias: one float32 per column. A batch: A and out (batch, M, ...), ``packed`` one per matrix or one
    for all. The rows (the matrices of a batch) split over a native team from `TEAM_SPLIT_MACS` multiply-adds,
    else over `parallel_for` from `SPLIT_MACS`."""
    mats = _matrices(a, packed, out)
    if not mats or not out.size:
        return out
    _ensure_kernels()
    first = mats[0][1]
    m, k, n = mats[0][0].shape + (first.n,)
    alpha = 128 if a.dtype == np.int8 else 0
    g = (alpha + np.asarray(a_zero_point, dtype=np.int64).reshape(-1)).astype(np.int32)  # the offset of A' per row
    h = (first.beta - np.asarray(b_zero_point, dtype=np.int64).reshape(-1)).astype(np.int32)  # B' to B - zb
    h = np.full(n, h[0], np.int32) if h.size == 1 else h
    mode = 0 if scale is None and requantize is None else (1 if requantize is None else 2)
    mode = 3 if chain is not None else mode
    s = np.float32(np.asarray(scale).reshape(-1)[0]) if mode == 1 else np.float32(1)
    bz = _NO_BIAS if bias is None else np.ascontiguousarray(bias, dtype=np.float32).reshape(-1)
    # every array read-only, as a constant bias comes: numba compiles one version per argument types, and one
    # compiled in a timed first run would lose the core's timing
    ends = (s, readonly(bz)) + _requantizing(requantize, out.dtype, n) + (_NO_CHAIN if chain is None else chain.operands)
    panel = (k // 4 * 4 * W,)  # one panel of B packed for the micro-kernel: scratch of the thread computing

    def rows(x: np.ndarray, p: Packed, y: np.ndarray, lo: int, hi: int) -> None:
        buf = scratch("minfer_ops_numba-igemm-panel", panel, np.int8)
        x = readonly(np.ascontiguousarray(x).view(np.uint8))  # rows K bytes apart, as the micro-kernel reads them
        _rows(x, alpha, g, p.b, p.beta, p.colsum, h, mode, ends, y, lo, hi, 0, p.n, buf)

    g, h = readonly(g), readonly(h)
    threads, macs = intra_op_threads(), len(mats) * m * k * n
    parts = len(mats) > 1 or m > MR or n > W  # a team shares matrices, columns or rows
    size = team.size() if threads > 1 and macs >= TEAM_SPLIT_MACS and parts else 1
    if size > 1:
        _team(a, packed, out, len(mats), m, size, (alpha, g, first.beta, h, mode, ends), panel)
        return out
    split = threads > 1 and macs >= SPLIT_MACS
    if split and len(mats) > 1:
        parallel_for(len(mats), lambda lo, hi: [rows(*mats[i], 0, m) for i in range(lo, hi)], outputs_only=True)
    elif split and m > MR:
        parallel_for(-(-m // MR), lambda lo, hi: rows(*mats[0], lo * MR, min(hi * MR, m)), outputs_only=True)
    else:
        for x, p, y in mats:
            rows(x, p, y, 0, m)
    return out


def warm(out_dtype: Any) -> None:
    """Compile (or load from numba's cache) the product into ``out_dtype`` now, at build: on this thread and, where
    a native team may run, the team's driver. Compiled in a first run instead, it would lose the core's timing of
    its kernel (measured: attention's QLinearMatMul went to numpy's kernel, 176 us a run against igemm's 103)."""
    a, packed = np.zeros((1, 4), np.uint8), pack_b(np.zeros((4, 1), np.int8))
    out = np.empty((1, 1), out_dtype)
    scale = np.float32(1) if out.dtype == np.float32 else None
    requantize = (1.0, None) if out.dtype in EIGHT_BIT else None
    igemm(a, packed, out, scale=scale, requantize=requantize)
    if team.available():  # (the call above made the IR kernels)
        g, h = readonly(np.zeros(1, np.int32)), readonly(np.zeros(1, np.int32))
        mode = 0 if scale is None and requantize is None else (1 if requantize is None else 2)
        ends = (np.float32(1), readonly(_NO_BIAS)) + _requantizing(requantize, out.dtype, 1) + _NO_CHAIN
        _team(a, packed, out, 1, 1, 1, (0, g, 0, h, mode, ends), (4 * W,))


def _team(a: np.ndarray, packed: Any, out: np.ndarray, count: int, m: int, size: int, how: tuple, panel: tuple
          ) -> None:
    """`igemm`'s product on a native team of ``size``, in ``size`` parts as even as the blocks allow, one a team
    thread: the batch's ``count`` matrices (count > 1), else the one matrix's panels of W columns (each thread packs
    only its own panels) or, with fewer panels than threads, its rows in blocks of MR."""
    alpha, g, beta, h, mode, ends = how
    if isinstance(packed, Packed):
        b, colsum = packed.b[None], packed.colsum[None]
    elif isinstance(packed, Batch) and len(packed) == count:
        b, colsum = packed.b, packed.colsum
    else:  # a list a caller made: one array of them (read-only, as the matrices are)
        b, colsum = readonly(np.stack([p.b for p in packed])), readonly(np.stack([p.colsum for p in packed]))
    a3 = readonly(np.ascontiguousarray(a).view(np.uint8))
    a3, out3 = (a3, out) if a.ndim == 3 else (a3[None], out[None])
    n = b.shape[2]
    by = 2 if count > 1 else (1 if -(-n // W) >= size else 0)  # matrices, columns, rows
    blocks, step, end = ((count, 1, count), (-(-n // W), W, n), (-(-m // MR), MR, m))[2 - by]
    bounds = np.array([min(end, blocks * t // size * step) for t in range(size + 1)], np.int64)
    panels = scratch("minfer_ops_numba-igemm-panels", (size,) + panel, np.int8)
    _on_team(a3, alpha, g, b, beta, colsum, h, mode, ends, out3, bounds, by, panels)


class Fixed:
    """`igemm` of one constant A (M, K) with its zero point, through a `Chain` into float32, on a native team of
    ``size`` (a conv's product: `team_applies`), its arguments made once a B shape. `igemm` makes them at every call
    (A's offsets, B's, the team's bounds, a dozen numpy calls and checks): ~30 us of Python a conv in a run, where the
    interpreter's data has left the cache since the node's last run (measured on MobileNetV2's QDQ 1x1 convs:
    igemm's product 40-50 us, its call 100-200). The same driver on the same ranges: the same bits."""

    __slots__ = ("a3", "alpha", "g", "m", "k", "shapes", "last")

    def __init__(self, a: np.ndarray, a_zero_point: Any = 0) -> None:
        self.m, self.k = a.shape
        self.alpha = 128 if a.dtype == np.int8 else 0
        self.a3 = readonly(np.ascontiguousarray(a).view(np.uint8))[None]
        self.g = readonly((self.alpha + np.asarray(a_zero_point, dtype=np.int64).reshape(-1)).astype(np.int32))
        self.shapes: dict[tuple[int, int, int], list] = {}
        self.last: tuple = (None, None)  # (chain, its write-out's arguments): a constant chain's made once

    def team_applies(self, n: int, threads: int) -> bool:
        """Whether `igemm` runs this product on a native team (given one of ``threads`` runs): `Fixed` serves it."""
        return threads > 1 and self.m * self.k * n >= TEAM_SPLIT_MACS and (self.m > MR or n > W)

    def __call__(self, b: np.ndarray, colsum: np.ndarray, beta: int, b_zero: int, out: np.ndarray, chain: "Chain",
                 size: int) -> None:
        """out (M, N) = the chain's values of (A - za) @ (B - b_zero) for B (K, N) viewed as int8 (``beta``: 128 for
        a uint8 B, its bytes read xor 0x80, else 0) with ``colsum`` B's column sums less beta * K (int32), on a team
        of ``size`` (> 1: `team.size()`'s answer)."""
        n = b.shape[1]
        found = self.shapes.get((n, size, beta))
        if found is None:
            by = 1 if -(-n // W) >= size else 0  # columns, else rows (as `_team` cuts one matrix)
            blocks, step, end = (-(-n // W), W, n) if by else (-(-self.m // MR), MR, self.m)
            bounds = readonly(np.array([min(end, blocks * t // size * step) for t in range(size + 1)], np.int64))
            found = self.shapes[(n, size, beta)] = [bounds, by, (size, self.k // 4 * 4 * W), None, None]
        bounds, by, panel, zero, h = found
        if zero != b_zero:  # B's offset a column: changes only with a dynamic input's zero point
            h = found[4] = readonly(np.full(n, beta - b_zero, np.int32))
            found[3] = b_zero
        chained, how = self.last
        if chained is not chain:
            how = _CHAIN_ENDS + chain.operands
            self.last = (chain, how)
        _on_team(self.a3, self.alpha, self.g, b[None], beta, colsum[None], h, 3, how, out[None], bounds, by,
                 scratch("minfer_ops_numba-igemm-panels", panel, np.int8))


@jit(parallel=True)
def _on_team(a, alpha, g, b, beta, colsum, h, mode, how, out, bounds, by, panels):  # pragma: no cover - compiled
    """`_rows` for each part bounds[t]..bounds[t + 1], one a team thread with its own ``panels[t]``: matrices of the
    batch, all of each (``by`` 2), columns (1) or rows (0) of the one matrix. ``b``/``colsum``: one matrix for all,
    or one each."""
    m, n = a.shape[1], b.shape[2]
    for t in prange(bounds.size - 1):
        lo, hi = bounds[t], bounds[t + 1]
        if by == 2:
            for i in range(lo, hi):
                j = i if b.shape[0] > 1 else 0
                _rows(a[i], alpha, g, b[j], beta, colsum[j], h, mode, how, out[i], 0, m, 0, n, panels[t])
        elif by == 1:
            _rows(a[0], alpha, g, b[0], beta, colsum[0], h, mode, how, out[0], 0, m, lo, hi, panels[t])
        else:
            _rows(a[0], alpha, g, b[0], beta, colsum[0], h, mode, how, out[0], lo, hi, 0, n, panels[t])


EIGHT_BIT = (np.dtype(np.uint8), np.dtype(np.int8))


def _matrices(a: np.ndarray, packed: Any, out: np.ndarray) -> list[tuple[np.ndarray, Packed, np.ndarray]]:
    """(A, packed B, out) of each product, checked: they fit, A is 8-bit, every B of one type."""
    if a.ndim == 3:
        mats = list(zip(a, packed if isinstance(packed, (list, tuple)) else [packed] * len(a), out))
    else:
        mats = [(a, packed, out)]
    for x, p, y in mats:
        if x.shape[1] != p.k or y.shape != (x.shape[0], p.n) or p.beta != mats[0][1].beta or x.dtype not in EIGHT_BIT:
            raise ValueError(f"igemm: A {x.dtype} {x.shape} times B ({p.k}, {p.n}) does not fit out {y.dtype} "
                             f"{y.shape}; give a 2-D 8-bit A of B's K rows and an (M, N) out, B of one type")
    return mats
_NO_BIAS = np.zeros(0, np.float32)
_NO_FACTOR = readonly(np.ones(1, np.float64))


class Chain:
    """A conv's epilogue (quant.py's Requantize without division) for `igemm` to apply to each tile as it writes it:
    dst = act(rint(clip((float32(sum) + c) * m, low, high)) * out_scale * s + b), then the post grid's
    clip(rint(. / post), low, high) * factor when there is one; without ``rounding`` (a ConvInteger's Cast and
    Mul) act((float32(sum) + c) * m * out_scale * s + b). m, c, s, b: one float32 value or one a row of A (an
    output channel), empty when absent; ``params`` quant.py's Requantize params (low, high, out_scale, the Clip
    bounds, the post grid and its factor), ``act`` its activation (0 none, 1 Relu, 2 Clip). The same float32
    operations in the same order as quant.py's `_rq_fused`: the same bits."""

    __slots__ = ("operands",)

    def __init__(self, m: np.ndarray, c: np.ndarray, s: np.ndarray, b: np.ndarray, params: np.ndarray, act: int,
                 rounding: bool = True) -> None:
        lo, hi = params[3], params[4]
        act_lo = lo if act == 2 else (np.float32(0) if act == 1 else np.float32(-np.inf))
        act_hi = hi if act == 2 else np.float32(np.inf)
        out_scale = params[2] if params[2] != 0 else np.float32(1)
        values = np.asarray([params[0], params[1], out_scale, act_lo, act_hi, params[5], params[6], params[7],
                             params[8], 1 if rounding else 0], np.float32)
        self.operands = tuple(readonly(np.ascontiguousarray(v, np.float32).reshape(-1)) for v in (m, c, s, b, values))

    def times(self, m: np.ndarray) -> "Chain":
        """This chain with m in place of its m (one float32 value, C-contiguous and read-only as the others)."""
        part = Chain.__new__(Chain)
        part.operands = (m, *self.operands[1:])
        return part

    def rows(self, lo: int, hi: int) -> "Chain":
        """The chain for rows lo..hi of A (its per-row operands sliced)."""
        part = Chain.__new__(Chain)
        part.operands = tuple(v[lo:hi] if v.size > 1 and i < 4 else v for i, v in enumerate(self.operands))
        return part


# a `Chain`'s (and `requantize_channels`') rounding flag for a chain `fitted` replaced
FITTED = 2


@jit
def requantize_channels(flat, base, c0, c1, cells, stride, m, c, s, b, params):  # pragma: no cover - compiled
    """In place on channels c0..c1 of one image (channel ch's ``cells`` values at flat[base + (ch - c0) * stride:]):
    `_rq_fused`'s chain on each exact sum, act(R((v + c) * m) * out_scale * s + b), then the post grid, in its float32
    operations and order (without rounding, a ScaledConvInteger's: act((v + c) * m * out_scale * s + b)); m, c, s, b
    one value or one a channel, c, s, b empty when absent; ``params``: low, high, out_scale, the activation's bounds,
    the post grid's scale, bounds and factor, whether to round (`FITTED`: the chain after the first rint as
    `fitted` found it, s and b its r and t). (One array: a loop over two that are the same memory fails numba's
    overlap check and runs unvectorized.)"""
    low, high, osc, act_lo, act_hi = params[0], params[1], params[2], params[3], params[4]
    ps, plo, phi, pq, rounding, short = params[5], params[6], params[7], params[8], params[9] != 0, params[9] == FITTED
    osc = osc if osc != 0 else np.float32(1)
    hc, hs, hb = c.size > 0, s.size > 0, b.size > 0
    ms, cs, ss, bs = m.size > 1, c.size > 1, s.size > 1, b.size > 1
    for ch in range(c0, c1):
        at = base + (ch - c0) * stride
        mc = m[uintp(ch if ms else 0)]
        cc = c[uintp(ch if cs else 0)] if hc else np.float32(-0.0)
        sc = s[uintp(ch if ss else 0)] if hs else np.float32(1)
        bc = b[uintp(ch if bs else 0)] if hb else np.float32(-0.0)
        if short:  # `fitted`: s and b hold each channel's r and t
            for j in range(at, at + cells):
                v = (flat[uintp(j)] + cc) * mc
                v = low if v < low else v
                v = high if v > high else v
                v = np.rint(v) * sc + bc
                v = plo if v < plo else v
                flat[uintp(j)] = np.rint(phi if v > phi else v) * pq
        elif not rounding:  # a ConvInteger's Cast and Mul: the product, then the affine
            for j in range(at, at + cells):
                v = (flat[uintp(j)] + cc) * mc * osc * sc + bc
                v = act_lo if v < act_lo else v
                flat[uintp(j)] = act_hi if v > act_hi else v
        elif ps != 0:
            for j in range(at, at + cells):
                v = (flat[uintp(j)] + cc) * mc
                v = low if v < low else v
                v = high if v > high else v
                v = np.rint(v) * osc * sc + bc
                v = act_lo if v < act_lo else v
                v = act_hi if v > act_hi else v
                v = v / ps
                v = plo if v < plo else v
                v = phi if v > phi else v
                flat[uintp(j)] = np.rint(v) * pq
        else:
            for j in range(at, at + cells):
                v = (flat[uintp(j)] + cc) * mc
                v = low if v < low else v
                v = high if v > high else v
                v = np.rint(v) * osc * sc + bc
                v = act_lo if v < act_lo else v
                flat[uintp(j)] = act_hi if v > act_hi else v


def _tail(k: np.ndarray, chain: np.ndarray, sc: np.ndarray, bc: np.ndarray) -> np.ndarray:
    """The chain after its first rint, for each integer k (a row) and each channel's S and B (a column), in
    `requantize_channels`' float32 operations and order: rint(clip(clip(k * out_scale * s + b, act) / post_scale, post
    bounds)) * post factor."""
    osc = chain[2] if chain[2] != 0 else np.float32(1)
    v = k * osc * sc + bc
    v = np.where(v < chain[3], chain[3], v)
    v = np.where(v > chain[4], chain[4], v) / chain[5]
    v = np.where(v < chain[6], chain[6], v)
    return np.rint(np.where(v > chain[7], chain[7], v)) * chain[8]


def fitted(chain: np.ndarray, operands: tuple, channels: int) -> tuple[np.ndarray, tuple]:
    """(chain, operands) for `requantize_channels` (or a `Chain`'s values and m, c, s, b: the same
    layout): when the chain ends on a post grid, its steps after the first rint
    replaced by ``rint(clip(k * r + t, post bounds)) * post factor`` with each channel's float32 r and t (S and B's
    places), where that gives the chain's bits for every k its first clip lets through (-0.0 included): checked
    here on all of them (at most 2**16 a channel). Two multiplies, an add, two clips and a division less a value:
    ~20% of the chain on MobileNetV2's shapes. Else as given."""
    low, high, post = float(chain[0]), float(chain[1]), float(chain[5])
    if chain[9] != 1 or post == 0 or not (np.isfinite(low) and np.isfinite(high)) or high - low > 1 << 16:
        return chain, operands
    m, c, s, b = operands
    ones = np.ones(channels, np.float32)
    sc = (ones * (s if s.size else np.float32(1))).astype(np.float32).reshape(-1, 1)
    bc = (ones * (b if b.size else np.float32(-0.0))).astype(np.float32).reshape(-1, 1)
    k = np.concatenate([[np.float32(-0.0)], np.arange(low, high + 1, dtype=np.float32)]).reshape(1, -1)
    with np.errstate(all="ignore"):
        want = _tail(k, chain, sc, bc).view(np.int32)
        osc = float(chain[2]) if chain[2] != 0 else 1.0
        r0 = (osc * sc.astype(np.float64) / post).astype(np.float32)
        t0 = (bc.astype(np.float64) / post).astype(np.float32)
        r, t = r0.copy(), t0.copy()
        todo = np.ones(channels, bool)
        for dr in (0, 1, -1):
            for dt in (0, 1, -1):
                rr = r0 if dr == 0 else np.nextafter(r0, np.float32(np.inf * dr))
                tt = t0 if dt == 0 else np.nextafter(t0, np.float32(np.inf * dt))
                v = k * rr + tt
                v = np.where(v < chain[6], chain[6], v)
                got = (np.rint(np.where(v > chain[7], chain[7], v)) * chain[8]).view(np.int32)
                ok = todo & np.all(got == want, axis=1) & np.isfinite(rr[:, 0]) & (rr[:, 0] != 0)
                r[ok], t[ok] = rr[ok], tt[ok]
                todo &= ~ok
    if todo.any():
        return chain, operands
    params = chain.copy()
    params[9] = FITTED
    return readonly(params), (m, c, readonly(r.reshape(-1)), readonly(t.reshape(-1)))


_NO_CHAIN = tuple(readonly(np.zeros(0, np.float32)) for _ in range(5))
# a chain's write-out's leading `_write` arguments (scale 1, no bias, no requantizing), which `Fixed` passes
_CHAIN_ENDS = (np.float32(1), readonly(_NO_BIAS), _NO_FACTOR, readonly(np.zeros(3, np.float64)))


def _requantizing(requantize: Any, dtype: np.dtype, n: int) -> tuple[np.ndarray, np.ndarray]:
    """(factor per column, [y zero point, type min, type max]) as float64 arrays for `_write`."""
    if requantize is None:
        return _NO_FACTOR, readonly(np.zeros(3, np.float64))
    factor, zero = requantize
    info = np.iinfo(dtype)
    factor = np.asarray(factor, dtype=np.float64).reshape(-1)
    factor = np.full(n, factor[0]) if factor.size == 1 else factor
    zy = 0.0 if zero is None else float(np.asarray(zero).reshape(-1)[0])
    return readonly(np.ascontiguousarray(factor)), readonly(np.array([zy, info.min, info.max], np.float64))


@jit
def _rows(a, alpha, g, b, beta, colsum, h, mode, how, out, lo, hi, c0, c1, panel):  # pragma: no cover - compiled
    """Rows lo..hi, columns c0..c1 (c0 a multiple of 64) of the product: per panel of 64 columns of B, packed into
    ``panel``, each block of MR rows by the micro-kernel, its tile written out at once."""
    k, n = b.shape
    k4 = k // 4
    flip = np.uint8(128 if alpha else 0)
    ra = np.empty(hi - lo, np.int32)
    for m in range(lo, hi):  # rowsum(A) - za * K, from A' (the bytes the micro-kernel multiplies, xor'ed)
        total = np.int32(0)
        for j in range(k):
            total += np.int32(a[uintp(m), uintp(j)] ^ flip)
        ra[m - lo] = total - g[m if g.shape[0] > 1 else 0] * np.int32(k)
    tile = np.empty((RB, W), np.int32)
    xor, flip_b = (_XOR if alpha else np.int32(0)), (_XOR if beta else np.int32(0))
    base, pb = np.int64(a.ctypes.data), np.int64(b.ctypes.data)
    pp, pt = np.int64(panel.ctypes.data), np.int64(tile.ctypes.data)
    for n0 in range(c0, c1, W):
        w = min(W, c1 - n0)
        if k4 > 0:
            _pack(pb + n0, np.int64(n), np.int64(w), pp, np.int64(k4), flip_b)
        for b0 in range(lo, hi, RB):  # RB rows' tiles, then their write-out in one call
            block = min(RB, hi - b0)
            for m0 in range(b0, b0 + block, MR):
                rows = min(MR, b0 + block - m0)
                if k4 > 0:
                    _tile(rows, base + np.int64(m0) * k, np.int64(k), pp, pt + np.int64(m0 - b0) * (4 * W),
                          np.int64(W), np.int64(k4), xor)
            _write(a, flip, g, b, beta, colsum, h, mode, how, out, tile, ra[b0 - lo :], b0, block, n0, w, 4 * k4)


@jit
def _tile(rows, pa, lda, pb, pc, ldc, k4, xor):  # pragma: no cover - compiled
    """The micro-kernel for 1-4 rows (one instance each: the row count is fixed in its code)."""
    if rows == 4:
        _ukernel4(pa, lda, pb, pc, ldc, k4, xor)
    elif rows == 3:
        _ukernel3(pa, lda, pb, pc, ldc, k4, xor)
    elif rows == 2:
        _ukernel2(pa, lda, pb, pc, ldc, k4, xor)
    else:
        _ukernel1(pa, lda, pb, pc, ldc, k4, xor)


@jit
def _write(a, flip, g, b, beta, colsum, h, mode, how, out, tile, ra, m0, rows, n0, w, kt):  # pragma: no cover
    """Rows m0.. of a tile (columns n0..n0 + w): + the K % 4 last products + the two rank-1 terms (ra: rowsum(A)
    - za * K per row), into ``out``: int32 (mode 0), scaled float32 (1), requantized 8-bit (2), a `Chain`'s float32
    (3); ``how``: (scale, bias, factor, [y zero point, min, max]) then the chain's operands."""
    flip_b = np.int8(-128 if beta else 0)
    s, bias, fq, qp = how[0], how[1], how[2], how[3]
    for r in range(rows):
        m = m0 + r
        acc = tile[r]
        if kt == 0:
            acc[:] = 0  # no micro-kernel ran (K < 4): the products are the tail's alone
        for t in range(kt, a.shape[1]):
            x = np.int32(a[m, t] ^ flip)
            for j in range(w):
                acc[uintp(j)] += x * np.int32(np.int8(b[uintp(t), uintp(n0 + j)] ^ flip_b))
        rm, gm = ra[r], g[m if g.shape[0] > 1 else 0]
        for j in range(w):
            acc[uintp(j)] = np.int32(acc[uintp(j)] + h[uintp(n0 + j)] * rm - gm * colsum[uintp(n0 + j)])
        dst = out[m, n0 : n0 + w]
        if mode == 0:
            for j in range(w):
                dst[uintp(j)] = acc[uintp(j)]
        elif mode == 1 and bias.shape[0]:
            for j in range(w):
                dst[uintp(j)] = np.float32(acc[uintp(j)]) * s + bias[uintp(n0 + j)]
        elif mode == 1:
            for j in range(w):
                dst[uintp(j)] = np.float32(acc[uintp(j)]) * s
        elif mode == 3:  # `Chain`'s steps (absent operands exact identities: + -0.0, * 1, a clip to +-inf), as
            cm, cc, cs, cb, p = how[4], how[5], how[6], how[7], how[8]  # quant.py's `_rq_fused` computes each value
            mc = cm[uintp(m if cm.size > 1 else 0)]
            ac = cc[uintp(m if cc.size > 1 else 0)] if cc.size else np.float32(-0.0)
            sc = cs[uintp(m if cs.size > 1 else 0)] if cs.size else np.float32(1)
            bc = cb[uintp(m if cb.size > 1 else 0)] if cb.size else np.float32(-0.0)
            low, high, osc, act_lo, act_hi = p[0], p[1], p[2], p[3], p[4]
            ps, plo, phi, pq = p[5], p[6], p[7], p[8]
            if p[9] == 0:
                for j in range(w):
                    v = (np.float32(acc[uintp(j)]) + ac) * mc * osc * sc + bc
                    v = act_lo if v < act_lo else v
                    dst[uintp(j)] = act_hi if v > act_hi else v
            elif p[9] == FITTED:  # `fitted`'s: s and b hold each row's r and t
                for j in range(w):
                    v = (np.float32(acc[uintp(j)]) + ac) * mc
                    v = low if v < low else v
                    v = high if v > high else v
                    v = np.rint(v) * sc + bc
                    v = plo if v < plo else v
                    dst[uintp(j)] = np.rint(phi if v > phi else v) * pq
            else:
                post = ps != 0
                for j in range(w):  # one loop: LLVM unswitches the branch, the same for every element
                    v = (np.float32(acc[uintp(j)]) + ac) * mc
                    v = low if v < low else v
                    v = high if v > high else v
                    v = np.rint(v) * osc * sc + bc
                    v = act_lo if v < act_lo else v
                    v = act_hi if v > act_hi else v
                    if post:
                        v = v / ps
                        v = plo if v < plo else v
                        v = phi if v > phi else v
                        v = np.rint(v) * pq
                    dst[uintp(j)] = v
        else:
            zy, low, high = qp[0], qp[1], qp[2]
            for j in range(w):
                v = np.rint(np.float64(acc[uintp(j)]) * fq[uintp(n0 + j)] + zy)
                dst[uintp(j)] = low if v < low else (high if v > high else v)


def _ensure_kernels() -> None:
    """The IR kernels, as numba intrinsics, in this module's namespace, where the jit functions look them up when
    the module compiles (made here, not at import: they need numba, imported at the first use)."""
    if "_ukernel4" in globals():  # made last
        return
    fast = vnni()
    globals()["_pack"] = _intrinsic("_pack", _pack_ir)
    for r in range(1, MR + 1):
        globals()[f"_ukernel{r}"] = _intrinsic(f"_ukernel{r}", functools.partial(_kernel_ir, r, fast), 1)


def _intrinsic(name: str, build: Any, more: int = 0) -> Any:
    """A numba intrinsic of (5 + ``more``) int64 and one int32 arguments whose code ``build(builder, *args)`` makes."""
    from numba import types
    from numba.extending import intrinsic

    def codegen(context: Any, builder: Any, signature: Any, values: Any) -> Any:
        build(builder, *values)
        return context.get_dummy_value()

    sig = types.void(*[types.int64] * (5 + more), types.int32)

    def typer6(typingctx: Any, a: Any, b: Any, c: Any, d: Any, e: Any, f: Any) -> Any:
        return sig, codegen

    def typer7(typingctx: Any, a: Any, b: Any, c: Any, d: Any, e: Any, f: Any, g: Any) -> Any:
        return sig, codegen

    typer = typer7 if more else typer6  # numba reads the arguments from the signature: no *args
    typer.__name__ = name
    return intrinsic(typer)


def _pack_ir(builder: Any, pb: Any, ldb: Any, w: Any, pp: Any, k4: Any, xor: Any) -> None:
    """``_pack(pb, ldb, w, pp, k4, xor)``: the panel of B's w <= 64 columns at pb (rows ldb bytes apart) packed at
    pp for the micro-kernel: for k < k4, the bytes B[4k + j, c] at k * 256 + 4c + j, xor'ed with ``xor`` (B - 128
    of a uint8 B), zero from column w on (masked loads: nothing read past B)."""
    from llvmlite import ir

    i64, v64 = ir.IntType(64), ir.VectorType(ir.IntType(8), 64)
    pb, pp = builder.inttoptr(pb, v64.as_pointer()), builder.inttoptr(pp, v64.as_pointer())
    lanes = ir.Constant(ir.VectorType(i64, 64), list(range(64)))
    mask = builder.icmp_unsigned("<", lanes, _splat(builder, w, 64))
    flip = builder.bitcast(_splat(builder, xor, 16), v64)
    name = "llvm.masked.load.v64i8.p0"
    load = builder.module.globals.get(name) or ir.Function(
        builder.module, ir.FunctionType(v64, [pb.type, ir.IntType(32), mask.type, v64]), name)
    # byte interleaves: rows 0 and 1 (2 and 3) column by column, then 16 columns of both pairs, 4 bytes a column
    pairs = [[x for c in range(h, h + 32) for x in (c, 64 + c)] for h in (0, 32)]
    quads = [[x for c in range(q, q + 16) for x in (2 * c, 2 * c + 1, 64 + 2 * c, 65 + 2 * c)] for q in (0, 16)]
    with _loop(builder, k4, ()) as (i, _):
        rows = [builder.call(load, [_at(builder, pb, builder.mul(builder.add(builder.mul(i, i64(4)), i64(r)), ldb)),
                                    ir.IntType(32)(1), mask, ir.Constant(v64, [0] * 64)]) for r in range(4)]
        low, high = ([_shuffle(builder, x, y, p) for p in pairs] for x, y in ((rows[0], rows[1]), (rows[2], rows[3])))
        for j in range(4):
            v = builder.xor(_shuffle(builder, low[j // 2], high[j // 2], quads[j % 2]), flip)
            builder.store(v, _at(builder, pp, builder.add(builder.mul(i, i64(4 * W)), i64(64 * j))), align=1)


def _kernel_ir(rows: int, fast: bool, builder: Any, pa: Any, lda: Any, pb: Any, pc: Any, ldc: Any, k4: Any,
               xor: Any) -> None:
    """``_ukernel<rows>(pa, lda, pb, pc, ldc, k4, xor)``: the (rows, 64) int32 tile at pc (rows ldc apart) =
    A'[rows, :4 k4] @ the packed panel at pb, A's rows at pa + r * lda, each 4-byte word xor'ed with ``xor``."""
    from llvmlite import ir

    i64, v16 = ir.IntType(64), ir.VectorType(ir.IntType(32), 16)
    v64 = ir.VectorType(ir.IntType(8), 64)
    pa, pb, pc = (builder.inttoptr(x, ir.IntType(8).as_pointer()) for x in (pa, pb, pc))
    flip = _splat(builder, xor, 16)
    with _loop(builder, k4, [ir.Constant(v16, [0] * 16)] * (rows * NR)) as (i, acc):
        panel = [_at(builder, pb, builder.add(builder.mul(i, i64(4 * W)), i64(64 * j)), v64) for j in range(NR)]
        panel = [builder.load(p, align=1) for p in panel]
        for r in range(rows):
            word = builder.load(_at(builder, pa, builder.add(builder.mul(i64(r), lda), builder.mul(i, i64(4))),
                                    ir.IntType(32)), align=1)
            a = builder.xor(_splat(builder, word, 16), flip)
            acc[r * NR : r * NR + NR] = [_dot4(builder, acc[r * NR + j], a, panel[j], fast) for j in range(NR)]
    for r in range(rows):
        for j in range(NR):
            at = _at(builder, pc, builder.mul(builder.add(builder.mul(i64(r), ldc), i64(16 * j)), i64(4)), v16)
            builder.store(acc[r * NR + j], at, align=4)


@contextlib.contextmanager
def _loop(builder: Any, count: Any, carried: Any) -> Iterator[tuple[Any, list[Any]]]:
    """``for i in range(count)`` (count >= 1) in LLVM IR, with values carried from one step to the next: yields
    (i, values); the body replaces the values in that list, which holds the last step's after the loop."""
    from llvmlite import ir

    i64 = ir.IntType(64)
    entry = builder.block
    body, done = builder.append_basic_block("igemm_loop"), builder.append_basic_block("igemm_done")
    builder.branch(body)
    builder.position_at_end(body)
    i = builder.phi(i64)
    phis = [builder.phi(c.type) for c in carried]
    values = list(phis)
    yield i, values
    step = builder.add(i, i64(1))
    for phi, first, last in zip([i, *phis], [i64(0), *carried], [step, *values]):
        phi.add_incoming(first, entry)
        phi.add_incoming(last, builder.block)
    builder.cbranch(builder.icmp_signed("<", step, count), body, done)
    builder.position_at_end(done)
    if isinstance(carried, list):
        carried[:] = values


def _splat(builder: Any, value: Any, lanes: int) -> Any:
    """A scalar broadcast to ``lanes`` lanes (vpbroadcastd for an i32)."""
    from llvmlite import ir

    kind = ir.VectorType(value.type, lanes)
    one = builder.insert_element(ir.Constant(kind, None), value, ir.IntType(32)(0))
    return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))


def _shuffle(builder: Any, x: Any, y: Any, picks: list[int]) -> Any:
    """The elements ``picks`` of x then y (index 64 + i is y's element i)."""
    from llvmlite import ir

    return builder.shuffle_vector(x, y, ir.Constant(ir.VectorType(ir.IntType(32), len(picks)), picks))


def _at(builder: Any, base: Any, offset: Any, kind: Any = None) -> Any:
    """A pointer to a ``kind`` (default: what ``base`` points to) at byte ``offset`` from ``base``."""
    from llvmlite import ir

    raw = builder.gep(builder.bitcast(base, ir.IntType(8).as_pointer()), [offset])
    return builder.bitcast(raw, (kind or base.type.pointee).as_pointer())


def _dot4(builder: Any, acc: Any, a: Any, b: Any, fast: bool) -> Any:
    """acc + in each of 16 lanes the sum of 4 uint8(a) * int8(b) byte products: one vpdpbusd, or the same
    integers from portable IR."""
    from llvmlite import ir

    v16 = ir.VectorType(ir.IntType(32), 16)
    if fast:
        name = "llvm.x86.avx512.vpdpbusd.512"
        fn = builder.module.globals.get(name) or ir.Function(builder.module, ir.FunctionType(v16, [v16] * 3), name)
        return builder.call(fn, [acc, a, builder.bitcast(b, v16)])
    wide = ir.VectorType(ir.IntType(32), 64)
    prod = builder.mul(builder.zext(builder.bitcast(a, b.type), wide), builder.sext(b, wide))
    for j in range(4):
        acc = builder.add(acc, _shuffle(builder, prod, prod, [4 * lane + j for lane in range(16)]))
    return acc
