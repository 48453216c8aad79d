"""Kernels: MaxPool, AveragePool, LpPool and the global pools.

numpy's ufuncs are several times faster on contiguous runs than on
row-strided views, so the 2-D pools are written as one contiguous run per
kernel tap over a whole chunk of planes (see `_same` and `_phased`);
other ranks reduce one axis at a time, each tap reading only the cells it
covers (`_separable`). Chunks of planes bound the scratch; only pools of
a few hundred microseconds are split between the intra-op threads, as
every numpy call of a split costs a GIL hand-over (`_SPLIT_WORK`).
"""

from __future__ import annotations

import functools
import math
import sys
from typing import Callable

import numpy as np

from minfer_core import kernel, parallel_for, scratch, spmd

from . import _geometry as geo

_ALL = (slice(None), slice(None))
# a chunk's input planes plus its scratch. Not L2-sized: each numpy call costs a few microseconds
# of Python, so many small chunks lose more than the cache saves; this only bounds the scratch. 8 MB
# gives each thread one chunk at the batch-1 stem pools and won at batch 8 (8x64x112x112 max 3x3 s2,
# 2 threads: 3436 us with 4 MB, 2702 with 8, 20% slower with 16: two chunks no longer fit the L3).
_CHUNK_BYTES = 8 * 1024 * 1024
# below this input size a global pool is cheaper whole than split between two threads
_SPLIT_BYTES = 5 * 1024 * 1024 // 2
# windowed pools split from this much work: input cells times (1 + 24 / last input dim), as narrow
# planes cost more per cell (numpy's per-row overhead: the serial time fits 0.4 ns x work). A waiting
# thread needs the GIL back after each of a chunk's ~10 numpy calls and a contended hand-over costs
# 25-75 us here, so the split pays only from ~250 us of work. Measured serial -> split, 2 threads with
# the workers spinning as in a run (us): 1x64x112x112 max 3x3 s2 405 -> 299, 2x576x14x14 avg 3x3 s1
# 195 -> 156, 8x1024x7x7 652 -> 421, 8x272x14x14 avg 3x3 s2 579 -> 418; but 1x320x28x28 max 3x3 s2
# 141 -> 147, 1x256x28x28 avg 3x3 s1 129 -> 151, 2x1024x7x7 183 -> 335, 2x272x14x14 avg 3x3 s2
# 107 -> 279. Inside the models (inputs fresh from a conv) 1x128x55x55 max (work 557k) 187 -> 220 and
# 1x128x56x56 avg 2x2 (574k) 196 -> 232, though alone they gained 10-20%.
_SPLIT_WORK = 600_000


def _worth_splitting(x: np.ndarray) -> bool:
    return x.size * (1 + 24 / max(1, x.shape[-1])) >= _SPLIT_WORK


# AveragePool's 1/count per output cell is kept tiled over up to this many cells (or the output's planes)
_TILE_CELLS = 1 << 18


SCRATCH = "pool"  # this module's per-thread scratch (minfer_core.scratch)

Reducer = Callable[[np.ndarray, np.ndarray], None]


def _lowest(dtype: np.dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _tap_views(x: np.ndarray, w: geo.Window, fill) -> list[np.ndarray]:
    xp = geo.pad(x, w, fill)
    return [xp[_ALL + taps] for taps in w.taps()]


Step = Callable[[np.ndarray, np.ndarray], None]


def _axis_steps(axis: int, lo: int, hi: int, segments: list[geo.Segment], op, fill) -> list[Step]:
    """The numpy calls setting outputs ``lo:hi`` along ``axis`` of dst to op over the taps of src along it.

    ``segments`` number those outputs from ``lo``; outputs no tap reaches get
    ``fill``. The indices are worked out here, once per plan: a step then costs
    one numpy call and no Python arithmetic (small pools are mostly such calls).
    """
    lead = (slice(None),) * axis

    def at(a: int, b: int) -> tuple[slice, ...]:
        return lead + (slice(lo + a, lo + b),)

    if not segments:
        return [_fill_step(at(0, hi - lo), fill)]
    first, rest = segments[0], segments[1:]
    if rest and rest[0].dst == first.dst:
        steps = [_pair_step(op, at(first.lo, first.hi), lead + (first.src,), lead + (rest[0].src,))]
        rest = rest[1:]
    else:
        steps = [_copy_step(at(first.lo, first.hi), lead + (first.src,))]
    steps += [_fill_step(at(a, b), fill) for a, b in ((0, first.lo), (first.hi, hi - lo)) if b > a]
    return steps + [_acc_step(op, at(g.lo, g.hi), lead + (g.src,)) for g in rest]


def _pair_step(op, out: tuple, a: tuple, b: tuple) -> Step:
    return lambda src, dst: op(src[a], src[b], out=dst[out])


def _copy_step(out: tuple, a: tuple) -> Step:
    return lambda src, dst: np.copyto(dst[out], src[a])


def _fill_step(out: tuple, fill) -> Step:
    return lambda src, dst: dst[out].fill(fill)


def _acc_step(op, out: tuple, a: tuple) -> Step:
    return lambda src, dst: op(dst[out], src[a], out=dst[out])


def _separable(w: geo.Window, op, fill) -> tuple[Reducer, int]:
    """A reducer of (P, *in_shape) planes into (P, *out_shape), one pass per spatial axis the window changes.

    Also returns the intermediate's size per plane (elements), for chunking.
    """
    passes, shapes, shape = [], [], list(w.in_shape)
    for i in range(len(w.kernel)):
        segments = geo.axis_segments(w, i)
        if w.out_shape[i] == w.in_shape[i] and segments == [geo.Segment(0, w.in_shape[i], 0, 1)]:
            continue  # a 1-wide, unstrided, unpadded axis: nothing to do
        shape[i] = w.out_shape[i]
        passes.append(_axis_steps(i + 1, 0, w.out_shape[i], segments, op, fill))
        shapes.append(tuple(shape))

    def reduce(src: np.ndarray, dst: np.ndarray) -> None:
        if not passes:
            np.copyto(dst, src)
            return
        for j, steps in enumerate(passes):
            last = j == len(passes) - 1
            nxt = dst if last else np.empty((len(src),) + shapes[j], dtype=src.dtype)
            for step in steps:
                step(src, nxt)
            src = nxt

    return reduce, sum(math.prod(s) for s in shapes[:-1])


def _scratch(dtype: np.dtype, sizes: list[int]) -> list[np.ndarray]:
    """Flat arrays of ``sizes`` elements carved from this thread's scratch (reused by every pool it runs)."""
    spans = [-(-n * dtype.itemsize // 64) * 64 for n in sizes]  # cache-line aligned
    if sum(spans) > 2 * _CHUNK_BYTES:  # planes too large to chunk (megapixel images): not kept for later
        buf = np.empty(sum(spans), dtype=np.uint8)
    else:
        buf = scratch(SCRATCH, (sum(spans),), np.uint8)
    out, off = [], 0
    for n, span in zip(sizes, spans):
        out.append(buf[off : off + n * dtype.itemsize].view(dtype))
        off += span
    return out


# cells of 1, 2 or 4 bytes: the integer type of one cell and of a pair (little-endian only: see _even_columns)
_PAIRS = {n: (np.dtype(f"i{n}"), np.dtype(f"i{2 * n}")) for n in (1, 2, 4)} if sys.byteorder == "little" else {}


def _even_columns(src: np.ndarray, dst: np.ndarray) -> None:
    """dst = src[..., ::2], bit for bit, for an even-length last axis of 1-, 2- or 4-byte cells.

    numpy copies a column-strided view one cell at a time; read as integers
    of twice the width, each pair of cells is one contiguous item whose low
    half (little-endian: the even cell) a narrowing cast keeps. 1.5-2.2x
    faster at the zoo's stride-2 pools (64x55x111 planes: 73 -> 33 us).
    """
    cell, pair = _PAIRS[src.dtype.itemsize]
    np.copyto(dst.view(cell), src.view(pair), casting="unsafe")


def _phased(w: geo.Window, op, fill) -> tuple[Reducer, int]:
    """A 2-D window as contiguous passes over a padded copy of the input split into row phases.

    numpy's ufuncs run several times faster on contiguous runs than on
    row-strided views, while a row-strided copy is cheap. So each chunk is
    copied once, padded, into one array per row phase of the stride (rows
    p, p + s, ...): every kernel row is then a shifted contiguous run of one
    phase, and every kernel column a shifted run of the row result. Rows and
    columns past the outputs are computed and dropped by the final strided
    copy. Returns the reducer and its scratch size per plane.
    """
    ah, aw = geo.padded_axis(w, 0), geo.padded_axis(w, 1)
    taps = geo.phase_taps(w, 0)
    phases = sorted({p for _, p in taps})
    (out_h, out_w), (sh, sw) = w.out_shape, w.strides
    lag = max(q for q, _ in taps)
    rows, width = out_h + lag, aw.length
    plane = rows * width
    copies, fills = [], []  # per phase: where its data goes and comes from; the pad regions to fill
    cols, src_cols = slice(aw.before, aw.before + aw.keep), slice(aw.crop, aw.crop + aw.keep)
    for p in phases:
        lo = min(rows, max(0, -(-(ah.before - p) // sh)))
        hi = max(lo, min(rows, -(-(ah.before + ah.keep - p) // sh)))
        start = p + lo * sh - ah.before + ah.crop
        rows_in = slice(start, start + (hi - lo - 1) * sh + 1, sh)
        copies.append(((slice(None), slice(lo, hi), cols), (slice(None), rows_in, src_cols)) if hi > lo else None)
        regions: list[tuple[slice, ...]] = [(slice(0, lo),), (slice(hi, rows),)]
        if hi > lo:
            regions += [(slice(lo, hi), slice(0, cols.start)), (slice(lo, hi), slice(cols.stop, width))]
        fills.append([(slice(None),) + r for r in regions if all(d.stop > d.start for d in r)])
    shifts = [t * w.dilations[1] for t in range(w.kernel[1])]
    pick = (slice(None), slice(0, out_h), slice(0, (out_w - 1) * sw + 1, sw))
    paired = sw == 2 and 2 * out_w <= width  # the kept columns as whole pairs of cells: see _even_columns
    # The row result overwrites, in place, a phase that only its first or second tap reads (the column result
    # then any other phase): half the scratch of separate buffers, so less to fetch after a conv evicted it.
    counts = [p for _, p in taps].count
    alone = [p for q, p in taps[:2] if q == 0 and counts(p) == 1 and len(taps) > 1]
    t_at = phases.index(alone[0]) if alone else None
    held = t_at if len(taps) > 1 else phases.index(taps[0][1])  # the phase the row result is (or is in)
    u_at = next((i for i in range(len(phases)) if i != held), None)
    n_buf = len(phases) + (t_at is None) + (u_at is None)

    def reduce(src: np.ndarray, dst: np.ndarray) -> None:
        k = len(src)
        if dst.size == 0:
            return
        n_t = k * plane - lag * width
        n_u = n_t - shifts[-1]
        bufs = _scratch(src.dtype, [k * plane] * n_buf)
        split = bufs[: len(phases)]
        t = bufs[len(phases)] if t_at is None else split[t_at]
        u = bufs[-1] if u_at is None else split[u_at]
        for copy, regions, flat in zip(copies, fills, split):
            ph = flat.reshape(k, rows, width)
            for region in regions:
                ph[region] = fill
            if copy is not None:
                np.copyto(ph[copy[0]], src[copy[1]])
        runs = [split[phases.index(p)][q * width : q * width + n_t] for q, p in taps]
        t = _fold(op, runs, t[:n_t])
        if len(shifts) > 1:
            _fold(op, [t[d : d + n_u] for d in shifts], u[:n_u])
        else:  # a one-column kernel: the row result is the answer (copied to get the chunk's layout back)
            np.copyto(u[:n_u], t[:n_u])
        if paired and src.dtype.itemsize in _PAIRS:
            _even_columns(u.reshape(k, rows, width)[:, :out_h, : 2 * out_w], dst)
        else:
            np.copyto(dst, u.reshape(k, rows, width)[pick])

    return reduce, plane * n_buf


def _same(w: geo.Window, op, fill) -> tuple[Reducer, int]:
    """A stride-1 2-D window whose output has the input's size (3x3 pad 1): no copy in or out.

    Each pass is one contiguous run per kernel tap over the whole chunk,
    as if the planes were one long image; the few rows and columns whose
    window crosses an edge (where those runs read a neighbour's cells) are
    then recomputed from the taps that fall on data.
    """
    (h, wd), (dh, dw) = w.in_shape, w.dilations
    rows = [t * dh - w.begin[0] for t in range(w.kernel[0])]
    cols = [t * dw - w.begin[1] for t in range(w.kernel[1])]

    def edges(offsets: list[int], n: int, axis: int) -> list[Step]:
        """The steps for the outputs before and after those whose every tap is inside the input."""
        lo = min(n, -offsets[0])
        hi = max(lo, n - offsets[-1])
        segments = geo.axis_segments(w, axis - 1)
        spans = [(a, b) for a, b in ((0, lo), (hi, n)) if b > a]
        return [step for a, b in spans for step in _axis_steps(axis, a, b, geo.clip_segments(segments, a, b), op, fill)]

    r_edges, c_edges = edges(rows, h, 1), edges(cols, wd, 2)

    def one_pass(src, dst, offsets, stride, steps):
        flat_src, flat_dst = src.reshape(-1), dst.reshape(-1)
        a, b = -offsets[0] * stride, flat_src.size - offsets[-1] * stride
        if b > a:
            _fold(op, [flat_src[a + o * stride : b + o * stride] for o in offsets], flat_dst[a:b])
        for step in steps:
            step(src, dst)

    def reduce(src: np.ndarray, dst: np.ndarray) -> None:
        if len(rows) == 1:
            mid = src
        else:
            (mid,) = _scratch(src.dtype, [src.size])
            mid = mid.reshape(src.shape)
            one_pass(src, mid, rows, wd, r_edges)
        if len(cols) == 1:
            np.copyto(dst, mid)
        else:
            one_pass(mid, dst, cols, 1, c_edges)

    return reduce, h * wd


def _blocks(w: geo.Window, op) -> tuple[Reducer, int]:
    """A 2-D window that tiles the input (kernel = stride, no pads, no dilation): no copy in or out.

    A tap-by-tap fold over row views, then over column views, of the input
    cut into blocks; at 2x2 this moves half the data the phased path does.
    """
    (out_h, out_w), (sh, sw) = w.out_shape, w.strides

    def reduce(src: np.ndarray, dst: np.ndarray) -> None:
        k = len(src)
        blocks = src[:, : out_h * sh, : out_w * sw].reshape(k, out_h, sh, out_w * sw)
        (t,) = _scratch(src.dtype, [k * out_h * out_w * sw])
        t = _fold(op, [blocks[:, :, r] for r in range(sh)], t.reshape(k, out_h, out_w * sw))
        columns = [t.reshape(k, out_h, out_w, sw)[..., c] for c in range(sw)]
        if sw == 1:
            np.copyto(dst, columns[0])
        else:
            _fold(op, columns, dst)

    return reduce, out_h * out_w * sw


def _fold(op, runs: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    """op over equal-length runs into out (or the only run itself)."""
    if len(runs) == 1:
        return runs[0]
    op(runs[0], runs[1], out=out)
    for run in runs[2:]:
        op(out, run, out=out)
    return out


@functools.lru_cache(maxsize=64)
def _ones(n: int, dtype: np.dtype) -> np.ndarray:
    return np.ones(n, dtype=dtype)


@functools.lru_cache(maxsize=64)
def _means(n: int, dtype: np.dtype) -> np.ndarray:
    weights = np.full(n, 1 / n, dtype=dtype)
    weights.flags.writeable = False
    return weights


def _rows_reduce(op, src: np.ndarray, dst: np.ndarray) -> None:
    """dst[i] = op over row i of src. Float sums are a matrix-vector product with ones: 4x faster than add.reduce."""
    if op is np.add and src.dtype in (np.float32, np.float64):
        np.matmul(src, _ones(src.shape[1], src.dtype), out=dst)
    else:
        op.reduce(src, axis=1, out=dst)


def _whole(op) -> Reducer:
    """A reducer for a window that reads every input cell once: one reduction per plane."""

    def reduce(src: np.ndarray, dst: np.ndarray) -> None:
        _rows_reduce(op, src.reshape(len(src), -1), dst.reshape(len(dst)))

    return reduce


def _reducer(w: geo.Window, op, fill) -> tuple[Reducer, int]:
    """The fastest reducer for this window, and its scratch size per plane."""
    if all(w.in_shape) and geo.covers_input(w):
        return _whole(op), 0
    if len(w.in_shape) != 2:
        return _separable(w, op, fill)
    if w.strides == (1, 1) and w.out_shape == w.in_shape and min(w.begin + w.end) >= 0:
        return _same(w, op, fill)
    if w.kernel == w.strides and w.dilations == (1, 1) and not any(w.begin) and max(w.end) <= 0:
        return _blocks(w, op)
    return _phased(w, op, fill)


def _pool_plan(w: geo.Window, op, fill, dtype: np.dtype, finish=None):
    """The run callable of one pool at one input shape: reduce chunks of planes, then ``finish`` each chunk."""
    reduce, scratch = _reducer(w, op, fill)
    per_chunk = max(1, _CHUNK_BYTES // ((math.prod(w.in_shape) + scratch) * dtype.itemsize))

    def run(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        planes = x.shape[0] * x.shape[1]
        y = np.empty(x.shape[:2] + w.out_shape, dtype=x.dtype) if out is None else out
        src = x.reshape((planes,) + x.shape[2:])
        dst = y.reshape((planes,) + w.out_shape)

        def chunks(lo: int, hi: int) -> None:
            n = -(-(hi - lo) // per_chunk)  # equal chunks: a small last one would cost as many calls as the others
            for j in range(n):
                a, b = lo + (hi - lo) * j // n, lo + (hi - lo) * (j + 1) // n
                reduce(src[a:b], dst[a:b])
                if finish is not None:
                    finish(dst[a:b])

        # chunks write only their planes of y: a process team may share them (one part: one process)
        parallel_for(planes, chunks, parts=None if _worth_splitting(x) else 1, outputs_only=True)
        return y

    return run


def _max_with_indices(x: np.ndarray, w: geo.Window, storage_order: int):
    """Max and the flat NCHW (or NCWH when storage_order=1) index of the first maximum."""
    views = _tap_views(x, w, _lowest(x.dtype))
    out = views[0].copy()
    best = np.zeros(out.shape, dtype=np.int64)
    for t, v in enumerate(views[1:], 1):
        better = v > out
        np.copyto(out, v, where=better)
        best[better] = t
    taps = np.unravel_index(best, w.kernel)
    n, c = x.shape[:2]
    spatial = w.in_shape
    coords = []
    for i, (s, d, b) in enumerate(zip(w.strides, w.dilations, w.begin)):
        o = np.arange(w.out_shape[i]).reshape((-1,) + (1,) * (len(spatial) - 1 - i))
        coords.append(o * s - b + taps[i] * d)
    if storage_order:
        flat = np.ravel_multi_index(coords[::-1], spatial[::-1], mode="clip")
    else:
        flat = np.ravel_multi_index(coords, spatial, mode="clip")
    base = np.arange(n * c, dtype=np.int64).reshape((n, c) + (1,) * len(spatial)) * int(np.prod(spatial))
    return out, flat + base


def _sum(x: np.ndarray, w: geo.Window) -> np.ndarray:
    return _pool_plan(w, np.add, 0, x.dtype)(x)


def _cached(make: Callable[[tuple[int, ...], np.dtype], Callable[..., object]]):
    """Per input shape and dtype memo of the plan ``make`` builds, so geometry is resolved once."""
    plans: dict = {}

    def run(x, *, out=None):
        key = (x.shape, x.dtype)
        plan = plans.get(key)
        if plan is None:
            plan = plans[key] = make(*key)
        return plan(x, out)

    # the plans write y in `_pool_plan`'s chunks (with indices there are two outputs and never an out=)
    return spmd(run)


def _geometry(kernel_shape, strides, pads, auto_pad, dilations=None, ceil_mode=0):
    def at(shape):
        return geo.window(shape[2:], kernel_shape, strides=strides, dilations=dilations, pads=pads,
                          auto_pad=auto_pad, ceil_mode=ceil_mode)
    return at


def _max_pool(ctx, geometry, storage_order=0):
    indices = ctx.num_outputs > 1

    def make(shape, dtype):
        w = geometry(shape)
        if indices:  # two outputs: the engine never passes out=
            return lambda x, out: _max_with_indices(x, w, storage_order)
        return _pool_plan(w, np.maximum, _lowest(dtype), dtype)

    return _cached(make)


@kernel("MaxPool", since=1, prepare=True, out=True, views=False)
def max_pool_1(ctx, *, auto_pad="NOTSET", kernel_shape, pads=None, strides=None):
    """MaxPool-1: max over windows, pads never win."""
    return _max_pool(ctx, _geometry(kernel_shape, strides, pads, auto_pad))


@kernel("MaxPool", since=8, prepare=True, out=True, views=False)
def max_pool_8(ctx, *, auto_pad="NOTSET", kernel_shape, pads=None, storage_order=0, strides=None):
    """MaxPool-8: adds the Indices output and storage_order."""
    return _max_pool(ctx, _geometry(kernel_shape, strides, pads, auto_pad), storage_order)


@kernel("MaxPool", since=10, prepare=True, out=True, views=False)
def max_pool_10(ctx, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, pads=None,
                storage_order=0, strides=None):
    """MaxPool-10/11/12/22: adds dilations and ceil_mode."""
    return _max_pool(ctx, _geometry(kernel_shape, strides, pads, auto_pad, dilations, ceil_mode), storage_order)


def _average_pool(geometry, count_include_pad):
    def make(shape, dtype):
        w = geometry(shape)
        counts = geo.tap_counts(w, bool(count_include_pad)).reshape(-1)
        # multiplying by 1/count is within an ulp of dividing and twice as fast; one scalar when all agree
        uniform = counts.size and (counts == counts[0]).all()
        with np.errstate(divide="ignore"):  # a window on no data at all averages to NaN, as 0/0 would
            scale = np.where(counts > 0, 1.0 / counts, np.nan).astype(dtype)
        if uniform:
            scale = scale[0]
        elif scale.size:  # one run of several planes' scales: a (planes, H*W) broadcast took 1.5-4x as long
            # (never more planes than the output has: every plan holds its run, and small models have many)
            scale = np.tile(scale, max(1, min(_TILE_CELLS // scale.size, math.prod(shape[:2]))))

        def finish(y):
            flat = y.reshape(-1)
            if uniform:
                np.multiply(flat, scale, out=flat)
                return
            for a in range(0, flat.size, scale.size):  # no outputs at all: no scales and nothing to do
                part = flat[a : a + scale.size]
                np.multiply(part, scale[: part.size], out=part)

        return _pool_plan(w, np.add, 0, dtype, finish=finish)

    return _cached(make)


@kernel("AveragePool", since=1, prepare=True, out=True, views=False)
def average_pool_1(ctx, *, auto_pad="NOTSET", kernel_shape, pads=None, strides=None):
    """AveragePool-1: mean over windows, pads excluded from the count."""
    return _average_pool(_geometry(kernel_shape, strides, pads, auto_pad), 0)


@kernel("AveragePool", since=7, prepare=True, out=True, views=False)
def average_pool_7(ctx, *, auto_pad="NOTSET", count_include_pad=0, kernel_shape, pads=None, strides=None):
    """AveragePool-7: adds count_include_pad."""
    return _average_pool(_geometry(kernel_shape, strides, pads, auto_pad), count_include_pad)


@kernel("AveragePool", since=10, prepare=True, out=True, views=False)
def average_pool_10(ctx, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, kernel_shape, pads=None,
                    strides=None):
    """AveragePool-10/11: adds ceil_mode."""
    return _average_pool(_geometry(kernel_shape, strides, pads, auto_pad, None, ceil_mode), count_include_pad)


@kernel("AveragePool", since=19, prepare=True, out=True, views=False)
def average_pool_19(ctx, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, kernel_shape,
                    pads=None, strides=None):
    """AveragePool-19/22: adds dilations."""
    return _average_pool(_geometry(kernel_shape, strides, pads, auto_pad, dilations, ceil_mode), count_include_pad)


def _lp_pool(geometry, p):
    def make(shape, dtype):
        w = geometry(shape)

        def run(x, out):
            powered = np.abs(x) ** x.dtype.type(p)
            return (_sum(powered, w) ** x.dtype.type(1.0 / p)).astype(x.dtype, copy=False)

        return run

    return _cached(make)


@kernel("LpPool", since=1, prepare=True)
def lp_pool_1(ctx, *, auto_pad="NOTSET", kernel_shape=None, p=2.0, pads=None, strides=None):
    """LpPool-1: (sum |x|^p)^(1/p) over windows, float p."""
    return _lp_pool(_geometry(kernel_shape, strides, pads, auto_pad), p)


@kernel("LpPool", since=2, prepare=True)
def lp_pool_2(ctx, *, auto_pad="NOTSET", kernel_shape, p=2, pads=None, strides=None):
    """LpPool-2/11: integer p."""
    return _lp_pool(_geometry(kernel_shape, strides, pads, auto_pad), p)


@kernel("LpPool", since=18, prepare=True)
def lp_pool_18(ctx, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, p=2, pads=None, strides=None):
    """LpPool-18/22: adds ceil_mode and dilations."""
    return _lp_pool(_geometry(kernel_shape, strides, pads, auto_pad, dilations, ceil_mode), p)


def _spatial_axes(x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(2, x.ndim))


def _global(x: np.ndarray, out: np.ndarray | None, op, mean: bool) -> np.ndarray:
    """Reduce each (image, channel) plane to one value, in parallel over planes when worth it."""
    planes = x.shape[0] * x.shape[1]
    y = np.empty(x.shape[:2] + (1,) * (x.ndim - 2), dtype=x.dtype) if out is None else out
    src, dst = x.reshape(planes, -1), y.reshape(planes)
    # float16 sums would lose digits over a plane: accumulate those in float32 (as np.mean does)
    acc = np.float32 if mean and x.dtype == np.float16 else None
    if mean and x.dtype in (np.float32, np.float64) and src.shape[1]:
        # the planes against a vector of 1/count: one BLAS call, no pass dividing the sums (mobilenet_v3's
        # squeeze-excite pools, 1x16x56x56 to 1x960x7x7, took 25-30% less in a run: 7-15 us -> 5-10)
        weights = _means(src.shape[1], x.dtype)

        def means(lo: int, hi: int) -> None:
            np.matmul(src[lo:hi], weights, out=dst[lo:hi])

        parallel_for(planes, means, parts=1 if x.nbytes < _SPLIT_BYTES else None, outputs_only=True)
        return y

    def rows(lo: int, hi: int) -> None:
        if acc:
            r = op.reduce(src[lo:hi], axis=1, dtype=acc)
        else:
            _rows_reduce(op, src[lo:hi], r := dst[lo:hi])
        if mean:
            np.divide(r, r.dtype.type(src.shape[1]), out=dst[lo:hi], casting="unsafe")

    parallel_for(planes, rows, parts=1 if x.nbytes < _SPLIT_BYTES else None, outputs_only=True)
    return y


@kernel("GlobalAveragePool", since=1, out=True, views=False)
@spmd
def global_average_pool(x, *, out=None):
    """GlobalAveragePool-1/22: mean over all spatial dims, kept as size 1."""
    return _global(x, out, np.add, mean=True)


@kernel("GlobalMaxPool", since=1, out=True, views=False)
@spmd
def global_max_pool(x, *, out=None):
    """GlobalMaxPool-1/22: max over all spatial dims, kept as size 1."""
    return _global(x, out, np.maximum, mean=False)


def _global_lp(x, p):
    s = np.sum(np.abs(x) ** p, axis=_spatial_axes(x), keepdims=True)
    return (s ** (1.0 / p)).astype(x.dtype, copy=False)


@kernel("GlobalLpPool", since=1)
def global_lp_pool_1(x, *, p=2.0):
    """GlobalLpPool-1: float p."""
    return _global_lp(x, p)


@kernel("GlobalLpPool", since=2)
def global_lp_pool_2(x, *, p=2):
    """GlobalLpPool-2/22: integer p."""
    return _global_lp(x, p)


def _max_unpool(x, indices, output_shape, kernel_shape, pads, strides):
    """Indices address the unpooled shape inferred from the attributes; a larger output_shape
    just gets that block in its leading corner (as onnx's reference and onnxruntime do)."""
    rank = x.ndim - 2
    st = strides or [1] * rank
    p = pads or [0] * 2 * rank
    spatial = [(i - 1) * s + k - p[d] - p[d + rank] for d, (i, s, k) in enumerate(zip(x.shape[2:], st, kernel_shape))]
    inferred = tuple(x.shape[:2]) + tuple(spatial)
    y = np.zeros(int(np.prod(inferred)), dtype=x.dtype)
    y[indices.reshape(-1)] = x.reshape(-1)
    y = y.reshape(inferred)
    if output_shape is None or tuple(int(v) for v in output_shape) == inferred:
        return y
    out = np.zeros(tuple(int(v) for v in output_shape), dtype=x.dtype)
    out[tuple(slice(0, n) for n in inferred)] = y
    return out


@kernel("MaxUnpool", since=9)
def max_unpool(x, indices, output_shape=None, *, kernel_shape, pads=None, strides=None):
    """MaxUnpool-9/11/22: scatter values to the flat positions MaxPool's Indices recorded, zeros elsewhere."""
    return _max_unpool(x, indices, output_shape, kernel_shape, pads, strides)


