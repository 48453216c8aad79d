"""A quantized network's stem (FloatQLinearConv of at most 4 input channels, 3x3) by stem_rows.py's direct loop.

qconv.py computes a FloatQLinearConv by igemm's exact 8-bit product over an 8-bit im2col: on a stem (27 taps an
output) the im2col and igemm's write-out of few sums a column are most of the work, and MobileNetV2's QDQ stem
took 625-714 us in the model against 383-419 for its float twin's. Its sums are small integers: 27 products of
8-bit values (centered by their zero points) and a bound qconv.py checks below 2**24, so float32 holds each sum,
and each partial sum, exactly, in any order. So here the input is quantized and centered into float32
(`centered`: QuantizeLinear's float32 division, clip and rint, as qconv_gemm.py's `_quantize`, without the zero
point put back), the weights are centered into float32 once, and stem_rows.py's loop (inputs in registers, fused
multiply-adds, exact here) writes the sums as float32: qconv.py's epilogue then runs on the same values igemm
gives, so the outputs are its bits. An input holding NaN (no 8-bit value) leaves it to igemm's path.

Where qconv.py's epilogue is a compiled chain (no division, no residual: `QStem.into`) the stem writes its sums
into the output and applies the chain to each band of rows while the band is in cache (igemm.py's
`requantize_channels`, the same float32 operations), and the input's quantization is shared by the team's threads:
before, the sums went to scratch (1.6 MB for MobileNetV2's 32x112x112) and the chain ran after, a pass over all of
them, and the input was quantized on one thread. MobileNetV2 in one process, two threads, banded / before
(bench/results/session28/stem_ab.py): QDQ 7.21 / 7.34 ms, per channel 8.41 / 8.85, QOperator 6.70 / 6.90; same bits.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import intra_op_threads, scratch

from . import fewchannels
from . import stem_rows as direct
from . import team
from ._jit import jit, readonly, uintp  # noqa: F401 (uintp: numba's type at compile)
from .igemm import requantize_channels  # noqa: F401 (compiled code calls it)
from .qconv_gemm import grid  # noqa: F401 (compiled code calls it)
from .stem_rows import stem_rows
from .team import NONE, prange  # noqa: F401 (rebound to numba's at compile)


def fits(w: np.ndarray, attrs: dict) -> bool:
    """A 3x3 weight of at most 4 input channels, one group, dilation 1, strides 1 or 2 alike (stem_rows.py)."""
    strides = tuple(int(v) for v in attrs.get("strides") or (1, 1))
    return (int(attrs.get("group") or 1) == 1 and all(int(d) == 1 for d in attrs.get("dilations") or (1, 1))
            and w.ndim == 4 and direct.fits(w.shape[1], tuple(w.shape[2:]), strides))


@jit
def centered(x, dst, scale, low, high):  # pragma: no cover - compiled
    """dst = `grid` of x (qconv_gemm.py's `_quantize` without + zp); returns how many x were NaN."""
    return _centered(x, dst, scale, low, high, 0, x.size)


@jit
def _centered(x, dst, scale, low, high, lo, hi):  # pragma: no cover - compiled
    """`centered` on x[lo:hi]."""
    bad = 0
    for i in range(lo, hi):
        v = grid(x[uintp(i)], scale, low, high)
        if v != v:
            bad += 1
        dst[uintp(i)] = v
    return bad


@jit
def _bands(xs, packed, y, table, lo, hi, m, c, s, b, params):  # pragma: no cover - compiled
    """Bands lo..hi of ``table`` (fewchannels.py's plan): each band's exact sums by stem_rows into y, then the
    chain on the band's rows of every channel while they are in cache."""
    yf, channels, plane = y.reshape(-1), y.shape[1], y.shape[2] * y.shape[3]
    for u in range(lo, hi):
        geo = table[u]
        i, r0, r1, ow = geo[0], geo[1], geo[2], geo[7]
        stem_rows(xs, i, packed, y, r0, r1, geo[3], geo[5], geo[6], NONE, np.float32(0), np.float32(0))
        requantize_channels(yf, (i * channels * plane) + r0 * ow, 0, channels, (r1 - r0) * ow, plane, m, c, s, b,
                            params)


@jit(parallel=True)
def _drive(x, xc, scale, low, high, packed, y, table, parts, m, c, s, b, params):  # pragma: no cover - compiled
    """Over a native team's ``parts``: x quantized into xc (an equal share each), then `_drive_bands`; returns how
    many x were NaN (then no band is computed)."""
    xf, xcf, bad = x.reshape(-1), xc.reshape(-1), 0
    for t in prange(parts):
        bad += _centered(xf, xcf, scale, low, high, xf.size * t // parts, xf.size * (t + 1) // parts)
    if bad == 0:
        _drive_bands(xc, packed, y, table, parts, m, c, s, b, params)
    return bad


@jit(parallel=True)
def _drive_bands(xc, packed, y, table, parts, m, c, s, b, params):  # pragma: no cover - compiled
    """`_bands` over a native team's ``parts``, an equal share of the table each."""
    count = table.shape[0]
    for t in prange(parts):
        _bands(xc, packed, y, table, count * t // parts, count * (t + 1) // parts, m, c, s, b, params)


class QStem:
    """One stem as fewchannels.py's Node of its centered float32 weights and no bias (the epilogue adds it): the
    same bands and drivers, no activation."""

    def __init__(self, w: np.ndarray, w_zero_point: np.ndarray | None, attrs: dict) -> None:
        zero = 0.0 if w_zero_point is None else np.asarray(w_zero_point, np.float32).reshape(-1, 1, 1, 1)
        self.node = fewchannels.Node(w.astype(np.float32) - zero, None, attrs.get("auto_pad") or "NOTSET",
                                     attrs.get("pads"), attrs.get("strides"))
        x = readonly(np.zeros((1, w.shape[1], 1, 1), np.float32))  # compiled at build, not in the first run
        centered(x.reshape(-1), np.zeros(x.size, np.float32), np.float32(1), np.float32(0), np.float32(1))
        fewchannels._warm(self.node, None, 0, team.available())

    def _plan(self, x: np.ndarray, threads: int = 0) -> tuple[Any, ...]:
        """The node's plan for x's shape over the threads that run it: a native team's where the stem splits, else
        one (``threads`` 1: one thread whatever runs)."""
        node = self.node
        size = 1
        if threads != 1 and intra_op_threads() > 1 and team.available():
            size = team.size() if node.macs(x.shape) >= fewchannels.TEAM_SPLIT_MACS else 1
        key = x.shape + (size, True)  # planned once a shape, as fewchannels.py's kernel keeps its plans
        if key not in node.plans:
            node.plans[key] = node.plan(x.shape, size, native=True)
        return node.plans[key]

    def warm(self, chain: tuple[np.ndarray, ...]) -> None:
        """Compile `into`'s loops (or load them from the cache) at build, not in the first run."""
        x = readonly(np.zeros((1, self.node.packed.shape[1] // 9, 4, 4), np.float32))
        shape, _, _, _, table = self.node.plan(x.shape, 1, native=True)
        out = np.zeros(shape, np.float32)  # the plan's output shape: the node's strides and pads
        self.into(x, (np.float32(1), np.float32(0), np.float32(1)), 0, out, chain, threads=1)
        if team.available():
            _drive(x, np.zeros(x.shape, np.float32), np.float32(1), np.float32(0), np.float32(1), self.node.packed,
                   out, table, 1, *chain)

    def into(self, x: np.ndarray, quantize: tuple[Any, ...] | None, x_zero: int, out: np.ndarray,
             chain: tuple[np.ndarray, ...], threads: int = 0) -> bool:
        """out = the chain (qconv.py's epilogue as `igemm.Chain` operands m, c, s, b, params) on the exact sums of x,
        band by band while each is in cache; False (out unfinished) where x holds NaN. ``threads``: see `_plan`."""
        _, _, parts, _, table = self._plan(x, threads)
        xs, xc = readonly(np.ascontiguousarray(x)), scratch("minfer_ops_numba-qstem-x", x.shape, np.float32)
        if quantize is not None and parts > 1:
            return not _drive(xs, xc, *quantize, self.node.packed, out, table, parts, *chain)
        if quantize is None:  # 8-bit x: less its zero point, exact
            np.subtract(xs, np.float32(x_zero), out=xc)
        elif centered(xs.reshape(-1), xc.reshape(-1), *quantize):
            return False
        if parts > 1:
            _drive_bands(readonly(xc), self.node.packed, out, table, parts, *chain)
        else:
            _bands(readonly(xc), self.node.packed, out, table, 0, table.shape[0], *chain)
        return True

    def __call__(self, x: np.ndarray, quantize: tuple[Any, ...] | None, x_zero: int) -> np.ndarray | None:
        """The exact sums (float32, N x M x OH x OW, in scratch) of x, quantized by ``quantize`` (qconv.py's: scale,
        low, high; None: x is 8-bit, less ``x_zero``), or None where x holds NaN."""
        xc = scratch("minfer_ops_numba-qstem-x", x.shape, np.float32)
        if quantize is None:
            np.subtract(x, np.float32(x_zero), out=xc)
        elif centered(readonly(np.ascontiguousarray(x)).reshape(-1), xc.reshape(-1), *quantize):
            return None
        node = self.node
        shape, _, parts, made, table = self._plan(x)
        sums, xr = scratch("minfer_ops_numba-qstem-sums", shape, np.float32), readonly(xc)
        if parts > 1:
            fewchannels.drive_direct(xr, node.packed, sums, team.NOTHING, table, parts, *fewchannels.NO_OP)
        else:
            for geo, *_ in made:
                stem_rows(xr, geo[0], node.packed, sums, geo[1], geo[2], geo[3], geo[5], geo[6], *fewchannels.NO_OP)
        return sums
