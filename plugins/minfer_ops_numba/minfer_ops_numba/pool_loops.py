"""The 2-D pools' compiled loops for strides of 2, windows of up to 3 rows and no column dilation: the pooling
layers of real CNNs (3x3 and 2x2, pads, ceil_mode); other pools keep loops.pool_rows.

Separable as `pool_rows`, and in its order, so that it gives the same bits:
per output row, the window's rows are combined column by column in ky
order, then each output takes its taps from that combined row in kx
order, the earlier value winning a tie (signed zeros come out alike).
What differs is the layout of the combined rows, to keep every loop
vectorized (AVX-512 here) without a read at stride 2 in it (compiled to
gathers or scalar code, most of `pool_rows`' time):

- they are kept as their even and odd padded columns: column 2p of output
  row oy's window in ``ev[oy * width + p]``, column 2p + 1 in ``od``, so
  that output ox's taps 2ox + kx are the contiguous ``ev``/``od`` cells
  ``oy * width + ox + kx // 2``;
- a row of ``ev``/``od`` is ``width`` cells from the next, so that cell f
  of ev reads input index 2f + a constant per window row: the column max
  of all of a plane's whole windows is one loop over the plane (the cells
  of a row past what its windows use read the next rows and are never read
  back). That loop reads pairs of cells (two loads and a permute per
  vector) and runs long: a loop per row of 27 or 55 cells did not fill a
  vector (2x slower), and setting one up per row cost more than the row at
  13 outputs. A window clipped by the padding gets the same loop over its
  row's cells; the cells holding a pad are set to -inf after it.

The max is a plain comparison, which compiles to vector max instructions,
and the loop notes whether it read a NaN: the NaN-aware comparison (NaN
wins, as np.maximum) did not vectorize and was 2x slower; a plane holding a
NaN is pooled again by `pool_rows` (a plane without one gets `pool_rows`'
bits either way). Indices are unsigned (``uintp``): numba then drops its
negative-index check (the loop was 1.5x slower with a row index it could
wrap).

2x2 windows at stride 2 that tile the rows exactly (no pads, an even height: the
recognizers' and U-Nets' pools) skip the per-row work around that loop:
`max_pairs` runs it once over a run of planes, which follow one another in
the same layout, then takes each output from its two cells.

AveragePool (`mean_flat`) sums in the same layout and order, and
multiplies by the 1/count as scale_planes does; a pad's cell holds 0,
which added to a sum started from +0 changes no bit (the sum is never -0).
It was 1.6-1.9x faster than `pool_rows` and scale_planes (1x128x56x56 2x2:
82 -> 52 us, 1x64x111x111 3x3: 185 -> 112), still slower than the numpy
kernel on some planes, which the core's timing then keeps.
"""

from __future__ import annotations

import numpy as np

from ._jit import jit, uintp  # noqa: F401 (uintp: rebound to numba's type at compile)
from .loops import pool_rows, scale_planes  # noqa: F401 (compiled: called from `pool_planes`)

UNIT_CELLS = 64 << 10  # see `pool_planes`
PAIR_CELLS = 1 << 13  # see `max_pairs`: its two buffers of column maxima (32 kB each) stay in L2


@jit
def pool_planes(x, y, is_max, scale, c0, c1, kh, kw, sh, sw, ph, pw, dh, dw):  # pragma: no cover - compiled
    """y[c] = max (or mean, ``scale`` the 1/count per output) over each window of x[c], for planes c0..c1:
    `max_pairs`, `max_flat` or `mean_flat` where they apply, else loops.pool_rows (and scale_planes)."""
    if is_max and kh == kw == sh == sw == 2 and dh == dw == 1 and ph == pw == 0 and y.size and \
            x.shape[1] == 2 * y.shape[1] and 2 * y.shape[2] <= x.shape[2]:
        max_pairs(x, y, c0, c1)
        return
    if sh == 2 and sw == 2 and kh <= 3 and dw == 1 and ph >= 0 and pw >= 0 and y.shape[2] + kw // 2 <= x.shape[2]:
        if is_max:
            max_flat(x, y, c0, c1, kh, kw, ph, pw, dh)
        else:
            mean_flat(x, y, scale, c0, c1, kh, kw, ph, pw, dh)
        return
    # UNIT_CELLS of planes at a time: an average's are scaled while they are in L2
    step = max(1, UNIT_CELLS // (x.shape[1] * x.shape[2] + y.shape[1] * y.shape[2]))
    for p in range(c0, c1, step):
        pool_rows(x, y, is_max, p, min(c1, p + step), kh, kw, sh, sw, ph, pw, dh, dw)
        if not is_max:
            scale_planes(y, scale, p, min(c1, p + step))


@jit
def max_pairs(x, y, c0, c1):  # pragma: no cover - compiled
    """`max_flat` for 2x2 windows at stride 2 tiling the planes' rows exactly (no pads, H = 2 * OH): the planes
    follow one another, so the column maxima of PAIR_CELLS' worth of them are one loop (max_flat's loop a plane
    and the work around it took 4.7 us on an OCR recognizer's 48 planes of 7x16 outputs, this 2.5); the same
    comparisons in the same order, so the same bits. A plane holding a NaN is pooled again by loops.pool_rows."""
    oh, ow, width = y.shape[1], y.shape[2], x.shape[2]
    xf, per = x.reshape(-1), max(1, PAIR_CELLS // (oh * width))
    ev, od = np.empty(per * oh * width, x.dtype), np.empty(per * oh * width, x.dtype)
    for p0 in range(c0, c1, per):
        p1, base, nan = min(c1, p0 + per), p0 * oh * width, False
        # cell f: output row f // width's columns 2 (f % width) and the next, read from input index 2f (its
        # window's top row) and 2f + width; a row's cells past its outputs read the next rows and go unused
        for f in range(base, (p1 * oh - 1) * width + ow):
            i = 2 * f
            u0, v0, u1, v1 = xf[uintp(i)], xf[uintp(i + 1)], xf[uintp(i + width)], xf[uintp(i + width + 1)]
            nan |= (u0 != u0) | (v0 != v0) | (u1 != u1) | (v1 != v1)
            ev[uintp(f - base)], od[uintp(f - base)] = (u1 if u1 > u0 else u0), (v1 if v1 > v0 else v0)
        for c in range(p0, p1):
            for oy in range(oh):
                e0 = ((c - p0) * oh + oy) * width
                for ox in range(ow):
                    m, t = ev[uintp(e0 + ox)], od[uintp(e0 + ox)]
                    y[uintp(c), uintp(oy), uintp(ox)] = t if t > m else m
        for c in range(p0, p1 if nan else p0):
            plane = xf[c * x.shape[1] * width:(c + 1) * x.shape[1] * width]
            for v in plane:
                if v != v:
                    pool_rows(x, y, True, c, c + 1, 2, 2, 2, 2, 0, 0, 1, 1)
                    break


@jit
def window_rows(kh, sh, ph, dh, height, oh):  # pragma: no cover - compiled
    """Per output row, the window's rows on data: top + k * dh for k in k0..k1 (k1 <= k0: none)."""
    k0, k1 = np.empty(oh, np.int64), np.empty(oh, np.int64)
    for oy in range(oh):
        top = oy * sh - ph
        k0[oy] = max(0, (dh - 1 - top) // dh)
        k1[oy] = min(kh, (height - 1 - top) // dh + 1) if top < height else 0
    return k0, k1


@jit
def column_max(xf, ev, od, e0, p, top, k0, k1, dh, width, pw):  # pragma: no cover - compiled
    """Cell p of ev/od's row at e0 worked out alone: the max down rows top + k * dh (k in k0..k1; flat rows of
    x, the plane's included) of padded columns 2p and 2p + 1, -inf in the padding; whether it read a NaN."""
    nan = False
    for j in range(2):
        col, m = 2 * p + j - pw, -np.inf
        if 0 <= col < width:
            m = xf[(top + k0 * dh) * width + col]
            for k in range(k0, k1):
                u = xf[(top + k * dh) * width + col]
                nan |= u != u
                m = u if u > m else m
        if j:
            od[e0 + p] = m
        else:
            ev[e0 + p] = m
    return nan


@jit
def pad_cells(ev, od, e0, width, pw, ev_read, od_read, value):  # pragma: no cover - compiled
    """The pad cells of one output row's column buffers from ``e0`` (its left pads, and its cells past the input's
    right edge that a tap reads) set to ``value``: -inf for a max, 0 for a sum."""
    for p in range((pw + 1) // 2):
        ev[e0 + p] = value
    for p in range(pw // 2):
        od[e0 + p] = value
    for p in range((width + pw + 1) // 2, ev_read):
        ev[e0 + p] = value
    for p in range((width + pw) // 2, od_read):
        od[e0 + p] = value


@jit
def edge_span(whole, e0, fa, fb, half, width, pw):  # pragma: no cover - compiled
    """(left, right): an output row's cells from ``e0`` left out of the flat loop are those below ``left`` and from
    ``right`` on: for a row of whole windows (``whole``) the cells before fa and from fb, else its pads and edges."""
    if whole:
        return min(half, max(0, fa - e0)), max(0, min(half, fb - e0))
    return min(half, (pw + 1) // 2), min(half, (width + pw) // 2)


@jit
def max_flat(x, y, c0, c1, kh, kw, ph, pw, dh):  # pragma: no cover - compiled
    """y[c] = the max over each window of x[c], for planes c0..c1 (the module docstring); a plane in which it
    read a NaN is pooled again by loops.pool_rows, whose max lets NaN win."""
    height, width, oh, ow = x.shape[1], x.shape[2], y.shape[1], y.shape[2]
    half, xf = ow + kw // 2, x.reshape(-1)
    ev, od = np.empty(oh * width + half, x.dtype), np.empty(oh * width + half, x.dtype)
    k0s, k1s = window_rows(kh, 2, ph, dh, height, oh)
    f0, f1 = oh, 0  # the output rows whose windows are whole: f0..f1
    for oy in range(oh):
        if k0s[oy] == 0 and k1s[oy] == kh:
            f0, f1 = min(f0, oy), oy + 1
    d1, d2 = dh * min(1, kh - 1) * width, dh * min(2, kh - 1) * width  # a whole window's rows 2 and 3
    ev_read, od_read = ow + (kw - 1) // 2, ow + (kw - 2) // 2 if kw > 1 else 0  # the cells p < these are read
    pads = pw > 0 or (width + pw + 1) // 2 < ev_read or (width + pw) // 2 < od_read
    for c in range(c0, c1):
        o0 = (c * height - ph) * width - pw  # cell f of ev reads 2f + o0 (+ d1, + d2); od the next column
        fa = max(f0 * width, (1 - o0) // 2)  # the flat loop's cells: its reads stay in the array
        fb = min((f1 - 1) * width + half, (xf.size - 2 - o0 - d2) // 2 + 1)
        nan = False
        for f in range(fa, fb):
            i = 2 * f + o0
            u0, v0, u1, v1 = xf[uintp(i)], xf[uintp(i + 1)], xf[uintp(i + d1)], xf[uintp(i + d1 + 1)]
            u2, v2 = xf[uintp(i + d2)], xf[uintp(i + d2 + 1)]
            nan |= (u0 != u0) | (v0 != v0) | (u1 != u1) | (v1 != v1) | (u2 != u2) | (v2 != v2)
            u, v = (u1 if u1 > u0 else u0), (v1 if v1 > v0 else v0)
            ev[uintp(f)], od[uintp(f)] = (u2 if u2 > u else u), (v2 if v2 > v else v)
        for oy in range(oh):  # the clipped windows' rows: the same loop over a row's cells without a pad
            k0, k1 = k0s[oy], k1s[oy]
            if f0 <= oy < f1 or k1 <= k0:
                continue
            o1 = o0 + k0 * dh * width  # its rows of data (fewer than three repeat their last)
            r1, r2 = dh * min(1, k1 - k0 - 1) * width, dh * min(2, k1 - k0 - 1) * width
            for f in range(oy * width + (pw + 1) // 2, oy * width + min(half, (width + pw) // 2)):
                i = 2 * f + o1
                u0, v0, u1, v1 = xf[uintp(i)], xf[uintp(i + 1)], xf[uintp(i + r1)], xf[uintp(i + r1 + 1)]
                u2, v2 = xf[uintp(i + r2)], xf[uintp(i + r2 + 1)]
                nan |= (u0 != u0) | (v0 != v0) | (u1 != u1) | (v1 != v1) | (u2 != u2) | (v2 != v2)
                u, v = (u1 if u1 > u0 else u0), (v1 if v1 > v0 else v0)
                ev[uintp(f)], od[uintp(f)] = (u2 if u2 > u else u), (v2 if v2 > v else v)
        for oy in range(f0 if pads else f1, f1):  # the whole windows' cells that hold a pad a tap reads
            pad_cells(ev, od, oy * width, width, pw, ev_read, od_read, np.float32(-np.inf))
        # the cells left out of the flat loop, one by one: the clipped windows' pads and edges, and the cells
        # of the whole windows' rows before fa and from fb (none in rows ra..rb)
        ra, rb = min(f1, max(f0, -(-fa // width))), min(f1, (fb - half) // width + 1)
        for oy in range(oh):
            k0, k1, e0 = k0s[oy], k1s[oy], oy * width
            if k1 <= k0 or ra <= oy < rb:
                continue
            left, right = edge_span(f0 <= oy < f1, e0, fa, fb, half, width, pw)
            for n in range(left + half - max(left, right)):
                p = n if n < left else max(left, right) + n - left
                nan |= column_max(xf, ev, od, e0, p, c * height + oy * 2 - ph, k0, k1, dh, width, pw)
        for oy in range(oh):
            e0 = oy * width
            if k1s[oy] <= k0s[oy]:
                for ox in range(ow):
                    y[c, oy, ox] = -np.inf
                continue
            if kw == 3:
                for ox in range(ow):
                    m, t, e = ev[uintp(e0 + ox)], od[uintp(e0 + ox)], ev[uintp(e0 + ox + 1)]
                    m = t if t > m else m
                    y[uintp(c), uintp(oy), uintp(ox)] = e if e > m else m
                continue
            if kw == 2:  # as the loop below, without reading y back at signed indices (2x faster: 1x48x14x32)
                for ox in range(ow):
                    m, t = ev[uintp(e0 + ox)], od[uintp(e0 + ox)]
                    y[uintp(c), uintp(oy), uintp(ox)] = t if t > m else m
                continue
            for ox in range(ow):
                y[c, oy, ox] = ev[e0 + ox]
            for kx in range(1, kw):  # kx order, ties keeping the earlier tap
                for ox in range(ow):
                    t, m = ev[e0 + ox + kx // 2] if kx % 2 == 0 else od[e0 + ox + kx // 2], y[c, oy, ox]
                    y[c, oy, ox] = t if t > m else m
        if nan:
            pool_rows(x, y, True, c, c + 1, kh, kw, 2, 2, ph, pw, dh, 1)


@jit
def column_sum(xf, ev, od, e0, p, top, k0, k1, dh, width, pw):  # pragma: no cover - compiled
    """`column_max` for `mean_flat`: the sum in row order, 0 in the padding."""
    for j in range(2):
        col, m = 2 * p + j - pw, np.float32(0.0)
        if 0 <= col < width:
            m = xf[(top + k0 * dh) * width + col]
            for k in range(k0 + 1, k1):
                m = m + xf[(top + k * dh) * width + col]
        if j:
            od[e0 + p] = m
        else:
            ev[e0 + p] = m


@jit
def mean_flat(x, y, scale, c0, c1, kh, kw, ph, pw, dh):  # pragma: no cover - compiled
    """`max_flat` for AveragePool (``scale``: 1/count per output), with loops.pool_rows' and scale_planes' bits:
    the rows summed in ky order (a whole window's in one pass, a clipped one's a row a pass), then 0 + the taps
    in kx order, times the scale (a pad's tap adds 0, which changes no bit of a sum started from +0)."""
    height, width, oh, ow = x.shape[1], x.shape[2], y.shape[1], y.shape[2]
    half, xf, sf, zero = ow + kw // 2, x.reshape(-1), scale.reshape(-1), np.float32(0.0)
    ev, od = np.empty(oh * width + half, x.dtype), np.empty(oh * width + half, x.dtype)
    k0s, k1s = window_rows(kh, 2, ph, dh, height, oh)
    f0, f1 = oh, 0
    for oy in range(oh):
        if k0s[oy] == 0 and k1s[oy] == kh:
            f0, f1 = min(f0, oy), oy + 1
    ev_read, od_read = ow + (kw - 1) // 2, ow + (kw - 2) // 2 if kw > 1 else 0
    pads = pw > 0 or (width + pw + 1) // 2 < ev_read or (width + pw) // 2 < od_read
    for c in range(c0, c1):
        o0 = (c * height - ph) * width - pw
        fa = max(f0 * width, (1 - o0) // 2)
        fb = min((f1 - 1) * width + half, (xf.size - 2 - o0 - (kh - 1) * dh * width) // 2 + 1)
        d1 = dh * width
        if kh == 2:  # the whole windows' rows in one pass (as in max_flat: 1.5x faster than a pass per row)
            for f in range(fa, fb):
                i = 2 * f + o0
                ev[uintp(f)] = xf[uintp(i)] + xf[uintp(i + d1)]
                od[uintp(f)] = xf[uintp(i + 1)] + xf[uintp(i + d1 + 1)]
        elif kh == 3:
            for f in range(fa, fb):
                i = 2 * f + o0
                ev[uintp(f)] = (xf[uintp(i)] + xf[uintp(i + d1)]) + xf[uintp(i + 2 * d1)]
                od[uintp(f)] = (xf[uintp(i + 1)] + xf[uintp(i + d1 + 1)]) + xf[uintp(i + 2 * d1 + 1)]
        for oy in range(-1 if kh == 1 else 0, oh):  # the whole windows' rows (-1), then each clipped window's row
            if oy < 0:
                lo, hi, k0, k1 = fa, fb, 0, kh
            else:
                lo, hi, k0, k1 = oy * width + (pw + 1) // 2, oy * width + min(half, (width + pw) // 2), k0s[oy], \
                    k1s[oy]
                if f0 <= oy < f1 or k1 <= k0:
                    continue
            o = o0 + k0 * dh * width
            for f in range(lo, hi):
                ev[uintp(f)], od[uintp(f)] = xf[uintp(2 * f + o)], xf[uintp(2 * f + o + 1)]
            for k in range(k0 + 1, k1):
                o = o0 + k * dh * width
                for f in range(lo, hi):
                    ev[uintp(f)], od[uintp(f)] = ev[uintp(f)] + xf[uintp(2 * f + o)], \
                        od[uintp(f)] + xf[uintp(2 * f + o + 1)]
        for oy in range(f0 if pads else f1, f1):
            pad_cells(ev, od, oy * width, width, pw, ev_read, od_read, zero)
        ra, rb = min(f1, max(f0, -(-fa // width))), min(f1, (fb - half) // width + 1)
        for oy in range(oh):
            k0, k1, e0 = k0s[oy], k1s[oy], oy * width
            if k1 <= k0 or ra <= oy < rb:
                continue
            left, right = edge_span(f0 <= oy < f1, e0, fa, fb, half, width, pw)
            for n in range(left + half - max(left, right)):
                p = n if n < left else max(left, right) + n - left
                column_sum(xf, ev, od, e0, p, c * height + oy * 2 - ph, k0, k1, dh, width, pw)
        for oy in range(oh):
            e0, s0 = oy * width, oy * ow
            if k1s[oy] <= k0s[oy]:
                for ox in range(ow):
                    y[c, oy, ox] = zero * sf[s0 + ox]
            elif kw == 2:
                for ox in range(ow):
                    y[uintp(c), uintp(oy), uintp(ox)] = ((zero + ev[uintp(e0 + ox)]) + od[uintp(e0 + ox)]) * \
                        sf[uintp(s0 + ox)]
            elif kw == 3:
                for ox in range(ow):
                    m = (zero + ev[uintp(e0 + ox)]) + od[uintp(e0 + ox)]
                    y[uintp(c), uintp(oy), uintp(ox)] = (m + ev[uintp(e0 + ox + 1)]) * sf[uintp(s0 + ox)]
            else:
                for ox in range(ow):
                    y[c, oy, ox] = zero + ev[e0 + ox]
                for kx in range(1, kw):
                    for ox in range(ow):
                        y[c, oy, ox] += ev[e0 + ox + kx // 2] if kx % 2 == 0 else od[e0 + ox + kx // 2]
                for ox in range(ow):
                    y[c, oy, ox] *= sf[s0 + ox]
