"""The depthwise conv's compiled phase-plane loop (`phase_rows`): copy each channel into zero-bordered phase
planes, then sum its taps over contiguous runs.

The taps are summed in onnxruntime's order (loops.py's docstring): in (ky, kx) order, in runs of four taps
whose products are added left to right, each run's sum then added to the total, the bias last; every
product and sum rounded on its own, so loops.py's row loops give the same bits. The 3x3 and 5x5 kernels
(nearly every depthwise layer of MobileNets, PP-LCNet, EfficientNets) take all their taps in one pass over
a run, the total held in a register; other kernels take one run of taps a pass, the total going through
memory between passes. Indices are made unsigned (``uintp``): numba then drops its negative-index check,
which otherwise keeps the loops from vectorizing.
"""

from __future__ import annotations

import numpy as np

from ._jit import jit, uintp  # noqa: F401 (uintp: rebound to numba's type at compile)

VECTOR = 8  # float32 lanes of the vectors the loops compile to (a constant to numba, as every global)


@jit
def phase_rows(x, w, bias, y, c0, c1, sh, sw, ph, pw, dh, dw):  # pragma: no cover - compiled
    """y[c] = sum of w[c, ky, kx] * x[c] shifted, + bias[c], for planes c0..c1 of x (C, H, W) into y (C, OH, OW),
    summed in runs of four taps (the module docstring).

    Each channel is copied into sh * sw zero-bordered phase planes (row i, column j of the padded input goes
    to plane (i % sh, j % sw) at (i // sh, j // sw)), all Wq wide: a tap then reads one plane at a fixed
    offset from its output, whatever the stride, and every tap is one contiguous run over all output rows
    ("wide" rows of Wq outputs, the columns past the output's width computed and dropped). Contiguous runs
    vectorize where a stride-2 read does not (3x faster on 5x5 stride-2 layers), and one run per tap and
    plane costs less than one per row on 14x14 and 7x7 planes. The tap loops are spelt out here rather than
    called per channel: as calls (arrays passed in, which the compiler cannot prove apart) they ran 20-30%
    slower.
    """
    height, width = x.shape[1], x.shape[2]
    kh, kw = w.shape[1], w.shape[2]
    oh, ow = y.shape[1], y.shape[2]
    wq, hq = ow + ((kw - 1) * dw) // sw, oh + ((kh - 1) * dh) // sh
    size = (hq + 1) * wq  # a plane and a spare row: the last wide row's dropped columns read past hq rows
    # whole vectors of outputs: the sums past the last wide row are dropped too, and a scalar remainder of
    # 25 taps cost 5-15% on 7x7 and 14x14 planes
    runs = -(-(oh * wq) // VECTOR) * VECTOR
    q = np.zeros(sh * sw * size + VECTOR, x.dtype)  # the borders stay zero: every channel fills the same cells
    acc = np.empty(runs, x.dtype)
    srcs, dsts, counts, m = copies(height, width, sh, sw, ph, pw, hq, wq, size)
    offs = np.empty(kh * kw, np.int64)  # where tap (ky, kx) reads in the planes, from its output's index
    for ky in range(kh):
        for kx in range(kw):
            offs[ky * kw + kx] = (((ky * dh) % sh) * sw + (kx * dw) % sw) * size + ((ky * dh) // sh) * wq \
                + (kx * dw) // sw
    xf, yf = x.reshape(-1), y.reshape(-1)
    for c in range(c0, c1):
        fill(xf, q, c * height * width, srcs, dsts, counts, m, sw)
        wc = w[c].reshape(-1)
        bc = bias[c]
        if kh == 3 and kw == 3:  # runs of 4, 4, 1 taps
            o0, o1, o2, o3, o4, o5, o6, o7, o8 = offs[0], offs[1], offs[2], offs[3], offs[4], offs[5], offs[6], \
                offs[7], offs[8]
            w0, w1, w2, w3, w4, w5, w6, w7, w8 = wc[0], wc[1], wc[2], wc[3], wc[4], wc[5], wc[6], wc[7], wc[8]
            for j in range(runs):
                s = w0 * q[uintp(o0 + j)] + w1 * q[uintp(o1 + j)]
                s += w2 * q[uintp(o2 + j)]
                s += w3 * q[uintp(o3 + j)]
                t = w4 * q[uintp(o4 + j)] + w5 * q[uintp(o5 + j)]
                t += w6 * q[uintp(o6 + j)]
                t += w7 * q[uintp(o7 + j)]
                acc[uintp(j)] = (w8 * q[uintp(o8 + j)] + (t + s)) + bc
        elif kh == 5 and kw == 5:  # runs of 4 (six) and 1
            o0, o1, o2, o3, o4, o5, o6, o7, o8 = offs[0], offs[1], offs[2], offs[3], offs[4], offs[5], offs[6], \
                offs[7], offs[8]
            o9, o10, o11, o12, o13, o14, o15, o16 = offs[9], offs[10], offs[11], offs[12], offs[13], offs[14], \
                offs[15], offs[16]
            o17, o18, o19, o20, o21, o22, o23, o24 = offs[17], offs[18], offs[19], offs[20], offs[21], offs[22], \
                offs[23], offs[24]
            w0, w1, w2, w3, w4, w5, w6, w7, w8 = wc[0], wc[1], wc[2], wc[3], wc[4], wc[5], wc[6], wc[7], wc[8]
            w9, w10, w11, w12, w13, w14, w15, w16 = wc[9], wc[10], wc[11], wc[12], wc[13], wc[14], wc[15], wc[16]
            w17, w18, w19, w20, w21, w22, w23, w24 = wc[17], wc[18], wc[19], wc[20], wc[21], wc[22], wc[23], wc[24]
            for j in range(runs):
                a = w0 * q[uintp(o0 + j)] + w1 * q[uintp(o1 + j)]
                a += w2 * q[uintp(o2 + j)]; a += w3 * q[uintp(o3 + j)]  # noqa: E702
                s = w4 * q[uintp(o4 + j)] + w5 * q[uintp(o5 + j)]
                s += w6 * q[uintp(o6 + j)]; s += w7 * q[uintp(o7 + j)]  # noqa: E702
                a = s + a
                s = w8 * q[uintp(o8 + j)] + w9 * q[uintp(o9 + j)]
                s += w10 * q[uintp(o10 + j)]; s += w11 * q[uintp(o11 + j)]  # noqa: E702
                a = s + a
                s = w12 * q[uintp(o12 + j)] + w13 * q[uintp(o13 + j)]
                s += w14 * q[uintp(o14 + j)]; s += w15 * q[uintp(o15 + j)]  # noqa: E702
                a = s + a
                s = w16 * q[uintp(o16 + j)] + w17 * q[uintp(o17 + j)]
                s += w18 * q[uintp(o18 + j)]; s += w19 * q[uintp(o19 + j)]  # noqa: E702
                a = s + a
                s = w20 * q[uintp(o20 + j)] + w21 * q[uintp(o21 + j)]
                s += w22 * q[uintp(o22 + j)]; s += w23 * q[uintp(o23 + j)]  # noqa: E702
                acc[uintp(j)] = (w24 * q[uintp(o24 + j)] + (s + a)) + bc
        else:  # one run a pass, the total going through memory between passes (spelt out here: as a call, its
            # loops ran 20% slower on 7x7 kernels)
            for j in range(runs):
                acc[uintp(j)] = 0.0
            t0 = 0
            while t0 < kh * kw:
                rest = kh * kw - t0
                n = 4 if rest >= 4 else 2 if rest >= 2 else 1
                w0, o0 = wc[t0], offs[t0]
                if n == 1:
                    for j in range(runs):
                        acc[uintp(j)] = w0 * q[uintp(o0 + j)] + acc[uintp(j)]
                elif n == 2:
                    w1, o1 = wc[t0 + 1], offs[t0 + 1]
                    for j in range(runs):
                        acc[uintp(j)] = (w0 * q[uintp(o0 + j)] + w1 * q[uintp(o1 + j)]) + acc[uintp(j)]
                else:
                    w1, w2, w3 = wc[t0 + 1], wc[t0 + 2], wc[t0 + 3]
                    o1, o2, o3 = offs[t0 + 1], offs[t0 + 2], offs[t0 + 3]
                    for j in range(runs):
                        s = w0 * q[uintp(o0 + j)] + w1 * q[uintp(o1 + j)]
                        s += w2 * q[uintp(o2 + j)]
                        acc[uintp(j)] = (s + w3 * q[uintp(o3 + j)]) + acc[uintp(j)]
                t0 += n
            for j in range(runs):
                acc[uintp(j)] += bc
        for oy in range(oh):
            for ox in range(ow):
                yf[uintp((c * oh + oy) * ow + ox)] = acc[uintp(oy * wq + ox)]


@jit
def copies(height, width, sh, sw, ph, pw, hq, wq, size):  # pragma: no cover - compiled
    """The strided copies that fill one channel's phase planes: (offset in x's plane, offset in the planes,
    count) per input row and column phase, a row's in the order of their first column, and how many. Found
    once per call: the integer divisions cost more than a 7-wide row's copy."""
    srcs, dsts = np.empty(height * sw, np.int64), np.empty(height * sw, np.int64)
    counts, m = np.empty(height * sw, np.int64), 0
    for iy in range(height):
        i = iy + ph
        if i // sh >= hq:
            continue  # read by no output
        for ix0 in range(sw):  # x's first column of each column phase px, in column order
            px = (ix0 + pw) % sw
            j0 = (ix0 + pw) // sw
            n = min((width - ix0 + sw - 1) // sw, wq - j0)
            if n > 0:
                srcs[m], counts[m] = iy * width + ix0, n
                dsts[m] = ((i % sh) * sw + px) * size + (i // sh) * wq + j0
                m += 1
    return srcs, dsts, counts, m


@jit
def fill(xf, q, base, srcs, dsts, counts, m, sw):  # pragma: no cover - compiled
    """One channel's copies (`copies`) from xf at ``base`` into the phase planes q.

    At stride 2 a row's two column phases are split in one pass (x[2u] to one plane, x[2u + 1] to the
    other), which vectorizes; one strided pass per phase does not, and took 2.3x as long on 112x112 rows.
    """
    t = 0
    while t < m:
        s0, d0, n0 = base + srcs[t], dsts[t], counts[t]
        if sw == 1:  # a constant stride: the copy vectorizes
            for u in range(n0):
                q[uintp(d0 + u)] = xf[uintp(s0 + u)]
        elif sw == 2 and t + 1 < m and srcs[t + 1] == srcs[t] + 1:  # the next copy starts a column on: both at once
            d1, n1 = dsts[t + 1], counts[t + 1]
            both = min(n0, n1)
            for u in range(both):
                q[uintp(d0 + u)] = xf[uintp(s0 + 2 * u)]
                q[uintp(d1 + u)] = xf[uintp(s0 + 2 * u + 1)]
            for u in range(both, n0):
                q[uintp(d0 + u)] = xf[uintp(s0 + 2 * u)]
            for u in range(both, n1):
                q[uintp(d1 + u)] = xf[uintp(s0 + 2 * u + 1)]
            t += 1
        else:
            for u in range(n0):
                q[uintp(d0 + u)] = xf[uintp(s0 + u * sw)]
        t += 1
