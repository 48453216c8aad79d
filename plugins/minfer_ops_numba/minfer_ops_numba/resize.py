"""Resize-11/13/18/19 of float32 NCHW by linear interpolation of H and W (or nearest): one compiled pass per plane.

The numpy kernel resamples one axis at a time with a gather (np.take) and a
weighted sum over the gathered copy: several passes over the output and
temporaries as large (1x64x56x56 to 112x112: 15 ms). Compiled, each output
row is made from two input rows combined into a row buffer, then each output
takes its two taps from it: the same arithmetic in the same order (H first,
then W; float32 weights), so the same bits, in one pass (0.6 ms).

The tables (source indices and weights per output row and column) follow the
ONNX rules as minfer-ops-conv computes them, worked out once per input shape.
Where a native team runs (team.py), the planes are split over numba's threads
by a compiled driver (`_drive`) instead of parallel_for, from TEAM_SPLIT_ELEMENTS
outputs on: the same loop on each share, so the same bits, and a hand-over of
about a microsecond against parallel_for's ~60 us.
Nearest takes the same pass with one tap an axis (the same coordinates,
rounded by the numpy kernel's rules, `ROUNDING`: the same cells copied) up to
NEAREST_MAX outputs: there the numpy kernel's Python and its two np.repeat
or np.take calls cost more than the copy (a detector's 1x16x8x8 to 16x16,
in the model: 6.6 us against 3.9); larger ones stay with it, its np.take per
axis as fast as a compiled gather (1x256x20x20 to 40x40: 233 us against 247).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minfer_core import intra_op_threads, kernel, parallel_for

from . import team
from ._jit import PRIORITY, is_float32, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)
from .team import prange  # noqa: F401 (the driver's, compiled)

COORDINATES = ("half_pixel", "asymmetric", "align_corners", "pytorch_half_pixel")
SPLIT_ELEMENTS = 1 << 20  # from this many outputs (~500 us here) the planes go over the intra-op threads
# the same over a native team (team.py: a hand-over of a few us): measured, one thread against a team of two (loaded
# host), x2 linear 39 -> 24 us at 51k outputs, 140 -> 74 at 201k, and no faster at 16k (14.0 -> 14.4)
TEAM_SPLIT_ELEMENTS = 1 << 15
NEAREST_MAX = 1 << 16  # outputs up to which a nearest Resize is this kernel's (see the module docstring)
ROUNDING = {"round_prefer_floor": lambda x: np.ceil(x - 0.5), "round_prefer_ceil": lambda x: np.floor(x + 0.5),
            "floor": np.floor, "ceil": np.ceil}  # nearest_mode: ONNX's rules, as the numpy kernel rounds


@jit
def _planes(x, y, i0, i1, w0, w1, lin_h, j0, j1, v0, v1, lin_w, p0, p1):  # pragma: no cover - compiled
    """Planes p0..p1 of y (P, OH, OW) from x (P, H, W): row oy from input rows i0/i1[oy] (weights w0/w1, or row
    i0 alone when not ``lin_h``), column ox from columns j0/j1[ox] (v0/v1, or j0 alone)."""
    width = x.shape[2]
    oh, ow = y.shape[1], y.shape[2]
    t = np.empty(width, np.float32)
    for p in range(p0, p1):
        for oy in range(oh):
            a, b = x[p, i0[oy]], x[p, i1[oy]]
            if lin_h:
                wa, wb = w0[oy], w1[oy]
                for k in range(width):
                    t[uintp(k)] = a[uintp(k)] * wa + b[uintp(k)] * wb
            row = y[p, oy]
            if lin_w:
                src = t if lin_h else a
                for ox in range(ow):
                    row[uintp(ox)] = src[uintp(j0[ox])] * v0[ox] + src[uintp(j1[ox])] * v1[ox]
            else:
                src = t if lin_h else a
                for ox in range(ow):
                    row[uintp(ox)] = src[uintp(j0[ox])]


@jit(parallel=True)
def _drive(x, y, i0, i1, w0, w1, lin_h, j0, j1, v0, v1, lin_w, parts):  # pragma: no cover - compiled
    """`_planes` over ``parts`` contiguous shares of the planes on a native team (team.py)."""
    count = x.shape[0]
    for t in prange(parts):
        _planes(x, y, i0, i1, w0, w1, lin_h, j0, j1, v0, v1, lin_w, count * t // parts, count * (t + 1) // parts)


def _coordinates(mode: str, out_len: int, in_len: int, scale: float) -> np.ndarray:
    """Output positions as (fractional) input coordinates, as ONNX defines each coordinate_transformation_mode
    (align_corners and pytorch_half_pixel measure the resized length as in_len * scale)."""
    y = np.arange(out_len, dtype=np.float64)
    length = in_len * scale
    if abs(length - out_len) < 1e-6 * max(1, out_len):
        length = out_len  # scales derived from sizes: undo the rounding of in * (out / in)
    if mode == "asymmetric":
        return y / scale
    if mode == "align_corners":
        return np.zeros(out_len) if length == 1 else y * (in_len - 1) / (length - 1)
    if mode == "pytorch_half_pixel" and length == 1:
        return np.zeros(out_len)
    return (y + 0.5) / scale - 0.5  # half_pixel, pytorch_half_pixel


def _axis(in_len: int, out_len: int, scale: float, coordinates: str, nearest: str | None = None) -> tuple:
    """(i0, i1, w0, w1, linear) for one axis: source indices and float32 weights per output position; by
    ``nearest`` (a nearest_mode) one tap, the coordinate rounded so and clipped to the axis."""
    if nearest:  # one tap, as the numpy kernel takes it (an axis it skips, scale 1, comes out as the same copy)
        x = ROUNDING[nearest](_coordinates(coordinates, out_len, in_len, scale))
        idx = np.clip(x, 0, in_len - 1).astype(np.int64)
        return idx, idx, np.ones(out_len, np.float32), np.zeros(out_len, np.float32), False
    if scale == 1.0 and out_len == in_len:  # an axis left as it is (the numpy kernel skips it): copied
        idx = np.arange(in_len, dtype=np.int64)
        return idx, idx, np.ones(in_len, np.float32), np.zeros(in_len, np.float32), False
    x = _coordinates(coordinates, out_len, in_len, scale)
    base = np.floor(x)
    frac = x - base
    whole = frac == 0  # on a sample: the taps are (left, it) with weights (0, 1)
    base = np.where(whole, base - 1, base).astype(np.int64)
    frac = np.where(whole, 1.0, frac)
    w0, w1 = np.clip(1 - np.abs(frac), 0, 1), np.clip(1 - np.abs(1 - frac), 0, 1)
    i0, i1 = np.clip(base, 0, in_len - 1), np.clip(base + 1, 0, in_len - 1)
    return i0, i1, w0.astype(np.float32), w1.astype(np.float32), True


def _targets(shape: tuple[int, ...], scales: np.ndarray | None, sizes: np.ndarray | None) -> list[tuple[int, float]]:
    """(output length, scale) of H and W, from sizes when given, else from scales."""
    if sizes is not None and sizes.size:
        return [(int(sizes[a]), int(sizes[a]) / shape[a]) for a in (2, 3)]
    return [(int(math.floor(shape[a] * float(scales[a]))), float(scales[a])) for a in (2, 3)]


def applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 NCHW by linear, or nearest up to NEAREST_MAX outputs (no antialias, exclude_outside or axes, the
    coordinate modes above), with constant scales or sizes that keep N and C."""
    mode = attrs.get("mode", "nearest")
    if not is_float32(ctx, 0, rank=4) or mode not in ("linear", "nearest"):
        return False
    if mode == "nearest" and (attrs.get("nearest_mode", "round_prefer_floor") not in ROUNDING
                              or not _small(ctx.input_types[0].shape, ctx.constants)):
        return False
    if attrs.get("coordinate_transformation_mode", "half_pixel") not in COORDINATES:
        return False
    if attrs.get("antialias", 0) or attrs.get("exclude_outside", 0) or attrs.get("axes"):
        return False
    if attrs.get("keep_aspect_ratio_policy", "stretch") != "stretch":
        return False
    consts = tuple(ctx.constants) + (None,) * 4
    scales, sizes = consts[2], consts[3]
    if sizes is not None and sizes.size:
        return sizes.size == 4 and tuple(int(v) for v in sizes[:2]) == tuple(ctx.input_types[0].shape[:2])
    return scales is not None and scales.size == 4 and float(scales[0]) == float(scales[1]) == 1.0


def _small(shape: Any, constants: Any) -> bool:
    """Whether a Resize of this input shape (static) has at most NEAREST_MAX outputs."""
    consts = tuple(constants) + (None,) * 4
    if shape is None or not all(isinstance(d, int) for d in shape) or (consts[2] is None and consts[3] is None):
        return False
    try:
        (oh, _), (ow, _) = _targets(tuple(shape), consts[2], consts[3])
    except (IndexError, TypeError, ValueError):  # scales or sizes of another length: `applies` refuses them
        return False
    return shape[0] * shape[1] * oh * ow <= NEAREST_MAX


def _resize(ctx: Any, coordinates: str, nearest: str | None = None) -> Any:
    """The run callable: tables per input shape, then `_planes` over units of planes (``nearest``: its rounding)."""
    consts = tuple(ctx.constants) + (None,) * 4
    scales, sizes = consts[2], consts[3]
    plans: dict[tuple[int, ...], Any] = {}
    one, zero = readonly(np.ones(1, np.float32)), readonly(np.zeros(1, np.float32))
    at = readonly(np.zeros(1, np.int64))
    _planes(readonly(np.zeros((1, 1, 1), np.float32)), np.zeros((1, 1, 1), np.float32),
            at, at, one, zero, True, at, at, one, zero, True, 0, 1)  # compile at build
    if team.available():
        _drive(readonly(np.zeros((1, 1, 1), np.float32)), np.zeros((1, 1, 1), np.float32),
               at, at, one, zero, True, at, at, one, zero, True, 1)

    def plan(shape: tuple[int, ...]) -> Any:
        (oh, sh), (ow, sw) = _targets(shape, scales, sizes)
        tables = _axis(shape[2], oh, sh, coordinates, nearest) + _axis(shape[3], ow, sw, coordinates, nearest)
        tables = tuple(readonly(t) if isinstance(t, np.ndarray) else t for t in tables)
        planes = shape[0] * shape[1]
        parts = None if planes * oh * ow >= SPLIT_ELEMENTS and intra_op_threads() > 1 else 1
        return (oh, ow), tables, parts

    def run(x, roi=None, scales_=None, sizes_=None, *, out=None):
        key = x.shape + (intra_op_threads(),)
        if key not in plans:
            plans[key] = plan(x.shape)
        (oh, ow), tables, parts = plans[key]
        y = out if out is not None else np.empty(x.shape[:2] + (oh, ow), np.float32)
        if y.size == 0:
            return y
        src = readonly(np.ascontiguousarray(x)).reshape((-1,) + x.shape[2:])
        dst = y.reshape(-1, oh, ow)
        # the team is asked only where the planes split over it: asking claims the run's threads (team.py)
        size = team.size() if len(src) > 1 and y.size >= TEAM_SPLIT_ELEMENTS else 1
        if size > 1:
            _drive(src, dst, *tables, min(size, len(src)))
            return y
        parallel_for(len(src), lambda lo, hi: _planes(src, dst, *tables, lo, hi), parts=parts)
        return y

    return run


@kernel("Resize", since=11, priority=PRIORITY, prepare=True, out=True, views=False, applies=applies)
def resize_11(ctx, *, coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
              extrapolation_value=0.0, mode="nearest", nearest_mode="round_prefer_floor"):
    """Resize-11/13: linear or nearest of H and W (see `applies`)."""
    return _resize(ctx, coordinate_transformation_mode, nearest_mode if mode == "nearest" else None)


@kernel("Resize", since=18, priority=PRIORITY, prepare=True, out=True, views=False, applies=applies)
def resize_18(ctx, *, antialias=0, axes=None, coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75,
              exclude_outside=0, extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
              nearest_mode="round_prefer_floor"):
    """Resize-18/19: linear or nearest of H and W (see `applies`)."""
    return _resize(ctx, coordinate_transformation_mode, nearest_mode if mode == "nearest" else None)
