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
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minfer_core import intra_op_threads, scratch

from . import stem_rows as direct
from . import team
from ._jit import jit, readonly, uintp  # noqa: F401 (uintp: numba's type at compile)
from .fewchannels import bands_of
from .qconv_gemm import grid  # noqa: F401 (compiled code calls it)
from .stem_rows import stem_rows  # noqa: F401 (the driver's, compiled)
from .team import NONE, prange  # noqa: F401 (the driver's, compiled)
from .window import window

TEAM_SPLIT_MACS = 1_000_000  # as fewchannels.py's: a native team's hand-over costs about a microsecond
NO_ACTIVATION = (NONE, np.float32(0), np.float32(0))


def fits(w: np.ndarray, attrs: dict) -> bool:
    """A 3x3 weight of at most 4 input channels, one group, dilation 1, strides 1 or 2 alike (stem_rows.py)."""
    strides = tuple(int(v) for v in attrs.get("strides") or (1, 1))
    return (int(attrs.get("group") or 1) == 1 and all(int(d) == 1 for d in attrs.get("dilations") or (1, 1))
            and w.ndim == 4 and direct.fits(w.shape[1], tuple(w.shape[2:]), strides))


@jit
def centered(x, dst, scale, low, high):  # pragma: no cover - compiled
    """dst = `grid` of x (qconv_gemm.py's `_quantize` without + zp); returns how many x were NaN."""
    bad = 0
    for i in range(x.size):
        v = grid(x[uintp(i)], scale, low, high)
        if v != v:
            bad += 1
        dst[uintp(i)] = v
    return bad


@jit(parallel=True)
def drive(xc, packed, sums, table, parts):  # pragma: no cover - compiled
    """The bands of ``table`` (rows: image, r0, r1, stride, pad top, pad left) in ``parts`` contiguous shares over
    a native team (team.py), each by stem_rows."""
    count = table.shape[0]
    for t in prange(parts):
        for u in range(count * t // parts, count * (t + 1) // parts):
            geo = table[u]
            stem_rows(xc, geo[0], packed, sums, geo[1], geo[2], geo[3], geo[4], geo[5], NONE, np.float32(0),
                      np.float32(0))


class QStem:
    """One stem's centered float32 weights (M, C*9 + 1: a zero bias column, the epilogue adds the bias) and its
    bands per input shape."""

    def __init__(self, w: np.ndarray, w_zero_point: np.ndarray | None, attrs: dict) -> None:
        m = w.shape[0]
        zero = 0.0 if w_zero_point is None else np.asarray(w_zero_point, np.float32).reshape(-1, 1)
        centered_w = w.reshape(m, -1).astype(np.float32) - zero
        self.packed = readonly(np.concatenate([centered_w, np.zeros((m, 1), np.float32)], axis=1, dtype=np.float32))
        self.attrs, self.stride = attrs, int((attrs.get("strides") or (1, 1))[0])
        self.plans: dict[tuple[int, ...], tuple[Any, ...]] = {}
        x = readonly(np.zeros((1, w.shape[1], 1, 1), np.float32))  # compiled at build, not in the first run
        centered(x.reshape(-1), np.zeros(x.size, np.float32), np.float32(1), np.float32(0), np.float32(1))
        sums, table = np.zeros((1, m, 1, 1), np.float32), readonly(np.array([[0, 0, 1, 1, 1, 1]], np.int64))
        stem_rows(x, 0, self.packed, sums, 0, 1, 1, 1, 1, *NO_ACTIVATION)
        if team.available():
            drive(x, self.packed, sums, table, 1)

    def plan(self, shape: tuple[int, ...], parts: int) -> tuple[tuple[int, ...], np.ndarray, int]:
        """The sums' shape, the bands' table and how many shares (once per input shape and thread count)."""
        key = shape + (parts,)
        if key not in self.plans:
            begin, _, (oh, ow) = window(shape[2:], (3, 3), [self.stride] * 2, (1, 1), self.attrs.get("pads"),
                                        self.attrs.get("auto_pad") or "NOTSET", clamp_same=True)
            bands = bands_of(shape[0], oh, ow, self.packed.shape[1], parts, even=True) if oh * ow else []
            table = readonly(np.array([(i, r0, r1, self.stride, begin[0], begin[1]) for i, r0, r1 in bands],
                                      np.int64).reshape(-1, 6))
            self.plans[key] = ((shape[0], self.packed.shape[0], oh, ow), table, min(parts, len(bands)))
        return self.plans[key]

    def __call__(self, x: np.ndarray, quantize: tuple[Any, ...] | None, x_zero: int) -> np.ndarray | None:
        """The exact sums (float32, N x M x OH x OW, in scratch) of x, quantized by ``quantize`` (qconv.py's: scale,
        low, high; None: x is 8-bit, less ``x_zero``), or None where x holds NaN."""
        xc = scratch("minfer_ops_numba-qstem-x", x.shape, np.float32)
        if quantize is None:
            np.subtract(x, np.float32(x_zero), out=xc)
        elif centered(readonly(np.ascontiguousarray(x)).reshape(-1), xc.reshape(-1), *quantize):
            return None
        shape = self.plan(x.shape, 1)[0]
        macs = math.prod(shape) * (self.packed.shape[1] - 1)
        size = team.size() if intra_op_threads() > 1 and macs >= TEAM_SPLIT_MACS and team.available() else 1
        shape, table, parts = self.plan(x.shape, size)
        sums, xr = scratch("minfer_ops_numba-qstem-sums", shape, np.float32), readonly(xc)
        if parts > 1:
            drive(xr, self.packed, sums, table, parts)
        else:
            for i, r0, r1, s, ph, pw in table:
                stem_rows(xr, i, self.packed, sums, r0, r1, s, ph, pw, *NO_ACTIVATION)
        return sums
