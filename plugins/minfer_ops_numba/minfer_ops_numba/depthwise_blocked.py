"""Conv when depthwise, on small maps: a cell's 16 channels one vector, all its taps in registers (`conv_blocked`).

channels.py's kernel already vectorizes across channels: it runs every tap
as one loop over an output row of cells x 16 channels, with each tap's
weights repeated along the row (`repeat`) and, past 3x3, the total going
through memory between runs of taps. Here a block of LANES channels is
copied (channels.py's `fill`, 16x16 transposes in registers) into one
zero-bordered channels-last scratch (padded H, padded W, LANES), and each
output cell is one LANES-lane vector: for 3x3 and 5x5 kernels at dilation 1
(nearly every depthwise layer) a small LLVM intrinsic (`taps16`) holds the
block's 9 or 25 weight vectors in registers, and a tap is one vector load
of the cell's input, one product and one sum, at stride 1 or 2 alike (the
cell's reads start sw cells on), the total in a register, the activation
applied there when the fused op has no residual. Written as numba loops
over the lanes, the same sums ran 2-3x slower: numba's code checked the
arrays for overlap at every cell (80 compares for 5x5) and reloaded the
weights. Other kernels take a run of taps a pass over the cell's lanes. The
block's sums go back to NCHW (channels.py's `drain`) and its unit gets the
rest of the fused op's epilogue as in depthwise.py (there too in a native
team's compiled driver, `drive`). A fourth candidate for depthwise.py's
nodes, declared alike: the core times it against the others per node.

Each cell sums its taps in onnxruntime's MLAS order (loops.py's
docstring): runs of four taps in (ky, kx) order, a run's products added
left to right, the run's sum then added to the total, the taps left over as
a run of two and then of one, the bias last, every product and sum rounded
on its own. Vectorizing across channels leaves each cell's order as it is:
the kernel gives loops.py's bits (and onnxruntime's).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from minfer_core import intra_op_threads, kernel, parallel_for, spmd

from . import channels, team
from ._jit import PRIORITY, jit, readonly, uintp  # noqa: F401 (uintp: rebound to numba's type at compile)
from .activation import (CLIP, HARD_SIGMOID, HARD_SWISH, LEAKY_RELU, ROUND, SWISH, _round, _swish,  # noqa: F401
                         _value)  # (compiled code calls them)
from .channels import LANES, drain, fill, lined, runs  # noqa: F401 (runs: compiled code calls it)
from .depthwise import AFTER, applies, compiled_epilogue, finished, path
from .team import NONE, NOTHING, finish, prange  # noqa: F401 (compiled: the driver's)
from .window import Window, window

# the loop `block_sums` runs per block: 3x3 and 5x5 at dilation 1 in `taps16`, the total in a register; any other
# kernel a run of taps a pass, the total in the block's sums
ANY, TAPS3, TAPS5 = 0, 3, 5


@jit
def block_sums(x, w, bias, y, c0, c1, dst, offs, planes, hp, wp, sh, sw, kind, op, a, b):  # pragma: no cover
    """y[c] = act(sum of w[c, ky, kx] * x[c] shifted, + bias[c]) for channels c0..c1 of x (C, H, W) into y (C, OH,
    OW), LANES channels at a time; w is (blocks, taps, LANES) and bias (blocks * LANES,), both zero past C; dst
    (where each input cell goes in the scratch), offs (where tap t reads from a cell's first), planes (each lane's
    plane in y) and the scratch's rows and columns as `_tables` finds them; ``kind``: `TAPS3`, `TAPS5` or `ANY`;
    act: the activation ``op`` with parameters a, b (team.py's `finish`, `team.NONE`: none), in `taps16`'s registers
    where it has code for it, else by `_value` on the block's sums (ROUND, a DequantConv's rounding: `taps16` stores
    nothing for an op it has no code for), Swish by `_swish`."""
    hw, oh, ow = x.shape[1] * x.shape[2], y.shape[1], y.shape[2]
    q, acc = lined(hp * wp * LANES), lined(oh * ow * LANES)  # q's borders stay zero: every block fills its interior
    xf, yf = x.reshape(-1), y.reshape(-1)
    row, step = sh * wp * LANES, sw * LANES  # a cell's reads start step on from its left neighbour's, row below
    registers = kind != ANY and (op == NONE or op == CLIP or op == LEAKY_RELU or op == HARD_SIGMOID or op == HARD_SWISH)
    inner = op if registers else NONE  # `_activations`' codes
    for cb in range(c0, c1, LANES):
        lanes = min(LANES, c1 - cb)
        fill(xf, q, cb * hw, hw, dst, lanes)
        wb, bb = w[cb // LANES].reshape(-1), bias[cb:cb + LANES]
        if kind == TAPS3:
            cells3(q, wb, bb, acc, offs, oh, ow, row, step, inner, a, b)
        elif kind == TAPS5:
            cells5(q, wb, bb, acc, offs, oh, ow, row, step, inner, a, b)
        else:
            cells_any(q, wb, bb, acc, offs, oh, ow, row, step)
        if op == SWISH:  # `_value` leaves Swish out (activation.py)
            for i in range(oh * ow * LANES):
                acc[uintp(i)] = _swish(acc[uintp(i)], a)
        elif op == ROUND:  # its own loop: through `_value`'s branches it stays scalar (team.py's `_activate`)
            for i in range(oh * ow * LANES):
                acc[uintp(i)] = _round(acc[uintp(i)], a, b)
        elif op != NONE and not registers:
            for i in range(oh * ow * LANES):
                acc[uintp(i)] = _value(acc[uintp(i)], op, a, b)
        drain(acc, yf, cb * oh * ow, oh * ow, planes, lanes)


def taps16(q, w, b, acc, rows, oh, ow, row, step, op, pa, pb):  # pragma: no cover - replaced
    """A block's cells for a square kernel at dilation 1: cell (oy, ox) to acc[(oy * ow + ox) * LANES:][:LANES], its
    tap (ky, kx) read at q[oy * row + ox * step + rows[ky] + kx * LANES:][:LANES] (rows a tuple, whose length, the
    kernel's, is known when the caller compiles) with the LANES weights at w[(ky * k + kx) * LANES:], the biases at
    b, then the activation ``op`` with parameters pa, pb (team.py's `finish`'s codes). The weight vectors are loaded
    once a block and held in registers; per cell a tap is one vector load, product and sum, in onnxruntime's order
    (the module docstring). A stand-in, made numba's intrinsic when the kernel is first prepared (`_install`)."""
    raise RuntimeError("depthwise_blocked.taps16 runs compiled only")


def _install() -> None:
    """Make `taps16` numba's intrinsic (and channels.py's transposes, which `fill` and `drain` use), importing
    numba now (never at import: _jit.py's docstring)."""
    channels._install()
    if getattr(taps16, "_is_intrinsic", False):
        return
    from numba import types
    from numba.extending import intrinsic

    def typer(typingctx, q, w, b, acc, rows, oh, ow, row, step, op, pa, pb):
        return types.void(q, w, b, acc, rows, oh, ow, row, step, op, pa, pb), _taps16

    made = intrinsic(typer)
    made._is_intrinsic = True
    globals()["taps16"] = made


def _taps16(context: Any, builder: Any, sig: Any, args: tuple[Any, ...]) -> Any:
    """`taps16`'s code: a loop nest over the cells per activation (the choice made once a block, not per cell)."""
    from llvmlite import ir
    from numba.core import cgutils

    q, w, b, acc, rows, oh, ow, row, step, op, pa, pb = args
    data = [context.make_array(sig.args[i])(context, builder, v).data for i, v in enumerate((q, w, b, acc))]
    vector, i64 = ir.VectorType(ir.FloatType(), LANES), ir.IntType(64)

    def at(base, index):  # the LANES floats from base[index]
        return builder.bitcast(builder.gep(base, [index]), vector.as_pointer())

    k = sig.args[4].count
    weights = [builder.load(at(data[1], ir.Constant(i64, t * LANES)), align=4) for t in range(k * k)]
    bias = builder.load(at(data[2], ir.Constant(i64, 0)), align=4)
    starts = [builder.extract_value(rows, ky) for ky in range(k)]
    for code, activate in _activations(builder, vector, pa, pb).items():
        with builder.if_then(builder.icmp_signed("==", op, ir.Constant(op.type, code))):
            with cgutils.for_range(builder, oh) as oy, cgutils.for_range(builder, ow) as ox:
                p = builder.add(builder.mul(oy.index, row), builder.mul(ox.index, step))
                # a pointer per kernel row, the columns constant offsets from it: 25 offsets in registers spilled
                firsts = [at(data[0], builder.add(p, starts[ky])) for ky in range(k)]
                x = [builder.load(builder.gep(firsts[t // k], [ir.Constant(ir.IntType(32), t % k)]), align=4)
                     for t in range(k * k)]
                total = _in_runs(builder, [builder.fmul(weights[t], x[t]) for t in range(k * k)])
                cell = builder.mul(builder.add(builder.mul(oy.index, ow), ox.index), ir.Constant(i64, LANES))
                builder.store(activate(builder.fadd(total, bias)), at(data[3], cell), align=4)
    return context.get_dummy_value()


def _in_runs(builder: Any, products: list[Any]) -> Any:
    """The sum of ``products`` in onnxruntime's order: runs of 4, then 2, then 1, a run's products left to right,
    then the run + the total (the first run is the total)."""
    total, t0 = None, 0
    while t0 < len(products):
        n = 4 if len(products) - t0 >= 4 else 2 if len(products) - t0 >= 2 else 1
        run = products[t0]
        for t in range(t0 + 1, t0 + n):
            run = builder.fadd(run, products[t])
        total = run if total is None else builder.fadd(run, total)
        t0 += n
    return total


def _activations(builder: Any, vector: Any, pa: Any, pb: Any) -> dict[int, Callable[[Any], Any]]:
    """Per activation code (team.py's `finish`'s op), code emitting it on a vector: activation.py's `_value`'s
    operations and comparisons, lane by lane (the same bits)."""
    from llvmlite import ir

    first, undefined = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [0] * LANES), ir.Constant(vector, ir.Undefined)

    def splat(v):  # v in every lane
        return builder.shuffle_vector(builder.insert_element(undefined, v, ir.Constant(ir.IntType(32), 0)), undefined,
                                      first)

    a, b, zero, one = splat(pa), splat(pb), ir.Constant(vector, [0.0] * LANES), ir.Constant(vector, [1.0] * LANES)

    def pick(v, than, rival):  # v if (v `than` rival or v is NaN) else rival: numpy's maximum and minimum
        return builder.select(builder.or_(builder.fcmp_ordered(than, v, rival), builder.fcmp_unordered("!=", v, v)),
                              v, rival)

    def clip(v):
        return pick(pick(v, ">", a), "<", b)

    def leaky(v):
        return builder.select(builder.fcmp_ordered("<", v, zero), builder.fmul(v, a), v)

    def hard(v):
        t = builder.fadd(builder.fmul(a, v), b)
        t = builder.select(builder.fcmp_ordered("<", t, zero), zero, t)
        return builder.select(builder.fcmp_ordered(">", t, one), one, t)

    return {NONE: lambda v: v, CLIP: clip, LEAKY_RELU: leaky, HARD_SIGMOID: hard,
            HARD_SWISH: lambda v: builder.fmul(v, hard(v))}


@jit
def cells3(q, w, b, acc, offs, oh, ow, row, step, op, pa, pb):  # pragma: no cover - compiled
    """A block's 3x3 sums at dilation 1 (`taps16`; offs[3 * ky]: where row ky of the kernel reads)."""
    taps16(q, w, b, acc, (offs[0], offs[3], offs[6]), oh, ow, row, step, op, pa, pb)


@jit
def cells5(q, w, b, acc, offs, oh, ow, row, step, op, pa, pb):  # pragma: no cover - compiled
    """A block's 5x5 sums at dilation 1 (`taps16`; offs[5 * ky]: where row ky of the kernel reads)."""
    taps16(q, w, b, acc, (offs[0], offs[5], offs[10], offs[15], offs[20]), oh, ow, row, step, op, pa, pb)


@jit
def cells_any(q, w, b, acc, offs, oh, ow, row, step):  # pragma: no cover - compiled
    """A block's sums for any kernel, cell by cell: channels.py's `runs` on each cell's LANES lanes (one run of taps
    a pass, the total in acc, the bias last), with the block's weights and bias in one (taps + 1, LANES) copy."""
    taps = offs.shape[0]
    rep = np.empty((taps + 1) * LANES, np.float32)
    rep[: taps * LANES] = w
    rep[taps * LANES:] = b
    for oy in range(oh):
        for ox in range(ow):
            a = (oy * ow + ox) * LANES
            runs(q[oy * row + ox * step:], rep, acc[a: a + LANES], offs, 1, LANES, 0)


@jit
def units_of(x, w, bias, y, table, lo, hi, dst, offs, planes, hp, wp, sh, sw, kind, z, op, a, b):  # pragma: no cover
    """Units lo..hi of ``table`` (rows image, c0, c1): each unit's blocks (`block_sums`) and the fused op's
    epilogue (z: the residual flat, or none; the activation ``op``): without a residual the activation in
    `block_sums` (on each block of 16 channels while in cache), else all of it by `team.finish` while the unit is
    in L2, as depthwise.py's."""
    c, cells = y.shape[1], y.shape[2] * y.shape[3]
    flat = y.reshape(-1)
    for u in range(lo, hi):
        i, c0, c1 = table[u, 0], table[u, 1], table[u, 2]
        if z.size == 0:  # no residual: the activation on the block's sums (`taps16`'s registers where it can)
            block_sums(x[i], w, bias, y[i], c0, c1, dst, offs, planes, hp, wp, sh, sw, kind, op, a, b)
        else:
            block_sums(x[i], w, bias, y[i], c0, c1, dst, offs, planes, hp, wp, sh, sw, kind, NONE, a, b)
            finish(flat, z, (i * c + c0) * cells, 1, (c1 - c0) * cells, 0, NOTHING, 0, op, a, b)


@jit(parallel=True)
def drive(x, w, bias, y, table, parts, dst, offs, planes, hp, wp, sh, sw, kind, z, op, a, b):  # pragma: no cover
    """`units_of` over a native team (team.py): the units of ``table`` in ``parts`` contiguous shares."""
    count = table.shape[0]
    for t in prange(parts):
        units_of(x, w, bias, y, table, count * t // parts, count * (t + 1) // parts, dst, offs, planes, hp, wp, sh,
                 sw, kind, z, op, a, b)


# below depthwise.py's two and channels.py's (MINFER_TUNE=0 keeps taking the phase planes), above numpy's: one more
# timed candidate, stored under its own name (module and qualified name)
@kernel("Conv", since=1, priority=PRIORITY - 3, prepare=True, out=True, views=False, packed=(1, 2), epilogue=True,
        applies=applies)
def conv_blocked(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv-1/11/22, depthwise only (depthwise.py's `applies`): LANES channels a cell, its taps in registers."""
    w = ctx.constants[1]
    c, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    blocks = -(-c // LANES)
    # copies, zero past the last channel (packed=(1, 2)): (block, tap, lane), a block's weights contiguous
    weights, flat = channels._aligned((blocks, kh * kw, LANES)), np.zeros((blocks * LANES, kh * kw), np.float32)
    flat[:c] = w.reshape(c, kh * kw)
    weights[:] = flat.reshape(blocks, LANES, kh * kw).transpose(0, 2, 1)
    packed = readonly(weights)
    b = ctx.constants[2] if len(ctx.constants) > 2 else None
    fixed_bias = None if b is None else channels._padded(b, blocks)
    zeros = readonly(channels._aligned((blocks * LANES,)))
    st, dl = tuple(strides or (1, 1)), tuple(dilations or (1, 1))
    geometry: dict[tuple[int, ...], tuple[Window, tuple[Any, ...]]] = {}
    cuts: dict[tuple[int, ...], tuple[list[tuple[int, int, int]], int, np.ndarray]] = {}
    _warm(packed, st, dl, (kh, kw))

    def locate(dims: tuple[int, ...]) -> tuple[Window, tuple[Any, ...]]:
        if dims not in geometry:
            win = window(dims[1:], (kh, kw), st, dl, pads, auto_pad, clamp_same=True)
            geometry[dims] = win, _tables(dims[1:], win, (kh, kw), st, dl)
        return geometry[dims]

    known = ctx.input_types[0].shape[1:]
    if all(isinstance(d, int) for d in known):  # now, not in the first run, which the core times against the others
        locate(known)

    # the last serial call's ((input shape, epilogue), units_of's arguments after y), one item read and replaced
    # whole (concurrent calls): a fused node's epilogue is one object for all its calls, so a small model's steady
    # runs skip the planning below (1-2 us a call)
    last: list[Any] = [(None, ())]

    def run(x, w=None, b=None, *, out=None, epilogue=None):
        seen, args = last[0]
        if out is not None and seen == (x.shape, epilogue) and (b is None or fixed_bias is not None) \
                and intra_op_threads() == 1 and out.flags.c_contiguous:
            units_of(readonly(np.ascontiguousarray(x)), packed, args[0], out, *args[1:])  # no pool: no team shares it
            return out
        n = x.shape[0]
        (_, _, out_shape), tables = locate(x.shape[1:])
        y = out if out is not None else np.empty((n, c) + out_shape, np.float32)
        if y.size == 0:
            return y
        bias = fixed_bias if fixed_bias is not None else zeros if b is None else channels._padded(b, blocks)
        threads, native = path(epilogue, y)
        if native is None and threads == 1:  # one thread: the units and their epilogue in one compiled call too
            native = compiled_epilogue(epilogue, y)
        key = (n, threads, native is not None) + x.shape[1:]
        if key not in cuts:
            cuts[key] = channels._cut(n, c, x.shape[2:], out_shape, kh * kw, threads, native is not None)
        found, parts, table = cuts[key]
        xs = readonly(np.ascontiguousarray(x))  # one compiled signature, whether x is a feed or not
        if native is not None and threads == 1:  # compiled end to end on this thread, no pool to share it
            units_of(xs, packed, bias, y, table, 0, len(found), *tables, *native)
            finished(epilogue, y, native)
            if native[0] is NOTHING and native is not AFTER and (b is None or fixed_bias is not None):
                last[0] = (x.shape, epilogue), (bias, table, 0, len(found), *tables, *native)  # the same next time
            return y
        if native is not None:  # compiled end to end: over the team when worth a split, else on this thread

            def whole(lo: int, hi: int) -> None:
                if parts > 1:
                    drive(xs, packed, bias, y, table, parts, *tables, *native)
                else:
                    units_of(xs, packed, bias, y, table, 0, len(found), *tables, *native)
                finished(epilogue, y, native)

            # one range, which the driver splits itself: a process team's ranks still write y only in here
            parallel_for(1, whole, parts=1, outputs_only=True)
            return y

        def span(lo: int, hi: int) -> None:
            for i, c0, c1 in found[lo:hi]:
                block_sums(xs[i], packed, bias, y[i], c0, c1, *tables, team.NONE, np.float32(0), np.float32(0))
                if epilogue is not None:
                    epilogue(y, (slice(i, i + 1), slice(c0, c1)))

        parallel_for(len(found), span, parts=parts, outputs_only=True)  # a unit writes only its y block
        return y

    # every unit writes only its own block of y, inside parallel_for(outputs_only=True): a process team may share it
    return spmd(run)


def _tables(in_shape: tuple[int, ...], win: Window, kernel: tuple[int, int], strides: tuple[int, ...],
            dilations: tuple[int, ...]) -> tuple[Any, ...]:
    """block_sums' arguments after c1, found once per input shape: where each input cell goes in the scratch (dst),
    where tap (ky, kx) reads from a cell's first read (offs), each lane's plane in y (planes), the scratch's rows
    and columns (every input cell has a place, and every tap of every output cell), the strides, the loop."""
    (height, width), (oh, ow), (kh, kw) = in_shape, win.out_shape, kernel
    (sh, sw), (dh, dw), (ph, pw) = strides, dilations, win.begin
    hp, wp = max(height + ph, (oh - 1) * sh + (kh - 1) * dh + 1), max(width + pw, (ow - 1) * sw + (kw - 1) * dw + 1)
    taps = np.arange(kh * kw)
    offs = (taps // kw * dh * wp + taps % kw * dw) * LANES
    dst = ((np.arange(height)[:, None] + ph) * wp + np.arange(width)[None, :] + pw) * LANES
    ints = [readonly(np.ascontiguousarray(a, np.int64).reshape(-1)) for a in (dst, offs, np.arange(LANES) * oh * ow)]
    kind = ANY if dilations != (1, 1) else TAPS3 if kernel == (3, 3) else TAPS5 if kernel == (5, 5) else ANY
    return (*ints, hp, wp, sh, sw, kind)


def _warm(weights: np.ndarray, strides: tuple[int, ...], dilations: tuple[int, ...], kernel: tuple[int, int]) -> None:
    """Compile (or load from the cache) at build, not in the first run, where it would also skew the timing
    of the kernels the core compares: the loops, and the team's driver where a native team may run."""
    _install()
    reach = [(k - 1) * d for k, d in zip(kernel, dilations)]  # pads: at least one output
    win = window((4, 4), kernel, strides, dilations, reach + [0, 0])
    x, y = readonly(np.zeros((1, 1, 4, 4), np.float32)), np.zeros((1, 1) + win.out_shape, np.float32)
    bias, tables = readonly(np.zeros(LANES, np.float32)), _tables((4, 4), win, kernel, strides, dilations)
    table = readonly(np.array([[0, 0, 1]], np.int64))
    rest = (NOTHING, team.NONE, np.float32(0), np.float32(0))
    units_of(x, weights[:1], bias, y, table, 0, 1, *tables, *rest)
    if team.available():  # the team's driver too, where a native team may run
        drive(x, weights[:1], bias, y, table, 1, *tables, *rest)
