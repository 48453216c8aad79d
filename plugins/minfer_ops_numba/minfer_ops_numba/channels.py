"""Conv when depthwise, on small maps: compiled tap loops vectorized across channels (`conv_channels`).

depthwise.py's loops run along each channel's rows or planes: on a 14x14
or 7x7 map a row is shorter than one AVX-512 vector, and the per-channel
copies and loop set-ups cost more than the taps. Here a block of LANES
channels is copied into channels-last phase planes (each cell's LANES
channels one vector), every tap is one vectorized loop over an output
row's cells and lanes, and the block's sums go back to the NCHW output,
whose unit then gets the fused op's epilogue as in depthwise.py (there
too in a native team's compiled driver, `drive`, when one runs). The
copies are transposes of 16x16 tiles in registers (`transpose16`, an LLVM
intrinsic: numba has no shuffles). A third candidate for depthwise.py's
nodes, declared alike; the core times it against them and numpy's per
node. Measured (one thread, loaded host, MobileNetV2's layers at batch 1):
576x14x14 stride 2 and 960x7x7 took 27 us against the phase planes' 70 and
61, 576x14x14 52 against 73 (row loops); 144x56x56 took 198 against 149.

Each cell sums its taps in onnxruntime's MLAS order (loops.py's
docstring): runs of four taps in (ky, kx) order, a run's products added
left to right, the run's sum then added to the total, the taps left over as
a run of two and then of one, the bias last, every product and sum rounded
on its own. Vectorizing across channels leaves each cell's order as it is:
the kernel gives loops.py's bits (and onnxruntime's).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minfer_core import kernel, parallel_for, spmd

from . import team
from ._jit import PRIORITY, jit, readonly, uintp  # noqa: F401 (uintp: rebound to numba's type at compile)
from .depthwise import applies, finished, path, units
from .team import NOTHING, finish, prange  # noqa: F401 (compiled: the driver's)
from .window import Window, window

# channels a block computes at once: one AVX-512 vector of float32 (a constant to numba, as every global)
LANES = 16


def transpose16(src, sbase, sstride, dst, table, tbase, dbase, count):  # pragma: no cover - replaced
    """Rows r < 16 of 16 floats, src[sbase + r * sstride:][:16], transposed, to dst[dbase + table[tbase + r]:][:16]
    for r < count, in registers: a scalar copy (a load and a store a float) was 2-3x slower. A stand-in, made
    numba's intrinsic when the kernel is first prepared (`_install`)."""
    raise RuntimeError("channels.transpose16 runs compiled only")


def _install() -> None:
    """Make `transpose16` numba's intrinsic, importing numba now (never at import: _jit.py's docstring)."""
    if getattr(transpose16, "_is_intrinsic", False):
        return
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    def typer(typingctx, src, sbase, sstride, dst, table, tbase, dbase, count):
        def codegen(context, builder, sig, args):
            src, sbase, sstride, dst, table, tbase, dbase, count = args
            base = context.make_array(sig.args[0])(context, builder, src).data
            out = context.make_array(sig.args[3])(context, builder, dst).data
            where = context.make_array(sig.args[4])(context, builder, table).data
            vector, i64 = ir.VectorType(ir.FloatType(), LANES), ir.IntType(64)
            rows = [builder.load(builder.bitcast(builder.gep(base, [builder.add(sbase, builder.mul(
                sstride, ir.Constant(i64, r)))]), vector.as_pointer()), align=4) for r in range(LANES)]
            for bit in (8, 4, 2, 1):  # swap bit `bit` of the row and column indices: after all four, transposed
                low = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [j + LANES - bit if j & bit else j
                                                                         for j in range(LANES)])
                high = ir.Constant(ir.VectorType(ir.IntType(32), LANES), [j + LANES if j & bit else j + bit
                                                                          for j in range(LANES)])
                for r in [r for r in range(LANES) if not r & bit]:
                    a, b = rows[r], rows[r + bit]
                    rows[r], rows[r + bit] = builder.shuffle_vector(a, b, low), builder.shuffle_vector(a, b, high)
            for r in range(LANES):
                with builder.if_then(builder.icmp_signed(">", count, ir.Constant(i64, r))):
                    at = builder.add(dbase, builder.load(builder.gep(where, [builder.add(tbase, ir.Constant(i64, r))])))
                    builder.store(rows[r], builder.bitcast(builder.gep(out, [at]), vector.as_pointer()), align=4)
            return context.get_dummy_value()

        return types.void(src, sbase, sstride, dst, table, tbase, dbase, count), codegen

    made = intrinsic(typer)
    made._is_intrinsic = True
    globals()["transpose16"] = made


@jit
def lined(size):  # pragma: no cover - compiled
    """A zeroed float32 array of ``size`` starting on a 64-byte boundary: a vector load or store across two cache
    lines made the tap loop 1.7x slower (576x14x14: 42 against 25 us)."""
    raw = np.zeros(size + LANES, np.float32)
    skip = (-(raw.ctypes.data // 4)) % LANES
    return raw[skip:skip + size]


@jit
def channel_blocks(x, w, bias, y, c0, c1, offs, dst, planes, hq, wq, sh, sw, square):  # pragma: no cover - compiled
    """y[c] = sum of w[c, ky, kx] * x[c] shifted, + bias[c], for channels c0..c1 of x (C, H, W) into y (C, OH, OW),
    LANES channels at a time; w is (blocks, taps, LANES) and bias (blocks * LANES,), both zero past C; offs, dst,
    planes and the planes' size (hq, wq) as `_tables` finds them; ``square``: the kernel is 3x3.

    Each block is copied into sh * sw zero-bordered channels-last phase planes (Hq, Wq, LANES), as phases.py
    splits a plane: a tap then reads one plane at a fixed offset from its output cell, whatever the stride,
    and an output row's cells and lanes are one contiguous run of OW * LANES. The weights are repeated along
    such a run (`repeat`), so each tap is one vectorized loop over it; the block's sums, (OH * OW, LANES), are
    then written to y's planes.
    """
    hw, oh, ow, span = x.shape[1] * x.shape[2], y.shape[1], y.shape[2], y.shape[2] * LANES
    # q: the planes and a spare cell taking the input cells no output reads; its borders stay zero
    q, acc, rep = lined(sh * sw * hq * wq * LANES + LANES), lined(oh * span), lined((offs.shape[0] + 1) * span)
    xf, yf = x.reshape(-1), y.reshape(-1)
    for cb in range(c0, c1, LANES):
        lanes = min(LANES, c1 - cb)
        fill(xf, q, cb * hw, hw, dst, lanes)
        repeat(w[cb // LANES].reshape(-1), bias[cb:cb + LANES], rep, span)
        if square:
            taps3(q, rep, acc, offs, oh, span, wq * LANES)
        else:
            runs(q, rep, acc, offs, oh, span, wq * LANES)
        drain(acc, yf, cb * oh * ow, oh * ow, planes, lanes)


@jit
def fill(xf, q, base, hw, dst, lanes):  # pragma: no cover - compiled
    """Planes base.. of xf (``lanes`` of them, hw cells each) into q's lanes, cell j at dst[j]: sixteen cells a
    `transpose16` in a whole block, the rest (and a partial block, whose channels past C are not there to read)
    a cell at a time."""
    whole = hw - hw % LANES if lanes == LANES else 0
    for j0 in range(0, whole, LANES):
        transpose16(xf, base + j0, hw, q, dst, j0, 0, LANES)
    for j in range(whole, hw):
        for k in range(lanes):
            q[uintp(dst[j] + k)] = xf[uintp(base + k * hw + j)]


@jit
def repeat(w, b, rep, span):  # pragma: no cover - compiled
    """Each tap's LANES weights, then the LANES biases, repeated along a run of ``span``: rep (taps + 1, span).
    Each run is copied from the run LANES before it (a known distance: the copy vectorizes)."""
    taps = w.shape[0] // LANES
    for t in range(taps):
        for k in range(LANES):
            rep[uintp(t * span + k)] = w[uintp(t * LANES + k)]
    for k in range(LANES):
        rep[uintp(taps * span + k)] = b[uintp(k)]
    for t in range(taps + 1):
        for j in range(t * span + LANES, (t + 1) * span):
            rep[uintp(j)] = rep[uintp(j - LANES)]


@jit
def drain(acc, yf, base, cells, planes, lanes):  # pragma: no cover - compiled
    """acc's first ``lanes`` lanes into planes base.. of yf (lane k at planes[k]): sixteen cells a `transpose16`,
    the rest a cell at a time."""
    whole = cells - cells % LANES
    for j0 in range(0, whole, LANES):
        transpose16(acc, j0 * LANES, LANES, yf, planes, 0, base + j0, lanes)
    for j in range(whole, cells):
        for k in range(lanes):
            yf[uintp(base + planes[k] + j)] = acc[uintp(j * LANES + k)]


@jit
def taps3(q, rep, acc, offs, oh, span, row):  # pragma: no cover - compiled
    """A block's 3x3 sums, an output row a pass: runs of 4, 4 and 1 taps, the total in a register."""
    o0, o1, o2, o3, o4, o5, o6, o7, o8 = offs[0], offs[1], offs[2], offs[3], offs[4], offs[5], offs[6], offs[7], \
        offs[8]
    for oy in range(oh):
        i, o = oy * row, oy * span
        for j in range(span):
            s = rep[uintp(j)] * q[uintp(i + o0 + j)] + rep[uintp(span + j)] * q[uintp(i + o1 + j)]
            s += rep[uintp(2 * span + j)] * q[uintp(i + o2 + j)]
            s += rep[uintp(3 * span + j)] * q[uintp(i + o3 + j)]
            t = rep[uintp(4 * span + j)] * q[uintp(i + o4 + j)] + rep[uintp(5 * span + j)] * q[uintp(i + o5 + j)]
            t += rep[uintp(6 * span + j)] * q[uintp(i + o6 + j)]
            t += rep[uintp(7 * span + j)] * q[uintp(i + o7 + j)]
            acc[uintp(o + j)] = (rep[uintp(8 * span + j)] * q[uintp(i + o8 + j)] + (t + s)) \
                + rep[uintp(9 * span + j)]


@jit
def runs(q, rep, acc, offs, oh, span, row):  # pragma: no cover - compiled
    """A block's sums for any kernel, an output row a pass: one run of taps a loop, the total in acc."""
    taps = offs.shape[0]
    for oy in range(oh):
        i, o = oy * row, oy * span
        for j in range(span):
            acc[uintp(o + j)] = 0.0
        t0 = 0
        while t0 < taps:
            n = 4 if taps - t0 >= 4 else 2 if taps - t0 >= 2 else 1
            p0, v0 = i + offs[t0], t0 * span
            if n == 4:
                p1, p2, p3 = i + offs[t0 + 1], i + offs[t0 + 2], i + offs[t0 + 3]
                for j in range(span):
                    s = rep[uintp(v0 + j)] * q[uintp(p0 + j)] + rep[uintp(v0 + span + j)] * q[uintp(p1 + j)]
                    s += rep[uintp(v0 + 2 * span + j)] * q[uintp(p2 + j)]
                    acc[uintp(o + j)] = (s + rep[uintp(v0 + 3 * span + j)] * q[uintp(p3 + j)]) + acc[uintp(o + j)]
            elif n == 2:
                p1 = i + offs[t0 + 1]
                for j in range(span):
                    s = rep[uintp(v0 + j)] * q[uintp(p0 + j)] + rep[uintp(v0 + span + j)] * q[uintp(p1 + j)]
                    acc[uintp(o + j)] = s + acc[uintp(o + j)]
            else:
                for j in range(span):
                    acc[uintp(o + j)] = rep[uintp(v0 + j)] * q[uintp(p0 + j)] + acc[uintp(o + j)]
            t0 += n
        for j in range(span):
            acc[uintp(o + j)] += rep[uintp(taps * span + j)]


@jit(parallel=True)
def drive(x, w, bias, y, table, parts, offs, dst, planes, hq, wq, sh, sw, square, z, op, a, b):  # pragma: no cover
    """depthwise.py's `drive` for `channel_blocks`: the units of ``table`` (rows image, c0, c1) in ``parts``
    shares over a native team, each unit's blocks then its epilogue by `team.finish` while in L2."""
    c, cells = y.shape[1], y.shape[2] * y.shape[3]
    flat = y.reshape(-1)
    count = table.shape[0]
    for t in prange(parts):
        for u in range(count * t // parts, count * (t + 1) // parts):
            i, c0, c1 = table[u, 0], table[u, 1], table[u, 2]
            channel_blocks(x[i], w, bias, y[i], c0, c1, offs, dst, planes, hq, wq, sh, sw, square)
            finish(flat, z, (i * c + c0) * cells, 1, (c1 - c0) * cells, 0, NOTHING, 0, op, a, b)


# below depthwise.py's two (MINFER_TUNE=0 keeps taking its phase planes), above numpy's: one more timed candidate,
# stored under its own name (module and qualified name)
@kernel("Conv", since=1, priority=PRIORITY - 2, prepare=True, out=True, views=False, packed=(1, 2), epilogue=True,
        applies=applies)
def conv_channels(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv-1/11/22, depthwise only (depthwise.py's `applies`): LANES channels at once in channels-last planes."""
    w = ctx.constants[1]
    c, kh, kw = w.shape[0], w.shape[2], w.shape[3]
    blocks = -(-c // LANES)
    # copies, zero past the last channel (packed=(1, 2)): (block, tap, lane), a block's weights contiguous
    weights, flat = _aligned((blocks, kh * kw, LANES)), np.zeros((blocks * LANES, kh * kw), np.float32)
    flat[:c] = w.reshape(c, kh * kw)
    weights[:] = flat.reshape(blocks, LANES, kh * kw).transpose(0, 2, 1)
    b = ctx.constants[2] if len(ctx.constants) > 2 else None
    fixed_bias = None if b is None else _padded(b, blocks)
    zeros = readonly(_aligned((blocks * LANES,)))
    st, dl = tuple(strides or (1, 1)), tuple(dilations or (1, 1))
    geometry: dict[tuple[int, ...], tuple[Window, tuple[Any, ...]]] = {}
    cuts: dict[tuple[int, ...], tuple[list[tuple[int, int, int]], int, np.ndarray]] = {}
    packed = readonly(weights)
    _warm(packed, st, dl, (kh, kw))

    def locate(dims: tuple[int, ...]) -> tuple[Window, tuple[Any, ...]]:
        if dims not in geometry:
            win = window(dims[1:], (kh, kw), st, dl, pads, auto_pad, clamp_same=True)
            geometry[dims] = win, _tables(dims[1:], win, (kh, kw), st, dl)
        return geometry[dims]

    known = ctx.input_types[0].shape[1:]
    if all(isinstance(d, int) for d in known):  # now, not in the first run, which the core times against the others
        locate(known)

    def run(x, w=None, b=None, *, out=None, epilogue=None):
        n = x.shape[0]
        (_, _, out_shape), tables = locate(x.shape[1:])
        y = out if out is not None else np.empty((n, c) + out_shape, np.float32)
        if y.size == 0:
            return y
        bias = fixed_bias if fixed_bias is not None else zeros if b is None else _padded(b, blocks)
        threads, native = path(epilogue, y)
        key = (n, threads, native is not None) + x.shape[1:]
        if key not in cuts:
            cuts[key] = _cut(n, c, x.shape[2:], out_shape, kh * kw, threads, native is not None)
        found, parts, table = cuts[key]
        xs = readonly(np.ascontiguousarray(x))
        if native is not None and parts > 1:  # else not worth a split: one thread, as before

            def whole(lo: int, hi: int) -> None:
                drive(xs, packed, bias, y, table, parts, *tables, *native)
                finished(epilogue, y, native)

            # one range, which the driver splits itself: a process team's ranks still write y only in here
            parallel_for(1, whole, parts=1, outputs_only=True)
            return y

        def span(lo: int, hi: int) -> None:
            for i, c0, c1 in found[lo:hi]:
                channel_blocks(xs[i], packed, bias, y[i], c0, c1, *tables)
                if epilogue is not None:
                    epilogue(y, (slice(i, i + 1), slice(c0, c1)))

        parallel_for(len(found), span, parts=parts, outputs_only=True)  # a unit writes only its y block
        return y

    # every unit writes only its own block of y, inside parallel_for(outputs_only=True): a process team may share it
    return spmd(run)


def _aligned(shape: tuple[int, ...]) -> np.ndarray:
    """A zeroed float32 array starting on a 64-byte boundary (the vectors the loops load)."""
    size = math.prod(shape)
    raw = np.zeros(size + LANES, np.float32)
    skip = (-(raw.ctypes.data // 4)) % LANES
    return raw[skip:skip + size].reshape(shape)


def _padded(b: np.ndarray, blocks: int) -> np.ndarray:
    """The bias as float32, zero past the last channel up to whole blocks."""
    padded = _aligned((blocks * LANES,))
    padded[:b.shape[0]] = b
    return readonly(padded)


def _cut(n: int, c: int, in_shape: tuple[int, ...], out_shape: tuple[int, ...], taps: int, threads: int,
         native: bool) -> tuple[list[tuple[int, int, int]], int, np.ndarray]:
    """depthwise.py's units, in whole blocks of LANES channels (the last one cut at c), for a native team's driver
    (``native``) or parallel_for, and the same as `drive`'s table."""
    plane = (math.prod(in_shape) + math.prod(out_shape)) * 4 * LANES
    found, parts = units(n, -(-c // LANES), plane, n * c * math.prod(out_shape) * taps, threads, native)
    found = [(i, b0 * LANES, min(c, b1 * LANES)) for i, b0, b1 in found]
    return found, parts, readonly(np.array(found, np.int64).reshape(-1, 3))


def _tables(in_shape: tuple[int, ...], win: Window, kernel: tuple[int, int], strides: tuple[int, ...],
            dilations: tuple[int, ...]) -> tuple[Any, ...]:
    """channel_blocks' arguments after c1, found once per input shape: where tap (ky, kx) reads in the planes
    from its output cell (offs), where each input cell goes (dst; the spare cell past the planes when no output
    reads it), each lane's plane in y (planes), the planes' rows and columns, the strides, whether 3x3."""
    (height, width), (oh, ow), (kh, kw) = in_shape, win.out_shape, kernel
    (sh, sw), (dh, dw), (ph, pw) = strides, dilations, win.begin
    hq, wq = oh + (kh - 1) * dh // sh, ow + (kw - 1) * dw // sw
    size = hq * wq * LANES
    ry, rx = np.arange(kh * kw) // kw * dh, np.arange(kh * kw) % kw * dw
    offs = (ry % sh * sw + rx % sw) * size + (ry // sh * wq + rx // sw) * LANES
    iy, ix = np.arange(height)[:, None] + ph, np.arange(width)[None, :] + pw
    dst = np.where((iy // sh < hq) & (ix // sw < wq), (iy % sh * sw + ix % sw) * size
                   + (iy // sh * wq + ix // sw) * LANES, sh * sw * size)
    ints = [readonly(np.ascontiguousarray(a, np.int64).reshape(-1)) for a in (offs, dst, np.arange(LANES) * oh * ow)]
    return (*ints, hq, wq, sh, sw, kh == 3 and kw == 3)


def _warm(weights: np.ndarray, strides: tuple[int, ...], dilations: tuple[int, ...], kernel: tuple[int, int]) -> None:
    """Compile (or load from the cache) at build, not in the first run, where it would also skew the timing
    of the kernels the core compares."""
    _install()
    reach = [(k - 1) * d for k, d in zip(kernel, dilations)]  # pads: at least one output
    win = window((4, 4), kernel, strides, dilations, reach + [0, 0])
    x, y = readonly(np.zeros((1, 4, 4), np.float32)), np.zeros((1,) + win.out_shape, np.float32)
    bias, tables = readonly(np.zeros(LANES, np.float32)), _tables((4, 4), win, kernel, strides, dilations)
    channel_blocks(x, weights[:1], bias, y, 0, 1, *tables)
    if team.available():  # the team's driver too, where a native team may run
        drive(x[None], weights[:1], bias, y[None], readonly(np.array([[0, 0, 1]], np.int64)), 1, *tables, NOTHING,
              team.NONE, np.float32(0), np.float32(0))
