"""Conv 1x1 at stride 1 (float32, grouped or not): an AVX-512 micro-kernel in LLVM IR, no BLAS call.

A pointwise conv is a GEMM on its input as it lies: Y[M, P] = W[M, K] @ X[K, P] per image (P pixels, each of X's
K rows contiguous). In MobileNets most of them have few input channels (K = 16-64) and many pixels, a shape for
which OpenBLAS's sgemm, packing both operands at each call, ran 35-47 GMAC/s on one thread of this machine.
Here a tile of 4 output channels by 64 pixels is summed in 16 AVX-512 registers (`_tile`: per input channel
four loads of X's row, four broadcast weights, 16 fused multiply-adds), straight from X (rows P apart, masked
at the map's end: nothing read past it) into Y, the weights read as they lie (four rows' streams: as fast as a
packed copy here), so a weight given with each run (minfer-passes' DequantConv dequantizes its 8-bit weight
into scratch so) needs no packing either. numba's own loops neither keep such accumulators in registers nor
issue the fused multiply-adds, so the micro-kernel is IR (numba intrinsics, built here: numba's cache of this
file's compiled functions is invalidated by changes to this file only, so the IR helpers are not shared with
igemm.py's). Each block of 64 pixels then gets the fused op's epilogue over all its output channels while they
are in cache (`team.finish`: bias, residual, activation).

Measured on MobileNetV2's pointwise shapes (M x K x P, in-process, against numpy's matmul with OpenBLAS's
threads set alike): 16x32x12544 124 us against 182 on one thread, 64 against 99 on two; 96x16x12544 423/488
and 209/295; 144x24x3136 211/236 and 109/132; 192x32x784 96/103 and 53/75 -- 44-56 GMAC/s a thread, near
the FP pipes' peak; on larger K and small maps (960x160x49, 1000x512x169) OpenBLAS is as fast or faster, and
the core's timing per node (this kernel is a Conv candidate below smallconv.py's priority) keeps it there.
A grouped 1x1 conv (ShuffleNet's, four groups) is the same GEMM per group, each group's tiles reading its own
input rows: where numpy's Conv made one BLAS call a group, 136x34x784 four times took 115-119 us in shufflenet
against 60-64 here (two threads), shufflenet's run 5.8 ms against 4.4 (in-process A/B, session 22).

Sums: each output adds its K products in channel order by fused multiply-adds, whatever the tile, the unit or
the thread count (the same bits on one thread or two); against a BLAS product within float32 rounding.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from minfer_core import kernel, parallel_for, spmd

from . import team
from ._jit import F32, PRIORITY, is_float32, jit, readonly, uintp  # noqa: F401 (uintp: numba's type at compile)
from .smallconv import PLAN_PARTS
from .quant import NO_CHAIN, Chains
from .quant import _requantize as _rounding_loop  # noqa: F401 (compiled code calls it)
from .team import NOTHING, finish, prange  # noqa: F401 (compiled code calls them)

MR = 4  # output channels a tile
NV = 4  # 16-float vectors a tile row
W = 16 * NV  # pixels a tile
# at most this many input channels: beyond them a tile's weights (4 * K floats) and the X panel it reads (K rows of
# 256 bytes) leave L1 per pixel block, and OpenBLAS's blocking wins (1000x512x169 above)
MAX_CHANNELS = 512


def available() -> bool:
    """Whether the micro-kernel can be built here: numba compiles for this host, which has AVX-512F, under an LLVM
    of 17 or later (the IR names masked loads as opaque pointers mangle them)."""
    global _AVAILABLE
    if _AVAILABLE is None:
        import llvmlite.binding as llvm

        name, features = os.environ.get("NUMBA_CPU_NAME", "host"), os.environ.get("NUMBA_CPU_FEATURES")
        if llvm.llvm_version_info < (17,) or name != "host":
            _AVAILABLE = False
        elif features is not None:
            _AVAILABLE = "+avx512f" in features.split(",")
        else:
            _AVAILABLE = bool(llvm.get_host_cpu_features().get("avx512f", False))
    return _AVAILABLE


_AVAILABLE: bool | None = None


@jit
def _tile(rows, pa, lda, k, pb, ldb, pc, ldc, w):  # pragma: no cover - compiled
    """The micro-kernel for 1-4 output channels (one instance each: the row count is fixed in its code)."""
    if rows == 4:
        _pw4(pa, lda, k, pb, ldb, pc, ldc, w)
    elif rows == 3:
        _pw3(pa, lda, k, pb, ldb, pc, ldc, w)
    elif rows == 2:
        _pw2(pa, lda, k, pb, ldb, pc, ldc, w)
    else:
        _pw1(pa, lda, k, pb, ldb, pc, ldc, w)


@jit
def _tile_add(rows, pa, lda, k, pb, ldb, pc, ldc, w):  # pragma: no cover - compiled
    """`_tile` adding its products to the tile's values in C (its accumulators start from them, not from zero)."""
    if rows == 4:
        _pa4(pa, lda, k, pb, ldb, pc, ldc, w)
    elif rows == 3:
        _pa3(pa, lda, k, pb, ldb, pc, ldc, w)
    elif rows == 2:
        _pa2(pa, lda, k, pb, ldb, pc, ldc, w)
    else:
        _pa1(pa, lda, k, pb, ldb, pc, ldc, w)


@jit
def column_tiles(pa, lda, k, rows, pb, ldb, pc, ldc, w, add):  # pragma: no cover - compiled
    """C's (rows, w <= W) block at pc (rows ldc bytes apart) = A's (rows, K) at pa (rows lda bytes apart) @ B's
    (K, w) panel at pb (rows ldb bytes apart), in tiles of MR rows: the products that take A's rows as broadcast
    weights (qconv_blas.py's, linear.py's). With ``add``, C += the products: each output's sum continues from the
    float32 value C holds, as it would have in the register (a product cut along K gives the uncut one's bits).
    All int64 but ``add``."""
    r = 0
    while r < rows:
        t = min(MR, rows - r)
        if add:
            _tile_add(t, pa + r * lda, lda, k, pb, ldb, pc + r * ldc, ldc, w)
        else:
            _tile(t, pa + r * lda, lda, k, pb, ldb, pc + r * ldc, ldc, w)
        r += t


@jit
def units_of(a, x, y, z, bias, found, op, fa, fb, rm, ra, flags, params, lo, hi):  # pragma: no cover - compiled
    """Units lo..hi of ``found`` (rows i, p0, p1, m0, m1: image i's pixels p0..p1 and output channels m0..m1, m0 a
    multiple of MR): per block of W pixels, the tiles of its channels (a tile within one group: group g's outputs
    read its input channels only), then the epilogue on the block (bias, residual z, activation ``op``), then, when
    ``params`` is not empty, a rounding chain (quant.py's `Chains`: rm, ra, flags, params) by quant.py's
    QuantizeDequantize loop. x (N, K, P), y (N, M, P) and the weights ``a`` (M, K / groups) C-contiguous."""
    k, p, m, kg = x.shape[1], x.shape[2], y.shape[1], a.shape[1]
    mg = m // (k // kg)  # output channels a group
    pa, px, py = np.int64(a.ctypes.data), np.int64(x.ctypes.data), np.int64(y.ctypes.data)
    yf = y.reshape(-1)
    walk = np.empty(7, np.int64)  # a block for `_rounding_loop`: m1 - m0 runs of w values, p apart
    ms, as_ = rm.size > 1, ra.size > 1
    for u in range(lo, hi):
        i, p0, p1, m0, m1 = found[u, 0], found[u, 1], found[u, 2], found[u, 3], found[u, 4]
        xb, yb = px + np.int64(i * k * p * 4), py + np.int64(i * m * p * 4)
        for n0 in range(p0, p1, W):
            w = min(W, p1 - n0)
            r0 = m0
            while r0 < m1:
                g = r0 // mg
                rows = min(MR, m1 - r0, (g + 1) * mg - r0)
                _tile(rows, pa + np.int64(r0 * kg * 4), np.int64(kg * 4), np.int64(kg),
                      xb + np.int64((g * kg * p + n0) * 4), np.int64(p * 4), yb + np.int64((r0 * p + n0) * 4),
                      np.int64(p * 4), np.int64(w))
                r0 += rows
            at = (i * m + m0) * p + n0
            finish(yf, z, at, m1 - m0, w, p, bias, m0, op, fa, fb)
            if params.size:
                walk[0], walk[1], walk[2], walk[3], walk[4], walk[5], walk[6] = 1, 0, m1 - m0, p, w, flags[0], flags[1]
                block = yf[uintp(at):]
                _rounding_loop(block, block, walk, rm[m0:m1] if ms else rm, ra[m0:m1] if as_ else ra, params)


@jit(parallel=True)
def team_units(a, x, y, z, bias, found, op, fa, fb, rm, ra, flags, params, parts):  # pragma: no cover - compiled
    """`units_of` over a native team (team.py): part t of the units on team thread t."""
    count = found.shape[0]
    for t in prange(parts):
        units_of(a, x, y, z, bias, found, op, fa, fb, rm, ra, flags, params, count * t // parts,
                 count * (t + 1) // parts)


def plan(n: int, m: int, pixels: int, parts: int = PLAN_PARTS) -> np.ndarray:
    """The units (rows i, p0, p1, m0, m1) from the shape alone: each image's pixels in about ``parts`` / n runs
    of whole W blocks; where an image has fewer blocks than that (a 7x7 map is one), its output channels in runs
    of MR-multiples instead, so that two threads still share the work."""
    blocks = -(-pixels // W)
    cuts = max(1, -(-parts // n))
    if blocks >= cuts:
        per = -(-blocks // cuts) * W
        return np.array([(i, p0, min(pixels, p0 + per), 0, m) for i in range(n) for p0 in range(0, pixels, per)],
                        np.int64).reshape(-1, 5)
    step = max(MR, -(-m // (cuts * MR)) * MR)
    return np.array([(i, 0, pixels, m0, min(m, m0 + step)) for i in range(n) for m0 in range(0, m, step)],
                    np.int64).reshape(-1, 5)


def _weight_shape(ctx: Any) -> tuple[int, ...] | None:
    """The weight's shape: a constant's, or a float32 weight's given with each run (its static type), else None."""
    w = ctx.constants[1] if len(ctx.constants) > 1 else None
    if w is not None:
        return tuple(w.shape) if w.dtype == F32 else None
    t = ctx.input_types[1] if len(ctx.input_types) > 1 else None
    return tuple(t.shape) if t is not None and t.dtype == F32 and t.shape is not None and t.is_static else None


def applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """A 2-D float32 1x1 conv at stride 1, dilation 1, no pads, of at most MAX_CHANNELS input channels a group,
    with float32 weights constant or of a static shape given with each run (a DequantConv's), a constant bias or
    none, where the micro-kernel can be built (`available`)."""
    shape = _weight_shape(ctx)
    if not is_float32(ctx, 0, rank=4) or shape is None or len(shape) != 4 or shape[2:] != (1, 1):
        return False
    group = int(attrs.get("group", 1))
    if group < 1 or ctx.input_types[0].shape[1] != shape[1] * group or shape[0] % group or shape[1] > MAX_CHANNELS:
        return False
    if set(attrs.get("strides") or [1]) != {1} or set(attrs.get("dilations") or [1]) != {1}:
        return False
    if any(int(v) != 0 for v in attrs.get("pads") or [0]) or shape[0] == 0 or shape[1] == 0:
        return False
    b = ctx.constants[2] if len(ctx.constants) > 2 else None
    if len(ctx.input_types) > 2 and ctx.input_types[2] is not None and b is None:
        return False
    return available()


@kernel("Conv", since=1, priority=PRIORITY - 1, prepare=True, out=True, views=False, packed=(1, 2), epilogue=True,
        applies=applies)
def conv(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv-1/11/22, 1x1 at stride 1 only (see `applies`), grouped or not: the IR micro-kernel, the epilogue per
    pixel block."""
    w, b = ctx.constants[1], ctx.constants[2] if len(ctx.constants) > 2 else None
    m, k = _weight_shape(ctx)[:2]
    # a copy (packed=(1, 2)): the engine frees the initializers; a weight given with each run: None
    held = None if w is None else readonly(np.ascontiguousarray(w.reshape(m, k)).copy())
    bias = readonly(np.asarray(b, np.float32).copy()) if b is not None else NOTHING
    _ensure_kernels()
    _warm(np.zeros((m, k), np.float32) if held is None else held, bias)
    plans: dict[tuple[int, ...], np.ndarray] = {}
    chains = Chains(m, 4)

    def run(x, w=None, b=None, *, out=None, epilogue=None):
        a = held if held is not None else readonly(np.ascontiguousarray(w, np.float32).reshape(m, k))
        n, _, h, wd = x.shape
        shape = (n, m, h, wd)
        y = out if out is not None else np.empty(shape, np.float32)
        if y.size == 0:
            return y
        found = plans.get(x.shape)
        if found is None:
            found = plans[x.shape] = plan(n, m, h * wd)
        fused = team.native(epilogue) if epilogue is not None else team.PLAIN
        after = fused is None or not team.fits(fused[3], shape)  # no compiled form: the epilogue once, after
        op, fa, fb, z = team.PLAIN if after else fused
        chain = chains.of(epilogue) if after and epilogue is not None else None  # a DequantConv's: on each block
        args = (a, readonly(np.ascontiguousarray(x)).reshape(n, x.shape[1], -1), y.reshape(n, m, -1),
                NOTHING if z is None else readonly(z.reshape(-1)), bias, found, op, fa, fb, *(chain or NO_CHAIN))
        threads = team.size() if len(found) > 1 else 1
        if threads > 1:
            team_units(*args, min(threads, len(found)))
        else:

            def span(lo: int, hi: int) -> None:
                units_of(*args, lo, hi)

            parallel_for(len(found), span, outputs_only=True)  # a unit writes only its block of y
        if after and epilogue is not None and chain is None:  # one range: under a process team one rank applies it
            parallel_for(1, lambda lo, hi: epilogue(y, (slice(None),) * y.ndim), parts=1, outputs_only=True)
        return y

    return spmd(run)


def _warm(a: np.ndarray, bias: np.ndarray) -> None:
    """Compile (or load from the cache) at build, with a run's argument types, not in the first run, whose timing
    of the candidates it would skew."""
    m, k = a.shape
    a = readonly(a)
    x = readonly(np.zeros((1, k, 1), np.float32))
    y = np.zeros((1, m, 1), np.float32)
    found = plan(1, m, 1, 1)
    units_of(a, x, y, NOTHING, bias, found, team.NONE, np.float32(0), np.float32(0), *NO_CHAIN, 0, len(found))
    if team.available():
        team_units(a, x, y, NOTHING, bias, found, team.NONE, np.float32(0), np.float32(0), *NO_CHAIN, 1)


def _ensure_kernels() -> None:
    """The IR micro-kernels, as numba intrinsics, in this module's namespace, where `_tile` looks them up when the
    module compiles (made here, not at import: they need numba, imported at the first use)."""
    if "_pa4" in globals():  # made last
        return
    for add in (False, True):
        for rows in range(1, MR + 1):
            globals()[f"_p{'a' if add else 'w'}{rows}"] = _intrinsic(rows, add)


def _intrinsic(rows: int, add: bool = False) -> Any:
    """``_pw<rows>(pa, lda, k, pb, ldb, pc, ldc, w)`` (all int64): Y's (rows, w <= 64) tile at pc (rows ldc bytes
    apart) = the weights' (rows, K) at pa (rows lda bytes apart) @ X's (K, w) panel at pb (rows ldb bytes apart);
    with ``add`` (``_pa<rows>``), Y's tile += that product."""
    from numba import types
    from numba.extending import intrinsic

    def typer(typingctx: Any, pa: Any, lda: Any, k: Any, pb: Any, ldb: Any, pc: Any, ldc: Any, w: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, values: Any) -> Any:
            _tile_ir(rows, builder, *values, add=add)
            return context.get_dummy_value()

        return types.void(*[types.int64] * 8), codegen

    typer.__name__ = f"_p{'a' if add else 'w'}{rows}"
    return intrinsic(typer)


def _tile_ir(rows: int, builder: Any, pa: Any, lda: Any, k: Any, pb: Any, ldb: Any, pc: Any, ldc: Any, w: Any,
             add: bool = False) -> None:
    """The tile's IR: acc[r][j] = 0 (with ``add``: Y's tile, masked past w); for each of the K channels, X's four
    vectors of the panel (masked past w) and rows broadcasts of the weights, rows * 4 fused multiply-adds; then the
    accumulators stored (masked)."""
    from llvmlite import ir

    i64, i32, f32 = ir.IntType(64), ir.IntType(32), ir.FloatType()
    v16, m16 = ir.VectorType(f32, 16), ir.VectorType(ir.IntType(1), 16)
    module = builder.module

    def declared(name: str, result: Any, params: list[Any]) -> Any:
        return module.globals.get(name) or ir.Function(module, ir.FunctionType(result, params), name)

    load = declared("llvm.masked.load.v16f32.p0", v16, [v16.as_pointer(), i32, m16, v16])
    store = declared("llvm.masked.store.v16f32.p0", ir.VoidType(), [v16, v16.as_pointer(), i32, m16])
    fma = declared("llvm.fma.v16f32", v16, [v16, v16, v16])
    pa, pb, pc = (builder.inttoptr(v, ir.IntType(8).as_pointer()) for v in (pa, pb, pc))
    masks = [builder.icmp_unsigned("<", ir.Constant(ir.VectorType(i64, 16), list(range(16 * j, 16 * j + 16))),
                                   _splat(builder, w, 16)) for j in range(NV)]
    zero = ir.Constant(v16, [0.0] * 16)
    start = [builder.call(load, [_at(builder, pc, builder.add(builder.mul(i64(r), ldc), i64(64 * j)), v16), i32(4),
                                 masks[j], zero]) if add else zero for r in range(rows) for j in range(NV)]
    entry = builder.block
    body, done = builder.append_basic_block("pointwise_loop"), builder.append_basic_block("pointwise_done")
    builder.branch(body)
    builder.position_at_end(body)
    c = builder.phi(i64)
    acc = [builder.phi(v16) for _ in range(rows * NV)]
    row = builder.mul(c, ldb)
    xs = [builder.call(load, [_at(builder, pb, builder.add(row, i64(64 * j)), v16), i32(4), masks[j], zero])
          for j in range(NV)]
    summed = []
    for r in range(rows):
        weight = builder.load(_at(builder, pa, builder.add(builder.mul(i64(r), lda), builder.mul(c, i64(4))), f32),
                              align=4)
        spread = _splat(builder, weight, 16)
        summed += [builder.call(fma, [spread, xs[j], acc[r * NV + j]]) for j in range(NV)]
    step = builder.add(c, i64(1))
    c.add_incoming(i64(0), entry)
    c.add_incoming(step, builder.block)
    for phi, value, first in zip(acc, summed, start):
        phi.add_incoming(first, entry)
        phi.add_incoming(value, builder.block)
    builder.cbranch(builder.icmp_signed("<", step, k), body, done)
    builder.position_at_end(done)
    for r in range(rows):
        for j in range(NV):
            at = _at(builder, pc, builder.add(builder.mul(i64(r), ldc), i64(64 * j)), v16)
            builder.call(store, [summed[r * NV + j], at, i32(4), masks[j]])


def _splat(builder: Any, value: Any, lanes: int) -> Any:
    """A scalar broadcast to ``lanes`` lanes."""
    from llvmlite import ir

    kind = ir.VectorType(value.type, lanes)
    one = builder.insert_element(ir.Constant(kind, None), value, ir.IntType(32)(0))
    return builder.shuffle_vector(one, one, ir.Constant(ir.VectorType(ir.IntType(32), lanes), [0] * lanes))


def _at(builder: Any, base: Any, offset: Any, kind: Any) -> Any:
    """A pointer to a ``kind`` at byte ``offset`` from the byte pointer ``base``."""
    from llvmlite import ir

    return builder.bitcast(builder.gep(base, [offset]), kind.as_pointer())

