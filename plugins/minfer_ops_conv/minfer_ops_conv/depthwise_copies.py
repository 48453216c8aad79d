"""Depthwise 2-D convolution as tap copies and one small matrix product per channel ("copies" layout).

numpy has no fused multiply-add, so the tap methods of depthwise.py pay a
multiply per tap and output element (about 10 G/s here) and then a sum. Here
the taps are *copied* instead (about 18 G/s) into B (channels, taps, outputs),
and ``np.matmul`` of each channel's weight row (1, taps) with its (taps,
outputs) slice of B multiplies and sums them at once (about 11 G/s): fewer
passes, and the result lands in the output with no further copy.

Every tap must be one contiguous run of a source plane so the copy has long
rows. The input is split into stride phase planes (one plane, the input
itself, at stride 1), each laid out with rows of R cells, R the output width
when nothing wider is needed, and zero rows around them: a tap is then the
plane shifted by a constant. A tap that shifts columns reads, at the first or
last few output columns, a neighbouring row's cell instead of padding; those
cells of B are zeroed after the copy ("fills"), which is cheaper than padding
every row (a short-row copy in, a cropping copy out) at 28x28 and below.

Measured (one thread, single block, medians, us) against the channels-first tap method at shufflenet's
shapes: 136x28x28 s1 138-151 vs 185-222; 272x14x14 s1 89 vs 119; 112x56x56 s2 228 vs 307, of which the
strided phase copy is 105.
"""

from __future__ import annotations

import numpy as np

from . import _geometry as geo


class Copies:
    """The copies geometry of one 2-D window: phase planes, one copy per phase into B, fills, matmul."""

    def __init__(self, w: geo.Window) -> None:
        (h, wd), (kh, kw), (sh, sw), (dh, dw) = w.in_shape, w.kernel, w.strides, w.dilations
        (bh, bw), (oh, ow) = w.begin, w.out_shape
        rows = [divmod(i * dh - bh, sh) for i in range(kh)]  # per kernel row: (plane row shift, row phase)
        cols = [divmod(j * dw - bw, sw) for j in range(kw)]
        n_col = {b: len(range(b, wd, sw)) for _, b in cols}
        n_row = {a: len(range(a, h, sh)) for _, a in rows}
        self.rows_max = max(n_row.values())
        self.width = width = max([ow] + list(n_col.values()))  # R: cells per plane row and per B row
        self.outputs = oh * width
        self.kernel, self.out_shape, self.taps = (kh, kw), (oh, ow), kh * kw
        offsets = [kr * width + kc for kr, _ in rows for kc, _ in cols]
        self.lead = -min(0, min(offsets))
        self.plane = max(self.outputs + max(offsets), self.rows_max * width) + self.lead
        self.phases = sorted({(a, b) for _, a in rows for _, b in cols})
        # per phase: the plane cells its input fills, and those input cells
        self.copies = [((slice(None), slice(0, n_row[a]), slice(0, n_col[b])),
                        (slice(None), slice(a, None, sh), slice(b, None, sw))) for a, b in self.phases]
        # per phase: (first tap, tap steps, counts, plane offset of the first tap, plane steps)
        self.groups = []
        for a, b in self.phases:
            ii = [i for i in range(kh) if rows[i][1] == a]
            jj = [j for j in range(kw) if cols[j][1] == b]
            steps = (ii[1] - ii[0] if len(ii) > 1 else 0, jj[1] - jj[0] if len(jj) > 1 else 0)
            moves = ((rows[ii[1]][0] - rows[ii[0]][0]) * width if len(ii) > 1 else 0,
                     cols[jj[1]][0] - cols[jj[0]][0] if len(jj) > 1 else 0)
            start = rows[ii[0]][0] * width + cols[jj[0]][0] + self.lead
            self.groups.append((ii[0] * kw + jj[0], steps, (len(ii), len(jj)), start, moves))
        # output columns where a column-shifting tap ran into the neighbouring plane row
        self.fills = []
        for j, (kc, _) in enumerate(cols):
            lo, hi = min(ow, max(0, -kc)), max(0, min(ow, width - kc))
            self.fills += [(j, s) for s in (slice(0, lo), slice(max(hi, lo), ow)) if s.stop > s.start]

    @staticmethod
    def applies(w: geo.Window) -> bool:
        return len(w.kernel) == 2 and min(w.out_shape) > 0 and min(w.in_shape) > 0 and min(w.begin) >= 0

    def scratch_per_channel(self) -> int:
        return self.taps * self.outputs + len(self.phases) * self.plane + self.outputs

    def block(self, x: np.ndarray, weights: np.ndarray, y: np.ndarray, planes: np.ndarray, cols: np.ndarray,
              acc: np.ndarray | None, bias: np.ndarray | None) -> None:
        """x (cb, H, W) -> y (cb, oh, ow); weights (cb, 1, taps); ``planes`` (phases, cb, plane) zero-bordered
        (only their data cells are written); ``cols`` (cb, taps, outputs) and ``acc`` (cb, 1, outputs, or None
        to write y directly) scratch."""
        cb, width, item, dtype = x.shape[0], self.width, cols.itemsize, cols.dtype
        for k, (cells, part) in enumerate(self.copies):
            grid = planes[k, :, self.lead : self.lead + self.rows_max * width].reshape(cb, self.rows_max, width)
            np.copyto(grid[cells], x[part], casting="same_kind")
        for k, (first, steps, counts, start, moves) in enumerate(self.groups):
            shape = (cb,) + counts + (self.outputs,)
            src = np.ndarray(shape, dtype, planes, (k * cb * self.plane + start) * item,
                             (self.plane * item, moves[0] * item, moves[1] * item, item))
            dst = np.ndarray(shape, dtype, cols, first * self.outputs * item,
                             (self.taps * self.outputs * item, steps[0] * self.kernel[1] * self.outputs * item,
                              steps[1] * self.outputs * item, item))
            np.copyto(dst, src)
        grid = cols.reshape((cb,) + self.kernel + (self.out_shape[0], width))
        for j, s in self.fills:
            grid[:, :, j, :, s] = 0
        if acc is None:
            flat = y.reshape(cb, 1, self.outputs)
            np.matmul(weights, cols, out=flat)
            if bias is not None:
                flat += bias.reshape(cb, 1, 1)
            return
        np.matmul(weights, cols, out=acc)
        if bias is not None:
            acc += bias.reshape(cb, 1, 1)
        np.copyto(y, acc.reshape(cb, self.out_shape[0], width)[:, :, : self.out_shape[1]], casting="same_kind")

    def direct(self, y: np.ndarray, work: np.dtype) -> bool:
        """Whether the matmul can write y itself: rows of exactly the output width, in the work dtype."""
        return self.width == self.out_shape[1] and y.dtype == work and y.flags.c_contiguous
