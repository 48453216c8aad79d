"""Conv of a network's stem (at most 4 input channels, 3x3, stride 1 or 2): a direct vector loop, or a compiled
im2col + one BLAS GEMM.

The stem of MobileNets, PP-LCNet and the OCR detector (1x3x224x224 -> 32x112x112, 3x3 stride 2) has 27
multiply-adds an output, so a GEMM would be skinny (K = 27) and its im2col copy a large share of the work:
numpy's Conv copies strided windows of a padded input (365 us in MobileNetV2 against onnxruntime's 149, one
thread). Per band of one image's output rows, this kernel runs stem_rows.py's direct loop where its intrinsic
can be built (equal strides; numba's LLVM 17 or later): every output channel of 16 output columns from the
C*9 input vectors held in registers, four channels' chains of fused multiply-adds at a time, the fused op's
activation applied before the store where it has a vector form (team.py's codes but Swish and the rounding),
else by the epilogue after the band. Measured, one thread, no epilogue: 224x224 -> 16 channels 114-130 us
against 278 for the im2col + GEMM, -> 32 226 against 383, 320x320 -> 8 155 against 276; in the models, on
two threads with the fused activation: MobileNetV2's stem 199 us against 326, MobileNetV3-small's 110 against
178, the OCR detector's 187 against 389.

Elsewhere (mixed strides, an older LLVM), one compiled call writes the band's im2col (`im2col`: each input
row's three taps in one pass, reading its two column phases together), and one GEMM multiplies the weights,
the bias as their last column (against a row of ones), into the band's rows of the output, where the fused
op's epilogue finishes them while they are still in cache. Measured on the 224x224 stem (one thread, no
epilogue): 150-170 us against 220-250 for numpy's Conv; the im2col ~45 of them. Splitting the rows into
zero-bordered phase planes first took 46-50 us for the im2col against 43-44 this way; computing the sums
directly in plain compiled loops (four output channels a pass over phase planes, vectorized over the outputs)
took 240-270 (the loads and the one-channel chains: stem_rows.py's intrinsic keeps the inputs in registers).

Where a native team runs (team.py) and the epilogue has a compiled form, a compiled driver (`drive_direct`, or
`drive` for the GEMM: numpy's OpenBLAS called from compiled code, `team.gemm`) runs the bands over numba's
threads instead of parallel_for, with the same bits; its hand-over costs about a microsecond against
parallel_for's ~60 us, so smaller stems split too (`TEAM_SPLIT_MACS`).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minfer_core import intra_op_threads, kernel, parallel_for, scratch, spmd

from . import stem_rows as direct
from . import team
from ._jit import F32, PRIORITY, is_float32, jit, readonly, uintp  # noqa: F401 (uintp: numba's type at compile)
from .stem_rows import stem_rows  # noqa: F401 (the direct driver's, compiled)
from .team import NONE, NOTHING, finish, prange  # noqa: F401 (NONE, finish, prange: the drivers', compiled)
from .window import window

F32_ZERO = np.float32(0)
NO_OP = (NONE, F32_ZERO, F32_ZERO)  # stem_rows' (op, a, b) for no activation
MAX_CHANNELS = 4  # input channels: with more, a plain im2col's copy is a smaller share of the work
# a band's im2col takes at most this much (4096 columns at 3 channels), so that it and the band's output rows
# stay in L2 (1 MB a core here) from the copy through the GEMM to the epilogue. The 224x224 stem with a
# HardSwish epilogue (32 channels) took 193-198 us in bands of 3200 columns, 189-194 in 4096, 175-181 in
# 6400; the 320x320 one (8 channels) 205-245, 193-218 and 226-466 (OpenBLAS's sgemm of 8 rows ran 1.5-2x
# slower per output from 4608 columns on)
UNIT_BYTES = 448 << 10
# from this many multiply-adds the bands are shared between the intra-op threads (as smallconv.py)
MIN_SPLIT_MACS = 8_000_000
# the same over a native team, whose hand-over costs a few microseconds (team.py). Measured, one thread against a
# team of two with the fused activation (loaded host, BLAS on one thread): 224x224 -> 32 (MobileNetV2) 232 -> 129
# us (parallel_for: 136), -> 16 (MobileNetV3) 151 -> 90 (parallel_for did not split it), 320x320 -> 8 (the OCR
# detector) 180 -> 101, 112x112 -> 32 (2.7M) 58 -> 43; 64x64 -> 16 (0.4M) 15 -> 15
TEAM_SPLIT_MACS = 1_000_000


@jit
def im2col(x, row, cols, geo):  # pragma: no cover - compiled
    """cols[c*9 + ky*3 + kx, (oy - r0)*ow + ox] = x[n, c, oy*sh - ph + ky, ox*sw - pw + kx] (zero outside x) for
    image n = geo[0] and output rows r0 = geo[1]..geo[2], and a last row of ones (the bias, as the packed
    weights' last column). ``geo``: (n, r0, r1, sh, sw, ph, pw), one array (numba's call costs per argument);
    ``row``: scratch for one zero-bordered input row, (ow - 1)*sw + 3 long.

    Each input row a tap row reads is copied into ``row`` (its borders stay zero), then the three taps kx = 0,
    1, 2 of that row are written in one pass over the outputs, which at stride 2 reads the row's two column
    phases together: as one strided copy per tap (smallconv.py's way) the reads do not vectorize.
    """
    n, r0, r1, sh, sw, ph, pw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6]
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    columns = cols.shape[1]
    ow, inside = columns // (r1 - r0), max(0, min(width, row.size - pw))  # inside: input columns a row holds
    for j in range(row.size):
        row[j] = 0.0
    xf = x.reshape(-1)
    for c in range(channels):
        for ky in range(3):
            d0, d1, d2 = cols[c * 9 + ky * 3], cols[c * 9 + ky * 3 + 1], cols[c * 9 + ky * 3 + 2]
            for oy in range(r1 - r0):
                iy, at = (r0 + oy) * sh - ph + ky, oy * ow
                if iy < 0 or iy >= height:
                    for ox in range(ow):
                        d0[uintp(at + ox)] = 0.0
                        d1[uintp(at + ox)] = 0.0
                        d2[uintp(at + ox)] = 0.0
                    continue
                src = ((n * channels + c) * height + iy) * width
                for j in range(inside):
                    row[uintp(pw + j)] = xf[uintp(src + j)]
                if sw == 1:
                    for ox in range(ow):
                        d0[uintp(at + ox)] = row[uintp(ox)]
                        d1[uintp(at + ox)] = row[uintp(ox + 1)]
                        d2[uintp(at + ox)] = row[uintp(ox + 2)]
                else:
                    for ox in range(ow):
                        d0[uintp(at + ox)] = row[uintp(2 * ox)]
                        d1[uintp(at + ox)] = row[uintp(2 * ox + 1)]
                        d2[uintp(at + ox)] = row[uintp(2 * ox + 2)]
    if cols.shape[0] > channels * 9:
        last = cols[channels * 9]
        for j in range(columns):
            last[uintp(j)] = 1.0


@jit(parallel=True)
def drive(address, xs, packed, y, z, table, rows, cols, op, a, b):  # pragma: no cover - compiled
    """The bands of ``table`` (rows: `im2col`'s geo, then the output width) in ``cols.shape[0]`` contiguous shares
    over a native team (team.py): a band's im2col into its thread's ``rows`` and ``cols`` (flat scratch), one
    BLAS GEMM (`team.gemm` at ``address``) of the packed weights into y's band (y: (N, M, OH*OW)), then the
    epilogue (`team.finish`: z the residual flat or empty, the activation ``op``), as `conv`'s Python path does."""
    m, k, ohw = packed.shape[0], packed.shape[1], y.shape[2]
    yf, y0, w0 = y.reshape(-1), np.int64(y.ctypes.data), np.int64(packed.ctypes.data)
    parts, count = cols.shape[0], table.shape[0]
    for t in prange(parts):
        row, cf = rows[t], cols[t]
        for u in range(count * t // parts, count * (t + 1) // parts):
            geo = table[u]
            i, r0, r1, ow = geo[0], geo[1], geo[2], geo[7]
            columns = (r1 - r0) * ow
            band = cf[:k * columns].reshape((k, columns))
            im2col(xs, row, band, geo)
            at = i * m * ohw + r0 * ow
            gemm(address, m, columns, k, w0, k, np.int64(band.ctypes.data), columns, y0 + 4 * at, ohw, np.float32(0))
            finish(yf, z, at, m, columns, ohw, NOTHING, 0, op, a, b)


@jit(parallel=True)
def drive_direct(xs, packed, y, z, table, parts, op, a, b):  # pragma: no cover - compiled
    """`drive` for the direct loop (stem_rows.py): a band's rows of every channel, its activation in stem_rows'
    registers, or the epilogue by `team.finish` after it; y (N, M, OH, OW)."""
    m, ohw = y.shape[1], y.shape[2] * y.shape[3]
    yf, count = y.reshape(-1), table.shape[0]
    for t in prange(parts):
        for u in range(count * t // parts, count * (t + 1) // parts):
            geo = table[u]
            i, r0, r1, sh, ph, pw, ow = geo[0], geo[1], geo[2], geo[3], geo[5], geo[6], geo[7]
            # the activation in registers where there is no residual to add first and stem_rows has its code
            done = stem_rows(xs, i, packed, y, r0, r1, sh, ph, pw, op if z.size == 0 else NONE, a, b)
            if z.size > 0 or not done:
                finish(yf, z, i * m * ohw + r0 * ow, m, (r1 - r0) * ow, ohw, NOTHING, 0, op, a, b)


def applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """A 2-D float32 conv of one group with at most MAX_CHANNELS input channels, a constant 3x3 float32 weight
    (and bias), strides 1 or 2, no dilation and non-negative pads."""
    w = ctx.constants[1] if len(ctx.constants) > 1 else None
    if not is_float32(ctx, 0, rank=4) or w is None or w.ndim != 4 or w.dtype != F32:
        return False
    if int(attrs.get("group", 1)) != 1 or w.shape[1] != ctx.input_types[0].shape[1] or w.shape[2:] != (3, 3):
        return False
    if w.shape[1] > MAX_CHANNELS or min(attrs.get("pads") or [0]) < 0:
        return False
    if any(s not in (1, 2) for s in attrs.get("strides") or [1]) or any(d != 1 for d in attrs.get("dilations") or [1]):
        return False
    b = ctx.constants[2] if len(ctx.constants) > 2 else None
    return not (len(ctx.input_types) > 2 and ctx.input_types[2] is not None and b is None)


class Node:
    """One Conv node's packed weights (M, C*9 + 1: the bias as a last column), geometry and plans per input shape."""

    def __init__(self, w: np.ndarray, b: np.ndarray | None, auto_pad: str, pads: Any, strides: Any) -> None:
        m = w.shape[0]
        bias = np.zeros((m, 1), np.float32) if b is None else np.asarray(b, np.float32).reshape(m, 1)
        # copies: the engine frees the initializers (packed=(1, 2))
        self.packed = np.concatenate([w.reshape(m, -1), bias], axis=1, dtype=np.float32)
        self.pads, self.auto_pad = pads, auto_pad
        self.strides = tuple(int(v) for v in strides or (1, 1))
        # the direct loop (stem_rows.py) where it can run: 2-2.5x the im2col + GEMM's speed on one thread (224x224
        # -> 16 channels 122-130 us against 278, -> 32 226 against 383, 320x320 -> 8 155 against 276)
        self.direct = direct.fits(w.shape[1], (3, 3), self.strides)
        self.plans: dict[tuple[int, ...], tuple[Any, ...]] = {}
        self.work: dict[tuple[int, ...], int] = {}

    def macs(self, shape: tuple[int, ...]) -> int:
        """The conv's multiply-adds for an input of this shape (worked out once per shape)."""
        found = self.work.get(shape)
        if found is None:
            oh, ow = window(shape[2:], (3, 3), self.strides, (1, 1), self.pads, self.auto_pad, clamp_same=True)[2]
            found = self.work[shape] = shape[0] * oh * ow * self.packed.shape[0] * (self.packed.shape[1] - 1)
        return found

    def plan(self, shape: tuple[int, ...], threads: int, native: bool = False) -> tuple[Any, ...]:
        """For an input of this shape, once per shape: y's shape, the input row's scratch size, how many parts
        to run the units in, and each unit (one image's band of output rows) with its compiled call's geometry,
        its im2col's shape, its columns of y (viewed as (N, M, OH*OW)) and its region of y; and `drive`'s table
        of the units. ``native``: the parts are a native team's (team.py), which splits from TEAM_SPLIT_MACS."""
        begin, _, (oh, ow) = window(shape[2:], (3, 3), self.strides, (1, 1), self.pads, self.auto_pad,
                                    clamp_same=True)
        (sh, sw), n, (m, k) = self.strides, shape[0], self.packed.shape
        work = n * oh * ow * m * (k - 1)
        parts = threads if threads > 1 and work >= (TEAM_SPLIT_MACS if native else MIN_SPLIT_MACS) else 1
        bands = bands_of(n, oh, ow, k, parts, native) if oh * ow else []
        need = (ow - 1) * sw + 3  # a padded input row, as far as the last output's taps read
        made = [(np.array((i, r0, r1, sh, sw, begin[0], begin[1]), np.int64), (k, (r1 - r0) * ow),
                 (i, slice(None), slice(r0 * ow, r1 * ow)), (slice(i, i + 1), slice(None), slice(r0, r1)))
                for i, r0, r1 in bands]
        table = readonly(np.array([tuple(geo) + (ow,) for geo, *_ in made], np.int64).reshape(-1, 8))
        return (n, m, oh, ow), need, min(parts, len(made)), made, table


def bands_of(n: int, rows: int, columns: int, k: int, parts: int, even: bool = False) -> list[tuple[int, int, int]]:
    """(image, r0, r1) units: each image's output rows in equal bands whose im2col (``k`` rows) takes at most
    UNIT_BYTES (a row at least), and at least ``parts`` bands in all (a thread's share); ``even``: a multiple of
    ``parts`` bands an image, where that many rows allow (a native team's contiguous shares are then as large)."""
    per_image = max(math.ceil(rows * columns * k * 4 / UNIT_BYTES), math.ceil(parts / n))
    if even and n % parts:
        per_image = math.ceil(per_image / parts) * parts
    step = math.ceil(rows / min(rows, per_image))
    return [(i, r0, min(rows, r0 + step)) for i in range(n) for r0 in range(0, rows, step)]


_DECLARED = dict(prepare=True, out=True, views=False, packed=(1, 2), epilogue=True, applies=applies)


@kernel("Conv", since=1, priority=PRIORITY, **_DECLARED)
def conv(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv-1/11/22 of at most 4 input channels, 3x3 (see `applies`): the direct loop, or an im2col and one BLAS
    GEMM, a band at a time."""
    node = Node(ctx.constants[1], ctx.constants[2] if len(ctx.constants) > 2 else None, auto_pad, pads, strides)
    packed, plans = node.packed, node.plans
    address = team.gemm_address() if team.available() else 0
    if address:
        globals()["gemm"] = team.install()  # before `drive` compiles: it looks the name up here
    teams = bool(address) or (node.direct and team.available())  # the direct driver calls no BLAS
    _warm(node, ctx.input_types[0].shape, address, teams)

    def path(x: np.ndarray, epilogue: Any) -> tuple[int, tuple[Any, ...] | None]:
        """The threads to cut a run's bands for, and the epilogue's (z, op, a, b) when they are a native team's
        (`drive`'s path), else None. The team is asked for last, and only where the stem splits over it: asking
        claims the run's threads (team.py)."""
        threads = intra_op_threads()
        if not teams or threads < 2 or node.macs(x.shape) < TEAM_SPLIT_MACS:
            return threads, None
        fused = team.PLAIN if epilogue is None else team.native(epilogue)
        if fused is None:
            return threads, None
        size = team.size()
        return (size, (fused[3],) + fused[:3]) if size > 1 else (intra_op_threads(), None)

    def run(x, w=None, b=None, *, out=None, epilogue=None):
        threads, native = path(x, epilogue)
        key = x.shape + (threads, native is not None)
        if key not in plans:
            plans[key] = node.plan(x.shape, threads, native is not None)
        shape, need, parts, made, table = plans[key]
        y = out if out is not None else np.empty(shape, np.float32)  # out: C-contiguous, as the engine's
        if y.size == 0:
            return y
        xs = readonly(np.ascontiguousarray(x))  # one compiled signature, whether x is a feed or not
        yg = y.reshape(shape[0], shape[1], -1)
        if native is not None and parts > 1 and team.fits(native[0], shape):
            z, op, a, c = native
            z = NOTHING if z is None else readonly(z.reshape(-1))
            if node.direct:
                parallel_for(1, lambda lo, hi: drive_direct(xs, packed, y, z, table, parts, op, a, c), parts=1,
                             outputs_only=True)
                return y
            rows = scratch("fewchannels-team-row", (parts, need), np.float32)
            cols = scratch("fewchannels-team-cols", (parts, max(math.prod(s) for _, s, _, _ in made)), np.float32)
            # one range, which the driver splits itself: a process team's ranks still write y only in here
            parallel_for(1, lambda lo, hi: drive(address, xs, packed, yg, z, table, rows, cols, op, a, c), parts=1,
                         outputs_only=True)
            return y

        form = team.PLAIN if epilogue is None else team.native(epilogue) if node.direct else None
        inner = None if form is None or form[3] is not None else form[:3]  # None: the epilogue does it all

        def span(lo: int, hi: int) -> None:
            if node.direct:  # the activation in stem_rows' registers where it can (`drive_direct`), else the epilogue
                for geo, _, _, region in made[lo:hi]:
                    done = stem_rows(xs, geo[0], packed, y, geo[1], geo[2], geo[3], geo[5], geo[6], *(inner or NO_OP))
                    if epilogue is not None and not (inner and done):
                        epilogue(y, region)
                return
            row = scratch("fewchannels-row", (need,), np.float32)
            for geo, cols_shape, index, region in made[lo:hi]:
                cols = scratch("fewchannels-cols", cols_shape, np.float32)
                im2col(xs, row, cols, geo)
                np.matmul(packed, cols, out=yg[index])
                if epilogue is not None:
                    epilogue(y, region)

        parallel_for(len(made), span, parts=parts, outputs_only=True)  # a unit writes only its rows of y
        return y

    # every unit writes only its own rows of y, inside parallel_for(outputs_only=True): a team may share them
    return spmd(run)


def _warm(node: Node, shape: Any, address: int, teams: bool) -> None:
    """Compile (or load from the cache) at build, not in the first run, where it would also skew the timing
    of the kernels the core compares (the team's driver too, where one may run: ``address``); and for an input
    shape known at build, grow this thread's scratch to what a run takes, so that its page faults do not count
    against this kernel either (the core excludes a candidate whose first call took twice the best one's; the
    other kernels' scratch may be warm already)."""
    (m, k), geo = node.packed.shape, (0, 0, 1, 1, 1, 1, 1)
    x = readonly(np.zeros((1, (k - 1) // 9, 1, 1), np.float32))
    if node.direct:
        stem_rows(x, 0, node.packed, np.zeros((1, m, 1, 1), np.float32), 0, 1, 1, 1, 1, *NO_OP)
        if teams:
            drive_direct(x, node.packed, np.zeros((1, m, 1, 1), np.float32), NOTHING,
                         readonly(np.array([geo + (1,)], np.int64)), 1, team.NONE, np.float32(0), np.float32(0))
        return
    im2col(x, np.zeros(3, np.float32), np.zeros((k, 1), np.float32), np.array(geo, np.int64))
    if address:
        drive(address, x, node.packed, np.zeros((1, m, 1), np.float32), NOTHING,
              readonly(np.array([geo + (1,)], np.int64)), np.zeros((1, 3), np.float32), np.zeros((1, k), np.float32),
              team.NONE, np.float32(0), np.float32(0))
    if shape is not None and len(shape) == 4 and all(isinstance(d, int) and d > 0 for d in shape):
        _, need, _, made, _ = node.plan(tuple(shape), 1)
        scratch("fewchannels-row", (need,), np.float32).fill(0.0)
        if made:
            scratch("fewchannels-cols", max((cols for _, cols, _, _ in made), key=math.prod), np.float32).fill(0.0)
