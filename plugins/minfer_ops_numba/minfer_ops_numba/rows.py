"""Row kernels (float32), compiled: Softmax, LogSoftmax and LayerNormalization in one call per node instead of
~6-10 numpy calls.

On the small models' heads (a detector's [1, 768, 4] box distributions, a
recognizer's [1, 16, 37] classes, a classifier's [1, 2]) the numpy kernels
pay ~1 us per numpy call and numpy reduces short rows slowly (a row max over
rows of 4 floats took 26 us for 768 rows): there the compiled rows took
1.5-2 us where numpy's took 6-10 (session 10, interleaved A/B).

Numerics: each row is shifted by its maximum (a NaN anywhere in the row makes
the row NaN, an all -inf row gives NaN, as numpy's shifted formula does),
exponentiated with minfer-ops-numba's vectorizable float32 exp
(`elementwise.EXP_CONSTANTS`, within 3 ulps of np.exp), summed with eight
partial sums (so long rows are not one chain of dependent adds) and divided
by the sum; LogSoftmax subtracts ``m + log(sum)``. The results differ from the
numpy kernels' by a few ulps (the tests bound it). Where both kernels apply
the core times them per shape (large tensors may stay with numpy's).

LayerNormalization: per row the mean (eight partial sums, divided by the
length), d = x - mean, inv = 1 / sqrt(sum(d * d) / n + epsilon), then
y = d * inv * scale + bias, in the numpy kernel's order but with other sums
(it takes means as matrix-vector products): within a few float32 ulps of it.

Where a native team runs (team.py), rows from TEAM_SPLIT_ELEMENTS elements on
are split over numba's threads by compiled drivers (`_drive`, `_drive_norm`)
instead of parallel_for: each share of whole rows by the same loop, so the
same bits, and a hand-over of about a microsecond against ~60 us.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minfer_core import intra_op_threads, kernel, parallel_for

from . import team
from ._jit import PRIORITY, contiguous, is_float32, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)
from .activation import pow2  # noqa: F401 (compiled code calls it)
from .elementwise import EXP_CONSTANTS
from .team import prange  # noqa: F401 (the drivers', compiled)

_exp_names: dict[str, Any] = {"np": np}
exec(EXP_CONSTANTS, _exp_names)  # the one definition of the exp's constants (elementwise.py)
_L2E, _LN2HI, _LN2LO = _exp_names["_L2E"], _exp_names["_LN2HI"], _exp_names["_LN2LO"]
_EXP_HI, _EXP_LO = _exp_names["_EXP_HI"], _exp_names["_EXP_LO"]
_P0, _P1, _P2, _P3, _P4, _P5 = _exp_names["_EXP_P"]
_HALF, _ONE, _ZERO = np.float32(0.5), np.float32(1), np.float32(0)

ROWS_BLOCK = 1 << 16  # elements per parallel_for range (whole rows)
SHORT_ROW = 16  # rows shorter than this go column by column (`_short_rows`)
SPLIT_ELEMENTS = 1 << 17  # from this size the rows go over the intra-op threads (as the numpy kernel's)
# the same over a native team (team.py), whose hand-over costs a few microseconds. Measured (one thread against a
# team of two, loaded host): Softmax of 128-float rows 14 -> 11 us at 16k elements, 49 -> 29 at 65k, none at 8k;
# LayerNormalization of 256-float rows 14 -> 12 at 32k, but 8.5 -> 9.1 at 16k: it splits from TEAM_SPLIT_NORM
TEAM_SPLIT_ELEMENTS = 1 << 14
TEAM_SPLIT_NORM = 1 << 15


@jit
def _row_max(x, o, cols):  # pragma: no cover - compiled
    """The maximum of x[o:o + cols] in eight independent chains (one chain of compares is latency-bound). A NaN
    may or may not win: the row's sum turns NaN either way, and so does the whole row, as in numpy."""
    m0 = m1 = m2 = m3 = m4 = m5 = m6 = m7 = x[uintp(o)]
    k = 0
    while k + 8 <= cols:
        v0, v1, v2, v3 = x[uintp(o + k)], x[uintp(o + k + 1)], x[uintp(o + k + 2)], x[uintp(o + k + 3)]
        v4, v5, v6, v7 = x[uintp(o + k + 4)], x[uintp(o + k + 5)], x[uintp(o + k + 6)], x[uintp(o + k + 7)]
        m0, m1 = (v0 if v0 > m0 else m0), (v1 if v1 > m1 else m1)
        m2, m3 = (v2 if v2 > m2 else m2), (v3 if v3 > m3 else m3)
        m4, m5 = (v4 if v4 > m4 else m4), (v5 if v5 > m5 else m5)
        m6, m7 = (v6 if v6 > m6 else m6), (v7 if v7 > m7 else m7)
        k += 8
    while k < cols:
        v0 = x[uintp(o + k)]
        m0 = v0 if v0 > m0 else m0
        k += 1
    m0, m1, m2, m3 = (m4 if m4 > m0 else m0), (m5 if m5 > m1 else m1), (m6 if m6 > m2 else m2), (m7 if m7 > m3 else m3)
    m0, m1 = (m2 if m2 > m0 else m0), (m3 if m3 > m1 else m1)
    return m1 if m1 > m0 else m0


@jit
def _row_sum(y, o, cols):  # pragma: no cover - compiled
    """The sum of y[o:o + cols] in eight partial sums, added pairwise."""
    s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = _ZERO
    k = 0
    while k + 8 <= cols:
        s0 += y[uintp(o + k)]
        s1 += y[uintp(o + k + 1)]
        s2 += y[uintp(o + k + 2)]
        s3 += y[uintp(o + k + 3)]
        s4 += y[uintp(o + k + 4)]
        s5 += y[uintp(o + k + 5)]
        s6 += y[uintp(o + k + 6)]
        s7 += y[uintp(o + k + 7)]
        k += 8
    while k < cols:
        s0 += y[uintp(o + k)]
        k += 1
    return ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


@jit
def _exp(y, lo, hi):  # pragma: no cover - compiled
    """y[lo:hi] = exp(y[lo:hi]) in place: one flat loop over every row at once, so short rows vectorize too."""
    for i in range(lo, hi):
        p = y[uintp(i)]
        a = _EXP_HI if p > _EXP_HI else (_EXP_LO if p < _EXP_LO else (p if p == p else _ZERO))
        n = np.floor(a * _L2E + _HALF)
        t = a - n * _LN2HI
        t = t - n * _LN2LO
        e = (((((_P0 * t + _P1) * t + _P2) * t + _P3) * t + _P4) * t + _P5) * (t * t)
        e = e + t + _ONE
        e = e * pow2(np.int32(n))
        y[uintp(i)] = e if p == p else p


@jit
def _rows(x, y, cols, r_lo, r_hi, log):  # pragma: no cover - compiled
    """Softmax (LogSoftmax when ``log``) of flat rows r_lo..r_hi of x (``cols`` long) into y. Softmax reads each
    row before writing it, so y may be x; LogSoftmax reads x again at the end: y must not overlap x."""
    if cols < SHORT_ROW:
        _short_rows(x, y, cols, r_lo, r_hi, log)
        return
    for r in range(r_lo, r_hi):
        o = r * cols
        m = _row_max(x, o, cols)
        for k in range(cols):
            y[uintp(o + k)] = x[uintp(o + k)] - m
    if not log:
        _normalize(y, cols, r_lo, r_hi)
        return
    _exp(y, r_lo * cols, r_hi * cols)
    for r in range(r_lo, r_hi):
        o = r * cols
        s = _row_sum(y, o, cols)
        m = _row_max(x, o, cols)  # numpy's order: (x - m) - log(sum)
        shift = np.float32(np.log(s))
        for k in range(cols):
            y[uintp(o + k)] = (x[uintp(o + k)] - m) - shift


@jit
def _normalize(y, cols, r_lo, r_hi):  # pragma: no cover - compiled
    """The end of Softmax on rows r_lo..r_hi of y already shifted by their maximum: exp, then each row divided by
    its sum, in place (one array: the loops vectorize)."""
    _exp(y, r_lo * cols, r_hi * cols)
    for r in range(r_lo, r_hi):
        o = r * cols
        s = _row_sum(y, o, cols)
        for k in range(cols):
            y[uintp(o + k)] = y[uintp(o + k)] / s


@jit
def _short_rows(x, y, cols, r_lo, r_hi, log):  # pragma: no cover - compiled
    """`_rows` for rows shorter than SHORT_ROW, each pass a loop over the rows (column by column): a loop over a
    row of 4 costs more to enter than to run (768 rows of 4 took 16 us row by row, 3 so)."""
    n = r_hi - r_lo
    m = np.empty(n, np.float32)
    s = np.zeros(n, np.float32)
    o = r_lo * cols
    for r in range(n):
        m[uintp(r)] = x[uintp(o + r * cols)]
    for k in range(1, cols):
        for r in range(n):
            v = x[uintp(o + r * cols + k)]
            m[uintp(r)] = v if v > m[uintp(r)] else m[uintp(r)]
    for k in range(cols):
        for r in range(n):
            y[uintp(o + r * cols + k)] = x[uintp(o + r * cols + k)] - m[uintp(r)]
    _exp(y, o, o + n * cols)
    for k in range(cols):  # a column at a time: each row's sum in its own order, k = 0, 1, ...
        for r in range(n):
            s[uintp(r)] += y[uintp(o + r * cols + k)]
    if log:
        for r in range(n):
            s[uintp(r)] = np.float32(np.log(s[uintp(r)]))
        for k in range(cols):
            for r in range(n):
                y[uintp(o + r * cols + k)] = (x[uintp(o + r * cols + k)] - m[uintp(r)]) - s[uintp(r)]
    else:
        for k in range(cols):
            for r in range(n):
                y[uintp(o + r * cols + k)] = y[uintp(o + r * cols + k)] / s[uintp(r)]


def _shape_of(ctx: Any) -> tuple[Any, ...] | None:
    t = ctx.input_types[0] if ctx.input_types else None
    return None if t is None or t.shape is None else tuple(t.shape)


def _last_axis(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 of known rank, rows along the last axis (opset 13 on); before 13 any axis is rows of the 2-D
    coercion."""
    shape = _shape_of(ctx)
    if not is_float32(ctx) or shape is None or not shape:
        return False
    if ctx.opset < 13:
        return -len(shape) <= attrs.get("axis", 1) <= len(shape)
    return attrs.get("axis", -1) % len(shape) == len(shape) - 1


def _factory(log: bool, coerced: bool) -> Any:
    """The run callable's factory: rows of the last axis, or (``coerced``) of the 2-D coercion at ``axis``."""

    def make(ctx, *, axis=1 if coerced else -1):
        _rows(readonly(np.zeros(1, np.float32)), np.zeros(1, np.float32), 1, 0, 1, log)  # compile at build
        if team.available():
            _drive(readonly(np.zeros(1, np.float32)), np.zeros(1, np.float32), 1, 1, log, 1)
        cuts: dict[tuple[int, ...], tuple[int, int, bool]] = {}

        def cut(shape: tuple[int, ...]) -> tuple[int, int, bool]:
            """(cols, rows, whether they stay on this thread whatever the threads): once per shape."""
            start = axis % len(shape) if coerced and shape else len(shape) - 1
            cols = math.prod(shape[start:]) if shape else 1
            rows = math.prod(shape) // cols  # (x has elements: cols > 0)
            return cols, rows, rows < 2 or rows * cols < min(TEAM_SPLIT_ELEMENTS, SPLIT_ELEMENTS)

        def run(x, *, out=None):
            fits = out is not None and out.flags.c_contiguous and not (log and np.may_share_memory(x, out))
            y = out if fits else np.empty(x.shape, np.float32)
            if x.size:
                cols, rows, alone = cuts.get(x.shape) or cuts.setdefault(x.shape, cut(x.shape))
                flat, yf = readonly(contiguous(x)).reshape(-1), y.reshape(-1)
                if alone:  # a small head's rows (most Softmax nodes): no thread or team to ask
                    _rows(flat, yf, cols, 0, rows, log)
                else:
                    _spread(flat, yf, cols, rows, log)
            if out is not None and y is not out:
                np.copyto(out, y)
                return out
            return y

        return run

    return make


@jit(parallel=True)
def _drive(x, y, cols, rows, log, parts):  # pragma: no cover - compiled
    """`_rows` over ``parts`` contiguous shares of the rows on a native team (team.py)."""
    for t in prange(parts):
        _rows(x, y, cols, rows * t // parts, rows * (t + 1) // parts, log)


def _team(rows: int, cols: int, least: int) -> int:
    """The native team to split these rows over (from ``least`` elements), or 1. Asked only where they would split:
    it claims the run's threads (team.py)."""
    return team.size() if rows > 1 and rows * cols >= least else 1


def _spread(x: np.ndarray, y: np.ndarray, cols: int, rows: int, log: bool) -> None:
    """The rows in one call, or in blocks of whole rows over the threads: a native team's from TEAM_SPLIT_ELEMENTS
    on, else parallel_for's from SPLIT_ELEMENTS on."""
    size = _team(rows, cols, TEAM_SPLIT_ELEMENTS)
    if size > 1:
        _drive(x, y, cols, rows, log, min(size, rows))
        return
    if rows * cols < SPLIT_ELEMENTS or rows < 2 or intra_op_threads() < 2:
        _rows(x, y, cols, 0, rows, log)
        return
    per = max(1, ROWS_BLOCK // cols)
    parallel_for(-(-rows // per), lambda lo, hi: _rows(x, y, cols, lo * per, min(rows, hi * per), log))


# out=: the numpy kernels' declaration, so the core times the two per shape; not in place: the compiled loops read
# x and write y, which numba runs unvectorized when the two overlap
def _declare(op_type: str, since: int, log: bool) -> Any:
    coerced = since < 13
    make = _factory(log, coerced)
    make.__name__ = f"{op_type.lower()}_{since}"
    make.__qualname__ = make.__name__
    make.__doc__ = (f"{op_type}-{since} (float32): " + ("rows of the 2-D coercion at axis" if coerced
                    else "rows of the last axis") + ", compiled.")
    return kernel(op_type, since=since, priority=PRIORITY, prepare=True, out=True, views=False,
                  applies=_last_axis)(make)


# ---- LayerNormalization ------------------------------------------------------------------------------------


@jit
def _row_squares(y, o, cols):  # pragma: no cover - compiled
    """The sum of squares of y[o:o + cols] in four partial sums."""
    s0 = s1 = s2 = s3 = _ZERO
    k = 0
    while k + 4 <= cols:
        a, b, c, d = y[uintp(o + k)], y[uintp(o + k + 1)], y[uintp(o + k + 2)], y[uintp(o + k + 3)]
        s0 += a * a
        s1 += b * b
        s2 += c * c
        s3 += d * d
        k += 4
    while k < cols:
        a = y[uintp(o + k)]
        s0 += a * a
        k += 1
    return (s0 + s1) + (s2 + s3)


@jit
def _norm_rows(x, y, mean, inv, g, c, shift, eps, cols, r_lo, r_hi):  # pragma: no cover - compiled
    """LayerNormalization of flat rows r_lo..r_hi of x into y (which may be x): d = x - mean, y = d * inv * g
    (+ c when ``shift``), inv = 1 / sqrt(mean(d * d) + eps), as the numpy kernel orders it."""
    n = np.float32(cols)
    for r in range(r_lo, r_hi):
        o = r * cols
        m = _row_sum(x, o, cols) / n
        for k in range(cols):
            y[uintp(o + k)] = x[uintp(o + k)] - m
        v = _row_squares(y, o, cols) / n + eps
        iv = _ONE / np.sqrt(v)
        if shift:
            for k in range(cols):
                y[uintp(o + k)] = y[uintp(o + k)] * iv * g[uintp(k)] + c[uintp(k)]
        else:
            for k in range(cols):
                y[uintp(o + k)] = y[uintp(o + k)] * iv * g[uintp(k)]
        mean[uintp(r)] = m
        inv[uintp(r)] = iv


def _norm_applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 x of known rank with a float32 stash (the default), scale and bias float32 when known."""
    shape = _shape_of(ctx)
    return (is_float32(ctx) and shape is not None and len(shape) > 0 and attrs.get("stash_type", 1) == 1
            and all(t is None or t.dtype == np.float32 for t in ctx.input_types[1:]))


def _row_param(p: np.ndarray | None, inner: tuple[int, ...]) -> np.ndarray | None:
    """A scale or bias as one contiguous float32 row of the normalized shape (None stays None)."""
    if p is None:
        return None
    p = np.asarray(p, np.float32)
    return readonly(np.ascontiguousarray(np.broadcast_to(p, inner)).reshape(-1))


@kernel("LayerNormalization", since=17, priority=PRIORITY, prepare=True, out=True, views=False,
        applies=_norm_applies)
def layer_normalization(ctx, *, axis=-1, epsilon=1e-5, stash_type=1):
    """LayerNormalization-17 (float32): the rows of axes [axis, rank) in one compiled pass each; also Mean and
    InvStdDev."""
    one = readonly(np.ones(1, np.float32))
    _norm_rows(one, np.zeros(1, np.float32), np.zeros(1, np.float32), np.zeros(1, np.float32), one, one, True,
               np.float32(epsilon), 1, 0, 1)  # compile at build
    if team.available():
        _drive_norm(one, np.zeros(1, np.float32), np.zeros(1, np.float32), np.zeros(1, np.float32), one, one, True,
                    np.float32(epsilon), 1, 1, 1)
    consts = tuple(ctx.constants) + (None, None, None)
    eps = np.float32(epsilon)
    plans: dict[tuple[tuple[int, ...], ...], Any] = {}

    def plan(key: tuple[Any, ...]) -> Any:
        shape = key[0]
        a = axis % len(shape)
        inner = shape[a:]
        fixed = [_row_param(consts[i], inner) if consts[i] is not None else None for i in (1, 2)]
        return math.prod(shape[:a]), math.prod(inner), shape[:a] + (1,) * len(inner), inner, fixed

    def run(x, scale, b=None, *, out=None):
        key = (x.shape, scale.shape, None if b is None else b.shape)
        found = plans.get(key)
        if found is None:
            found = plans[key] = plan(key)
        rows, cols, stat, inner, (g, c) = found
        g = _row_param(scale, inner) if g is None else g
        c = (_row_param(b, inner) if b is not None else one) if c is None else c
        y = out if out is not None and out.flags.c_contiguous else np.empty(x.shape, np.float32)
        mean, inv = np.empty(rows, np.float32), np.empty(rows, np.float32)
        if x.size:
            flat = readonly(x if x.flags.c_contiguous else np.ascontiguousarray(x)).reshape(-1)
            _norm_spread(flat, y.reshape(-1), mean, inv, g, c, b is not None, eps, cols, rows)
        if out is not None and y is not out:
            np.copyto(out, y)
            y = out
        return y, mean.reshape(stat), inv.reshape(stat)

    return run


@jit(parallel=True)
def _drive_norm(x, y, mean, inv, g, c, shift, eps, cols, rows, parts):  # pragma: no cover - compiled
    """`_norm_rows` over ``parts`` contiguous shares of the rows on a native team (team.py)."""
    for t in prange(parts):
        _norm_rows(x, y, mean, inv, g, c, shift, eps, cols, rows * t // parts, rows * (t + 1) // parts)


def _norm_spread(x, y, mean, inv, g, c, shift, eps, cols, rows) -> None:
    """The rows in one call, or in blocks of whole rows over the threads (as `_spread`)."""
    size = _team(rows, cols, TEAM_SPLIT_NORM)
    if size > 1:
        _drive_norm(x, y, mean, inv, g, c, shift, eps, cols, rows, min(size, rows))
        return
    if rows * cols < SPLIT_ELEMENTS or rows < 2 or intra_op_threads() < 2:
        _norm_rows(x, y, mean, inv, g, c, shift, eps, cols, 0, rows)
        return
    per = max(1, ROWS_BLOCK // cols)
    parallel_for(-(-rows // per), lambda lo, hi: _norm_rows(x, y, mean, inv, g, c, shift, eps, cols, lo * per,
                                                            min(rows, hi * per)))


softmax_13 = _declare("Softmax", 13, False)
softmax_1 = _declare("Softmax", 1, False)
log_softmax_13 = _declare("LogSoftmax", 13, True)
log_softmax_1 = _declare("LogSoftmax", 1, True)
KERNELS = [softmax_13, softmax_1, log_softmax_13, log_softmax_1, layer_normalization]
