"""MaxPool and AveragePool (2-D, float32, strides of 2 or more): compiled loops over planes.

Separable, as the numpy kernel reduces (loops.pool_rows): per output row the
window's input rows are combined into one row, from which each output takes
its taps; the padding is the loop bounds. The pools of real CNNs (strides
of 2, windows of up to 3 rows) take pool_loops' flat loops instead, with the
same bits, 1.6-2.6x faster (`pool_loops.pool_planes` picks). Planes are cut
into units of about UNIT_BYTES that go over the intra-op threads, a
thread's share of them in one call. Stride-1 pools stay with the numpy kernel,
which was faster there (`_applies_2d`).

Where a native team runs (team.py), a compiled driver (`drive`) runs the
units over numba's threads instead of parallel_for (the same loops, so the
same bits): its hand-over costs about a microsecond against parallel_for's
~60 us, so much smaller pools split (`TEAM_SPLIT_CELLS`).

GlobalAveragePool is not here: the numpy kernel's row sums are one BLAS
matrix-vector product, which a compiled loop did not beat (1x1024x7x7:
16 us against 6.7).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minfer_core import intra_op_threads, kernel, parallel_for, spmd

from . import team
from ._jit import PRIORITY, is_float32, jit, readonly
from .pool_loops import pool_planes
from .team import prange  # noqa: F401 (the driver's, compiled)
from .window import Window, window

UNIT_BYTES = 256 << 10  # a unit's planes, in and out: they stay in L2 while it runs
# from this many input cells a pool is split over the threads (~300 us of work here; the hand-over costs 10-50 us)
MIN_SPLIT_CELLS = 600_000
# the same over a native team (team.py), whose hand-over costs a few microseconds: 3x3 stride-2 MaxPools (one thread
# against a team of two, loaded host) went 19 -> 15 us at 33k and 50k input cells, 246 -> 125 at 803k (parallel_for:
# 157), and no faster at 9k (8.2 -> 8.6)
TEAM_SPLIT_CELLS = 30_000


@jit(parallel=True)
def drive(x, y, is_max, scale, table, parts, kh, kw, sh, sw, ph, pw, dh, dw):  # pragma: no cover - compiled
    """The units of ``table`` (rows p0, p1: planes) in ``parts`` contiguous shares over a native team (team.py):
    `pool_planes` from x (P, H, W) into y (P, OH, OW), ``scale`` the 1/count of an average, as `_pool`'s
    parallel_for path does."""
    count = table.shape[0]
    for t in prange(parts):
        u0, u1 = count * t // parts, count * (t + 1) // parts
        if u1 > u0:  # a share's units are contiguous planes: one call
            pool_planes(x, y, is_max, scale, table[u0, 0], table[u1 - 1, 1], kh, kw, sh, sw, ph, pw, dh, dw)


def _counts(in_shape: tuple[int, ...], w: Window, kernel: tuple[int, ...], strides: tuple[int, ...],
            dilations: tuple[int, ...], include_pad: bool) -> np.ndarray:
    """How many taps of each output window fall on data (or on data and declared pads): (OH, OW)."""
    counts = np.ones((), np.float64)
    for i, k, s, d, b, f, o in zip(in_shape, kernel, strides, dilations, w.begin, w.end, w.out_shape):
        pos = np.arange(o)[:, None] * s - b + np.arange(k)[None, :] * d
        lo, hi = (-b, i + f) if include_pad else (0, i)
        counts = np.multiply.outer(counts, ((pos >= lo) & (pos < hi)).sum(axis=1))
    return counts


def _scale(counts: np.ndarray) -> np.ndarray:
    """1/count per output as float32 (as the numpy kernel multiplies); NaN where a window has no data."""
    with np.errstate(divide="ignore"):
        return readonly(np.ascontiguousarray(np.where(counts > 0, 1.0 / counts, np.nan).astype(np.float32)))


def _plane_units(planes: int, plane_bytes: int, cells: int, threads: int,
                 native: bool = False) -> tuple[list[tuple[int, int]], int]:
    """(p0, p1) ranges of about UNIT_BYTES (at least one per thread when worth splitting) and the parts; over a
    native team (``native``) from TEAM_SPLIT_CELLS, in a multiple of the parts of one size where planes allow
    (its parts are contiguous shares of the units)."""
    per = max(1, min(planes, UNIT_BYTES // max(plane_bytes, 1)))
    split = threads > 1 and cells >= (TEAM_SPLIT_CELLS if native else MIN_SPLIT_CELLS)
    if split and native:
        per = max(1, math.ceil(planes / (math.ceil(math.ceil(planes / per) / threads) * threads)))
    elif split:
        per = min(per, math.ceil(planes / threads))
    found = [(p, min(planes, p + per)) for p in range(0, planes, per)]
    return found, min(threads, len(found)) if split else 1


def _pool(average: bool, kernel_shape, strides, pads, auto_pad, dilations=None, ceil_mode=0, include_pad=0):
    """The run callable of a 2-D pool; geometry and units are worked out once per input shape."""
    kernel = tuple(int(k) for k in kernel_shape)
    st, dl = tuple(strides or (1, 1)), tuple(dilations or (1, 1))
    plans: dict[tuple[int, ...], Any] = {}

    def plan(shape: tuple[int, ...], threads: int, native: bool) -> Any:
        w = window(shape[2:], kernel, st, dl, pads, auto_pad, ceil_mode)
        planes = shape[0] * shape[1]
        scale = _scale(_counts(shape[2:], w, kernel, st, dl, bool(include_pad))) if average else None
        plane_bytes = (shape[2] * shape[3] + math.prod(w.out_shape)) * 4
        found, parts = _plane_units(planes, plane_bytes, planes * shape[2] * shape[3], threads, native)
        # all a call passes on besides the arrays, worked out here: a small pool's Python cost as much as its loop
        geo = (kernel[0], kernel[1], st[0], st[1], w.begin[0], w.begin[1], dl[0], dl[1])
        head = (not average, _NO_SCALE if scale is None else scale)
        return (shape[:2] + w.out_shape, (-1,) + shape[2:], (-1,) + w.out_shape, head, geo, found, parts,
                readonly(np.array(found, np.int64).reshape(-1, 2)))

    def run(x, *, out=None):
        threads = intra_op_threads()
        # the team is asked only where a pool splits over it: asking claims the run's threads (team.py)
        if threads > 1 and x.size >= TEAM_SPLIT_CELLS and team.available():
            size = team.size()
            threads, native = (size, True) if size > 1 else (intra_op_threads(), False)
        else:
            native = False
        key = x.shape + (threads, native)
        if key not in plans:
            plans[key] = plan(x.shape, threads, native)
        y_shape, x_planes, y_planes, head, geo, found, parts, table = plans[key]
        y = out if out is not None else np.empty(y_shape, np.float32)
        if y.size == 0:
            return y
        src = readonly(np.ascontiguousarray(x)).reshape(x_planes)
        dst = y.reshape(y_planes)
        if native and parts > 1:
            # one range, which the driver splits itself: a process team's ranks still write y only in here
            parallel_for(1, lambda lo, hi: drive(src, dst, *head, table, parts, *geo), parts=1, outputs_only=True)
            return y

        def span(lo: int, hi: int) -> None:  # the units' planes are contiguous: one call (~2 us each from Python)
            pool_planes(src, dst, *head, found[lo][0], found[hi - 1][1], *geo)

        parallel_for(len(found), span, parts=parts, outputs_only=True)  # a unit writes only its planes of y
        return y

    _warm(average, (kernel[0], kernel[1], st[0], st[1], 0, 0, dl[0], dl[1]))
    return spmd(run)


_NO_SCALE = readonly(np.zeros((0, 0), np.float32))  # `drive`'s scale for a max pool


def _warm(average: bool, geo: tuple[int, ...]) -> None:
    """Compile (or load from the cache) at build rather than in the first run (see depthwise._warm); the team's
    driver too where one may run."""
    x, y = readonly(np.zeros((1, 4, 4), np.float32)), np.zeros((1, 2, 2), np.float32)
    scale = readonly(np.ones((2, 2), np.float32)) if average else _NO_SCALE
    pool_planes(x, y, not average, scale, 0, 1, *geo)
    if team.available():
        drive(x, y, not average, scale, readonly(np.array([[0, 1]], np.int64)), 1, *geo)


def _applies_2d(ctx: Any, attrs: dict[str, Any]) -> bool:
    """A float32 NCHW pool with a 2-D kernel, strides of 2 or more and one output (MaxPool's Indices stays with
    the numpy kernel). Stride 1 stays with numpy too: its pools that keep the plane size were 1.5-2x faster
    (1x192x28x28 max 3x3: 75 us against 160; bench/kernels.py), except along an axis whose window is 1 wide,
    which pools nothing there (an OCR recognizer's 7x1 AveragePool of 1x48x7x16: 4x faster compiled, the
    same bits; where both apply the core times them)."""
    strides = attrs.get("strides") or (1, 1)
    kernel_shape = attrs.get("kernel_shape") or ()
    return (is_float32(ctx, 0, rank=4) and len(kernel_shape) == 2 and ctx.num_outputs == 1
            and all(s >= 2 or (s == 1 and k == 1) for s, k in zip(strides, kernel_shape)))


def _pool_kernel(op_type: str, since: int):
    return kernel(op_type, since=since, priority=PRIORITY, prepare=True, out=True, views=False, applies=_applies_2d)


@_pool_kernel("MaxPool", 1)
def max_pool_1(ctx, *, auto_pad="NOTSET", kernel_shape, pads=None, strides=None):
    """MaxPool-1: max over windows, pads never win."""
    return _pool(False, kernel_shape, strides, pads, auto_pad)


@_pool_kernel("MaxPool", 8)
def max_pool_8(ctx, *, auto_pad="NOTSET", kernel_shape, pads=None, storage_order=0, strides=None):
    """MaxPool-8: storage_order only matters for the Indices output, which the numpy kernel computes."""
    return _pool(False, kernel_shape, strides, pads, auto_pad)


@_pool_kernel("MaxPool", 10)
def max_pool_10(ctx, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, pads=None,
                storage_order=0, strides=None):
    """MaxPool-10/11/12/22: adds dilations and ceil_mode."""
    return _pool(False, kernel_shape, strides, pads, auto_pad, dilations, ceil_mode)


@_pool_kernel("AveragePool", 1)
def average_pool_1(ctx, *, auto_pad="NOTSET", kernel_shape, pads=None, strides=None):
    """AveragePool-1: mean over windows, pads excluded from the count."""
    return _pool(True, kernel_shape, strides, pads, auto_pad)


@_pool_kernel("AveragePool", 7)
def average_pool_7(ctx, *, auto_pad="NOTSET", count_include_pad=0, kernel_shape, pads=None, strides=None):
    """AveragePool-7: adds count_include_pad."""
    return _pool(True, kernel_shape, strides, pads, auto_pad, include_pad=count_include_pad)


@_pool_kernel("AveragePool", 10)
def average_pool_10(ctx, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, kernel_shape, pads=None,
                    strides=None):
    """AveragePool-10/11: adds ceil_mode."""
    return _pool(True, kernel_shape, strides, pads, auto_pad, None, ceil_mode, count_include_pad)


@_pool_kernel("AveragePool", 19)
def average_pool_19(ctx, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, kernel_shape,
                    pads=None, strides=None):
    """AveragePool-19/22: adds dilations."""
    return _pool(True, kernel_shape, strides, pads, auto_pad, dilations, ceil_mode, count_include_pad)
