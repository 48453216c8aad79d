"""ai.minfer::FloatQLinearConv and ScaledConvInteger when depthwise: input conversion, taps and epilogue per unit.

minfer-ops-conv's kernel runs a quantized depthwise conv as three passes over memory: the input quantized into
scratch (QuantizeLinear's division, clip and rint, less the zero point, as float32), the registered float Conv
kernel on it (the centered 8-bit weights held as float32), then the compiled Requantize over the whole output
(MobileNetV2 QDQ, per node: the quantization 15-20% of its time, the Requantize 25-35%). Here a unit is a block of
LANES (16) channels of one image, as depthwise_blocked.py cuts a float conv: its input centered into scratch
(`_center`; none when the producer wrote centered integers, ``float_input`` 2), its sums by depthwise_blocked.py's
`block_sums` on the centered weights packed as float32 (padding is zero there: x's zero point, centered, as
onnxruntime pads), then the Requantize chain (quant.py's `_rq_fused` operations, in its order) in place while the
unit is in L2 (igemm.py's `requantize_channels`; a chain ending on a post grid as `fitted` shortens it, checked at
build to give its bits); the units over a native team when one runs. On large maps (`ROW_CELLS`) a unit is a few
channels summed in rows instead: vector_rows.py's in-place vectors, or loops.py's wide rows. ScaledConvInteger's
dynamic input gets DynamicQuantizeLinear's scale and zero point as minfer-ops-conv computes them
(`dynamic_operands`).

The sums are exact: every product of centered 8-bit values is an integer, and ``applies`` asks that the largest
sum (the weights' row L1 norm times 255, plus the bias) stays below 2**24, where float32 holds every integer; so
the order of the taps does not matter and the values are minfer-ops-conv's (a zero sum's sign aside, which
follows each kernel's order; a NaN input gives NaN where a window holds it, as its float conv does).

``applies``: group == C == M > 1 (one input channel a group), a 4-D input of known channels (FloatQLinearConv:
float32 with ``float_input`` 1 or 2, else 8-bit; ScaledConvInteger: 8-bit, or float32 with ``dynamic_input``), a
constant 8-bit weight and zero point, the quantization parameters and any bias, S and B constant, float32 output,
no residual, this plugin's compiled Requantize as the epilogue (as minfer-ops-conv's kernel finds it),
non-negative pads.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import intra_op_threads, kernel, parallel_for, scratch, spmd

from . import channels, depthwise_blocked, team
from ._jit import PRIORITY, input_type, jit, readonly, uintp  # noqa: F401 (uintp: rebound to numba's type at compile)
from .channels import LANES
from .depthwise import units as row_cut
from .depthwise_blocked import block_sums  # noqa: F401 (compiled code calls it)
from .dynamic_quant import TEAM_RANGE, dynamic_grid, scale_and_zero_point, value_range, warm_range
from .igemm import FITTED, fitted, requantize_channels  # noqa: F401 (FITTED: qconv_blas, tests; compiled code)
from .loops import wide_rows  # noqa: F401 (compiled code calls it)
from .qconv import (EIGHT_BIT, EXACT, MINFER, _bound, _constant, _dynamic_quantizer, _epilogue, _frozen, _given,
                    _range_params, _scaled_epilogue)
from .team import NONE, prange  # noqa: F401 (rebound to numba's at compile)
from .vector_rows import fits as vector_fits, install as install_vector, vector_rows  # noqa: F401 (compiled code)
from .window import window

# how the conv's input is made: QuantizeLinear of float32 x less its zero point (float_input 1), 8-bit x less its
# zero point (float_input 0), each unit's channels into scratch; float_input 2: x as it is (centered already)
QUANTIZE, CENTERED, EIGHT = 1, 2, 0
# from this many output cells a conv sums each channel's plane in rows (`_row_units`) instead of blocks of LANES
# channels: a block's channels-last scratch outgrows L2 (16 channels of 114x114: 830 kB; MobileNetV2 QDQ's
# 32x112x112 took 362 us in blocks, its float twin 217 in rows). The rows are vector_rows.py's in-place vectors
# where they fit (3x3 or 5x5, stride 1 or 2), else loops.py's wide rows (stride 1). Alone, one thread (centered
# input, a fitted chain): 32x112x112 292 us wide rows -> 232-253 vector; 96x112x112 stride 2 365 blocks -> 270-282;
# 144x56x56 308 either; below it the blocks won (144x56x56 stride 2, 28x28 out: 126 against 131; 192x28x28: 102
# against 155)
ROW_CELLS = 56 * 56


@jit
def _center(x, xq, i, c0, c1, mode, quant):  # pragma: no cover - compiled
    """Channels c0..c1 of image i of x into xq, centered: the numpy kernel's input Requantize (the division, the
    clip, then rint) for `QUANTIZE`, x - zp for `EIGHT`. Each mode its own loop, so that each vectorizes."""
    hw = x.shape[2] * x.shape[3]
    src, dst = x[i].reshape(-1), xq[i].reshape(-1)
    xs, qlo, qhi, zp = quant[0], quant[1], quant[2], quant[3]
    if mode == QUANTIZE:
        for j in range(c0 * hw, c1 * hw):
            v = np.float32(src[uintp(j)]) / xs
            v = qlo if v < qlo else v
            v = qhi if v > qhi else v
            dst[uintp(j)] = np.rint(v)
    else:
        for j in range(c0 * hw, c1 * hw):
            dst[uintp(j)] = np.float32(src[uintp(j)]) - zp


@jit
def _units(x, xq, w, zeros, y, table, lo, hi, dst, offs, planes, hp, wp, sh, sw, kind, mode, quant, m, c, s, b,
           params):  # pragma: no cover - compiled
    """Units lo..hi of ``table`` (rows image, c0, c1; whole blocks of LANES channels): each unit's input centered
    into xq (`_center`), its blocks' exact sums (depthwise_blocked.py's `block_sums`, no bias, no activation),
    then `requantize_channels` while the unit is in L2."""
    nc, cells = y.shape[1], y.shape[2] * y.shape[3]
    flat = y.reshape(-1)
    for u in range(lo, hi):
        i, c0, c1 = table[u, 0], table[u, 1], table[u, 2]
        _center(x, xq, i, c0, c1, mode, quant)
        block_sums(xq[i], w, zeros, y[i], c0, c1, dst, offs, planes, hp, wp, sh, sw, kind, NONE, np.float32(0),
                   np.float32(0))
        requantize_channels(flat, (i * nc + c0) * cells, c0, c1, cells, cells, m, c, s, b, params)


@jit
def _centered_units(x, w, zeros, y, table, lo, hi, dst, offs, planes, hp, wp, sh, sw, kind, m, c, s, b,
                    params):  # pragma: no cover - compiled
    """`_units` for an x centered already (float_input 2): its blocks' sums, then `requantize_channels`."""
    nc, cells = y.shape[1], y.shape[2] * y.shape[3]
    flat = y.reshape(-1)
    for u in range(lo, hi):
        i, c0, c1 = table[u, 0], table[u, 1], table[u, 2]
        block_sums(x[i], w, zeros, y[i], c0, c1, dst, offs, planes, hp, wp, sh, sw, kind, NONE, np.float32(0),
                   np.float32(0))
        requantize_channels(flat, (i * nc + c0) * cells, c0, c1, cells, cells, m, c, s, b, params)


@jit(parallel=True)
def _drive(x, xq, w, zeros, y, table, parts, dst, offs, planes, hp, wp, sh, sw, kind, mode, quant, m, c, s, b,
           params):  # pragma: no cover - compiled
    """`_units` over a native team (team.py): the units of ``table`` in ``parts`` contiguous shares."""
    count = table.shape[0]
    for t in prange(parts):
        _units(x, xq, w, zeros, y, table, count * t // parts, count * (t + 1) // parts, dst, offs, planes, hp, wp, sh,
               sw, kind, mode, quant, m, c, s, b, params)


@jit(parallel=True)
def _drive_centered(x, w, zeros, y, table, parts, dst, offs, planes, hp, wp, sh, sw, kind, m, c, s, b,
                    params):  # pragma: no cover - compiled
    """`_centered_units` over a native team."""
    count = table.shape[0]
    for t in prange(parts):
        _centered_units(x, w, zeros, y, table, count * t // parts, count * (t + 1) // parts, dst, offs, planes, hp,
                        wp, sh, sw, kind, m, c, s, b, params)


@jit
def _row_sums(xq, w, zeros, y, i, c0, c1, ph, pw, sh, sw, vector, m, c, s, b, params):  # pragma: no cover
    """Channels c0..c1 of image i in rows: the exact sums of centered xq on the centered weights (C, kh, kw) and a
    zero bias by vector_rows.py's `vector_rows` (``vector``), else loops.py's `wide_rows` (stride 1), then
    `requantize_channels`. The sums are integers below 2**24: they are `block_sums`' whatever the order of the taps."""
    nc, cells = y.shape[1], y.shape[2] * y.shape[3]
    if vector:
        vector_rows(xq[i], w, zeros, y[i], c0, c1, sh, sw, ph, pw, 1, 1)
    else:
        wide_rows(xq[i], w, zeros, y[i], c0, c1, 1, 1, ph, pw, 1, 1)
    requantize_channels(y.reshape(-1), (i * nc + c0) * cells, c0, c1, cells, cells, m, c, s, b, params)


@jit
def _row_units(x, xq, w, zeros, y, table, lo, hi, ph, pw, sh, sw, vector, mode, quant, m, c, s, b,
               params):  # pragma: no cover - compiled
    """`_units` in rows: each unit's channels centered into xq (`_center`), then `_row_sums`."""
    for u in range(lo, hi):
        i, c0, c1 = table[u, 0], table[u, 1], table[u, 2]
        _center(x, xq, i, c0, c1, mode, quant)
        _row_sums(xq, w, zeros, y, i, c0, c1, ph, pw, sh, sw, vector, m, c, s, b, params)


@jit
def _centered_rows(x, w, zeros, y, table, lo, hi, ph, pw, sh, sw, vector, m, c, s, b,
                   params):  # pragma: no cover - compiled
    """`_row_units` for an x centered already (float_input 2)."""
    for u in range(lo, hi):
        _row_sums(x, w, zeros, y, table[u, 0], table[u, 1], table[u, 2], ph, pw, sh, sw, vector, m, c, s, b, params)


@jit(parallel=True)
def _drive_rows(x, xq, w, zeros, y, table, parts, ph, pw, sh, sw, vector, mode, quant, m, c, s, b,
                params):  # pragma: no cover - compiled
    """`_row_units` over a native team."""
    count = table.shape[0]
    for t in prange(parts):
        _row_units(x, xq, w, zeros, y, table, count * t // parts, count * (t + 1) // parts, ph, pw, sh, sw, vector,
                   mode, quant, m, c, s, b, params)


@jit(parallel=True)
def _drive_centered_rows(x, w, zeros, y, table, parts, ph, pw, sh, sw, vector, m, c, s, b,
                         params):  # pragma: no cover - compiled
    """`_centered_rows` over a native team."""
    count = table.shape[0]
    for t in prange(parts):
        _centered_rows(x, w, zeros, y, table, count * t // parts, count * (t + 1) // parts, ph, pw, sh, sw, vector, m,
                       c, s, b, params)


def _depthwise_weight(ctx: Any, w_index: int, zp_index: int, group: int) -> bool:
    """Whether input ``w_index`` is a constant 8-bit (group, 1, KH, KW) weight and ``zp_index`` its constant zero
    point (or none) whose sums float32 holds exactly (the bias aside: the caller adds it to the bound)."""
    w, wz = _constant(ctx, w_index), _constant(ctx, zp_index)
    if w is None or w.ndim != 4 or w.dtype not in EIGHT_BIT or w.shape[:2] != (group, 1):
        return False
    return not (wz is None and _given(ctx, zp_index) or wz is not None and wz.size not in (1, group))


def _common_fits(ctx: Any, attrs: dict, x_dtypes: tuple[np.dtype, ...]) -> bool:
    """Depthwise (group == C > 1) on a 4-D input of known channels and one of ``x_dtypes``, non-negative pads,
    positive strides and dilations, a float32 output."""
    x, group = input_type(ctx, 0), int(attrs.get("group", 1))
    if group < 2 or x is None or x.shape is None or len(x.shape) != 4 or x.shape[1] != group or x.dtype not in x_dtypes:
        return False
    if min(attrs.get("pads") or [0]) < 0 or min(attrs.get("strides") or [1]) < 1 or min(attrs.get("dilations") or [1]) < 1:
        return False
    out = ctx.output_types[0] if ctx.output_types else None
    return out is not None and out.dtype == np.float32


def _fits(ctx: Any, attrs: dict) -> bool:
    """FloatQLinearConv: what this kernel computes (the module docstring)."""
    if not attrs.get("float_output") or attrs.get("float_input", 0) not in (0, 1, 2):
        return False
    if attrs.get("residual_rounding") or _given(ctx, 11):
        return False
    xz, yz = _constant(ctx, 2), _constant(ctx, 7)
    if xz is None or yz is None or xz.size != 1 or yz.size != 1 or xz.dtype not in EIGHT_BIT:
        return False
    x_dtypes = (np.dtype(np.float32),) if attrs.get("float_input") else (xz.dtype,)
    if not _common_fits(ctx, attrs, x_dtypes) or not _depthwise_weight(ctx, 3, 5, int(attrs["group"])):
        return False
    needed = (1, 4, 6) + tuple(i for i in (8, 9, 10) if _given(ctx, i))
    if any(_constant(ctx, i) is None for i in needed) or _bound(_constant(ctx, 3), _constant(ctx, 5),
                                                                 _constant(ctx, 8)) >= EXACT:
        return False
    steps = getattr(_epilogue(ctx, attrs), "steps", None)
    return steps is not None and not steps[1][0] and bool(steps[1][1])  # Requantize without division, rounding


def _scaled_fits(ctx: Any, attrs: dict) -> bool:
    """ScaledConvInteger: the same, of an 8-bit x (or a float32 one with ``dynamic_input``), its zero point, the
    scale, S and B constant; the compiled epilogue (and DynamicQuantizeLinear kernel) minfer-ops-conv's uses."""
    dynamic = bool(attrs.get("dynamic_input"))
    x = input_type(ctx, 0)
    xz = _constant(ctx, 2)
    if dynamic:
        x_dtypes: tuple[np.dtype, ...] = (np.dtype(np.float32),)
    elif x is None or xz is None and _given(ctx, 2) or xz is not None and (xz.size != 1 or xz.dtype != x.dtype):
        return False
    else:
        x_dtypes = EIGHT_BIT
    if not _common_fits(ctx, attrs, x_dtypes) or not _depthwise_weight(ctx, 1, 3, int(attrs["group"])):
        return False
    if any(_constant(ctx, i) is None for i in (4,) + tuple(i for i in (5, 6) if _given(ctx, i))):
        return False
    if _constant(ctx, 4).size != 1 or _bound(_constant(ctx, 1), _constant(ctx, 3), None) >= EXACT:
        return False
    if dynamic and _dynamic_quantizer(ctx) is None:
        return False
    steps = getattr(_scaled_epilogue(ctx, attrs), "steps", None)
    return steps is not None and not steps[1][0] and not steps[1][1]  # Requantize's product, no rounding


def _chain(epilogue: Any) -> np.ndarray:
    """`requantize_channels`' params from a prepared compiled Requantize (quant.py's ``steps``), its activation
    bounds as quant.py's `_rq_rows` makes them."""
    params, (_, rounding, act) = epilogue.steps
    lo, hi = params[3], params[4]
    act_lo = lo if act == 2 else (np.float32(0) if act == 1 else np.float32(-np.inf))
    act_hi = hi if act == 2 else np.float32(np.inf)
    return readonly(np.array([params[0], params[1], params[2], act_lo, act_hi, *params[5:9], rounding], np.float32))


class Depthwise:
    """One node's depthwise integer conv over depthwise_blocked.py's blocks: the weights centered and packed once,
    per input shape the blocks' tables and the units' cut, each run `_units` (or `_centered_units`) over the
    threads."""

    def __init__(self, w: np.ndarray, wz: np.ndarray | None, attrs: dict, chain: np.ndarray) -> None:
        c, kh, kw = w.shape[0], w.shape[2], w.shape[3]
        zero = 0.0 if wz is None else np.asarray(wz, np.float64).reshape(-1, 1, 1, 1)
        centered = (w.astype(np.float64) - zero).astype(np.float32).reshape(c, kh * kw)  # exact integers
        blocks = -(-c // LANES)  # (block, tap, lane) as depthwise_blocked.py packs a float conv's, zero past C
        weights, flat = channels._aligned((blocks, kh * kw, LANES)), np.zeros((blocks * LANES, kh * kw), np.float32)
        flat[:c] = centered
        weights[:] = flat.reshape(blocks, LANES, kh * kw).transpose(0, 2, 1)
        self.packed, self.zeros = readonly(weights), readonly(channels._aligned((blocks * LANES,)))
        self.plain = readonly(np.ascontiguousarray(centered.reshape(c, kh, kw)))  # `_row_units`' weights
        self.c, self.kernel, self.chain = c, (kh, kw), chain
        self.st, self.dl = tuple(attrs.get("strides") or (1, 1)), tuple(attrs.get("dilations") or (1, 1))
        self.pads, self.auto_pad = attrs.get("pads"), attrs.get("auto_pad") or "NOTSET"
        self.vector = vector_fits(self.kernel, self.st, self.dl)
        self.geometry: dict[tuple[int, ...], tuple[tuple[int, ...], tuple[Any, ...]]] = {}
        self.cuts: dict[tuple[Any, ...], tuple[list[tuple[int, int, int]], int, np.ndarray]] = {}

    def locate(self, dims: tuple[int, ...]) -> tuple[tuple[int, ...], tuple[Any, ...]]:
        """For input dims (C, H, W): the output's (OH, OW), and the blocks' tables, or for `_row_units` (at least
        `ROW_CELLS` output cells, where vector rows fit or at stride 1) the row loops' (top, left, sh, sw, vector):
        the pads before, the strides, whether vector_rows.py's loop sums them."""
        found = self.geometry.get(dims)
        if found is None:
            win = window(dims[1:], self.kernel, self.st, self.dl, self.pads, self.auto_pad, clamp_same=True)
            cells = win.out_shape[0] * win.out_shape[1]
            vector = self.vector and cells >= ROW_CELLS
            rows = vector or self.st == self.dl == (1, 1) and cells >= ROW_CELLS
            found = self.geometry[dims] = win.out_shape, ((*win.begin, *self.st, vector) if rows else
                                                          depthwise_blocked._tables(dims[1:], win, self.kernel,
                                                                                    self.st, self.dl))
        return found

    def warm(self, mode: int, dtype: Any, quant: np.ndarray, operands: tuple) -> None:
        """Compile (or load from numba's cache) at build, not in the first run, where it would skew the core's
        timing: the loops for this input form, and the team's driver where a native team may run."""
        depthwise_blocked._install()
        install_vector()
        x = readonly(np.zeros((1, self.c, 8, 8), dtype))
        self(x, mode, quant, operands)
        xq, table = np.zeros(x.shape, np.float32), readonly(np.array([[0, 0, 1]], np.int64))
        rows = (self.plain, self.zeros, np.zeros((1, self.c, 8, 8), np.float32), table)  # the row loops (8x8: blocks)
        if mode == CENTERED:
            _centered_rows(x, *rows, 0, 1, *GEO, *operands, self.chain)
        else:
            _row_units(x, xq, *rows, 0, 1, *GEO, mode, quant, *operands, self.chain)
        if team.available():  # (the blocks' driver on blocks' tables, whichever path an 8x8 map takes)
            win = window(x.shape[2:], self.kernel, self.st, self.dl, self.pads, self.auto_pad, clamp_same=True)
            tables = depthwise_blocked._tables(x.shape[2:], win, self.kernel, self.st, self.dl)
            y = np.zeros((1, self.c) + win.out_shape, np.float32)
            if mode == CENTERED:
                _drive_centered_rows(x, *rows, 1, *GEO, *operands, self.chain)
                _drive_centered(x, self.packed, self.zeros, y, table, 1, *tables, *operands, self.chain)
            else:
                _drive_rows(x, xq, *rows, 1, *GEO, mode, quant, *operands, self.chain)
                _drive(x, xq, self.packed, self.zeros, y, table, 1, *tables, mode, quant, *operands, self.chain)
        self.geometry.clear()

    def __call__(self, x: np.ndarray, mode: int, quant: np.ndarray, operands: tuple, size: int = 0) -> np.ndarray:
        """The node's output for input x (``mode``: how it is centered, with ``quant``), m, c, s, b = operands.
        ``size``: `team.size()`'s answer when the caller asked it in this call (0: asked here)."""
        n, c = x.shape[0], self.c
        out_shape, tables = self.locate(x.shape[1:])
        y = np.empty((n, c) + out_shape, np.float32)
        if y.size == 0:
            return y
        threads = intra_op_threads()
        size = (size or team.size()) if threads > 1 else 1  # asking claims the run's threads for the team
        native, rows = size > 1, len(tables) == len(GEO)  # (the blocks: their tables, eight)
        key = (n, size if native else threads, native) + x.shape[1:]
        if key not in self.cuts:
            self.cuts[key] = self._cut(n, x.shape[2:], out_shape, size if native else threads, native, rows)
        found, parts, table = self.cuts[key]
        xs = readonly(np.ascontiguousarray(x))
        if rows and mode == CENTERED:
            head, rest = (xs, self.plain, self.zeros, y, table), (*tables, *operands, self.chain)
            units, drive = _centered_rows, _drive_centered_rows
        elif rows:
            xq = scratch("minfer_ops_numba-qdepthwise-x", x.shape, np.float32)
            head, rest = (xs, xq, self.plain, self.zeros, y, table), (*tables, mode, quant, *operands, self.chain)
            units, drive = _row_units, _drive_rows
        elif mode == CENTERED:
            head, rest = (xs, self.packed, self.zeros, y, table), (*tables, *operands, self.chain)
            units, drive = _centered_units, _drive_centered
        else:
            xq = scratch("minfer_ops_numba-qdepthwise-x", x.shape, np.float32)
            head, rest = (xs, xq, self.packed, self.zeros, y, table), (*tables, mode, quant, *operands, self.chain)
            units, drive = _units, _drive
        if native:  # one range, which the driver splits itself: a process team's ranks still write y only here
            parallel_for(1, lambda lo, hi: drive(*head, parts, *rest) if parts > 1 else
                         units(*head, 0, len(found), *rest), parts=1, outputs_only=True)
        else:  # a unit writes only its y block (and its channels of the scratch)
            parallel_for(len(found), lambda lo, hi: units(*head, lo, hi, *rest), parts=parts, outputs_only=True)
        return y

    def _cut(self, n: int, in_shape: tuple[int, ...], out_shape: tuple[int, ...], threads: int, native: bool,
             rows: bool) -> tuple[list[tuple[int, int, int]], int, np.ndarray]:
        """The units (image, c0, c1) and their parts: depthwise.py's cut of channels for `_row_units`, else whole
        blocks of LANES channels (channels.py's); with their compiled table."""
        if not rows:
            return channels._cut(n, self.c, in_shape, out_shape, self.kernel[0] * self.kernel[1], threads, native)
        plane = (in_shape[0] * in_shape[1] + out_shape[0] * out_shape[1]) * 4
        found, parts = row_cut(n, self.c, plane, n * self.c * out_shape[0] * out_shape[1] * self.kernel[0]
                               * self.kernel[1], threads, native)
        return found, parts, readonly(np.array(found, np.int64).reshape(-1, 3))


EMPTY = readonly(np.zeros(0, np.float32))
GEO = (0, 0, 1, 1, False)  # the row loops' (ph, pw, sh, sw, vector) when warmed: one compiled signature for all


def _operand(v: Any) -> np.ndarray:
    return EMPTY if v is None else _frozen(v)


@kernel("FloatQLinearConv", domain=MINFER, since=1, priority=PRIORITY, prepare=True, packed=(3, 5), views=False,
        applies=_fits)
def float_qlinear_conv_depthwise(ctx, *, float_input=0, float_output=0, activation="", activation_params=None,
                                 output_quantization=None, output_rounding=None, residual_rounding=None,
                                 auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """ai.minfer::FloatQLinearConv-1, depthwise (group == C == M): minfer-ops-conv's values in one compiled pass a
    unit of channels (the module docstring)."""
    attrs = dict(float_input=float_input, float_output=float_output, activation=activation,
                 activation_params=activation_params, output_quantization=output_quantization,
                 output_rounding=output_rounding, auto_pad=auto_pad, dilations=dilations, pads=pads, strides=strides)
    xs, xz, ws, ys = (_constant(ctx, i) for i in (1, 2, 4, 6))
    info, x_zero = np.iinfo(xz.dtype), np.float32(xz.reshape(-1)[0])
    scale = np.float32(xs.reshape(-1)[0])
    quant = readonly(np.array([scale, np.float32(info.min) - x_zero, np.float32(info.max) - x_zero, x_zero], np.float32))
    mode = QUANTIZE if float_input == 1 else CENTERED if float_input == 2 else EIGHT
    # x_scale * w_scale / y_scale in float32, as minfer-ops-conv computes it
    per_channel = (scale * np.asarray(ws, np.float32).reshape(-1)) / np.float32(ys.reshape(-1)[0])
    bias = _constant(ctx, 8)
    operands = (_operand(per_channel), _operand(None if bias is None else bias.astype(np.float32)),
                _operand(_constant(ctx, 9)), _operand(_constant(ctx, 10)))
    chain, operands = fitted(_chain(_epilogue(ctx, attrs)), operands, _constant(ctx, 3).shape[0])
    conv = Depthwise(_constant(ctx, 3), _constant(ctx, 5), attrs, chain)
    conv.warm(mode, np.float32 if float_input else xz.dtype, quant, operands)

    def run(x, x_scale=None, x_zero_point=None, w=None, w_scale=None, w_zero_point=None, y_scale=None,
            y_zero_point=None, b=None, s=None, a=None):
        return conv(x, mode, quant, operands)

    return spmd(run)


@kernel("ScaledConvInteger", domain=MINFER, since=1, priority=PRIORITY, prepare=True, packed=(1, 3), views=False,
        applies=_scaled_fits)
def scaled_conv_integer_depthwise(ctx, *, activation="", activation_params=None, dynamic_input=0, auto_pad="NOTSET",
                                  dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """ai.minfer::ScaledConvInteger-1, depthwise: [DynamicQuantizeLinear of x as minfer-ops-conv makes it,] the exact
    sums, * scale and act(. * S + A) in one compiled pass a unit of channels: minfer-ops-conv's values."""
    attrs = dict(activation=activation, activation_params=activation_params, auto_pad=auto_pad, dilations=dilations,
                 pads=pads, strides=strides)
    conv = Depthwise(_constant(ctx, 1), _constant(ctx, 3), attrs, _chain(_scaled_epilogue(ctx, attrs)))
    return scaled_run(ctx, conv, dynamic_input)


def scaled_run(ctx: Any, conv: Any, dynamic_input: int) -> Any:
    """A ScaledConvInteger kernel's run callable over ``conv`` (a `Depthwise`, or qconv_blas.py's `Product`: both
    ``warm(mode, dtype, quant, operands)`` and ``conv(x, mode, quant, operands)``), warmed now: an 8-bit x centered
    by its constant zero point, or with ``dynamic_input`` quantized as minfer-ops-conv does (`dynamic_operands`);
    the sums times the weight's scale (times x's with ``dynamic_input``), then ChannelAffine's S and B."""
    xz = _constant(ctx, 2)
    fixed = readonly(np.array([1, 0, 0, 0 if xz is None else xz.reshape(-1)[0]], np.float32))
    weight_scale = np.float32(_constant(ctx, 4).reshape(-1)[0])
    affine = (_operand(_constant(ctx, 5)), _operand(_constant(ctx, 6)))
    one = _operand(np.ones(1, np.float32) * weight_scale)
    dynamic = (_dynamic_quantizer(ctx), _range_params(ctx)) if dynamic_input else None
    if dynamic is None:
        conv.warm(EIGHT, input_type(ctx, 0).dtype, fixed, (one, EMPTY, *affine))
    else:
        conv.warm(QUANTIZE, np.float32, fixed, (one, EMPTY, *affine))
        warm_range()  # compiled at build, not in the first run

    def run(x, w=None, x_zero_point=None, w_zero_point=None, scale=None, s=None, a=None):
        if dynamic is None:
            return conv(x, EIGHT, fixed, (one, EMPTY, *affine))
        size = team.size() if x.size >= TEAM_RANGE else 0  # where the range asks: once for it and the conv
        x, mode, quant, m = dynamic_operands(dynamic, x, weight_scale, size)
        return conv(x, mode, quant, (m, EMPTY, *affine), size=size)

    return spmd(run)


def dynamic_operands(dynamic: Any, x: np.ndarray, weight_scale: np.float32, size: int = 0
                     ) -> tuple[np.ndarray, int, np.ndarray, np.ndarray]:
    """ScaledConvInteger's ``dynamic_input`` as minfer-ops-conv makes it: (the conv's x, how to center it, its
    `_center` parameters, the sums' factor x_scale * weight_scale): DynamicQuantizeLinear's scale and zero point
    as the registered kernel makes them of [min, max] (``dynamic``: (the kernel, `qconv._range_params`)), x then
    quantized on the way in; an x holding NaN or an infinity goes through the kernel itself (its 8-bit output, less
    its zero point). ``size``: `team.size()`'s answer when the caller asked it (0: asked where the range pays)."""
    kernel, range_params = dynamic
    if range_params is scale_and_zero_point and x.size:  # the range and its grid in one compiled call
        found = dynamic_grid(x, weight_scale, size)
        if found is not None:
            return (x, QUANTIZE) + found
    mn, mx = value_range(x) if x.size else (np.float32(np.nan),) * 2  # one pass (dynamic_quant.py)
    finite = -np.inf < mn and mx < np.inf  # (NaN compares false)
    if finite:
        x_scale, zp = range_params(mn, mx)
        zero = zp if isinstance(zp, np.float32) else np.float32(np.asarray(zp).reshape(-1)[0])
        quant, mode = readonly(np.array([np.float32(x_scale), -zero, np.float32(255) - zero, 0], np.float32)), QUANTIZE
    else:
        x, x_scale, zp = kernel(x)
        quant, mode = readonly(np.array([1, 0, 0, np.asarray(zp).reshape(-1)[0]], np.float32)), EIGHT
    # the numpy kernel's Mul (two float32 scalars: their float32 product, as np.multiply makes it)
    product = x_scale * weight_scale if isinstance(x_scale, np.float32) else np.multiply(x_scale, weight_scale)
    return x, mode, quant, readonly(np.asarray(product, np.float32).reshape(1))
