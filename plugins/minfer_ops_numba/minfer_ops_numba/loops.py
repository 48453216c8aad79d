"""The compiled sliding-window loops behind depthwise Conv and the 2-D pools.

The pools compute each output row while it sits in L1: it starts at its
initial value and takes its taps in the order (ky, kx), the numpy kernels'
tap order; taps falling in the padding are skipped through the loop
bounds, so the input is read in place (no padded copy); so does the
depthwise conv's `weighted_rows`. Its `wide_rows` (stride 1) and
phases.py's `phase_rows` copy each channel into zero-bordered planes
instead, so that every tap is one contiguous run over the plane.

The depthwise loops sum in onnxruntime's order, so that a model quantized
per tensor, where one float32 ulp can move a value to the next integer
step, gets onnxruntime's integers. Its CPU Conv (MLAS; the node's kernel at
ORT_DISABLE_ALL and ORT_ENABLE_BASIC) expands the taps into a matrix that
its one-row matrix kernel multiplies by the weights: it takes the taps in
(ky, kx) order in runs of four, adds a run's products left to right, then
adds the run's sum to the total; the taps left over go as a run of two,
then of one; the bias comes last. Every product and sum rounds on its own
(no fused multiply-add). A tap in the padding adds nothing, as its zero
product leaves onnxruntime's sum (up to the sign of a zero result). The
three loops give the same bits. (ORT_ENABLE_ALL's NCHWc kernel, which takes
such nodes when their channels are a multiple of its block, 16 with
AVX-512, instead chains fused multiply-adds from zero in (ky, kx) order and
adds the bias last.)

Indices are made unsigned (``uintp``): numba then drops its negative-index
check, which otherwise keeps the loops from vectorizing. The loops are
spelt out in each function rather than shared through calls: a call per
row costs more than the row itself at 28x28.
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
def run_taps(kh, kw, dh, sh, ph, height, width, offs, oh):  # pragma: no cover - compiled
    """Per output row and run of taps (the module docstring), the taps that read an input row: how many, and
    each one's flat index, column and offset in the channel's plane. The same for every channel: found once."""
    taps = kh * kw
    runs = taps // 4 + (taps % 4) // 2 + taps % 2
    count = np.zeros((oh, runs), np.int64)
    index, column, offset = np.empty((oh, runs, 4), np.int64), np.empty((oh, runs, 4), np.int64), \
        np.empty((oh, runs, 4), np.int64)
    for oy in range(oh):
        t0, r = 0, 0
        while t0 < taps:
            n = 4 if taps - t0 >= 4 else 2 if taps - t0 >= 2 else 1
            for t in range(t0, t0 + n):
                iy = oy * sh - ph + (t // kw) * dh
                if 0 <= iy < height:
                    m = count[oy, r]
                    index[oy, r, m], column[oy, r, m], offset[oy, r, m] = t, t % kw, iy * width + offs[t % kw]
                    count[oy, r] = m + 1
            t0, r = t0 + n, r + 1
    return count, index, column, offset


@jit
def weighted_rows(x, w, bias, y, c0, c1, sh, sw, ph, pw, dh, dw):  # pragma: no cover - compiled
    """y[c] = sum of w[c, ky, kx] * x[c] shifted, + bias[c], for planes c0..c1 of x (C, H, W) into y (C, OH, OW),
    summed in runs of four taps (the module docstring): each output row is a total in L1 taking a run a pass."""
    height, width = x.shape[1], x.shape[2]
    kh, kw = w.shape[1], w.shape[2]
    oh, ow = y.shape[1], y.shape[2]
    los, his, offs = bounds(kw, dw, pw, sw, width, ow)
    lo, hi = los.max(), max(los.max(), his.min())  # the interior: outputs every tap of a row reads input for
    left, right = min(lo, ow), min(hi, ow)  # the edges: [0, left) and [right, ow)
    count, index, column, offset = run_taps(kh, kw, dh, sh, ph, height, width, offs, oh)
    zero = np.zeros(1, x.dtype)[0]
    xf, yf = x.reshape(-1), y.reshape(-1)
    for c in range(c0, c1):
        wc, base, b = w[c].reshape(-1), c * height * width, bias[c]
        for oy in range(oh):
            yb = (c * oh + oy) * ow
            # the edges, one output at a time: each run's sum starts at zero, so a tap in the padding adds
            # nothing (as its zero product does in onnxruntime's sum)
            for i in range(left + ow - right):
                ox = i if i < left else right + i - left
                total = zero
                for r in range(count.shape[1]):
                    part = zero
                    for k in range(count[oy, r]):
                        kx = column[oy, r, k]
                        if los[kx] <= ox < his[kx]:
                            part += wc[index[oy, r, k]] * xf[uintp(base + offset[oy, r, k] + ox * sw)]
                    total = part + total
                yf[uintp(yb + ox)] = total + b
            # the interior, a run a pass
            for ox in range(lo, hi):
                yf[uintp(yb + ox)] = 0.0
            for r in range(count.shape[1]):
                m = count[oy, r]
                if m == 0:
                    continue
                w0, o0 = wc[index[oy, r, 0]], base + offset[oy, r, 0]
                if m == 1:
                    for ox in range(lo, hi):
                        yf[uintp(yb + ox)] = w0 * xf[uintp(o0 + ox * sw)] + yf[uintp(yb + ox)]
                    continue
                w1, o1 = wc[index[oy, r, 1]], base + offset[oy, r, 1]
                if m == 2:
                    for ox in range(lo, hi):
                        v = w0 * xf[uintp(o0 + ox * sw)] + w1 * xf[uintp(o1 + ox * sw)]
                        yf[uintp(yb + ox)] = v + yf[uintp(yb + ox)]
                    continue
                w2, o2 = wc[index[oy, r, 2]], base + offset[oy, r, 2]
                if m == 3:
                    for ox in range(lo, hi):
                        v = w0 * xf[uintp(o0 + ox * sw)] + w1 * xf[uintp(o1 + ox * sw)]
                        yf[uintp(yb + ox)] = (v + w2 * xf[uintp(o2 + ox * sw)]) + yf[uintp(yb + ox)]
                    continue
                w3, o3 = wc[index[oy, r, 3]], base + offset[oy, r, 3]
                for ox in range(lo, hi):
                    v = w0 * xf[uintp(o0 + ox * sw)] + w1 * xf[uintp(o1 + ox * sw)]
                    v += w2 * xf[uintp(o2 + ox * sw)]
                    yf[uintp(yb + ox)] = (v + w3 * xf[uintp(o3 + ox * sw)]) + yf[uintp(yb + ox)]
            for ox in range(lo, hi):
                yf[uintp(yb + ox)] += b


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
        wc = w[c].reshape(-1)
        for iy in range(height):  # the interior; the borders stay zero
            for ix in range(width):
                plane[uintp((iy + ph) * wp + ix + pw)] = xf[uintp((c * height + iy) * width + ix)]
        b = bias[c]
        if kh == 3 and kw == 3:  # runs of 4, 4, 1 taps in one pass, the total in a register
            r1, r2 = dh * wp, 2 * dh * wp
            o0, o1, o2, o3, o4, o5, o6, o7, o8 = 0, dw, 2 * dw, r1, r1 + dw, r1 + 2 * dw, r2, r2 + dw, r2 + 2 * dw
            w0, w1, w2, w3, w4, w5, w6, w7, w8 = wc[0], wc[1], wc[2], wc[3], wc[4], wc[5], wc[6], wc[7], wc[8]
            for j in range(runs):
                s = w0 * plane[uintp(o0 + j * sw)] + w1 * plane[uintp(o1 + j * sw)]
                s += w2 * plane[uintp(o2 + j * sw)]
                s += w3 * plane[uintp(o3 + j * sw)]
                t = w4 * plane[uintp(o4 + j * sw)] + w5 * plane[uintp(o5 + j * sw)]
                t += w6 * plane[uintp(o6 + j * sw)]
                t += w7 * plane[uintp(o7 + j * sw)]
                acc[uintp(j)] = (w8 * plane[uintp(o8 + j * sw)] + (t + s)) + b
            for oy in range(oh):
                for ox in range(ow):
                    yf[uintp((c * oh + oy) * ow + ox)] = acc[uintp(oy * wp + ox)]
            continue
        for j in range(runs):
            acc[uintp(j)] = 0.0
        t0 = 0
        while t0 < kh * kw:  # one run of taps a pass
            rest = kh * kw - t0
            n = 4 if rest >= 4 else 2 if rest >= 2 else 1
            w0, o0 = wc[t0], (t0 // kw) * dh * wp + (t0 % kw) * dw
            if n == 1:
                for j in range(runs):
                    acc[uintp(j)] = w0 * plane[uintp(o0 + j * sw)] + acc[uintp(j)]
            elif n == 2:
                w1, o1 = wc[t0 + 1], ((t0 + 1) // kw) * dh * wp + ((t0 + 1) % kw) * dw
                for j in range(runs):
                    acc[uintp(j)] = (w0 * plane[uintp(o0 + j * sw)] + w1 * plane[uintp(o1 + j * sw)]) + acc[uintp(j)]
            else:
                w1, o1 = wc[t0 + 1], ((t0 + 1) // kw) * dh * wp + ((t0 + 1) % kw) * dw
                w2, o2 = wc[t0 + 2], ((t0 + 2) // kw) * dh * wp + ((t0 + 2) % kw) * dw
                w3, o3 = wc[t0 + 3], ((t0 + 3) // kw) * dh * wp + ((t0 + 3) % kw) * dw
                for j in range(runs):
                    v = w0 * plane[uintp(o0 + j * sw)] + w1 * plane[uintp(o1 + j * sw)]
                    v += w2 * plane[uintp(o2 + j * sw)]
                    acc[uintp(j)] = (v + w3 * plane[uintp(o3 + j * sw)]) + acc[uintp(j)]
            t0 += n
        for oy in range(oh):
            for ox in range(ow):
                yf[uintp((c * oh + oy) * ow + ox)] = acc[uintp(oy * wp + ox)] + b
