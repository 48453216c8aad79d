"""onnxruntime's com.microsoft QLinearSoftmax over the last axis in one compiled pass per row (minfer-ops-conv's numpy
kernel spends ~10 passes, an int64 copy and a cumulative sum: 0.45 ms of a 3.3 ms quantized transformer block).

The numpy kernel's operations (qlinear.py there), in its order, so the same bits: per row, ``e = T[x - max(x) + 255]``
with T the float32 table of ``exp((d + shift) * x_scale)`` computed in float64 (`exp_table`, the same expression),
the row's float32 sum from left to right, then ``rint((e * inv) / sum) + y_zp`` saturated, ``inv = floor(1 / y_scale)``
in float32. The sum is finite by the shift's choice and at least the row maximum's entry, so the quotient is never
NaN; it may be infinite or huge (short rows), which saturates, as in numpy. Round half to even by adding and taking
away 1.5 * 2**23 (exact below 2**22; above, the output saturates either way).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import kernel

from . import team
from ._jit import PRIORITY, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)
from .team import prange  # noqa: F401 (rebound to numba's at compile)

MS = "com.microsoft"
EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
_ROUNDER = np.float32(1.5 * 2**23)
_EXACT = np.float32(2**22)


LANES = 16  # rows summed side by side, one per vector lane


@jit
def _softmax(x, table, out, inv, zp, lo, hi, e, et, total):  # pragma: no cover - compiled
    """out[r] = saturate(rint((T[x[r] - max(x[r]) + 255] * inv) / sum) + zp) for each row r of x, out (rows, n).

    Rows go LANES at a time: their table entries are gathered into ``e`` (LANES, n) and its transpose ``et`` (n,
    LANES), whose rows add up side by side, each row's sum still from left to right (a sum a row at a time is one
    chain of dependent adds: it ran at ~1 element per 4 cycles); the quotients are taken from ``e``'s rows, a
    loop that vectorizes. ``total``: LANES floats of scratch."""
    rows, n = x.shape
    zero = np.float32(0)
    for r0 in range(0, rows, LANES):
        k = min(LANES, rows - r0)
        for i in range(k):
            r = uintp(r0 + i)
            m = np.intp(x[r, 0])
            for j in range(1, n):
                m = max(m, np.intp(x[r, uintp(j)]))
            base = 255 - m
            for j in range(n):
                v = table[uintp(np.intp(x[r, uintp(j)]) + base)]
                e[uintp(i), uintp(j)] = v
                et[uintp(j), uintp(i)] = v
        for j in range(n):  # the last group's unused lanes: zeros, not whatever the scratch held
            for i in range(k, LANES):
                et[uintp(j), uintp(i)] = zero
        for i in range(LANES):
            total[uintp(i)] = zero
        for j in range(n):
            for i in range(LANES):
                total[uintp(i)] += et[uintp(j), uintp(i)]
        for i in range(k):
            t = total[uintp(i)]
            for j in range(n):
                v = (e[uintp(i), uintp(j)] * inv) / t
                q = hi if v > _EXACT else ((v + _ROUNDER) - _ROUNDER) + zp
                out[uintp(r0 + i), uintp(j)] = lo if q < lo else (hi if q > hi else q)


@jit(parallel=True)
def _softmax_team(x, table, out, inv, zp, lo, hi, e, et, total):  # pragma: no cover - compiled
    """`_softmax` over a native team (team.py): team thread t takes part t of the groups of LANES rows, with
    scratch e[t], et[t], total[t]. Each row as alone: the same bits."""
    rows, parts = x.shape[0], e.shape[0]
    groups = (rows + LANES - 1) // LANES
    for t in prange(parts):
        r0, r1 = min(groups * t // parts * LANES, rows), min(groups * (t + 1) // parts * LANES, rows)
        if r1 > r0:
            _softmax(x[r0:r1], table, out[r0:r1], inv, zp, lo, hi, e[t], et[t], total[t])


TEAM_ROWS = 4 * LANES  # rows from which a native team shares the rows (4x128x128, alone: 81 -> 58 us)


def exp_table(x_scale: Any, reduce_len: int) -> np.ndarray:
    """float32 exp((d + shift) * x_scale) for d in -255..0, in float64, shift = max(0, log(FLT_MAX / reduce_len) - 5)
    in units of x: the numpy kernel's table (onnxruntime's)."""
    xs = float(np.float32(np.asarray(x_scale).reshape(-1)[0]))
    shift = max(0.0, float(np.log(float(np.finfo(np.float32).max) / reduce_len)) - 5.0) / xs
    return np.exp((np.arange(-255, 1, dtype=np.float64) + shift) * xs).astype(np.float32)


def _scratch(n: int, parts: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`_softmax`'s scratch for rows of n: e (LANES, n), et (n, LANES), total (LANES,); with ``parts``, one each
    for that many team threads (a leading axis)."""
    lead = (parts,) if parts else ()
    return (np.empty(lead + (LANES, n), np.float32), np.empty(lead + (n, LANES), np.float32),
            np.empty(lead + (LANES,), np.float32))


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """8-bit X of known rank, over its last axis (as every opset reads it there), an 8-bit zero point if any."""
    types = tuple(ctx.input_types) + (None,) * 5
    x, zp = types[0], types[4]
    if x is None or x.dtype not in EIGHT_BIT or x.rank is None or x.rank < 1:
        return False
    if zp is not None and zp.dtype != x.dtype:
        return False
    return int(attrs.get("axis", -1)) % x.rank == x.rank - 1


@kernel("QLinearSoftmax", domain=MS, since=1, priority=PRIORITY, prepare=True, applies=_applies, views=False)
def qlinear_softmax(ctx, *, axis=-1, opset):
    """QLinearSoftmax-1 (com.microsoft; over the last axis): one compiled pass per row."""
    dtype = ctx.input_types[0].dtype
    info = np.iinfo(dtype)
    lo, hi = np.float32(info.min), np.float32(info.max)
    _softmax(readonly(np.zeros((1, 1), dtype)), readonly(np.ones(256, np.float32)), np.zeros((1, 1), dtype),
             np.float32(1), np.float32(0), lo, hi, *_scratch(1))  # compile (or load) at build
    if team.available():  # the team's driver too: compiled in a timed run, it would lose the core's timing
        _softmax_team(readonly(np.zeros((1, 1), dtype)), readonly(np.ones(256, np.float32)), np.zeros((1, 1), dtype),
                      np.float32(1), np.float32(0), lo, hi, *_scratch(1, 1))
    tables: dict[tuple[float, int], np.ndarray] = {}

    def run(x, x_scale, x_zero_point=None, y_scale=None, y_zero_point=None):
        n = x.shape[-1] if x.ndim else 1
        key = (float(np.asarray(x_scale).reshape(-1)[0]), n)
        table = tables.get(key)
        if table is None:
            if len(tables) > 16:
                tables.clear()
            table = tables[key] = readonly(exp_table(x_scale, n))
        out = np.empty(x.shape, dtype)
        if not x.size:
            return out
        inv = np.floor(np.float32(1.0) / np.float32(np.asarray(y_scale).reshape(-1)[0]))
        zp = np.float32(0) if y_zero_point is None else np.float32(np.asarray(y_zero_point).reshape(-1)[0])
        rows = readonly(np.ascontiguousarray(x)).reshape(-1, n)
        parts = min(team.size(), rows.shape[0] // LANES) if rows.shape[0] >= TEAM_ROWS else 1
        if parts > 1:
            _softmax_team(rows, table, out.reshape(-1, n), inv, zp, lo, hi, *_scratch(n, parts))
        else:
            _softmax(rows, table, out.reshape(-1, n), inv, zp, lo, hi, *_scratch(n))
        return out

    return run
