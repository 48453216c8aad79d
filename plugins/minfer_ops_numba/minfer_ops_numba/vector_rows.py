"""The depthwise conv's in-place vector loop (`vector_rows`): 16 output columns a vector, read from x where it is.

phases.py's and loops.py's loops copy each channel into zero-bordered
planes first, or take the total through memory a run of taps at a time.
Here a small LLVM intrinsic (`row_cells`) holds a channel's 9 or 25
weights in vector registers and computes each run of LANES output columns
of a row in one go: every tap one vector load (stride 1) or a pair of loads
split into their even and odd columns (stride 2: the even columns are one
tap's inputs, the odd ones the next tap's), one product and one sum, the
total in a register, stored once. Nothing is copied: the padding is the
lanes a masked load leaves zero (a row above or below the input, columns
left or right of it), which only the cells at a plane's edges need;
interior cells take plain loads. On 112x112 and 56x56 planes the copy into
phase planes was a quarter (stride 1) to over half (stride 2) of the
phase-plane loop's time.

The taps are summed in onnxruntime's order (loops.py's docstring;
depthwise_blocked.py's `_in_runs`), and a padded tap multiplies a zero as
the planes' borders do, so the loop gives phases.py's bits. It covers 3x3
and 5x5 kernels at dilation 1 and strides 1 and 2 alike in both axes
(`fits`): nearly every depthwise layer; the other loops keep the rest.
"""

from __future__ import annotations

import functools
from typing import Any

from ._jit import jit

LANES = 16  # float32 lanes of a vector: one AVX-512 register (LLVM splits it on narrower machines)


def fits(kernel: tuple[int, ...], strides: tuple[int, ...], dilations: tuple[int, ...]) -> bool:
    """Whether `vector_rows` computes a depthwise conv of this geometry (where it can be built: `buildable`)."""
    return kernel in ((3, 3), (5, 5)) and strides in ((1, 1), (2, 2)) and dilations == (1, 1) and buildable()


@functools.lru_cache(maxsize=1)
def buildable() -> bool:
    """Whether numba's LLVM takes the masked loads and stores as `row_cells` names them (opaque pointers: LLVM 17
    or later, as pointwise.py's micro-kernel needs); llvmlite only is imported, not numba."""
    import llvmlite.binding as llvm

    return llvm.llvm_version_info >= (17,)


@jit
def vector_rows(x, w, bias, y, c0, c1, sh, sw, ph, pw, dh, dw):  # pragma: no cover - compiled
    """y[c] = sum of w[c, ky, kx] * x[c] shifted, + bias[c], for planes c0..c1 of x (C, H, W) into y (C, OH, OW)
    (loops.py's signature; `fits` says which kernels, strides and dilations), a channel a `row_cells` call."""
    height, width = x.shape[1], x.shape[2]
    oh, ow, k = y.shape[1], y.shape[2], w.shape[1]
    xf, yf = x.reshape(-1), y.reshape(-1)
    for c in range(c0, c1):
        wc = w[c].reshape(-1)
        if k == 3:
            row_cells(xf, c * height * width, height, width, wc, bias[c], yf, c * oh * ow, oh, ow, sh, ph, pw,
                      (0, 1, 2))
        else:
            row_cells(xf, c * height * width, height, width, wc, bias[c], yf, c * oh * ow, oh, ow, sh, ph, pw,
                      (0, 1, 2, 3, 4))


def row_cells(xf, xbase, height, width, w, bias, yf, ybase, oh, ow, stride, ph, pw, size):  # pragma: no cover
    """One channel: its plane at xf[xbase:] (height x width) into yf[ybase:] (oh x ow), the kernel ``size``'s length
    square (a tuple, so its length is known when the caller compiles), its weights w in (ky, kx) order, then the
    bias. A stand-in, made numba's intrinsic when the kernel is first prepared (`install`)."""
    raise RuntimeError("vector_rows.row_cells runs compiled only")


def install() -> None:
    """Make `row_cells` numba's intrinsic, importing numba now (never at import: _jit.py's docstring)."""
    if getattr(row_cells, "_is_intrinsic", False):
        return
    from numba import types
    from numba.extending import intrinsic

    def typer(typingctx, xf, xbase, height, width, w, bias, yf, ybase, oh, ow, stride, ph, pw, size):
        return types.void(xf, xbase, height, width, w, bias, yf, ybase, oh, ow, stride, ph, pw, size), _row_cells

    made = intrinsic(typer)
    made._is_intrinsic = True
    globals()["row_cells"] = made


def _row_cells(context: Any, builder: Any, sig: Any, args: tuple[Any, ...]) -> Any:
    """`row_cells`' code: per output row, its runs of LANES columns; a run every tap of which reads inside the
    plane (and a whole run of outputs) takes plain loads and a plain store, the others masked ones. Per stride a
    loop nest (the choice made once a call)."""
    from llvmlite import ir
    from numba.core import cgutils

    from .depthwise_blocked import _in_runs

    if not buildable():  # an LLVM before 17 spells the masked intrinsics otherwise: callers still compile (`fits`
        # never picks this loop there), a call raises
        with builder.if_then(cgutils.true_bit):
            context.call_conv.return_user_exc(builder, RuntimeError, ("vector_rows needs numba's LLVM 17 or later",))
        return context.get_dummy_value()
    xf, xbase, height, width, w, bias, yf, ybase, oh, ow, stride, ph, pw, _ = args
    k = sig.args[13].count
    xd, wd, yd = (context.make_array(sig.args[i])(context, builder, args[i]).data for i in (0, 4, 6))
    kit = Kit(builder)
    i32, vec, ivec, zero, lanes, first = kit.i32, kit.vec, kit.ivec, kit.zero, kit.lanes, kit.first
    const, splat, mload, mstore, at = kit.const, kit.splat, kit.mload, kit.mstore, kit.at

    weights = [splat(builder.load(builder.gep(wd, [const(t)])), vec) for t in range(k * k)]
    biases = splat(bias, vec)
    width_v = splat(builder.trunc(width, i32), ivec)
    evens = ir.Constant(ir.VectorType(i32, LANES), list(range(0, 2 * LANES, 2)))
    odds = ir.Constant(ir.VectorType(i32, LANES), list(range(1, 2 * LANES, 2)))
    chunks = builder.sdiv(builder.add(ow, const(LANES - 1)), const(LANES))

    def inside(col):  # the lanes of a load from column col of a row that read the plane
        cols = builder.add(splat(builder.trunc(col, i32), ivec), lanes)
        return builder.and_(builder.icmp_signed(">=", cols, first),
                            builder.icmp_signed("<", cols, width_v))

    def taps(rows, oks, col0, s, masked):  # the k * k input vectors in (ky, kx) order for the run from col0 * s
        base = builder.sub(builder.mul(col0, const(s)), pw)
        # the columns each row loads from (per tap at stride 1, per pair of loads at 2), and where masked, which
        # of their lanes read the plane: the same for every row
        cols = [builder.add(base, const(kx)) for kx in range(k)] if s == 1 else \
            [builder.add(base, const(kx + half)) for kx in range(0, k, 2) for half in (0, LANES)]
        masks = [inside(col) for col in cols] if masked else []
        out = []
        for ky in range(k):
            def load(j):
                pointer = at(xd, builder.add(rows[ky], cols[j]))
                if not masked:
                    return builder.load(pointer, align=4)
                return builder.call(mload, [pointer, ir.Constant(i32, 4), masks[j], zero])

            loaded = [load(j) for j in range(len(cols))]
            if masked:  # a row outside the plane: zeros (its pointer is one inside it)
                loaded = [builder.select(oks[ky], v, zero) for v in loaded]
            if s == 1:
                out += loaded
                continue
            for kx in range(0, k, 2):  # a pair of loads: its even columns tap kx, its odd ones tap kx + 1
                a, b = loaded[kx], loaded[kx + 1]
                out.append(builder.shuffle_vector(a, b, evens))
                if kx + 1 < k:
                    out.append(builder.shuffle_vector(a, b, odds))
        return out

    def cell(rows, oks, col0, s, masked):
        values = taps(rows, oks, col0, s, masked)
        return builder.fadd(_in_runs(builder, [builder.fmul(weights[t], values[t]) for t in range(k * k)]), biases)

    for s in (1, 2):
        with builder.if_then(builder.icmp_signed("==", stride, const(s))):
            # the last column a run reads, from its first output column's: interior runs read [first, last]
            reach = const((LANES - 1) * s + k - 1)
            with cgutils.for_range(builder, oh) as oy:
                top = builder.sub(builder.mul(oy.index, const(s)), ph)
                rows, oks = [], []
                for ky in range(k):
                    iy = builder.add(top, const(ky))
                    oks.append(builder.and_(builder.icmp_signed(">=", iy, const(0)),
                                            builder.icmp_signed("<", iy, height)))
                    rows.append(builder.add(xbase, builder.mul(builder.select(oks[-1], iy, const(0)), width)))
                every = oks[0]
                for ok in oks[1:]:
                    every = builder.and_(every, ok)
                out_row = builder.add(ybase, builder.mul(oy.index, ow))
                with cgutils.for_range(builder, chunks) as chunk:
                    col0 = builder.mul(chunk.index, const(LANES))
                    start = builder.sub(builder.mul(col0, const(s)), pw)
                    plain = builder.and_(every, builder.and_(
                        builder.icmp_signed(">=", start, const(0)),
                        builder.icmp_signed("<", builder.add(start, reach), width)))
                    plain = builder.and_(plain, builder.icmp_signed("<=", builder.add(col0, const(LANES)), ow))
                    target = at(yd, builder.add(out_row, col0))
                    with builder.if_else(plain) as (then, otherwise):
                        with then:
                            builder.store(cell(rows, oks, col0, s, False), target, align=4)
                        with otherwise:
                            keep = builder.icmp_signed("<", builder.add(splat(builder.trunc(col0, i32), ivec), lanes),
                                                       splat(builder.trunc(ow, i32), ivec))
                            builder.call(mstore, [cell(rows, oks, col0, s, True), target, ir.Constant(i32, 4), keep])
    return context.get_dummy_value()


class Kit:
    """The LLVM pieces this module's and stem_rows.py's intrinsics build their vector loops from: the types (LANES
    float32 or int32 lanes, their masks), constants, a splat, LLVM's masked load and store, and a vector's pointer."""

    def __init__(self, builder: Any) -> None:
        from llvmlite import ir
        from numba.core import cgutils

        self.builder = builder
        f32, i1, self.i32, self.i64 = ir.FloatType(), ir.IntType(1), ir.IntType(32), ir.IntType(64)
        self.vec, self.ivec, mvec = ir.VectorType(f32, LANES), ir.VectorType(self.i32, LANES), ir.VectorType(i1, LANES)
        self.zero = ir.Constant(self.vec, [0.0] * LANES)
        self.lanes, self.first = ir.Constant(self.ivec, list(range(LANES))), ir.Constant(self.ivec, [0] * LANES)
        module, vp = builder.module, self.vec.as_pointer()
        self.mload = cgutils.get_or_insert_function(module, ir.FunctionType(self.vec, [vp, self.i32, mvec, self.vec]),
                                                    f"llvm.masked.load.v{LANES}f32.p0")
        self.mstore = cgutils.get_or_insert_function(module, ir.FunctionType(ir.VoidType(), [self.vec, vp, self.i32,
                                                                                             mvec]),
                                                     f"llvm.masked.store.v{LANES}f32.p0")

    def const(self, v: int) -> Any:
        """An i64 constant."""
        from llvmlite import ir

        return ir.Constant(self.i64, v)

    def splat(self, v: Any, kind: Any) -> Any:
        """v in every lane of a vector of type ``kind``."""
        from llvmlite import ir

        undefined = ir.Constant(kind, ir.Undefined)
        return self.builder.shuffle_vector(self.builder.insert_element(undefined, v, ir.Constant(self.i32, 0)),
                                           undefined, self.first)

    def at(self, base: Any, index: Any) -> Any:
        """The LANES floats from base[index], as a vector pointer."""
        return self.builder.bitcast(self.builder.gep(base, [index]), self.vec.as_pointer())
