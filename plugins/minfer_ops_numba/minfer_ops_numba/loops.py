"""The compiled sliding-window loops behind depthwise Conv and the 2-D pools.

The pools compute each output row while it sits in L1: it starts at its
initial value and takes its taps in the order (ky, kx), the numpy kernels'
tap order; taps falling in the padding are skipped through the loop
bounds, so the input is read in place (no padded copy); so does the
depthwise conv's `weighted_rows`. Its `wide_rows` (stride 1) and
phases.py's `phase_rows` copy each channel into zero-bordered planes
instead, so that every tap is one contiguous run over the plane: the same
(ky, kx) order, each tap rounded on its own, so all three give the same bits.
Indices are made unsigned (``uintp``): numba then drops its negative-index
check, which otherwise keeps the loops from vectorizing.

The loops are spelt out in each function rather than shared through calls:
a call per row costs more than the row itself at 28x28.
"""

from __future__ import annotations

import numpy as np

from ._jit import jit, uintp  # noqa: F401 (uintp: rebound to numba's type at compile)


@jit
def bounds(k, d, p, s, size, out):  # pragma: no cover - compiled
    """Per tap t along one axis: the outputs [lo, hi) whose tap reads real input, and the input offset t*d - p."""
    los, his, offs = np.empty(k, np.int64), np.empty(k, np.int64), np.empty(k, np.int64)
    for t in range(k):
        off = t * d - p
        los[t] = 0 if off >= 0 else (-off + s - 1) // s
        his[t] = max(los[t], min(out, (size - 1 - off) // s + 1))
        offs[t] = off
    return los, his, offs


@jit
def weighted_rows(x, w, bias, y, c0, c1, sh, sw, ph, pw, dh, dw):  # pragma: no cover - compiled
    """y[c] = bias[c] + sum of w[c, ky, kx] * x[c] shifted, for planes c0..c1 of x (C, H, W) into y (C, OH, OW)."""
    height, width = x.shape[1], x.shape[2]
    kh, kw = w.shape[1], w.shape[2]
    oh, ow = y.shape[1], y.shape[2]
    los, his, offs = bounds(kw, dw, pw, sw, width, ow)
    lo, hi = los.max(), max(los.max(), his.min())  # the interior
    xf, yf = x.reshape(-1), y.reshape(-1)
    for c in range(c0, c1):
        b = bias[c]
        for oy in range(oh):
            yb = (c * oh + oy) * ow
            for ox in range(ow):
                yf[uintp(yb + ox)] = b
            for ky in range(kh):
                iy = oy * sh - ph + ky * dh
                if iy < 0 or iy >= height:
                    continue
                xb = (c * height + iy) * width
                for kx in range(kw):  # the edges, tap by tap
                    wv, o = w[c, ky, kx], xb + offs[kx]
                    for ox in range(los[kx], lo):
                        yf[uintp(yb + ox)] += wv * xf[uintp(o + ox * sw)]
                    for ox in range(hi, his[kx]):
                        yf[uintp(yb + ox)] += wv * xf[uintp(o + ox * sw)]
                for k0 in range(0, kw, 3):  # the interior, three taps a pass
                    n = min(3, kw - k0)
                    w0, o0 = w[c, ky, k0], xb + offs[k0]
                    if n == 3:
                        w1, w2, o1, o2 = w[c, ky, k0 + 1], w[c, ky, k0 + 2], xb + offs[k0 + 1], xb + offs[k0 + 2]
                        for ox in range(lo, hi):
                            v = yf[uintp(yb + ox)]
                            v += w0 * xf[uintp(o0 + ox * sw)]
                            v += w1 * xf[uintp(o1 + ox * sw)]
                            v += w2 * xf[uintp(o2 + ox * sw)]
                            yf[uintp(yb + ox)] = v
                    elif n == 2:
                        w1, o1 = w[c, ky, k0 + 1], xb + offs[k0 + 1]
                        for ox in range(lo, hi):
                            v = yf[uintp(yb + ox)]
                            v += w0 * xf[uintp(o0 + ox * sw)]
                            v += w1 * xf[uintp(o1 + ox * sw)]
                            yf[uintp(yb + ox)] = v
                    else:
                        for ox in range(lo, hi):
                            yf[uintp(yb + ox)] += w0 * xf[uintp(o0 + ox * sw)]


@jit
def _bigger(a, v):  # pragma: no cover - compiled
    """max(a, v) where a NaN on either side wins, as np.maximum."""
    return v if v > a or v != v else a


@jit
def _combine(a, v, is_max):  # pragma: no cover - compiled
    """max(a, v) (NaN wins, as np.maximum) or a + v."""
    if is_max:
        return v if v > a or v != v else a
    return a + v


@jit
def pool_rows(x, y, is_max, c0, c1, kh, kw, sh, sw, ph, pw, dh, dw):  # pragma: no cover - compiled
    """y[c] = max (or sum) over each window of x[c], for planes c0..c1; a window on no data gives -inf (or 0).

    Separable, down the columns first as the numpy kernel reduces: per output row, the window's input rows
    are combined into one row of W cells (long contiguous loops), then each output takes its taps from it.
    """
    height, width = x.shape[1], x.shape[2]
    oh, ow = y.shape[1], y.shape[2]
    los, his, offs = bounds(kw, dw, pw, sw, width, ow)
    lo, hi = los.max(), max(los.max(), his.min())
    start = -np.inf if is_max else 0.0
    t = np.empty(width, x.dtype)
    ev, od = np.empty((width + 1) // 2, x.dtype), np.empty((width + 1) // 2, x.dtype)
    xf, yf = x.reshape(-1), y.reshape(-1)
    for c in range(c0, c1):
        for oy in range(oh):
            yb = (c * oh + oy) * ow
            rows = 0
            for ky in range(kh):
                iy = oy * sh - ph + ky * dh
                if iy < 0 or iy >= height:
                    continue
                xb = (c * height + iy) * width
                if rows == 0:
                    for i in range(width):
                        t[uintp(i)] = xf[uintp(xb + i)]
                else:
                    for i in range(width):
                        t[uintp(i)] = _combine(t[uintp(i)], xf[uintp(xb + i)], is_max)
                rows += 1
            if rows == 0:
                for ox in range(ow):
                    yf[uintp(yb + ox)] = start
                continue
            for ox in range(ow):
                yf[uintp(yb + ox)] = start
            for kx in range(kw):  # the edges, tap by tap
                for ox in range(los[kx], lo):
                    yf[uintp(yb + ox)] = _combine(yf[uintp(yb + ox)], t[uintp(offs[kx] + ox * sw)], is_max)
                for ox in range(hi, his[kx]):
                    yf[uintp(yb + ox)] = _combine(yf[uintp(yb + ox)], t[uintp(offs[kx] + ox * sw)], is_max)
            # the interior from the row's even and odd cells: contiguous reads vectorize (the horizontal taps 3x
            # faster), when rows are long enough to pay for the split (13 outputs did not, 26 did)
            if sw == 2 and hi - lo >= 20:
                for i in range(width // 2):
                    ev[uintp(i)] = t[uintp(2 * i)]
                    od[uintp(i)] = t[uintp(2 * i + 1)]
                if width % 2:
                    ev[uintp(width // 2)] = t[uintp(width - 1)]
                for kx in range(kw):
                    src, base = ev if offs[kx] % 2 == 0 else od, offs[kx] // 2
                    for ox in range(lo, hi):
                        yf[uintp(yb + ox)] = _combine(yf[uintp(yb + ox)], src[uintp(base + ox)], is_max)
                continue
            for k0 in range(0, kw, 3):  # the interior, three taps a pass
                n, o0 = min(3, kw - k0), offs[k0]
                if n == 3:
                    o1, o2 = offs[k0 + 1], offs[k0 + 2]
                    for ox in range(lo, hi):
                        v = _combine(yf[uintp(yb + ox)], t[uintp(o0 + ox * sw)], is_max)
                        v = _combine(v, t[uintp(o1 + ox * sw)], is_max)
                        yf[uintp(yb + ox)] = _combine(v, t[uintp(o2 + ox * sw)], is_max)
                elif n == 2:
                    o1 = offs[k0 + 1]
                    for ox in range(lo, hi):
                        v = _combine(yf[uintp(yb + ox)], t[uintp(o0 + ox * sw)], is_max)
                        yf[uintp(yb + ox)] = _combine(v, t[uintp(o1 + ox * sw)], is_max)
                else:
                    for ox in range(lo, hi):
                        yf[uintp(yb + ox)] = _combine(yf[uintp(yb + ox)], t[uintp(o0 + ox * sw)], is_max)


@jit
def scale_planes(y, scale, c0, c1):  # pragma: no cover - compiled
    """y[c] *= scale (OH, OW) for planes c0..c1."""
    cells = scale.size
    yf, sf = y.reshape(-1), scale.reshape(-1)
    for c in range(c0, c1):
        for i in range(cells):
            yf[uintp(c * cells + i)] *= sf[uintp(i)]


@jit
def wide_rows(x, w, bias, y, c0, c1, sh, sw, ph, pw, dh, dw):  # pragma: no cover - compiled
    """As `weighted_rows` (the same sums in the same order), for small planes: each channel is copied into a
    zero-bordered plane of rows Wp wide, so that every tap is one contiguous run over all output rows ("wide"
    rows of Wp outputs, the columns past the output's width computed and dropped). One loop per tap per plane,
    instead of one per tap per row: at 14x14 and 7x7 a row is too short to pay for its loop.
    """
    height, width = x.shape[1], x.shape[2]
    kh, kw = w.shape[1], w.shape[2]
    oh, ow = y.shape[1], y.shape[2]
    hp = max(height + ph, (oh - 1) * sh + (kh - 1) * dh + 1)
    wp = max(width + pw, (ow - 1) * sw + (kw - 1) * dw + 1)
    runs = oh * wp  # callers make sh == sw: a wide row then starts sh * wp after the last
    size = max(hp * wp, (runs - 1) * sw + (kh - 1) * dh * wp + (kw - 1) * dw + 1)
    plane, acc = np.zeros(size, x.dtype), np.empty(runs, x.dtype)
    xf, yf = x.reshape(-1), y.reshape(-1)
    for c in range(c0, c1):
        for iy in range(height):  # the interior; the borders stay zero
            for ix in range(width):
                plane[uintp((iy + ph) * wp + ix + pw)] = xf[uintp((c * height + iy) * width + ix)]
        b = bias[c]
        for j in range(runs):
            acc[uintp(j)] = b
        for ky in range(kh):
            for kx in range(kw):
                wv, o = w[c, ky, kx], ky * dh * wp + kx * dw
                for j in range(runs):
                    acc[uintp(j)] += wv * plane[uintp(o + j * sw)]
        for oy in range(oh):
            for ox in range(ow):
                yf[uintp((c * oh + oy) * ow + ox)] = acc[uintp(oy * wp + ox)]
