"""A stem conv's direct vector loop (`stem_rows`): every output channel of 16 output columns from inputs in registers.

A network's first conv (3 input channels, 3x3, stride 2: MobileNets,
PP-LCNet, the OCR detector) has 27 multiply-adds an output. fewchannels.py's
other way copies its windows into an im2col and multiplies them by one BLAS
GEMM, whose K of 28 leaves it far from the FP pipes' peak, and whose im2col
is a quarter of the time. Here a small LLVM intrinsic (`stem_cells`) loads
the C*9 input vectors of a run of LANES output columns once (vector_rows.py's
loads: masked at a plane's edges, a stride-2 tap pair split from two loads),
keeps them in vector registers, and then sums GROUP output channels at a
time: each channel's C*9 weights (broadcasts from memory) times those vectors
by a chain of fused multiply-adds on its bias, the GROUP chains interleaved so
that the core overlaps their latencies; the fused op's activation (team.py's
code, depthwise_blocked.py's vector forms) before the one store. No copy, no
pass over an im2col: 27 FMAs an output vector, the loads shared by every
channel. Measured on the 224x224 -> 16 stem, one thread: 114 us (about one
FMA a cycle), one channel at a time 131, two 118, eight (spilling) 178.

The sums are fused multiply-adds in (c, ky, kx) order on the bias: not the
GEMM's bits, within float32 rounding of them.
"""

from __future__ import annotations

import itertools
from typing import Any

from ._jit import jit
from .activation import CLIP, HARD_SIGMOID, HARD_SWISH, LEAKY_RELU
from .team import NONE
from .vector_rows import LANES, Kit, buildable

GROUP = 4  # output channels summed together (`_stem_cells`)
MAX_CHANNELS = 4  # input channels: the C*9 vectors held in registers (36 of AVX-512's 32 spill a few)


def fits(channels: int, kernel: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """Whether `stem_rows` computes a conv of this geometry (dilation 1, one group: the caller's checks)."""
    return 1 <= channels <= MAX_CHANNELS and kernel == (3, 3) and strides in ((1, 1), (2, 2)) and buildable()


@jit
def stem_rows(x, n, packed, y, r0, r1, sh, ph, pw, op, a, b):  # pragma: no cover - compiled
    """y[n, m, r0:r1] = act(packed[m, -1] + sum over (c, ky, kx) of packed[m, c*9 + ky*3 + kx] * x[n, c, oy*sh - ph +
    ky, ox*sh - pw + kx] (zero outside x)) for every output channel m: x (N, C, H, W), ``packed`` (M, C*9 + 1: the
    weights, the bias last; fewchannels.py's), y (N, M, OH, OW); act: team.py's activation ``op`` with its a, b
    where depthwise_blocked.py's `_activations` has code for it, else none. Returns whether ``op`` was applied
    (else the caller's `team.finish` applies it)."""
    inner = op if op == NONE or op == CLIP or op == LEAKY_RELU or op == HARD_SIGMOID or op == HARD_SWISH else NONE
    channels, height, width = x.shape[1], x.shape[2], x.shape[3]
    m, oh, ow = y.shape[1], y.shape[2], y.shape[3]
    xf, yf, wf = x.reshape(-1), y.reshape(-1), packed.reshape(-1)
    xbase, ybase = n * channels * height * width, n * m * oh * ow
    if channels == 1:
        stem_cells(xf, xbase, height, width, wf, yf, ybase, m, oh * ow, ow, r0, r1, sh, ph, pw, inner, a, b, (0,))
    elif channels == 2:
        stem_cells(xf, xbase, height, width, wf, yf, ybase, m, oh * ow, ow, r0, r1, sh, ph, pw, inner, a, b, (0, 1))
    elif channels == 3:
        stem_cells(xf, xbase, height, width, wf, yf, ybase, m, oh * ow, ow, r0, r1, sh, ph, pw, inner, a, b,
                   (0, 1, 2))
    else:
        stem_cells(xf, xbase, height, width, wf, yf, ybase, m, oh * ow, ow, r0, r1, sh, ph, pw, inner, a, b,
                   (0, 1, 2, 3))
    return inner == op


def stem_cells(xf, xbase, height, width, w, yf, ybase, m, plane, ow, r0, r1, stride, ph, pw, op, a, b,
               channels):
    """Output rows r0..r1 of every one of ``m`` channels (planes of ``plane`` cells, rows of ``ow``) at yf[ybase:]
    from the ``channels`` planes (a tuple: its length known at compile) at xf[xbase:]. A stand-in, made numba's
    intrinsic when the kernel is first prepared (`install`)."""  # pragma: no cover
    raise RuntimeError("stem_rows.stem_cells runs compiled only")


def install() -> None:
    """Make `stem_cells` numba's intrinsic, importing numba now (never at import: _jit.py's docstring)."""
    if getattr(stem_cells, "_is_intrinsic", False):
        return
    from numba import types
    from numba.extending import intrinsic

    def typer(typingctx, xf, xbase, height, width, w, yf, ybase, m, plane, ow, r0, r1, stride, ph, pw, op, a, b,
              channels):
        return types.void(xf, xbase, height, width, w, yf, ybase, m, plane, ow, r0, r1, stride, ph, pw, op, a, b,
                          channels), _stem_cells

    made = intrinsic(typer)
    made._is_intrinsic = True
    globals()["stem_cells"] = made


install_intrinsics = install  # _jit.py installs a module's intrinsics before its functions compile


def _stem_cells(context: Any, builder: Any, sig: Any, args: tuple[Any, ...]) -> Any:
    """`stem_cells`' code: per output row and run of LANES columns, the C*9 input vectors (masked loads, zero
    outside the plane), then a loop over the output channels, each a chain of fused multiply-adds stored once."""
    from llvmlite import ir
    from numba.core import cgutils

    if not buildable():
        with builder.if_then(cgutils.true_bit):
            context.call_conv.return_user_exc(builder, RuntimeError, ("stem_rows needs numba's LLVM 17 or later",))
        return context.get_dummy_value()
    from .depthwise_blocked import _activations

    xf, xbase, height, width, w, yf, ybase, m, plane, ow, r0, r1, stride, ph, pw, op, pa, pb, _ = args
    channels = sig.args[18].count
    taps = channels * 9
    xd, wd, yd = (context.make_array(sig.args[i])(context, builder, args[i]).data for i in (0, 4, 5))
    kit = Kit(builder)
    i32, vec, ivec, zero, lanes, first = kit.i32, kit.vec, kit.ivec, kit.zero, kit.lanes, kit.first
    const, splat, mload, mstore, at = kit.const, kit.splat, kit.mload, kit.mstore, kit.at
    fma = cgutils.get_or_insert_function(builder.module, ir.FunctionType(vec, [vec, vec, vec]), f"llvm.fma.v{LANES}f32")

    width_v, ow_v = splat(builder.trunc(width, i32), ivec), splat(builder.trunc(ow, i32), ivec)
    evens = ir.Constant(ivec, list(range(0, 2 * LANES, 2)))
    odds = ir.Constant(ivec, list(range(1, 2 * LANES, 2)))
    chunks = builder.sdiv(builder.add(ow, const(LANES - 1)), const(LANES))

    def inside(col):  # the lanes of a load from column col of a row that read the plane
        cols = builder.add(splat(builder.trunc(col, i32), ivec), lanes)
        return builder.and_(builder.icmp_signed(">=", cols, first), builder.icmp_signed("<", cols, width_v))

    def inputs(oy, col0, s):  # the C*9 vectors of the run from output column col0, in (c, ky, kx) order
        base = builder.sub(builder.mul(col0, const(s)), pw)
        cols = [builder.add(base, const(kx)) for kx in range(3)] if s == 1 else \
            [builder.add(base, const(kx + half)) for kx in (0, 2) for half in (0, LANES)]
        masks = [inside(col) for col in cols]
        top = builder.sub(builder.mul(oy, const(s)), ph)
        out = []
        for c in range(channels):
            for ky in range(3):
                iy = builder.add(top, const(ky))
                ok = builder.and_(builder.icmp_signed(">=", iy, const(0)), builder.icmp_signed("<", iy, height))
                row = builder.add(builder.add(xbase, builder.mul(const(c), builder.mul(height, width))),
                                  builder.mul(builder.select(ok, iy, const(0)), width))
                loaded = [builder.select(ok, builder.call(mload, [at(xd, builder.add(row, col)), ir.Constant(i32, 4),
                                                                  mask, zero]), zero)
                          for col, mask in zip(cols, masks)]
                if s == 1:
                    out += loaded
                else:  # pairs of loads: the even columns of (0, 16) tap 0, its odd ones tap 1; of (2, 18) tap 2
                    out += [builder.shuffle_vector(loaded[0], loaded[1], evens),
                            builder.shuffle_vector(loaded[0], loaded[1], odds),
                            builder.shuffle_vector(loaded[2], loaded[3], evens)]
        return out

    # a loop nest per activation and stride (the choice made once a call); `stem_rows` passes only their codes
    for (code, activate), s in itertools.product(_activations(builder, vec, pa, pb).items(), (1, 2)):
        with builder.if_then(builder.and_(builder.icmp_signed("==", op, ir.Constant(op.type, code)),
                                          builder.icmp_signed("==", stride, const(s)))):
            with cgutils.for_range_slice(builder, r0, r1, const(1), inc=True) as (oy, _):
                out_row = builder.add(ybase, builder.mul(oy, ow))
                with cgutils.for_range(builder, chunks) as chunk:
                    col0 = builder.mul(chunk.index, const(LANES))
                    values = inputs(oy, col0, s)
                    keep = builder.icmp_signed("<", builder.add(splat(builder.trunc(col0, i32), ivec), lanes), ow_v)
                    # GROUP channels at a time: their sums are independent chains of FMAs, which the core overlaps
                    # (one channel's chain waits on each FMA's latency), then the channels left one by one
                    def outputs(first, count):
                        wrows = [builder.mul(builder.add(first, const(g)), const(taps + 1)) for g in range(count)]
                        totals = [splat(builder.load(builder.gep(wd, [builder.add(r, const(taps))])), vec)
                                  for r in wrows]  # a row: the weights, the bias
                        for t in range(taps):
                            for g in range(count):
                                weight = splat(builder.load(builder.gep(wd, [builder.add(wrows[g], const(t))])), vec)
                                totals[g] = builder.call(fma, [weight, values[t], totals[g]])
                        for g in range(count):
                            target = at(yd, builder.add(builder.add(out_row, col0),
                                                        builder.mul(builder.add(first, const(g)), plane)))
                            builder.call(mstore, [activate(totals[g]), target, ir.Constant(i32, 4), keep])

                    groups = builder.sdiv(m, const(GROUP))
                    with cgutils.for_range(builder, groups) as group:
                        outputs(builder.mul(group.index, const(GROUP)), GROUP)
                    with cgutils.for_range_slice(builder, builder.mul(groups, const(GROUP)), m, const(1),
                                                 inc=True) as (channel, _):
                        outputs(channel, 1)
    return context.get_dummy_value()
