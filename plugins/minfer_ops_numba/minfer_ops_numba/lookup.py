"""minfer-passes' ``ai.minfer::Lookup`` in one compiled pass instead of the numpy kernel's six or seven.

``Lookup(X, T; scale, low, high)``: for 8-bit X, ``T[X - low]``; for float32 X,
``T[clip(rint(X / scale), low, high) - low]`` with NaN to ``T[high - low + 1]``
(minfer_passes.lookup, which makes it of a quantized model's GELU and other
elementwise chains). The index is the numpy kernel's: a float32 division by
``scale``, then the clip and the rounding half to even (which commute: the
bounds are integers). Where a native team runs (team.py), a tensor from
TEAM_SPLIT_ELEMENTS on is split over numba's threads by compiled drivers
(`_drive_grid`, `_drive_value`): the same loops on each share, so the same bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import intra_op_threads, kernel, parallel_for

from . import team
from ._jit import PRIORITY, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)
from .team import prange  # noqa: F401 (the drivers', compiled)

BLOCK = 1 << 16  # elements per parallel_for range
SPLIT_ELEMENTS = 1 << 18  # from this size the blocks go over the intra-op threads (a lookup is ~0.3 ns an element)
# the same over a native team (team.py: a hand-over of a few us): activation.py's bound, for a pass as cheap
TEAM_SPLIT_ELEMENTS = 1 << 17
LINE = 64  # a team's shares start on a multiple of this many elements: no cache line written by two threads
INDEXES = (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.float32))
_ROUNDER = np.float32(1.5 * 2**23)
CHUNK = 4096  # indexes computed ahead of their table reads (16 KB: in L1)


@jit
def _by_grid(x, table, y, scale, low, high, nan_index, lo, hi):  # pragma: no cover - compiled
    """y[i] = table[clip(rint(x[i] / scale), low, high) - low] over flat elements lo..hi; NaN to table[nan_index].

    In chunks: the indexes first, in a loop that vectorizes (the table read would keep it scalar), then the reads.
    """
    idx = np.empty(CHUNK, np.int32)
    for start in range(lo, hi, CHUNK):
        n = min(CHUNK, hi - start)
        for j in range(n):
            q = x[uintp(start + j)] / scale
            # clip, then round half to even by adding and taking away 1.5 * 2**23 (exact for |q| <= 2**22, which
            # the bounds ensure; numba's np.rint is a call per element): rint and clip to integers commute
            q = low if q < low else (high if q > high else q)
            idx[uintp(j)] = np.int32((q + _ROUNDER) - _ROUNDER - low) if q == q else nan_index
        for j in range(n):
            y[uintp(start + j)] = table[uintp(idx[uintp(j)])]


@jit
def _by_value(x, table, y, low, lo, hi):  # pragma: no cover - compiled
    """y[i] = table[x[i] - low] over flat elements lo..hi (8-bit x)."""
    for i in range(lo, hi):
        y[uintp(i)] = table[uintp(np.intp(x[uintp(i)]) - low)]


@jit(parallel=True)
def _drive_grid(x, table, y, scale, low, high, nan_index, parts):  # pragma: no cover - compiled
    """`_by_grid` over ``parts`` contiguous shares of the flat elements on a native team (team.py)."""
    n = x.size
    for t in prange(parts):
        lo, hi = n * t // parts // LINE * LINE, n if t == parts - 1 else n * (t + 1) // parts // LINE * LINE
        _by_grid(x, table, y, scale, low, high, nan_index, lo, hi)


@jit(parallel=True)
def _drive_value(x, table, y, low, parts):  # pragma: no cover - compiled
    """`_by_value` over ``parts`` contiguous shares of the flat elements on a native team (team.py)."""
    n = x.size
    for t in prange(parts):
        lo, hi = n * t // parts // LINE * LINE, n if t == parts - 1 else n * (t + 1) // parts // LINE * LINE
        _by_value(x, table, y, low, lo, hi)


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """8-bit or float32 X, a numeric table."""
    types = tuple(ctx.input_types) + (None, None)
    return (types[0] is not None and types[0].dtype in INDEXES and types[1] is not None
            and types[1].dtype.kind in "fiu")


@kernel("Lookup", domain="ai.minfer", since=1, priority=PRIORITY, prepare=True, out=True, views=False,
        applies=_applies)
def lookup(ctx, *, scale=0.0, low=0.0, high=0.0):
    """ai.minfer::Lookup-1 (8-bit or float32 X): the numpy kernel's table lookup in one compiled pass."""
    x_type, t_type = ctx.input_types[0], ctx.input_types[1]
    by_grid = x_type.dtype == np.float32
    s, lo_f, hi_f = np.float32(scale), np.float32(low), np.float32(high)
    nan_index, low_i = np.int32(high - low + 1), int(low)

    def span(x: np.ndarray, table: np.ndarray, y: np.ndarray, lo: int, hi: int) -> None:
        if by_grid:
            _by_grid(x, table, y, s, lo_f, hi_f, nan_index, lo, hi)
        else:
            _by_value(x, table, y, low_i, lo, hi)

    def drive(x: np.ndarray, table: np.ndarray, y: np.ndarray, parts: int) -> None:
        if by_grid:
            _drive_grid(x, table, y, s, lo_f, hi_f, nan_index, parts)
        else:
            _drive_value(x, table, y, low_i, parts)

    size = int(high - low) + (2 if by_grid else 1)
    probe = readonly(np.zeros(1, x_type.dtype)), readonly(np.zeros(size, t_type.dtype)), np.zeros(1, t_type.dtype)
    span(*probe, 0, 1)  # compile (or load) at build
    if team.available():
        drive(*probe, 1)

    def run(x, table, *, out=None):
        y = out if out is not None else np.empty(x.shape, table.dtype)
        flat, t, dst = readonly(np.ascontiguousarray(x)).reshape(-1), readonly(table), y.reshape(-1)
        n = flat.size
        # the team is asked only where the tensor splits over it: asking claims the run's threads (team.py)
        parts = team.size() if n >= TEAM_SPLIT_ELEMENTS else 1
        if parts > 1:
            drive(flat, t, dst, parts)
            return y
        if n < SPLIT_ELEMENTS or intra_op_threads() < 2:
            span(flat, t, dst, 0, n)
            return y
        parallel_for(-(-n // BLOCK), lambda lo, hi: span(flat, t, dst, lo * BLOCK, min(n, hi * BLOCK)))
        return y

    return run
