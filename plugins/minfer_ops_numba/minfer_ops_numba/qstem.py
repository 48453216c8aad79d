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

from typing import Any

import numpy as np

from minfer_core import intra_op_threads, scratch

from . import fewchannels
from . import stem_rows as direct
from . import team
from ._jit import jit, readonly, uintp  # noqa: F401 (uintp: numba's type at compile)
from .qconv_gemm import grid  # noqa: F401 (compiled code calls it)
from .stem_rows import stem_rows


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

    def __call__(self, x: np.ndarray, quantize: tuple[Any, ...] | None, x_zero: int) -> np.ndarray | None:
        """The exact sums (float32, N x M x OH x OW, in scratch) of x, quantized by ``quantize`` (qconv.py's: scale,
        low, high; None: x is 8-bit, less ``x_zero``), or None where x holds NaN."""
        xc = scratch("minfer_ops_numba-qstem-x", x.shape, np.float32)
        if quantize is None:
            np.subtract(x, np.float32(x_zero), out=xc)
        elif centered(readonly(np.ascontiguousarray(x)).reshape(-1), xc.reshape(-1), *quantize):
            return None
        node, native = self.node, intra_op_threads() > 1 and team.available()
        size = team.size() if native and self.node.macs(x.shape) >= fewchannels.TEAM_SPLIT_MACS else 1
        key = x.shape + (size, True)  # planned once a shape, as fewchannels.py's kernel keeps its plans
        if key not in node.plans:
            node.plans[key] = node.plan(x.shape, size, native=True)
        shape, _, parts, made, table = node.plans[key]
        sums, xr = scratch("minfer_ops_numba-qstem-sums", shape, np.float32), readonly(xc)
        if parts > 1:
            fewchannels.drive_direct(xr, node.packed, sums, team.NOTHING, table, parts, *fewchannels.NO_OP)
        else:
            for geo, *_ in made:
                stem_rows(xr, geo[0], node.packed, sums, geo[1], geo[2], geo[3], geo[5], geo[6], *fewchannels.NO_OP)
        return sums
