"""ConvTranspose whose kernel equals its strides (2-D, group 1, float32, constant weights): a GEMM and a shuffle.

With kernel == strides and no pads, each input pixel writes its own kh x kw block of the output, and no two
blocks overlap: y[n, m, i*kh + ky, j*kw + kx] = b[m] + sum_c x[n, c, i, j] * W[c, m, ky, kx]. It is the upsampling
step of text detectors (DBNet's head: two 2x2 stride-2 ConvTransposes) and segmentation decoders. numpy's kernel
(minfer-ops-conv's conv_transpose.py) makes it a general col2im: one GEMM an image on one thread, a scatter-add
of the taps, a crop copy, then the bias (the OCR detector's 24 -> 24 at 80x80: 900 us, onnxruntime 224). Here a
unit, a band of one image's input rows, is one compiled call: one GEMM of the packed weights (M*kh*kw, C) by the
band's pixels through numpy's BLAS (`team.gemm`) into a per-thread scratch, then each output row written once,
its kw taps interleaved, the bias added. Units are cut from the shape alone and run over a native team when one
runs, else over `parallel_for`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minfer_core import kernel, parallel_for, scratch, spmd

from . import team
from ._jit import F32, PRIORITY, is_float32, jit, readonly, uintp  # noqa: F401 (uintp: numba's type at compile)
from .smallconv import PLAN_PARTS
from .team import NOTHING, prange  # noqa: F401 (compiled code calls them)

# a unit's GEMM output (M*kh*kw rows of the band's pixels) takes at most this much: it stays in L2 until the
# shuffle has written it out
UNIT_BYTES = 512 << 10


@jit
def units_of(address, x, wt, bias, y, found, kh, kw, work, lo, hi):  # pragma: no cover - compiled
    """Units lo..hi of ``found`` (rows i, r0, r1: input rows r0..r1 of image i): P = wt @ x[i, :, r0:r1] into
    ``work`` (wt: (M*kh*kw, C), row (m*kh + ky)*kw + kx), then y[i, m, r*kh + ky, j*kw + kx] = P[., (r - r0)*W + j]
    + bias[m] (bias empty: none), each output row written once."""
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    m_out = y.shape[1]
    rows = wt.shape[0]
    x0, w0, p0 = np.int64(x.ctypes.data), np.int64(wt.ctypes.data), np.int64(work.ctypes.data)
    has_bias = bias.size > 0
    for u in range(lo, hi):
        i, r0, r1 = found[u, 0], found[u, 1], found[u, 2]
        cols = (r1 - r0) * width
        gemm(address, rows, cols, channels, w0, channels, x0 + 4 * ((i * channels) * height + r0) * width,
             height * width, p0, cols, np.float32(0))
        for m in range(m_out):
            v = bias[m] if has_bias else np.float32(0)
            for ky in range(kh):
                tap = (m * kh + ky) * kw * cols
                for r in range(r1 - r0):
                    row = y[i, m, (r0 + r) * kh + ky]
                    src = tap + r * width
                    if kw == 2:  # the common 2x2 head: both taps in one loop over slices (vectorized: 24x the
                        a, b = work[src: src + width], work[src + cols: src + cols + width]  # strided form)
                        for j in range(width):
                            row[2 * j] = a[j] + v
                            row[2 * j + 1] = b[j] + v
                    else:
                        for kx in range(kw):
                            taps, dst = work[src + kx * cols: src + kx * cols + width], row[kx::kw]
                            for j in range(width):
                                dst[j] = taps[j] + v


@jit(parallel=True)
def team_units(address, x, wt, bias, y, found, kh, kw, work):  # pragma: no cover - compiled
    """`units_of` over a native team (team.py): part t of the units on team thread t, with row t of ``work``."""
    parts, count = work.shape[0], found.shape[0]
    for t in prange(parts):
        units_of(address, x, wt, bias, y, found, kh, kw, work[t], count * t // parts, count * (t + 1) // parts)


def plan(n: int, height: int, width: int, rows: int) -> tuple[np.ndarray, int]:
    """Bands of input rows (rows i, r0, r1) whose GEMM output (``rows`` x band pixels) takes at most UNIT_BYTES, at
    least PLAN_PARTS of them when the input has the rows, from the shape alone; and the scratch floats a thread
    needs."""
    fit = max(1, UNIT_BYTES // (4 * rows * width))
    band = max(1, min(fit, height, math.ceil(height / math.ceil(PLAN_PARTS / n))))
    found = [(i, r, min(height, r + band)) for i in range(n) for r in range(0, height, band)]
    return np.array(found, np.int64).reshape(-1, 3), rows * band * width


def applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """A 2-D float32 ConvTranspose of group 1 whose constant float32 weights' kernel equals its strides, with no
    pads, dilation, output padding or output shape (the output is the input's size times the strides), its bias
    constant or absent, and numpy's BLAS callable from compiled code."""
    w = ctx.constants[1] if len(ctx.constants) > 1 else None
    if not is_float32(ctx, 0, rank=4) or w is None or w.ndim != 4 or w.dtype != F32:
        return False
    if int(attrs.get("group", 1)) != 1 or ctx.input_types[0].shape[1] != w.shape[0]:
        return False
    if list(attrs.get("strides") or [1, 1]) != list(w.shape[2:]) or set(attrs.get("dilations") or [1]) != {1}:
        return False
    if any(attrs.get("pads") or [0]) or any(attrs.get("output_padding") or [0]) or attrs.get("output_shape"):
        return False
    if attrs.get("auto_pad", "NOTSET") not in ("NOTSET", "VALID"):
        return False
    b = ctx.constants[2] if len(ctx.constants) > 2 else None
    if len(ctx.input_types) > 2 and ctx.input_types[2] is not None and b is None:
        return False
    return bool(team.gemm_address())


@kernel("ConvTranspose", since=1, priority=PRIORITY, prepare=True, packed=(1, 2), applies=applies)
def conv_transpose(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, output_padding=None,
                   output_shape=None, pads=None, strides=None):
    """ConvTranspose-1/11/22 whose kernel equals its strides (see `applies`): one GEMM and a shuffle a band."""
    w, b = ctx.constants[1], ctx.constants[2] if len(ctx.constants) > 2 else None
    c, m, kh, kw = w.shape
    wt = readonly(np.ascontiguousarray(w.reshape(c, m * kh * kw).T))  # (M*kh*kw, C): a copy (packed=(1, 2))
    bias = readonly(np.asarray(b, np.float32).reshape(-1).copy()) if b is not None else NOTHING
    address = team.gemm_address()
    globals()["gemm"] = team.install()  # before units_of compiles: it looks the name up here
    plans: dict[tuple[int, ...], tuple[np.ndarray, int]] = {}
    _warm(address, wt, bias, kh, kw)

    def run(x, w=None, b=None):
        n, _, height, width = x.shape
        y = np.empty((n, m, height * kh, width * kw), np.float32)
        if y.size == 0:
            return y
        if x.shape not in plans:
            plans[x.shape] = plan(n, height, width, wt.shape[0])
        found, size = plans[x.shape]
        args = (address, readonly(np.ascontiguousarray(x)), wt, bias, y, found, kh, kw)
        threads = team.size() if len(found) > 1 else 1
        if threads > 1:
            team_units(*args, scratch("upsample-team", (min(threads, len(found)), size), np.float32))
            return y

        def span(lo: int, hi: int) -> None:
            units_of(*args, scratch("upsample-unit", (size,), np.float32), lo, hi)

        parallel_for(len(found), span, outputs_only=True)  # a unit writes only its rows of y
        return y

    return spmd(run)


def _warm(address: int, wt: np.ndarray, bias: np.ndarray, kh: int, kw: int) -> None:
    """Compile (or load from the cache) at build, with a run's argument types: not in the first run, whose timing of
    the candidates it would skew."""
    c = wt.shape[1]
    x = readonly(np.zeros((1, c, 1, 1), np.float32))
    y = np.zeros((1, wt.shape[0] // (kh * kw), kh, kw), np.float32)
    found, size = plan(1, 1, 1, wt.shape[0])
    args = (address, x, wt, bias, y, found, kh, kw)
    units_of(*args, np.zeros(size, np.float32), 0, 1)
    if team.available():
        team_units(*args, np.zeros((1, size), np.float32))
