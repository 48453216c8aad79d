"""Conv 3x3 at stride 1 (group 1, float32, constant weights) by Winograd F(2x2, 3x3), compiled end to end.

In F(2x2, 3x3) each 2x2 output tile takes a 4x4 input tile; in the transformed domain the conv is an elementwise
product, which summed over the input channels is one GEMM per transformed position: 16 GEMMs of
[M, C] x [C, tiles] where im2col makes one of [M, 9C] x [9C, 4 * tiles], 2.25x fewer multiply-adds (Lavin and
Gray, "Fast Algorithms for Convolutional Neural Networks"; minfer-ops-conv's winograd.py is the numpy form, whose
transforms are numpy passes over the whole image split over parallel_for). Here a unit, a band of one image's tile
rows, runs in one compiled call (`unit`): its input transform into a per-thread scratch (each channel's rows
through B^T first, a contiguous loop, then each tile's columns), the 16 GEMMs by numpy's BLAS called from compiled
code (`team.gemm`), the output transform into y's rows, then the fused op's epilogue on those rows
(`team.finish`: bias, residual, activation) while they are in cache. The units are cut from the shape alone, so
every thread count makes the same BLAS calls; on a native team each thread runs its share (`team_units`).

Not bit-identical to an im2col conv (other sums, in another order): within float32 rounding of the
transforms, as minfer-ops-conv's numpy Winograd. The core times this kernel against the others per node.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minfer_core import kernel, parallel_for, scratch, spmd

from . import team
from ._jit import F32, PRIORITY, is_float32, jit, readonly, uintp  # noqa: F401 (uintp: numba's type at compile)
from .smallconv import PLAN_PARTS, bordered  # noqa: F401 (bordered: compiled code calls it)
from .team import NOTHING, finish, prange  # noqa: F401 (compiled code calls them)
from .window import window

# G, the weight transform of F(2x2, 3x3) (B^T and A^T are written out in the loops below)
G = np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]])
# below these the transforms cost more than the multiplies they save (minfer-ops-conv's winograd.py measured the
# same bounds for its numpy form): the kernel does not offer itself
MIN_CHANNELS = 32
MIN_OUT_CHANNELS = 16
# a unit's transformed tiles and their products take at most this much: they stay in L2 (2 MB a core here) from the
# input transform through the GEMMs to the output transform. Measured on two threads (one-conv models, session 13):
# 64->64 at 56x56 413 us at 512 KB, 521 at 1 MB, 703 at 4 MB (onnxruntime 451); 128->128 at 28x28 508, 448, 388-508;
# the OCR detector's 96->24 at 80x80 565, 539 (im2col 1100, onnxruntime 705)
UNIT_BYTES = 512 << 10
# but at least this many tiles a unit: a GEMM [M, C] x [C, tiles] narrower than this ran far below BLAS's speed
# (512->512 at 7x7, 16 tiles an image, in units of 8 tiles: no faster than im2col)
MIN_TILES = 64


def transform_weights(w: np.ndarray) -> np.ndarray:
    """G g G^T of each (M, C) 3x3 filter, as a (16, M, C) float32 stack (computed in float64)."""
    out_c, in_c = w.shape[:2]
    u = np.kron(G, G) @ w.astype(np.float64).reshape(out_c * in_c, 9).T  # (16, M * C)
    return np.ascontiguousarray(u.reshape(16, out_c, in_c), dtype=np.float32)


@jit
def transform_in(x, i, tr0, tr1, tw, ph, pw, plane, rows4, v, count, offset):  # pragma: no cover - compiled
    """v[k, c, offset + t] (flat, 16 x C x ``count``; t over the (tr1 - tr0) * tw tiles of tile rows tr0..tr1 of
    image i) = B^T d B of each tile's 4x4 input window d (rows 2*tr - ph.., columns 2*tc - pw..; zero outside x).
    ``plane``: one zero-bordered input plane (rows 2*tr0 - ph .. 2*tr1 + 1 - ph), ``rows4``: four rows of B^T d."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    wp = 2 * tw + 2
    hp = 2 * (tr1 - tr0) + 2
    xf = x.reshape(-1)
    for c in range(channels):
        bordered(xf, plane, (i * channels + c) * height, 2 * tr0 - ph, hp, height, width, wp, pw)
        for tr in range(tr1 - tr0):
            a0, a1, a2, a3 = 2 * tr * wp, (2 * tr + 1) * wp, (2 * tr + 2) * wp, (2 * tr + 3) * wp
            for q in range(wp):  # B^T d: four rows, each a contiguous loop over the plane's width
                d0, d1, d2, d3 = plane[uintp(a0 + q)], plane[uintp(a1 + q)], plane[uintp(a2 + q)], plane[uintp(a3 + q)]
                rows4[uintp(q)] = d0 - d2
                rows4[uintp(wp + q)] = d1 + d2
                rows4[uintp(2 * wp + q)] = d2 - d1
                rows4[uintp(3 * wp + q)] = d1 - d3
            for j in range(4):  # then . B: each tile's four columns
                base = ((4 * j) * channels + c) * count + offset + tr * tw
                step = channels * count
                for tc in range(tw):
                    s = j * wp + 2 * tc
                    e0, e1, e2, e3 = rows4[uintp(s)], rows4[uintp(s + 1)], rows4[uintp(s + 2)], rows4[uintp(s + 3)]
                    v[uintp(base + tc)] = e0 - e2
                    v[uintp(base + step + tc)] = e1 + e2
                    v[uintp(base + 2 * step + tc)] = e2 - e1
                    v[uintp(base + 3 * step + tc)] = e1 - e3


@jit
def transform_out(mo, y, i, tr0, tr1, tw, count, offset):  # pragma: no cover - compiled
    """y[i, m, 2*tr + a, 2*tc + b] = (A^T M A)[a, b] of each tile's 4x4 products M (mo flat, 16 x M x ``count``,
    image i's tiles from ``offset``), the tiles' rows and columns past y's edge left out."""
    m_out, oh, ow = y.shape[1], y.shape[2], y.shape[3]
    step = m_out * count
    full = ow // 2  # tiles whose two columns are in y: one loop without branches (vectorized over the tiles)
    yf = y.reshape(-1)
    for m in range(m_out):
        for tr in range(tr1 - tr0):
            oy = 2 * (tr0 + tr)
            rows = min(2, oh - oy)
            row = ((i * m_out + m) * oh + oy) * ow
            at = m * count + offset + tr * tw
            for tc in range(tw):
                p = at + tc
                # A^T M: two rows of four, then . A (written out: a few adds each, in registers)
                s0 = mo[uintp(p)] + mo[uintp(p + 4 * step)] + mo[uintp(p + 8 * step)]
                s1 = mo[uintp(p + step)] + mo[uintp(p + 5 * step)] + mo[uintp(p + 9 * step)]
                s2 = mo[uintp(p + 2 * step)] + mo[uintp(p + 6 * step)] + mo[uintp(p + 10 * step)]
                s3 = mo[uintp(p + 3 * step)] + mo[uintp(p + 7 * step)] + mo[uintp(p + 11 * step)]
                yf[uintp(row + 2 * tc)] = s0 + s1 + s2
                if tc < full:
                    yf[uintp(row + 2 * tc + 1)] = s1 - s2 - s3
            if rows == 2:
                row += ow
                for tc in range(tw):
                    p = at + tc
                    s4 = mo[uintp(p + 4 * step)] - mo[uintp(p + 8 * step)] - mo[uintp(p + 12 * step)]
                    s5 = mo[uintp(p + 5 * step)] - mo[uintp(p + 9 * step)] - mo[uintp(p + 13 * step)]
                    s6 = mo[uintp(p + 6 * step)] - mo[uintp(p + 10 * step)] - mo[uintp(p + 14 * step)]
                    s7 = mo[uintp(p + 7 * step)] - mo[uintp(p + 11 * step)] - mo[uintp(p + 15 * step)]
                    yf[uintp(row + 2 * tc)] = s4 + s5 + s6
                    if tc < full:
                        yf[uintp(row + 2 * tc + 1)] = s5 - s6 - s7


@jit
def units_of(address, x, u, bias, y, z, found, ph, pw, work, op, a, b, lo, hi):  # pragma: no cover - compiled
    """Units lo..hi of ``found`` (rows i0, i1, tr0, tr1: tile rows tr0..tr1 of images i0..i1): the input transform
    into ``work`` (this thread's scratch: the plane, four rows, then V and the products), 16 GEMMs u[k] @ V[k] over
    the unit's tiles, the output transform into y, then the epilogue on the unit's rows of y (bias, residual z,
    activation ``op``)."""
    channels, m_out, oh, ow = x.shape[1], y.shape[1], y.shape[2], y.shape[3]
    tw = (ow + 1) // 2
    wp = 2 * tw + 2
    yf, u0 = y.reshape(-1), np.int64(u.ctypes.data)
    for n in range(lo, hi):
        i0, i1, tr0, tr1 = found[n, 0], found[n, 1], found[n, 2], found[n, 3]
        per = (tr1 - tr0) * tw  # an image's tiles in the unit
        count = (i1 - i0) * per
        plane = work[: (2 * (tr1 - tr0) + 2) * wp]
        rows4 = work[plane.size: plane.size + 4 * wp]
        v = work[plane.size + rows4.size: plane.size + rows4.size + 16 * channels * count]
        mo = work[plane.size + rows4.size + v.size: plane.size + rows4.size + v.size + 16 * m_out * count]
        for i in range(i0, i1):
            transform_in(x, i, tr0, tr1, tw, ph, pw, plane, rows4, v, count, (i - i0) * per)
        v0, m0 = np.int64(v.ctypes.data), np.int64(mo.ctypes.data)
        for k in range(16):
            gemm(address, m_out, count, channels, u0 + 4 * k * m_out * channels, channels, v0 + 4 * k * channels * count,
                 count, m0 + 4 * k * m_out * count, count, np.float32(0))
        r0, r1 = 2 * tr0, min(oh, 2 * tr1)
        for i in range(i0, i1):
            transform_out(mo, y, i, tr0, tr1, tw, count, (i - i0) * per)
            finish(yf, z, (i * m_out) * oh * ow + r0 * ow, m_out, (r1 - r0) * ow, oh * ow, bias, 0, op, a, b)


@jit(parallel=True)
def team_units(address, x, u, bias, y, z, found, ph, pw, work, op, a, b):  # pragma: no cover - compiled
    """`units_of` over a native team (team.py): part t of the units on team thread t, with row t of ``work``."""
    parts, count = work.shape[0], found.shape[0]
    for t in prange(parts):
        units_of(address, x, u, bias, y, z, found, ph, pw, work[t], op, a, b, count * t // parts,
                 count * (t + 1) // parts)


def plan(n: int, c: int, m: int, oh: int, ow: int) -> tuple[np.ndarray, int]:
    """The units (rows i0, i1, tr0, tr1) for an input of n images, c channels and an (oh, ow) output, from the
    shape alone, and the scratch floats a thread needs. A unit holds about UNIT_BYTES of transformed tiles and
    products, and at least MIN_TILES tiles (narrower GEMMs lose more than L2 saves): a band of one image's tile
    rows, or whole small images together; at least PLAN_PARTS units in all when there are that many tile rows."""
    th, tw = (oh + 1) // 2, (ow + 1) // 2
    tiles = max(MIN_TILES, UNIT_BYTES // (16 * (c + m) * 4))
    if th * tw < tiles and n > 1:  # small images: several a unit (each image's tiles after the last one's)
        k = max(1, min(n // min(n, PLAN_PARTS), tiles // (th * tw)))
        found = [(i, min(n, i + k), 0, th) for i in range(0, n, k)]
        rows = th
    else:
        rows = max(1, min(th, math.ceil(tiles / tw), math.ceil(th / math.ceil(PLAN_PARTS / n))))
        found = [(i, i + 1, r, min(th, r + rows)) for i in range(n) for r in range(0, th, rows)]
    wp = 2 * tw + 2
    most = max((i1 - i0) * (r1 - r0) * tw for i0, i1, r0, r1 in found)
    size = (2 * rows + 2) * wp + 4 * wp + 16 * (c + m) * most
    return np.array(found, np.int64).reshape(-1, 4), size


def applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """A 2-D float32 3x3 conv at stride 1 and dilation 1, group 1, of at least MIN_CHANNELS input and
    MIN_OUT_CHANNELS output channels, with constant float32 weights (and bias), non-negative pads, and numpy's BLAS
    callable from compiled code."""
    w = ctx.constants[1] if len(ctx.constants) > 1 else None
    if not is_float32(ctx, 0, rank=4) or w is None or w.ndim != 4 or w.dtype != F32 or w.shape[2:] != (3, 3):
        return False
    if int(attrs.get("group", 1)) != 1 or ctx.input_types[0].shape[1] != w.shape[1]:
        return False
    if set(attrs.get("strides") or [1]) != {1} or set(attrs.get("dilations") or [1]) != {1}:
        return False
    if min(attrs.get("pads") or [0]) < 0 or w.shape[1] < MIN_CHANNELS or w.shape[0] < MIN_OUT_CHANNELS:
        return False
    b = ctx.constants[2] if len(ctx.constants) > 2 else None
    if len(ctx.input_types) > 2 and ctx.input_types[2] is not None and b is None:
        return False
    return bool(team.gemm_address())


@kernel("Conv", since=1, priority=PRIORITY - 2, prepare=True, out=True, views=False, packed=(1, 2), epilogue=True,
        applies=applies)
def conv(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv-1/11/22, 3x3 at stride 1 only (see `applies`): Winograd F(2x2, 3x3), compiled end to end."""
    w, b = ctx.constants[1], ctx.constants[2] if len(ctx.constants) > 2 else None
    u = readonly(transform_weights(w))  # a copy (packed=(1, 2)): the engine frees the initializers
    bias = readonly(np.asarray(b, np.float32).copy()) if b is not None else NOTHING
    address = team.gemm_address()
    globals()["gemm"] = team.install()  # before units_of compiles: it looks the name up here
    plans: dict[tuple[int, ...], tuple[Any, ...]] = {}
    _warm(address, u, bias)

    def run(x, w=None, b=None, *, out=None, epilogue=None):
        if x.shape not in plans:
            begin, _, out_hw = window(x.shape[2:], (3, 3), (1, 1), (1, 1), pads, auto_pad, clamp_same=True)
            found, size = plan(x.shape[0], x.shape[1], u.shape[1], *out_hw)
            plans[x.shape] = (int(begin[0]), int(begin[1])), (x.shape[0], u.shape[1]) + tuple(out_hw), found, size
        (ph, pw), shape, found, size = plans[x.shape]
        y = out if out is not None else np.empty(shape, np.float32)
        if y.size == 0:
            return y
        fused = team.native(epilogue) if epilogue is not None else team.PLAIN
        after = fused is None or not team.fits(fused[3], shape)  # no compiled form: the epilogue once, after
        op, fa, fb, z = team.PLAIN if after else fused
        args = (address, readonly(np.ascontiguousarray(x)), u, bias, y, NOTHING if z is None else readonly(z.reshape(-1)),
                found, ph, pw)
        threads = team.size() if len(found) > 1 else 1
        if threads > 1:
            team_units(*args, scratch("winograd-team", (min(threads, len(found)), size), np.float32), op, fa, fb)
        else:

            def span(lo: int, hi: int) -> None:
                units_of(*args, scratch("winograd-unit", (size,), np.float32), op, fa, fb, lo, hi)

            parallel_for(len(found), span, outputs_only=True)  # a unit writes only its rows of y
        if after and epilogue is not None:  # one range: under a process team one rank applies it (spmd's promise)
            parallel_for(1, lambda lo, hi: epilogue(y, (slice(None),) * y.ndim), parts=1, outputs_only=True)
        return y

    return spmd(run)


def _warm(address: int, u: np.ndarray, bias: np.ndarray) -> None:
    """Compile (or load from the cache) at build, with a run's argument types, not in the first run, whose timing
    of the candidates it would skew."""
    m, c = u.shape[1], u.shape[2]
    x = readonly(np.zeros((1, c, 2, 2), np.float32))
    y = np.zeros((1, m, 2, 2), np.float32)
    found, size = plan(1, c, m, 2, 2)
    args = (address, x, u, bias, y, NOTHING, found, 1, 1)
    units_of(*args, np.zeros(size, np.float32), team.NONE, np.float32(0), np.float32(0), 0, len(found))
    if team.available():
        team_units(*args, np.zeros((1, size), np.float32), team.NONE, np.float32(0), np.float32(0))
