"""minfer-passes' ``ai.minfer::ChannelAffine`` (float32): act(X * S + B) per channel in one compiled pass.

The numpy kernel multiplies, adds and activates chunk by chunk in cache (three or four numpy calls a
chunk); this is one pass, with the same float32 operations in the same order (the product rounded, then
the sum: no fused multiply-add), so the results are the same bits. The activations taken are the
numpy kernel's Relu (NaN kept, like np.maximum), Clip (np.clip's order) and LeakyRelu; others stay with
numpy (`applies`). In place (X's memory is the output's) a single-array loop runs: numba's two-array
loop checks its operands for overlap and runs unvectorized when they do. Where a native team runs (team.py),
rows from TEAM_SPLIT elements on are split over numba's threads by a compiled driver (`_drive`), the same
loops on each share (so the same bits), instead of parallel_for (a hand-over of ~1 us against ~60).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minfer_core import kernel, parallel_for

from . import team
from ._jit import PRIORITY, is_float32, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)
from .team import prange  # noqa: F401 (the driver's, compiled)

ACTS = {"": 0, "Relu": 1, "Clip": 2, "LeakyRelu": 3}
SPLIT = 1 << 20  # elements from which rows go over the intra-op threads (the numpy kernel's threshold)
ROWS_PER_PART = 64
# the same over a native team (team.py), whose hand-over costs a few microseconds: activation.py's bound (a pass as
# cheap; elementwise.py's measured the same)
TEAM_SPLIT = 1 << 17


@jit
def _value(v, sc, bc, scaled, act, p0, p1):  # pragma: no cover - compiled
    """act(v * sc + bc) (v + bc when not scaled), in the numpy kernel's order: the product rounded, then the sum."""
    if scaled:
        v = v * sc
    v = v + bc
    if act == 1:
        v = v if (v >= 0 or v != v) else np.float32(0)
    elif act == 2:
        v = v if (v >= p0 or v != v) else p0
        v = v if (v <= p1 or v != v) else p1
    elif act == 3:
        v = v * p0 if v < 0 else v
    return v


@jit
def _affine(x, y, s, b, channels, inner, act, p0, p1, r0, r1):  # pragma: no cover - compiled
    """Rows r0..r1 (a row: one channel of one image, ``inner`` values) of y = act(x * s + b); s empty: x + b."""
    scaled = s.size > 0
    for r in range(r0, r1):
        ch = r % channels
        sc = s[uintp(ch)] if scaled else np.float32(1)
        bc = b[uintp(ch)]
        base = r * inner
        for j in range(inner):
            y[uintp(base + j)] = _value(x[uintp(base + j)], sc, bc, scaled, act, p0, p1)


@jit
def _affine_in_place(y, s, b, channels, inner, act, p0, p1, r0, r1):  # pragma: no cover - compiled
    """`_affine` with y as its input and output."""
    scaled = s.size > 0
    for r in range(r0, r1):
        ch = r % channels
        sc = s[uintp(ch)] if scaled else np.float32(1)
        bc = b[uintp(ch)]
        base = r * inner
        for j in range(inner):
            y[uintp(base + j)] = _value(y[uintp(base + j)], sc, bc, scaled, act, p0, p1)


def _vectors(s: np.ndarray | None, b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """S (empty when absent) and B as the compiled loops take them: flat, float32, read-only."""
    sv = np.zeros(0, np.float32) if s is None else np.ascontiguousarray(s, dtype=np.float32).reshape(-1)
    return readonly(sv), readonly(np.ascontiguousarray(b, dtype=np.float32).reshape(-1))


def _params(activation: str, params: list[float]) -> tuple[np.float32, np.float32]:
    """The activation's two parameters as the numpy kernel reads them (Clip: lo, hi; LeakyRelu: alpha)."""
    if activation == "Clip":
        lo, hi = (params + [-math.inf, math.inf])[:2] if params else (-math.inf, math.inf)
        return np.float32(lo), np.float32(hi)
    if activation == "LeakyRelu":
        return np.float32(params[0] if params else 0.01), np.float32(0)
    return np.float32(0), np.float32(0)


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 X of rank 2 or more, and an activation this kernel computes (none, Relu, Clip, LeakyRelu)."""
    t = ctx.input_types[0] if ctx.input_types else None
    return (is_float32(ctx) and t.rank is not None and t.rank >= 2
            and (attrs.get("activation") or "") in ACTS)


@jit(parallel=True)
def _drive(src, dst, sv, bv, channels, inner, act, p0, p1, rows, same, parts):  # pragma: no cover - compiled
    """`_affine` (`_affine_in_place` on dst when ``same``) over ``parts`` contiguous shares of the rows on a native
    team (team.py)."""
    for t in prange(parts):
        r0, r1 = rows * t // parts, rows * (t + 1) // parts
        if same:
            _affine_in_place(dst, sv, bv, channels, inner, act, p0, p1, r0, r1)
        else:
            _affine(src, dst, sv, bv, channels, inner, act, p0, p1, r0, r1)


# inplace: each element is read before it is written
@kernel("ChannelAffine", domain="ai.minfer", since=1, priority=PRIORITY, prepare=True, out=True, inplace=(0,),
        views=False, applies=_applies)
def channel_affine(ctx, *, activation="", activation_params=None):
    """ai.minfer::ChannelAffine-1 (float32): act(X * S + B) per channel (axis 1) in one compiled pass."""
    act = ACTS[activation or ""]
    p0, p1 = _params(activation or "", [float(v) for v in (activation_params or [])])
    one = np.zeros(1, np.float32)
    s_const, b_const = (ctx.constants[i] if len(ctx.constants) > i else None for i in (1, 2))
    built = _vectors(s_const, b_const) if b_const is not None else None  # the node's constants, laid out once
    _affine(readonly(one), one.copy(), readonly(one), readonly(one), 1, 1, act, p0, p1, 0, 1)  # compile at build
    _affine_in_place(one.copy(), readonly(one), readonly(one), 1, 1, act, p0, p1, 0, 1)
    if team.available():
        _drive(readonly(one), one.copy(), readonly(one), readonly(one), 1, 1, act, p0, p1, 1, False, 1)

    def run(x, s, b, *, out=None):
        channels = x.shape[1]
        if (s is not None and s.size != channels) or b.size != channels:
            raise ValueError(f"ChannelAffine: X {list(x.shape)} needs S (or none) and B of one value per channel "
                             f"(axis 1); got {None if s is None else s.size} and {b.size}")
        y = np.empty(x.shape, np.float32) if out is None else out
        if x.size == 0:
            return y
        sv, bv = built if built is not None and s is s_const and b is b_const else _vectors(s, b)
        rows, inner = x.shape[0] * channels, x.size // (x.shape[0] * channels)
        dst = y.reshape(-1)
        overlap = np.may_share_memory(x, y)
        same = overlap and x.shape == y.shape and x.flags.c_contiguous and x.ctypes.data == y.ctypes.data
        # a partial overlap (never made by the engine) is read from a copy
        src = dst if same else readonly(np.array(x, order="C") if overlap else np.ascontiguousarray(x)).reshape(-1)

        # the team is asked only where the rows split over it: asking claims the run's threads (team.py)
        size = team.size() if rows > 1 and x.size >= TEAM_SPLIT else 1
        if size > 1:
            _drive(readonly(dst) if same else src, dst, sv, bv, channels, inner, act, p0, p1, rows, same,
                   min(size, rows))
            return y

        def part(lo: int, hi: int) -> None:
            r0, r1 = lo * ROWS_PER_PART, min(rows, hi * ROWS_PER_PART)
            if same:
                _affine_in_place(dst, sv, bv, channels, inner, act, p0, p1, r0, r1)
            else:
                _affine(src, dst, sv, bv, channels, inner, act, p0, p1, r0, r1)

        parts = -(-rows // ROWS_PER_PART)
        parallel_for(parts, part, parts=None if x.size >= SPLIT and parts > 1 else 1, outputs_only=True)
        return y

    return run
