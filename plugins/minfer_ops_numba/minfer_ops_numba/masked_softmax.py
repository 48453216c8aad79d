"""minfer-passes' ``ai.minfer::MaskedSoftmax`` (float32): attention's scale, padding mask and Softmax in one pass.

minfer-passes' kernel scales the scores with numpy into scratch, writes the mask's fill with four numpy passes
(bit masks), then calls the registered Softmax: about five passes over the scores. Here each row is scaled
(``x * scalar`` or ``x / scalar``, one float32 rounding as numpy's), masked (``fill`` where the mask holds) and
put through rows.py's Softmax loops in place, in one compiled call (the rows shared over a native team from
rows.py's TEAM_SPLIT_ELEMENTS): the values rows.py's Softmax computes from those scores, so the bits of
minfer-passes' kernel over this plugin's Softmax. An encoder's 4x128x128 scores, one thread: 78 -> 55 us
(the Softmax's own loops, 50 us, are most of it now; its exp takes 2^n from exponent bits since session 28).

The mask may be smaller than the scores (a key padding mask of (batch, 1, 1, keys)): each row of scores reads
the mask's row it broadcasts from (a table of offsets per shape) and, when the mask's last axis is 1, its one
element for the whole row.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import kernel

from . import team
from ._jit import F32, PRIORITY, input_type, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)
from .rows import SHORT_ROW, TEAM_SPLIT_ELEMENTS, _normalize, _row_max, _short_rows
from .team import prange  # noqa: F401 (the driver's, compiled)

OP = "MaskedSoftmax"
MUL, DIV, NO_OP = 0, 1, 2
NO_MASK = np.zeros(0, np.bool_)
NO_ROWS = np.zeros(0, np.int64)


@jit
def _masked_rows(x, cond, crow, cstep, y, cols, r_lo, r_hi, op, s, fill):  # pragma: no cover - compiled
    """Rows r_lo..r_hi of the flat scores x (``cols`` long) into y: scaled by ``s`` (``op``), ``fill`` where the
    mask holds (cond's row crow[r], its elements a step of ``cstep`` apart; no mask when cond is empty), then
    rows.py's Softmax in place (its loops, in its order)."""
    masked = cond.size > 0
    for r in range(r_lo, r_hi):
        o = r * cols
        c0 = crow[uintp(r)] if masked else 0
        for k in range(cols):
            v = x[uintp(o + k)]
            if op == MUL:
                v = v * s
            elif op == DIV:
                v = v / s
            if masked and cond[uintp(c0 + k * cstep)]:
                v = fill
            y[uintp(o + k)] = v
    if cols < SHORT_ROW:
        _short_rows(y, y, cols, r_lo, r_hi, False)
        return
    for r in range(r_lo, r_hi):  # rows.py's `_rows` on y itself: one array, so its loops vectorize in place
        o = r * cols
        m = _row_max(y, o, cols)
        for k in range(cols):
            y[uintp(o + k)] = y[uintp(o + k)] - m
    _normalize(y, cols, r_lo, r_hi)


@jit(parallel=True)
def _drive(x, cond, crow, cstep, y, cols, rows, op, s, fill, parts):  # pragma: no cover - compiled
    """`_masked_rows` over ``parts`` contiguous shares of the rows on a native team (team.py)."""
    for t in prange(parts):
        _masked_rows(x, cond, crow, cstep, y, cols, rows * t // parts, rows * (t + 1) // parts, op, s, fill)


def _mask_rows(shape: tuple[int, ...], cond_shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
    """(per row of the scores, the flat offset of its mask row; the step between a row's mask elements)."""
    offsets = np.arange(int(np.prod(cond_shape)), dtype=np.int64).reshape(cond_shape)
    crow = np.broadcast_to(offsets, shape)[..., 0].reshape(-1)
    return readonly(np.ascontiguousarray(crow)), int(cond_shape[-1] != 1) if cond_shape else 0


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 scores of known rank, a bool mask (if any) of known shape that broadcasts into them without growing
    them (each dim 1 or the scores' own), a scale by Mul, Div or none."""
    x = input_type(ctx)
    if x is None or x.dtype != F32 or x.shape is None or not x.shape or attrs.get("op", "") not in ("", "Mul", "Div"):
        return False
    if len(ctx.input_types) < 2 or ctx.input_types[1] is None:
        return True
    m = ctx.input_types[1]
    if m.dtype != np.bool_ or m.shape is None or len(m.shape) > len(x.shape):
        return False
    return all(d == 1 or d == e for d, e in zip(m.shape[::-1], x.shape[::-1]))


@kernel(OP, domain="ai.minfer", since=1, priority=PRIORITY, prepare=True, out=True, views=False, applies=_applies)
def masked_softmax(ctx, *, op="", scalar=None, fill=None):
    """ai.minfer::MaskedSoftmax-1 (float32): Softmax(Where(M, fill, X op scalar)) over the last axis, one pass."""
    code = {"Mul": MUL, "Div": DIV}.get(op, NO_OP)
    s = np.float32(0 if scalar is None else np.asarray(scalar).astype(np.float32))
    f = np.float32(0 if fill is None else np.asarray(fill).astype(np.float32))
    warm = (readonly(np.zeros(1, F32)), readonly(NO_MASK), readonly(NO_ROWS), 0, np.zeros(1, F32), 1)
    _masked_rows(*warm, 0, 1, code, s, f)  # compile (or load) at build
    if team.available():
        _drive(*warm, 1, code, s, f, 1)
    tables: dict[tuple[tuple[int, ...], tuple[int, ...]], tuple[np.ndarray, int]] = {}

    def table(shape: tuple[int, ...], cond_shape: tuple[int, ...]) -> tuple[np.ndarray, int]:
        """`_mask_rows` for these shapes, made (and the shapes checked) once."""
        found = tables.get((shape, cond_shape))
        if found is None:
            if np.broadcast_shapes(shape, cond_shape) != shape:
                raise ValueError(f"{OP}: the mask {cond_shape} would broadcast the scores {shape} larger")
            empty = 0 in shape  # no rows to read a mask for
            found = tables[(shape, cond_shape)] = (NO_ROWS, 0) if empty else _mask_rows(shape, cond_shape)
        return found

    def run(x, cond=None, *, out=None):
        crow, cstep = (NO_ROWS, 0) if cond is None else table(x.shape, cond.shape)
        y = out if out is not None and out.flags.c_contiguous else np.empty(x.shape, F32)
        if x.size:
            cols = x.shape[-1]
            rows = x.size // cols
            mask = NO_MASK if cond is None else readonly(np.ascontiguousarray(cond)).reshape(-1)
            flat = readonly(np.ascontiguousarray(x)).reshape(-1)
            size = team.size() if rows > 1 and x.size >= TEAM_SPLIT_ELEMENTS else 1
            if size > 1:
                _drive(flat, mask, crow, cstep, y.reshape(-1), cols, rows, code, s, f, min(size, rows))
            else:
                _masked_rows(flat, mask, crow, cstep, y.reshape(-1), cols, 0, rows, code, s, f)
        if out is not None and y is not out:
            np.copyto(out, y)
            return out
        return y

    return run


KERNELS = [masked_softmax]
