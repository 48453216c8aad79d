"""Conv when not depthwise (2-D, float32, constant weights): one compiled im2col + GEMM per unit.

numpy's Conv (minfer-ops-conv's conv.py) runs a small conv as im2col
views, scratch copies and a BLAS call per tile: some 30 Python calls and
20-60 us, where the multiply-adds of a 1x16x16x16 3x3 conv take a few us.
Here a unit (a run of whole images, or a band of one image's output rows
when the image is large or the two intra-op threads share it) costs two
calls: one compiled call copies the unit's windows into a per-thread
(C*kh*kw + 1, columns) matrix (zero where they fall in the padding, a
last row of ones), and one BLAS GEMM multiplies the packed weights, the
bias as their last column, into the unit's output rows; a 1x1 conv at
stride 1 without pads multiplies its input in place and adds the bias.
Then the fused op's epilogue runs on those rows. Everything per input
shape (geometry, units, their slices) is worked out on its first call.
A compiled GEMM instead of BLAS (four output channels a pass, each inner
loop vectorized over the columns) was measured too: 1.5-4x slower than
BLAS from about 0.3M multiply-adds up, equal at best below.

A group-1 conv whose epilogue has a compiled form (team.py) runs compiled end
to end instead (`units_of`: im2col, numpy's sgemm called from compiled code,
the epilogue), on a native team when one runs (`team_units`), else its units
over `parallel_for`; its units come from the shape alone (`compiled_plan`),
so every thread count makes the same BLAS calls. That path takes group-1
convs of any size (a thread's share one wide GEMM, COMPILED_UNIT_BYTES):
with the whole conv on the team, a model's runs can let kernels claim the
threads (minfer_core.claim_threads) where numpy's convs held them back.
"""

from __future__ import annotations

import math
import os
from typing import Any

import numpy as np

from minfer_core import intra_op_threads, kernel, parallel_for, scratch, spmd

from . import team
from ._jit import F32, PRIORITY, is_float32, jit, readonly, uintp  # noqa: F401 (uintp: numba's type at compile)
from .team import NOTHING, finish, prange  # noqa: F401 (finish, prange: compiled code calls them)
from .window import window

# above this many multiply-adds per image the Python path (grouped convs, or no BLAS callable from compiled code)
# leaves the conv to numpy's kernel, whose per-call overhead no longer matters. Measured one kernel against the other (one thread, loaded host): 3x3 convs of 0.2-1.2M won 1.1-5.7x
# (detector, ocr_recognizer, orientation), 32->48 3x3 at 16x34 (6.2M) tied, mobilenet_v3's 224x224 stem (5.4M)
# lost 0.6x, and 1x1 convs of 1-20M (the mobilenets) tied or lost up to 0.5x
MAX_MACS = 4_000_000
# a unit's im2col takes at most about this much (more than one image's when they are small): it stays in L2
# (1 MB here, per core) from the copy to the GEMM
UNIT_BYTES = 256 << 10
# below this many multiply-adds a conv runs on one thread, as minfer-ops-conv's tiles: the hand-over to the other
# thread costs 10-50 us, more on a loaded host (at 2M, as depthwise.py's, mobilenet_v3_small at batch 1 took 5%
# longer than with numpy's Conv alone; so a single image, at most MAX_MACS, never splits)
MIN_SPLIT_MACS = 8_000_000
# with a native team (team.py) a hand-over costs about a microsecond: a conv splits from this size (~5 us of work
# a thread)
TEAM_SPLIT_MACS = 200_000
# the compiled path's units: a unit's im2col takes at most this much, so that a thread's share of a conv is one wide
# GEMM (in L3) rather than L2-sized bands whose narrow GEMMs OpenBLAS runs at half speed (64->64 3x3 at 56x56 on two
# threads: 747 us in 1-row bands, 652 in one unit a thread; session 13, Zen 5: squeezenet b1 5.4 -> 3.4 ms,
# resnet50 33.9 -> 28.9, inception_v2 21.4 -> 17.0, densenet121 36.2 -> 28.7, the OCR detector 11.2 -> 9.0;
# 1 MB units gave 3.5, 29.8, 18.5, 30.2, 8.8)
COMPILED_UNIT_BYTES = 4 << 20
# but where the packed weights are this small, re-packing them for each band costs little and a band's im2col in L2
# (a core's 1 MB here) pays: resnet50's 7x7 stem (3 -> 64 channels, 38 KB of weights) 2.7 -> 1.9 ms on two threads
SMALL_WEIGHT_BYTES, L2_UNIT_BYTES = 64 << 10, 1 << 20
SMALL_MAP = 1024  # output cells: on maps up to this size a team splits a conv's output channels, not its rows
# the threads the compiled path's units are cut for, whatever a run's count: the same units, the same BLAS calls
PLAN_PARTS = max(1, min(8, os.cpu_count() or 1))


@jit
def bordered(xf, plane, first, top, rows, height, width, wp, pw):  # pragma: no cover - compiled
    """plane[r * wp + q] = the input row top + r of the plane whose first row is row ``first`` of the flat input
    ``xf`` (rows ``width`` long, ``height`` a plane), at column q - pw: zero outside the plane's rows and columns.
    A zero-bordered copy, so that the loops reading it need no bounds."""
    lo, hi = min(wp, pw), max(min(wp, pw), min(wp, width + pw))  # the plane's columns holding input
    for r in range(rows):
        iy, at = top + r, r * wp
        if iy < 0 or iy >= height:
            for q in range(wp):
                plane[uintp(at + q)] = 0.0
            continue
        src = (first + iy) * width - pw
        for q in range(lo):
            plane[uintp(at + q)] = 0.0
        for q in range(lo, hi):
            plane[uintp(at + q)] = xf[uintp(src + q)]
        for q in range(hi, wp):
            plane[uintp(at + q)] = 0.0


@jit
def im2col(x, cf, images, group, rows, n, geo):  # pragma: no cover - compiled
    """cols[j, g, (c % cg)*kh*kw + ky*kw + kx, (oy - r0)*ow + ox] = x[i0 + j, c, oy*sh - ph + ky*dh, ox*sw - pw + kx*dw]
    (c in group g of cg channels), zero outside x, for output rows r0..r1 of images i0..; a last row of ones in
    each group when cols has room for it (the bias, as a column of the packed weights).

    ``cols`` is the flat C-contiguous ``cf`` of shape (images, group, rows, n). ``geo``: (i0, r0, r1, kh, kw, sh,
    sw, ph, pw, dh, dw), one array (numba's call costs per argument). Each
    channel's window is first copied into a zero-bordered plane, so that every tap's row is one loop without
    bounds: 1.5-2.7x faster than clipping each row to the input (three loops per row, at 8-32 columns).
    """
    i0, r0, r1, kh, kw, sh, sw, ph, pw, dh, dw = geo[0], geo[1], geo[2], geo[3], geo[4], geo[5], geo[6], geo[7], \
        geo[8], geo[9], geo[10]
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    ow, cg = n // (r1 - r0), channels // group
    top, hp, wp = r0 * sh - ph, (r1 - 1 - r0) * sh + (kh - 1) * dh + 1, (ow - 1) * sw + (kw - 1) * dw + 1
    plane = np.empty(hp * wp, np.float32)
    xf = x.reshape(-1)
    for j in range(images):
        for c in range(channels):
            bordered(xf, plane, ((i0 + j) * channels + c) * height, top, hp, height, width, wp, pw)
            g = c // cg
            for ky in range(kh):
                for kx in range(kw):
                    row = ((j * group + g) * rows + ((c - g * cg) * kh + ky) * kw + kx) * n
                    for oy in range(r1 - r0):
                        base, at = row + oy * ow, (oy * sh + ky * dh) * wp + kx * dw
                        if sw == 1:
                            for ox in range(ow):
                                cf[uintp(base + ox)] = plane[uintp(at + ox)]
                        else:
                            for ox in range(ow):
                                cf[uintp(base + ox)] = plane[uintp(at + ox * sw)]
        if rows > cg * kh * kw:
            for g in range(group):
                for t in range(n):
                    cf[uintp(((j * group + g) * rows + rows - 1) * n + t)] = 1.0


@jit
def units_of(address, xs, full, bias, y, z, found, geos, cf, direct, op, a, b, lo, hi):  # pragma: no cover
    """Units lo..hi of ``found`` ((i0, i1, r0, r1, m0, m1): images, output rows, output channels) of a group-1 conv,
    compiled end to end: a unit's im2col into ``cf`` (none when ``direct``: a 1x1 conv at stride 1 without pads
    multiplies its input as it lies), a BLAS GEMM an image into y's rows (`team.gemm`), then the epilogue
    (`team.finish`; ``bias`` there when ``direct``, else it is empty: a column of ``full`` against im2col's row of
    ones). y is (N, M, OH*OW), ``full`` (M, K + 1), ``geos`` a unit's im2col geometry and its output width."""
    m, ohw, hw, rows = y.shape[1], y.shape[2], xs.shape[2] * xs.shape[3], full.shape[1]
    k = xs.shape[1] if direct else rows
    yf, x0, y0, w0 = y.reshape(-1), np.int64(xs.ctypes.data), np.int64(y.ctypes.data), np.int64(full.ctypes.data)
    c0 = np.int64(cf.ctypes.data)
    for u in range(lo, hi):
        i0, i1, r0, r1, m0, m1 = found[u, 0], found[u, 1], found[u, 2], found[u, 3], found[u, 4], found[u, 5]
        ow = geos[u, 11]
        ncols = (r1 - r0) * ow
        if not direct:
            im2col(xs, cf, i1 - i0, 1, rows, ncols, geos[u])
        for i in range(i0, i1):
            at = (i * m + m0) * ohw + r0 * ow
            src = x0 + 4 * (i * k * hw + r0 * ow) if direct else c0 + 4 * (i - i0) * rows * ncols
            gemm(address, m1 - m0, ncols, k, w0 + 4 * m0 * rows, rows, src, hw if direct else ncols, y0 + 4 * at,
                 ohw, np.float32(0))
            finish(yf, z, at, m1 - m0, ncols, ohw, bias, m0, op, a, b)


@jit(parallel=True)
def team_units(address, xs, full, bias, y, z, found, geos, cols, direct, op, a, b):  # pragma: no cover - compiled
    """`units_of` over a native team (team.py): part t of the units on team thread t, with row t of ``cols``."""
    parts, count = cols.shape[0], found.shape[0]
    for t in prange(parts):
        units_of(address, xs, full, bias, y, z, found, geos, cols[t], direct, op, a, b, count * t // parts,
                 count * (t + 1) // parts)


def macs(ctx: Any, w: np.ndarray, attrs: dict[str, Any]) -> int | None:
    """Multiply-adds of the conv per image, None when the input's spatial shape is not known."""
    shape = ctx.input_types[0].shape
    if shape is None or not all(isinstance(d, int) for d in shape[1:]):
        return None
    st, dl = attrs.get("strides") or (1, 1), attrs.get("dilations") or (1, 1)
    out = window(shape[2:], w.shape[2:], st, dl, attrs.get("pads"), attrs.get("auto_pad", "NOTSET"),
                 clamp_same=True).out_shape
    return math.prod(out) * w.shape[0] * math.prod(w.shape[1:])


def applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """A 2-D float32 conv that is not depthwise (one input channel per group with group == C), with constant
    float32 weights and bias, non-negative pads; at most MAX_MACS multiply-adds per image unless it takes the
    compiled path (group 1, numpy's BLAS callable from compiled code: `team.gemm_address`)."""
    w = ctx.constants[1] if len(ctx.constants) > 1 else None
    if not is_float32(ctx, 0, rank=4) or w is None or w.ndim != 4 or w.dtype != F32:
        return False
    group, channels = int(attrs.get("group", 1)), ctx.input_types[0].shape[1]
    if channels != w.shape[1] * group or w.shape[0] % group or (group > 1 and w.shape[1] == 1):
        return False
    if min(attrs.get("pads") or [0]) < 0 or min(attrs.get("strides") or [1]) < 1:
        return False
    b = ctx.constants[2] if len(ctx.constants) > 2 else None
    if len(ctx.input_types) > 2 and ctx.input_types[2] is not None and b is None:
        return False  # a bias computed at run time: numpy's kernel
    work = macs(ctx, w, attrs)
    # a group-1 conv runs the compiled path (`units_of`), one wide GEMM a thread: offered at any size, the core
    # times it against numpy's kernel (Winograd, tiles) per node
    compiled = group == 1 and bool(team.gemm_address())
    return work is not None and (compiled or work <= MAX_MACS)


def units(n: int, rows: int, row_bytes: int, work: int, threads: int, split: int = MIN_SPLIT_MACS,
          unit: int = UNIT_BYTES) -> tuple[list[tuple[int, int, int, int]], int]:
    """(i0, i1, r0, r1) units (images i0..i1, output rows r0..r1) and how many parts to run them in: runs of
    whole images whose im2col (``row_bytes`` an output row) stays under UNIT_BYTES, one per thread at least
    when the work (from ``split`` multiply-adds) pays for the hand-over; else bands of each image's rows."""
    parts = threads if threads > 1 and n * work >= split else 1
    fit = max(1, unit // max(row_bytes, 1))  # rows
    if rows > fit or n < parts <= rows:
        per = min(fit, math.ceil(rows / math.ceil(parts / n)))
        if parts > 1:  # an image's bands a multiple of the threads sharing it: equal shares (18-row bands of 56
            share = math.ceil(parts / n)  # rows went 36 and 20 rows to the two threads)
            per = math.ceil(rows / (math.ceil(math.ceil(rows / per) / share) * share))
        found = [(i, i + 1, r, min(rows, r + per)) for i in range(n) for r in range(0, rows, per)]
    else:
        per = max(1, min(math.ceil(n / parts), fit // rows))
        found = [(i, min(n, i + per), 0, rows) for i in range(0, n, per)]
    return found, min(parts, len(found))


class Node:
    """One Conv node's packed weights (copies: the engine frees the initializers, packed=(1, 2)) and geometry."""

    def __init__(self, ctx: Any, auto_pad: str, dilations: Any, group: int, pads: Any, strides: Any) -> None:
        w = ctx.constants[1]
        b = ctx.constants[2] if len(ctx.constants) > 2 else None
        m, g = w.shape[0], int(group)
        self.group, self.kernel = g, (int(w.shape[2]), int(w.shape[3]))
        self.strides = tuple(int(v) for v in strides or (1, 1))
        self.dilations = tuple(int(v) for v in dilations or (1, 1))
        self.pads, self.auto_pad = pads, auto_pad
        bias = np.zeros(m, np.float32) if b is None else np.asarray(b, np.float32)
        # (G, Mg, Kg + 1): the bias rides in the GEMM as a last column, against im2col's row of ones
        self.packed = np.concatenate([w.reshape(g, m // g, -1), bias.reshape(g, m // g, 1)], axis=2, dtype=np.float32)
        self.plans: dict[tuple[int, ...], tuple[Any, ...]] = {}

    def plan(self, x: np.ndarray, threads: int, split: int = MIN_SPLIT_MACS, unit: int = UNIT_BYTES) -> tuple[Any, ...]:
        """For input x, once per shape: whether the GEMMs are 2-D, the shapes x and y are viewed in for them,
        y's shape, the units and how many parts to run them in; each unit with its compiled call's geometry
        (None: no im2col), its scratch shape, its columns (in those views) and its region of y."""
        begin, _, (oh, ow) = window(x.shape[2:], self.kernel, self.strides, self.dilations, self.pads,
                                    self.auto_pad, clamp_same=True)
        g, mg, rows = self.packed.shape
        found, parts = units(x.shape[0], oh, g * rows * ow * 4, oh * ow * self.packed.size, threads, split, unit)
        geometry = self.kernel + self.strides + (int(begin[0]), int(begin[1])) + self.dilations
        # a 1x1 conv at stride 1 without pads is a GEMM on its input as it lies: no copy (the bias added after)
        direct = self.kernel == self.strides == (1, 1) and begin == (0, 0) and (oh, ow) == x.shape[2:]
        # one image and one group a unit: 2-D GEMMs on (N, M, OH*OW) and (N, C, H*W) views (numpy's stacked
        # matmul costs ~1 us more a call), else stacked ones on (N, G, M/G, OH*OW) and (N, G, C/G, H*W)
        n, flat = x.shape[0], g == 1 and all(i1 - i0 == 1 for i0, i1, _, _ in found)
        made = []
        for i0, i1, r0, r1 in found:
            geo = None if direct else np.array((i0, r0, r1) + geometry, np.int64)
            images = (i0,) if flat else (slice(i0, i1), slice(None))
            cols = images + (slice(None), slice(r0 * ow, r1 * ow))
            region = (slice(i0, i1), slice(None), slice(r0, r1))
            made.append((geo, (i1 - i0, g, rows, (r1 - r0) * ow), cols, region))
        by_group = (n,) if flat else (n, g)
        x_by, y_by = by_group + (-1, x.shape[2] * x.shape[3]), by_group + (-1, oh * ow)
        return flat, x_by, y_by, (n, g * mg, oh, ow), made, parts

    def compiled_plan(self, x: np.ndarray) -> tuple[Any, ...]:
        """`units_of`' arguments for input x (group 1), once per shape, from the shape alone (PLAN_PARTS, not the
        run's threads: any thread count makes the same BLAS calls, so the same bits): the units as rows (i0, i1,
        r0, r1, m0, m1), their im2col geometry and output width, the scratch a thread needs, whether the GEMM reads
        x as it lies (the bias then added after it), and y's shape."""
        unit = L2_UNIT_BYTES if self.packed.nbytes <= SMALL_WEIGHT_BYTES else COMPILED_UNIT_BYTES
        _, _, _, shape, made, parts = self.plan(x, PLAN_PARTS, TEAM_SPLIT_MACS, unit)
        m, cells = shape[1], shape[2] * shape[3]
        blocks, direct = [(0, m)], made[0][0] is None
        if parts > 1 and shape[0] < parts and cells <= SMALL_MAP and (direct or m >= cells):
            # a small map: split the output channels instead of the rows, so that each thread reads only its
            # share of the weights, the bulk of the bytes (1280x320 at 7x7: 229 -> 137 us on two threads). Not
            # where an im2col has more columns than the weights rows: each thread would copy all of it (resnet50's
            # 128-channel 3x3 stride 2 at 56 -> 28, a 3.6 MB im2col)
            _, _, _, _, made, _ = self.plan(x, 1, unit=unit)
            step = -(-m // (parts * 16)) * 16
            blocks = [(m0, min(m, m0 + step)) for m0 in range(0, m, step)]
        found = np.array([[r[0].start, r[0].stop, r[2].start, r[2].stop, m0, m1] for *_, r in made
                          for m0, m1 in blocks], np.int64)
        geos = np.array([[*(geo if geo is not None else (0,) * 11), shape[3]] for geo, *_ in made
                         for _ in blocks], np.int64)
        size = 1 if direct else max(math.prod(cols_shape) for _, cols_shape, _, _ in made)
        return found, geos, size, direct, shape


_DECLARED = dict(prepare=True, out=True, views=False, packed=(1, 2), epilogue=True, applies=applies)


@kernel("Conv", since=1, priority=PRIORITY, **_DECLARED)
def conv(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv-1/11/22, small and not depthwise only (see `applies`): compiled im2col, one BLAS GEMM per unit."""
    node = Node(ctx, auto_pad, dilations, group, pads, strides)
    packed, plans = node.packed, node.plans
    # the GEMMs' operands as stacks of groups, and as matrices (group 1)
    stacked = packed, packed[:, :, :-1], packed[:, :, -1:]
    matrices = packed[0], packed[0, :, :-1], packed[0, :, -1:]
    _warm(node)

    bias = readonly(np.ascontiguousarray(packed[0, :, -1]))
    compiled_plans: dict[tuple[int, ...], tuple[Any, ...]] = {}  # `compiled`'s, by input shape
    address = team.gemm_address() if node.group == 1 else 0  # group 1: the compiled path (`compiled`)
    if address:
        globals()["gemm"] = team.install()  # before units_of compiles: it looks the name up here
        _warm_compiled(address, packed[0], bias)

    # a serial call's compiled arguments by (input shape, epilogue), with the planned output they were made for:
    # a fused node's epilogue is one object for all its calls (minfer-passes' act_only), and the engine passes
    # the same output view each run, so a small model's steady runs skip the planning in `compiled`
    quick: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def compiled(x: np.ndarray, out: np.ndarray | None, fused: tuple[Any, ...],
                 epilogue: Any = None) -> np.ndarray | None:
        """The conv by `units_of` into ``out`` (or a new array): on a native team when one runs, else its units
        over `parallel_for`; None when the residual does not fit (the Python path then takes it)."""
        op, a, b, z = fused
        found, geos, size, direct, shape = compiled_plans.get(x.shape) or compiled_plans.setdefault(
            x.shape, node.compiled_plan(x))
        if not team.fits(z, shape):
            return None
        y = out if out is not None else np.empty(shape, np.float32)
        if y.size == 0:
            return y
        args = (address, readonly(np.ascontiguousarray(x)), packed[0], bias if direct else NOTHING,
                y.reshape(shape[0], shape[1], -1), NOTHING if z is None else readonly(z.reshape(-1)), found, geos)
        threads = team.size() if len(found) > 1 else 1
        if threads > 1:
            team_units(*args, scratch("smallconv-team", (min(threads, len(found)), size), np.float32), direct, op, a, b)
            return y
        if intra_op_threads() < 2:  # no pool (a serial run): no ranges to cut, nor a process team to share them
            units_of(*args, scratch("smallconv-unit", (size,), np.float32), direct, op, a, b, 0, len(found))
            if z is None and out is not None:
                quick[(x.shape, epilogue)] = (out, args[2:], size, (direct, op, a, b, 0, len(found)))
            return y

        def span(lo: int, hi: int) -> None:
            units_of(*args, scratch("smallconv-unit", (size,), np.float32), direct, op, a, b, lo, hi)

        parallel_for(len(found), span, outputs_only=True)  # a unit writes only its y block
        return y

    def run(x, w=None, b=None, *, out=None, epilogue=None):
        fast = quick.get((x.shape, epilogue)) if out is not None else None
        if fast is not None and fast[0] is out and intra_op_threads() < 2:
            units_of(address, readonly(np.ascontiguousarray(x)), *fast[1], scratch("smallconv-unit", (fast[2],),
                     np.float32), *fast[3])
            return out
        if address:
            fused = team.native(epilogue) if epilogue is not None else team.PLAIN
            y = compiled(x, out, fused, epilogue) if fused is not None else None
            if y is not None:
                return y
        threads = intra_op_threads()
        key = x.shape + (threads,)
        if key not in plans:
            plans[key] = node.plan(x, threads)
        flat, x_by, y_by, shape, made, parts = plans[key]
        y = out if out is not None else np.empty(shape, np.float32)  # out: C-contiguous, as the engine's
        if y.size == 0:
            return y
        xs = readonly(np.ascontiguousarray(x))  # one compiled signature, whether x is a feed or not
        xg, yg = xs.reshape(x_by), y.reshape(y_by)
        full, weights, bias = matrices if flat else stacked

        def span(lo: int, hi: int) -> None:
            for geo, cols_shape, index, region in made[lo:hi]:
                dst = yg[index]
                if geo is None:
                    np.matmul(weights, xg[index], out=dst)
                    np.add(dst, bias, out=dst)
                else:
                    cols = scratch("smallconv-cols", cols_shape, np.float32)
                    im2col(xs, cols.reshape(-1), *cols_shape, geo)
                    np.matmul(full, cols[0, 0] if flat else cols, out=dst)
                if epilogue is not None:
                    epilogue(y, region)

        parallel_for(len(made), span, parts=parts, outputs_only=True)  # a unit writes only its y block
        return y

    # every unit writes only its own block of y, inside parallel_for(outputs_only=True): a team may share it
    return spmd(run)


def warm_unit(m: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(x, y, found, geos) of one unit of a 1x1 conv of k channels into m on a 1x1 map, with a run's argument types:
    what the compiled units (this module's and those built on them) are compiled with at build."""
    found = np.array([[0, 1, 0, 1, 0, m]], np.int64)
    geos = np.zeros((1, 12), np.int64)
    geos[0, 11] = 1
    return readonly(np.zeros((1, k, 1, 1), np.float32)), np.zeros((1, m, 1), np.float32), found, geos


def _warm_compiled(address: int, full: np.ndarray, bias: np.ndarray) -> None:
    """Compile (or load) the compiled path's functions at build, with the argument types of a run: else a new
    input shape's first run compiled them (seconds on an empty cache: mobilenet_v2 b1's first run 1549x its
    median) and the core's timing of this kernel paid for it."""
    m, rows = full.shape
    x, y, found, geos = warm_unit(m, rows - 1)
    args = (address, x, full, bias, y, NOTHING, found, geos)
    units_of(*args, np.zeros(1, np.float32), True, team.NONE, np.float32(0), np.float32(0), 0, 1)
    if team.available():
        team_units(*args, np.zeros((1, 1), np.float32), True, team.NONE, np.float32(0), np.float32(0))


def _warm(node: Node) -> None:
    """Compile (or load from the cache) at build, not in the first run, where it would also skew the timing
    of the kernels the core compares."""
    x = readonly(np.zeros((1, node.group, 1, 1), np.float32))
    im2col(x, np.zeros(2 * node.group, np.float32), 1, node.group, 2, 1,
           np.array((0, 0, 1, 1, 1, 1, 1, 0, 0, 1, 1), np.int64))
