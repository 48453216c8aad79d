"""ai.minfer::FloatQLinearConv and ScaledConvInteger (group 1) on numpy's sgemm from compiled code, the Requantize
chain per unit in cache.

igemm (qconv.py) loses to minfer-ops-conv's kernel on MobileNetV2's 1x1 convs of 16-32 input channels over wide
maps, where writing out each sum costs more than the product; minfer-ops-conv's kernel there runs the float conv on
the centered operands (sgemm) and its compiled Requantize from Python tile by tile. Here the conv is smallconv.py's
compiled path on the centered weights (float32, written into scratch from the 8-bit ones each run): per unit (a
band of output rows and a block of output channels) an im2col or none (a 1x1 stride-1 conv reads its input as it
lies), one sgemm, then igemm.py's `requantize_channels` on the unit's rows while they are in cache, over a native team
when one runs. An input to quantize (or 8-bit) is centered first, the whole of it, into scratch (`_center`).

The sums are exact: `applies` asks that the largest (255 times the weights' row L1 norm, plus the bias) is below
2**24, where float32 holds every integer, so BLAS's order and fused multiply-adds change nothing and the values are
minfer-ops-conv's. The core times this kernel against igemm's and numpy's per node.

A 1x1 stride-1 conv of at most pointwise.MAX_CHANNELS input channels takes pointwise.py's AVX-512 micro-kernel
instead of sgemm where it can be built (`MICRO`: OpenBLAS packs both operands at each call, slow for MobileNetV2's
projections of 16-32 output channels), each block of 64 pixels then requantized while in cache. The same exact
sums. MobileNetV2 QDQ, in one process, per step in the run, micro-kernel / sgemm
(bench/results/session28/micro_steps.py): its ten projection convs 1036 / 1210 us (96->24 at 56x56 124 / 140,
144->24 with the residual block's tail 173 / 216).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import KernelContext, TensorType, intra_op_threads, kernel, parallel_for, scratch, spmd

from . import pointwise, smallconv, team
from ._jit import PRIORITY, input_type, jit, readonly
from .qconv import EIGHT_BIT, EXACT, MINFER, _bound, _constant, _dynamic_quantizer, _epilogue, _given, _scaled_epilogue
from .igemm import requantize_channels  # noqa: F401 (compiled code calls it)
from .qdepthwise import (EMPTY, CENTERED, EIGHT, QUANTIZE, _center, _chain, _operand,  # noqa: F401
                         fitted, scaled_run)
from .pointwise import W, column_tiles  # noqa: F401 (compiled code calls it)
from .smallconv import im2col  # noqa: F401 (compiled code calls it)
from .team import prange  # noqa: F401 (rebound to numba's at compile)


# the weights this kernel takes: its sgemm reads them centered as float32, which it writes into scratch each run
# (~1 us a 4k weight), holding the 8-bit ones. Up to MobileNetV2's 1x1 convs of 64-96 output channels over 14x14 and
# 28x28 maps (4.6-55k weights: 384 -> 96 at 14x14, the first of its stage, 271 us in igemm's kernel, 124 here
# against 112 for its float twin); larger weights pay their centering on maps where igemm wins anyway.
MAX_WEIGHTS = 65536


@jit
def _plus_residual(yf, z, at, m0, m1, cells, stride, grid):  # pragma: no cover - compiled
    """y += z, then QuantizeDequantize on ``grid`` (scale, low, high: divide, rint, clip, multiply, as its kernels
    do) on channels m0..m1 of a unit (``cells`` values from ``at``, channels ``stride`` apart): a quantized residual
    block's Add and rounding while the unit is in cache."""
    scale, low, high = grid[0], grid[1], grid[2]
    for ch in range(m1 - m0):
        base = at + ch * stride
        for j in range(cells):
            v = np.rint((yf[uintp(base + j)] + z[uintp(base + j)]) / scale)
            v = low if v < low else (high if v > high else v)
            yf[uintp(base + j)] = v * scale


@jit
def _units(address, xs, full, y, found, geos, cf, direct, lo, hi, m, c, s, b, params, z, grid):  # pragma: no cover
    """Units lo..hi of ``found`` ((i0, i1, r0, r1, m0, m1): images, output rows, output channels): smallconv.py's
    `units_of` (an im2col into ``cf`` unless ``direct``, a BLAS GEMM an image into y's rows) with `requantize_channels`
    on the unit's rows as the epilogue, then, when ``z`` (flat, y's shape) is not empty, `_plus_residual`.
    ``full``: the centered weights (M, K + 1), a last column of zeros. ``direct`` `MICRO` (a 1x1 stride-1 conv of
    at most pointwise.MAX_CHANNELS input channels): pointwise.py's micro-kernel instead of BLAS (`_blocks`)."""
    mm, ohw, hw, rows = y.shape[1], y.shape[2], xs.shape[2] * xs.shape[3], full.shape[1]
    k = xs.shape[1] if direct else rows
    yf, x0, y0, w0 = y.reshape(-1), np.int64(xs.ctypes.data), np.int64(y.ctypes.data), np.int64(full.ctypes.data)
    c0 = np.int64(cf.ctypes.data)
    for u in range(lo, hi):
        i0, i1, r0, r1, m0, m1 = found[u, 0], found[u, 1], found[u, 2], found[u, 3], found[u, 4], found[u, 5]
        ow = geos[u, 11]
        ncols = (r1 - r0) * ow
        if direct == MICRO:
            for i in range(i0, i1):
                _blocks(x0 + 4 * i * k * hw, w0, y0, yf, k, rows, mm, hw, i, r0 * ow, r1 * ow, m0, m1, m, c, s, b,
                        params, z, grid)
            continue
        if not direct:
            im2col(xs, cf, i1 - i0, 1, rows, ncols, geos[u])
        for i in range(i0, i1):
            at = (i * mm + m0) * ohw + r0 * ow
            src = x0 + 4 * (i * k * hw + r0 * ow) if direct else c0 + 4 * (i - i0) * rows * ncols
            gemm(address, m1 - m0, ncols, k, w0 + 4 * m0 * rows, rows, src, hw if direct else ncols, y0 + 4 * at,
                 ohw, np.float32(0))
            requantize_channels(yf, at, m0, m1, ncols, ohw, m, c, s, b, params)
            if z.size:
                _plus_residual(yf, z, at, m0, m1, ncols, ohw, grid)


@jit
def _blocks(xb, w0, y0, yf, k, rows, mm, hw, i, p0, p1, m0, m1, m, c, s, b, params, z, grid):  # pragma: no cover
    """Image i's pixels p0..p1 of output channels m0..m1 of a 1x1 stride-1 conv by pointwise.py's micro-kernel
    (`column_tiles`: MR channels by W pixels in registers, the K products of each output added in channel order by
    fused multiply-adds, exact here as BLAS's are: integers below 2**24), the input's rows read where they lie from
    ``xb``; then the unit's epilogue on each block of W pixels while it is in cache."""
    for n0 in range(p0, p1, W):
        w = min(W, p1 - n0)
        column_tiles(w0 + np.int64(4 * m0 * rows), np.int64(4 * rows), np.int64(k), np.int64(m1 - m0),
                     xb + np.int64(4 * n0), np.int64(4 * hw), y0 + np.int64(4 * ((i * mm + m0) * hw + n0)),
                     np.int64(4 * hw), np.int64(w), False)
        at = (i * mm + m0) * hw + n0
        requantize_channels(yf, at, m0, m1, w, hw, m, c, s, b, params)
        if z.size:
            _plus_residual(yf, z, at, m0, m1, w, hw, grid)


@jit(parallel=True)
def _team_units(address, xs, full, y, found, geos, cols, direct, m, c, s, b, params, z, grid):  # pragma: no cover
    """`_units` over a native team (team.py): part t of the units on team thread t, with row t of ``cols``."""
    parts, count = cols.shape[0], found.shape[0]
    for t in prange(parts):
        _units(address, xs, full, y, found, geos, cols[t], direct, count * t // parts, count * (t + 1) // parts,
               m, c, s, b, params, z, grid)


@jit
def _center_weights(w, zero, full):  # pragma: no cover - compiled
    """full[:, :K] = w - zero (one a row, or one for all), full[:, K] = 0: the GEMM's operand (M, K + 1) and its
    zero bias column, from the 8-bit weights (M, K). Exact: integers."""
    k = w.shape[1]
    per_row = zero.size > 1
    for i in range(w.shape[0]):
        z = zero[uintp(i)] if per_row else zero[0]
        for j in range(k):
            full[uintp(i), uintp(j)] = np.float32(w[uintp(i), uintp(j)]) - z
        full[uintp(i), uintp(k)] = np.float32(0)


@jit
def _center_all(x, xq, mode, quant):  # pragma: no cover - compiled
    """All of x centered into xq (`_center`, image by image)."""
    for i in range(x.shape[0]):
        _center(x, xq, i, 0, x.shape[1], mode, quant)


@jit(parallel=True)
def _center_team(x, xq, mode, quant, parts):  # pragma: no cover - compiled
    """`_center_all` over a native team: ``parts`` even ranges of the channels, one a team thread's, every image.
    The same operations on each value: the same bits."""
    c = x.shape[1]
    for t in prange(parts):
        for i in range(x.shape[0]):
            _center(x, xq, i, c * t // parts, c * (t + 1) // parts, mode, quant)


def _weight_fits(ctx: Any, x: Any, w: Any, zp_index: int) -> bool:
    """A 4-D input of known channels and spatial size, a constant 8-bit 4-D weight of at most MAX_WEIGHTS values
    over those channels, and a constant weight zero point (or none), one or one an output channel."""
    if x is None or x.shape is None or len(x.shape) != 4 or not all(isinstance(d, int) for d in x.shape[1:]):
        return False
    if w is None or w.ndim != 4 or w.dtype not in EIGHT_BIT or w.size == 0 or x.shape[1] != w.shape[1]:
        return False
    if w.size > MAX_WEIGHTS:  # centered each run: a cost that grows with the weight
        return False
    wz = _constant(ctx, zp_index)
    return not (wz is None and _given(ctx, zp_index) or wz is not None and wz.size not in (1, w.shape[0]))


# input values from which a native team shares their centering: ~20 us of one thread's work (dynamic MobileNetV2's
# conv inputs took ~1 ms of one thread's time a run so, while the other core waited)
TEAM_CENTER = 1 << 16
NO_GRID = readonly(np.zeros(3, np.float32))
# `_units`' ``direct`` for a 1x1 stride-1 conv whose GEMM pointwise.py's micro-kernel takes (else 1: BLAS on x as
# it lies; 0: an im2col first)
MICRO = 2


def _window_fits(attrs: dict) -> bool:
    return min(attrs.get("pads") or [0]) >= 0 and min(attrs.get("strides") or [1]) >= 1 and bool(team.gemm_address())


def _fits(ctx: Any, attrs: dict) -> bool:
    """FloatQLinearConv: group 1, a 4-D input (float32 with ``float_input`` 1 or 2, else 8-bit), a small constant
    8-bit weight (`_weight_fits`), constant quantization parameters and bias, S and B, float32 output, a residual Z
    exactly when its rounding is given, exact float32 sums, this plugin's compiled Requantize as the epilogue,
    numpy's sgemm callable from compiled code."""
    x, w = input_type(ctx, 0), _constant(ctx, 3)
    if not attrs.get("float_output") or attrs.get("float_input", 0) not in (0, 1, 2) or attrs.get("group", 1) != 1:
        return False
    if bool(attrs.get("residual_rounding")) != _given(ctx, 11) or not _window_fits(attrs) or \
            not _weight_fits(ctx, x, w, 5):
        return False
    xz, yz = _constant(ctx, 2), _constant(ctx, 7)
    if xz is None or yz is None or xz.size != 1 or yz.size != 1 or xz.dtype not in EIGHT_BIT:
        return False
    if (x.dtype != np.float32) if attrs.get("float_input") else (x.dtype != xz.dtype):
        return False
    needed = (1, 4, 6) + tuple(i for i in (8, 9, 10) if _given(ctx, i))
    if any(_constant(ctx, i) is None for i in needed) or _bound(w, _constant(ctx, 5), _constant(ctx, 8)) >= EXACT:
        return False
    out = ctx.output_types[0] if ctx.output_types else None
    steps = getattr(_epilogue(ctx, attrs), "steps", None) if out is not None and out.dtype == np.float32 else None
    return steps is not None and not steps[1][0] and bool(steps[1][1])  # Requantize without division, rounding


def _scaled_fits(ctx: Any, attrs: dict) -> bool:
    """ScaledConvInteger: group 1, an 8-bit x with a constant zero point (or a float32 one with ``dynamic_input``),
    a small constant 8-bit weight, the scale, S and B constant, exact float32 sums, the compiled epilogue (and
    DynamicQuantizeLinear kernel) minfer-ops-conv's uses."""
    x, w, xz = input_type(ctx, 0), _constant(ctx, 1), _constant(ctx, 2)
    if attrs.get("group", 1) != 1 or not _window_fits(attrs) or not _weight_fits(ctx, x, w, 3):
        return False
    if attrs.get("dynamic_input"):
        if x.dtype != np.float32 or _dynamic_quantizer(ctx) is None:
            return False
    elif x.dtype not in EIGHT_BIT or xz is None and _given(ctx, 2) or xz is not None and (xz.size != 1 or
                                                                                        xz.dtype != x.dtype):
        return False
    if any(_constant(ctx, i) is None for i in (4,) + tuple(i for i in (5, 6) if _given(ctx, i))):
        return False
    if _constant(ctx, 4).size != 1 or _bound(w, _constant(ctx, 3), None) >= EXACT:
        return False
    steps = getattr(_scaled_epilogue(ctx, attrs), "steps", None)
    return steps is not None and not steps[1][0] and not steps[1][1]  # Requantize's product, no rounding


class Product:
    """One node's integer conv as sgemm on its centered weights (float32 (M, K + 1) with a zero bias column, written
    into scratch each run from the 8-bit weights it holds) over smallconv.py's compiled units, per input shape, with
    `requantize_channels`' ``chain`` per unit."""

    def __init__(self, ctx: Any, w: np.ndarray, wz: np.ndarray | None, attrs: dict, chain: np.ndarray) -> None:
        zero = np.zeros(1, np.float32) if wz is None else np.asarray(wz, np.float32).reshape(-1)
        x_type = input_type(ctx, 0)
        geometry = np.zeros(w.shape, np.float32)  # smallconv.Node's packing, for the plans: its shape is what counts
        inner = KernelContext(ctx.node_name, "Conv", 11, (TensorType(np.float32, x_type.shape),
                                                          TensorType(np.float32, w.shape)),
                              tuple(ctx.output_types), (None, geometry), 1)
        self.node = smallconv.Node(inner, attrs.get("auto_pad") or "NOTSET", attrs.get("dilations"), 1,
                                   attrs.get("pads"), attrs.get("strides"))
        self.node.packed = np.broadcast_to(np.float32(0), self.node.packed.shape)  # the shape, without its bytes
        self.w, self.zero = readonly(np.ascontiguousarray(w.reshape(w.shape[0], -1))), readonly(zero)
        self.chain, self.address = chain, team.gemm_address()
        self.plans: dict[tuple[int, ...], tuple[Any, ...]] = {}
        globals()["gemm"] = team.install()  # before _units compiles: it looks the name up here
        self.micro = self.w.shape[1] <= pointwise.MAX_CHANNELS and pointwise.available()
        if self.micro:
            pointwise._ensure_kernels()  # its intrinsics, before _units (which calls `_tile`) compiles

    def _plan(self, x: np.ndarray) -> tuple[Any, ...]:
        """smallconv.py's compiled plan for x's shape, its ``direct`` `MICRO` where pointwise.py's micro-kernel
        takes the GEMM (a 1x1 stride-1 conv of at most pointwise.MAX_CHANNELS input channels)."""
        found, geos, size, direct, shape = self.node.compiled_plan(x)  # direct: 1x1 stride 1, x read as it lies
        return found, geos, size, MICRO if direct and self.micro else int(direct), shape

    def warm(self, mode: int, dtype: Any, quant: np.ndarray, operands: tuple) -> None:
        """Compile (or load from numba's cache) at build, with a run's argument types: the units, the team's
        driver where a native team may run, and the input's centering."""
        full = self.centered()
        m, rows = full.shape
        x, y, found, geos = smallconv.warm_unit(m, rows - 1)
        args = (self.address, x, full, y, found, geos)
        for direct in (1, MICRO) if self.micro else (1,):
            _units(*args, np.zeros(1, np.float32), direct, 0, 1, *operands, self.chain, EMPTY, NO_GRID)
            if team.available():
                _team_units(*args, np.zeros((1, 1), np.float32), direct, *operands, self.chain, EMPTY, NO_GRID)
        if mode != CENTERED:
            _center_all(readonly(np.zeros((1, rows - 1, 1, 1), dtype)), np.zeros(x.shape, np.float32), mode, quant)
            if team.available():
                _center_team(readonly(np.zeros((1, rows - 1, 1, 1), dtype)),
                             np.zeros((1, rows - 1, 1, 1), np.float32),
                             mode, quant, 2)

    def centered(self) -> np.ndarray:
        """The GEMM's weight operand (M, K + 1) in this thread's scratch (valid until its next call)."""
        full = scratch("minfer_ops_numba-qconv-blas-w", (self.w.shape[0], self.w.shape[1] + 1), np.float32)
        _center_weights(self.w, self.zero, full)
        return readonly(full)

    def __call__(self, x: np.ndarray, mode: int, quant: np.ndarray, operands: tuple, z: np.ndarray | None = None,
                 grid: np.ndarray = None, size: int = 0) -> np.ndarray:
        """The node's output for input x (``mode``: how it is centered, with ``quant``), m, c, s, b = operands, then
        + z and the rounding on ``grid`` when z is given. ``size``: `team.size()`'s answer when the caller asked it
        in this call (0: asked here where a team pays; each asking costs ~1.4 us in a run)."""
        found, geos, unit, direct, shape = self.plans.get(x.shape) or self.plans.setdefault(
            x.shape, self._plan(x))
        y = np.empty(shape, np.float32)
        if y.size == 0:
            return y
        if z is None:
            z, grid = EMPTY, NO_GRID
        elif z.shape != y.shape:
            raise ValueError(f"FloatQLinearConv: the residual Z is {z.shape}, the output {y.shape}: they must match")
        else:
            z = readonly(np.ascontiguousarray(z, np.float32)).reshape(-1)
        operands = (*operands, self.chain, z, grid)
        xs = readonly(np.ascontiguousarray(x))
        if mode != CENTERED:  # every unit reads all of x: centered once, first (shared by a team when one runs)
            xq = scratch("minfer_ops_numba-qconv-blas-x", x.shape, np.float32)
            if x.size >= TEAM_CENTER:
                size = size or team.size()
            parts = min(size, x.shape[1]) if x.size >= TEAM_CENTER else 1
            if parts > 1:
                _center_team(xs, xq, mode, quant, parts)
            else:
                _center_all(xs, xq, mode, quant)
            xs = readonly(xq)
        args = (self.address, xs, self.centered(), y.reshape(shape[0], shape[1], -1), found, geos)
        threads = (size or team.size()) if len(found) > 1 else 1
        if threads > 1:  # one range, which the driver splits itself: a process team's ranks still write y only here
            cols = scratch("minfer_ops_numba-qconv-blas-team", (min(threads, len(found)), unit), np.float32)
            parallel_for(1, lambda lo, hi: _team_units(*args, cols, direct, *operands), parts=1, outputs_only=True)
            return y

        def span(lo: int, hi: int) -> None:
            _units(*args, scratch("minfer_ops_numba-qconv-blas-unit", (unit,), np.float32), direct, lo, hi, *operands)

        parallel_for(len(found), span, parts=None if intra_op_threads() > 1 else 1, outputs_only=True)
        return y


@kernel("FloatQLinearConv", domain=MINFER, since=1, priority=PRIORITY - 1, prepare=True, packed=(3, 5), views=False,
        applies=_fits)
def float_qlinear_conv_blas(ctx, *, float_input=0, float_output=0, activation="", activation_params=None,
                            output_quantization=None, output_rounding=None, residual_rounding=None, auto_pad="NOTSET",
                            dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """ai.minfer::FloatQLinearConv-1 (group 1): the exact sums by sgemm on the centered operands, the Requantize
    chain per unit in compiled code (the module docstring): minfer-ops-conv's values."""
    attrs = dict(float_input=float_input, float_output=float_output, activation=activation,
                 activation_params=activation_params, output_quantization=output_quantization,
                 output_rounding=output_rounding, auto_pad=auto_pad, dilations=dilations, pads=pads, strides=strides)
    xs, xz, ws, ys = (_constant(ctx, i) for i in (1, 2, 4, 6))
    info, x_zero = np.iinfo(xz.dtype), np.float32(xz.reshape(-1)[0])
    scale = np.float32(xs.reshape(-1)[0])
    quant = readonly(np.array([scale, np.float32(info.min) - x_zero, np.float32(info.max) - x_zero, x_zero], np.float32))
    mode = QUANTIZE if float_input == 1 else CENTERED if float_input == 2 else EIGHT
    per_channel = (scale * np.asarray(ws, np.float32).reshape(-1)) / np.float32(ys.reshape(-1)[0])  # as the numpy kernel
    bias = _constant(ctx, 8)
    operands = (_operand(per_channel), _operand(None if bias is None else bias.astype(np.float32)),
                _operand(_constant(ctx, 9)), _operand(_constant(ctx, 10)))
    chain, operands = fitted(_chain(_epilogue(ctx, attrs)), operands, _constant(ctx, 3).shape[0])
    conv = Product(ctx, _constant(ctx, 3), _constant(ctx, 5), attrs, chain)
    conv.warm(mode, input_type(ctx, 0).dtype, quant, operands)
    grid = None if residual_rounding is None else readonly(np.asarray(residual_rounding, np.float32).reshape(3))

    def run(x, x_scale=None, x_zero_point=None, w=None, w_scale=None, w_zero_point=None, y_scale=None,
            y_zero_point=None, b=None, s=None, a=None, z=None):
        return conv(x, mode, quant, operands, z, grid)

    return spmd(run)


@kernel("ScaledConvInteger", domain=MINFER, since=1, priority=PRIORITY - 1, prepare=True, packed=(1, 3), views=False,
        applies=_scaled_fits)
def scaled_conv_integer_blas(ctx, *, activation="", activation_params=None, dynamic_input=0, auto_pad="NOTSET",
                             dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """ai.minfer::ScaledConvInteger-1 (group 1): [DynamicQuantizeLinear of x as minfer-ops-conv makes it,] the exact
    sums by sgemm on the centered operands, * scale and act(. * S + A) per unit in compiled code: its values."""
    attrs = dict(activation=activation, activation_params=activation_params, auto_pad=auto_pad, dilations=dilations,
                 pads=pads, strides=strides)
    conv = Product(ctx, _constant(ctx, 1), _constant(ctx, 3), attrs, _chain(_scaled_epilogue(ctx, attrs)))
    return scaled_run(ctx, conv, dynamic_input)
