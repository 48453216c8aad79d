"""Relu, Clip, LeakyRelu, HardSigmoid, HardSwish and Swish (float32): one compiled pass instead of numpy's one to four.

The formulas are the numpy kernels', in float32 and in the same order, so
the results are the same bits (Swish excepted, below):

- Clip is numpy's ``maximum(x, min)`` then ``minimum(., max)``, as
  minfer-ops-basic computes it: NaN stays NaN, and on a tie numpy's
  maximum and minimum return their second operand (so Clip(-0.0, 0, 6) and
  Relu(-0.0) are +0.0); Relu is Clip(0, inf), whose min changes no bit;
- LeakyRelu is ``alpha * x`` where x < 0, else x: the bits of numpy's
  ``maximum(x, alpha * x)`` (``minimum`` for alpha > 1) when alpha > 0.
  For alpha <= 0 the two differ (alpha 0 at +inf: numpy's 0 * inf is NaN;
  a negative alpha at +-0.0: the sign of the zero), so `applies` leaves
  those to numpy;
- HardSigmoid is ``alpha * x + beta`` clipped to [0, 1], NaN kept; HardSwish
  multiplies x by it with alpha 1/6 and beta 1/2;
- Swish (Swish-24, and minfer-passes' fused ``x * Sigmoid(alpha * x)``) is
  ``x * s`` with s = 1 / (1 + e) for t = alpha * x >= 0, e / (1 + e) below,
  e = exp(-|t|) (never overflows), NaN kept. Its exp is a float32 polynomial
  (elementwise.py's constants, within 3 ulps of np.exp) scaled by 2^n built
  from the exponent bits (`_f32_from_bits`, an LLVM bitcast): no libm call
  and no table read, so the loop vectorizes. Within a few ulps of the numpy
  kernels (not their bits): a YOLO-style detector's Conv -> Sigmoid -> Mul
  then runs in the conv's epilogue, not as a pass of its own.

Each is also the activation of minfer-passes' FusedConv/FusedGemm/FusedMatMul,
which calls the registered in-place kernel of the op on each output tile
(``run(tile, out=tile)``): a small in-place call is one compiled call,
without the block machinery. The run callables say ``strided = True``: they
also write in place a tile that is not C-contiguous (a pointwise conv's
row tile of some output channels) when it is rows of contiguous elements,
so the epilogue calls them on those tiles too.

Where a native team runs (team.py), a tensor from TEAM_SPLIT_ELEMENTS on (in
place from SPLIT_ELEMENTS, where a split gained little) is split over numba's
threads by a compiled driver (`_drive`) instead of parallel_for, the same
formula on each share (so the same bits): its hand-over costs a few
microseconds against parallel_for's ~60.

Not here: Softmax and Gelu-20 (their own modules, rows.py and gelu.py), and
Sigmoid and Tanh alone (minfer-ops-basic's numpy loops; elementwise.py's
fused programs compute Sigmoid in their loop).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import intra_op_threads, kernel, parallel_for

from ._jit import PRIORITY, input_type, is_float32, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)

# elements per parallel_for range: a few hundred microseconds of work, so that a split pays for its hand-over
BLOCK = 1 << 16
SPLIT_ELEMENTS = 1 << 20  # from this size (~150 us of work) the blocks go over the intra-op threads
# the same over a native team (team.py), whose hand-over costs a few microseconds: HardSwish into another array
# (one thread, loaded host) 10 -> 7 us at 131k elements, 24 -> 15 at 301k, and lost below (4 -> 6 us at 65k). In
# place, a pass that reads and writes the same lines, it gained little even at 301k (12 -> 10 us): it splits from
# SPLIT_ELEMENTS, as over parallel_for
TEAM_SPLIT_ELEMENTS = 1 << 17
LINE = 16  # elements per cache line: a team's shares start on one, so that no line is written by two threads
F32_MAX = 3.4028234663852886e38  # Clip-6's default bounds, as minfer-ops-basic's

# what `_value` computes (its ``op``); a and b are its two parameters
CLIP, LEAKY_RELU, HARD_SIGMOID, HARD_SWISH, ROUND, SWISH = 0, 1, 2, 3, 4, 5
# ROUND is minfer-passes' QuantizeDequantize rounding, clip(rint(v / scale), low, high) * scale, with quant.py's
# kernel's operations in its order: a is the scale, b the integer bounds as one float32, ``(high + BOUND) * SPAN +
# (low + BOUND)`` (exact: below 2**24; `round_bounds`), unpacked by exact float32 operations the loop hoists
BOUND, SPAN = 2048, 4096


# Swish's exp(m) for m in [-104, 0]: n = round(m / ln 2), r = m - n ln 2 (ln 2 in two parts: r exact), e^r = 1 + r +
# r^2 q(r) with elementwise.py's constants (EXP_CONSTANTS: _L2E, _LN2HI, _LN2LO, _EXP_LO, _P0.._P5, set by
# `install_intrinsics`), times 2^n as two factors 2^(n >> 1) and 2^(n - (n >> 1)), each a normal float32 made from its
# exponent bits (n down to -150: results below 2^-149 flush to 0, as float32's)
_HALF, _ONE, _ZERO = np.float32(0.5), np.float32(1), np.float32(0)
_BIAS = np.int32(127)


def _f32_from_bits(bits):  # pragma: no cover - replaced
    """The float32 whose bits are the low 32 bits of the integer ``bits``: LLVM's bitcast, one instruction in a vector loop. A stand-in,
    made numba's intrinsic before this module compiles (`install_intrinsics`, which _jit.py calls)."""
    raise RuntimeError("activation._f32_from_bits runs compiled only")


def install_intrinsics() -> None:
    """Make `_f32_from_bits` numba's intrinsic (numba is imported now: never at import, _jit.py's docstring), and
    set `_swish`'s exp constants from elementwise.py's one definition (imported here, not at the top: elementwise.py
    imports team.py, which imports this module)."""
    if getattr(_f32_from_bits, "_is_intrinsic", False):
        return
    from .elementwise import EXP_CONSTANTS

    names: dict[str, Any] = {"np": np}
    exec(EXP_CONSTANTS, names)
    globals().update({k: names[k] for k in ("_L2E", "_LN2HI", "_LN2LO", "_EXP_LO")})
    globals().update(zip(("_P0", "_P1", "_P2", "_P3", "_P4", "_P5"), names["_EXP_P"]))
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    def typer(typingctx, bits):
        if not isinstance(bits, types.Integer):
            return None

        def codegen(context, builder, sig, args):  # numba widens int32 arithmetic: the low 32 bits are the word
            word = args[0] if bits.bitwidth == 32 else builder.trunc(args[0], ir.IntType(32))
            return builder.bitcast(word, ir.FloatType())

        return types.float32(bits), codegen

    made = intrinsic(typer)
    made._is_intrinsic = True
    globals()["_f32_from_bits"] = made


@jit(inline=True)
def pow2(k):  # pragma: no cover - compiled
    """2**k as float32 for an int32 k in [-150, 128] (the float32 exp's range: elementwise.py's EXP_CONSTANTS), as
    two normal factors 2^(k >> 1) and 2^(k - (k >> 1)) made from their exponent bits, each exact: below 2^-126 the
    product rounds once to the subnormal 2^k (2^-150 to 0), as a table of float32 powers holds them; 2^128 is inf.
    No table read, a gather an element: rows.py's Softmax over 4x128x128 scores 71 -> 57 us on one thread,
    8x4x128x128 545 -> 451; gelu.py's GELU over 131k values 170 -> 117 us. Inlined where it is called (`jit`'s
    ``inline``): left a call, through gelu.py's `gelu_value`, it kept GELU's loop scalar (8x slower)."""
    half = k >> 1
    return _f32_from_bits((half + _BIAS) << 23) * _f32_from_bits((k - half + _BIAS) << 23)


@jit(numpy_errors=True)  # its one division is float: without Python's zero test the callers' loops vectorize
def _swish(v, alpha):  # pragma: no cover - compiled
    """v * sigmoid(alpha * v) in float32 (the module docstring); NaN stays NaN."""
    t = alpha * v
    m = -abs(t)
    m = m if m >= _EXP_LO else _EXP_LO  # NaN too: the integer steps below see a number
    n = np.floor(m * _L2E + _HALF)
    r = (m - n * _LN2HI) - n * _LN2LO
    q = ((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5
    e = (_ONE + r + r * r * q) * pow2(np.int32(n))
    s = (_ONE if t >= _ZERO else e) / (_ONE + e)
    return v * (s if t == t else t)


def round_bounds(low: float, high: float) -> np.float32 | None:
    """ROUND's ``b`` for integer bounds low <= high (None when either is not an integer in [-BOUND, BOUND))."""
    if not all(float(v).is_integer() and -BOUND <= v < BOUND for v in (low, high)) or low > high:
        return None
    return np.float32((high + BOUND) * SPAN + (low + BOUND))


@jit
def _round(v, scale, bounds):  # pragma: no cover - compiled
    """clip(rint(v / scale), low, high) * scale, the bounds unpacked from ``bounds`` (`round_bounds`); NaN kept."""
    upper = np.floor(bounds / np.float32(SPAN))
    low = bounds - upper * np.float32(SPAN) - np.float32(BOUND)
    high = upper - np.float32(BOUND)
    v = np.rint(v / scale)
    v = low if v < low else v
    v = high if v > high else v
    return v * scale


@jit
def _value(v, op, a, b):  # pragma: no cover - compiled
    """One element of the activation ``op`` with parameters a, b (see the module docstring for each formula); not
    SWISH, whose long body kept the loops calling this with a run-time ``op`` from vectorizing (HardSwish 6 ->
    143 us over 65k elements): a loop over SWISH calls `_swish` itself."""
    if op == CLIP:  # numpy's maximum(v, a), then minimum(t, b): NaN from either side, the second on a tie
        t = v if (v > a or v != v) else a
        return t if (t < b or t != t) else b
    if op == LEAKY_RELU:
        return v * a if v < 0 else v
    if op == ROUND:
        return _round(v, a, b)
    t = a * v + b
    t = np.float32(0) if t < 0 else t
    t = np.float32(1) if t > 1 else t
    return v * t if op == HARD_SWISH else t


# here, not at the top: team.py imports the names above from this module (either module may be imported first)
from . import team  # noqa: E402


@jit
def _into(x, y, op, a, b, lo, hi):  # pragma: no cover - compiled
    """y = op(x) over flat elements lo..hi."""
    if op == SWISH:
        for i in range(lo, hi):
            y[uintp(i)] = _swish(x[uintp(i)], a)
    else:
        for i in range(lo, hi):
            y[uintp(i)] = _value(x[uintp(i)], op, a, b)


prange = range  # team.prange's stand-in (numba.prange at compile, _jit._compile_module): team.py imports this module


@jit
def _over(y, op, a, b, lo, hi):  # pragma: no cover - compiled
    """y = op(y) over flat elements lo..hi: one array, so the loop vectorizes (`_into` on two arrays that are one
    checks them for overlap and runs unvectorized: 6x slower, measured)."""
    if op == SWISH:
        for i in range(lo, hi):
            y[uintp(i)] = _swish(y[uintp(i)], a)
    else:
        for i in range(lo, hi):
            y[uintp(i)] = _value(y[uintp(i)], op, a, b)


@jit(parallel=True)
def _drive(x, y, op, a, b, parts):  # pragma: no cover - compiled
    """y = op(x) over flat x in ``parts`` contiguous shares over a native team (team.py): `_into` each, or `_over`
    y when x is y (in place)."""
    n, same = x.size, x.ctypes.data == y.ctypes.data
    for t in prange(parts):
        lo = n * t // parts // LINE * LINE
        hi = n if t == parts - 1 else n * (t + 1) // parts // LINE * LINE
        if same:
            _over(y, op, a, b, lo, hi)
        else:
            _into(x, y, op, a, b, lo, hi)


@jit
def _in_place(y, op, a, b):  # pragma: no cover - compiled
    """y = op(y) for a 2-D y whose rows are contiguous (any row stride): the loop vectorizes then."""
    for r in range(y.shape[0]):
        row = y[uintp(r)]
        if op == SWISH and row.strides[0] == 4:  # Swish's own loops (`_value` leaves it out), contiguous as below
            for i in range(row.size):
                row[uintp(i)] = _swish(row[uintp(i)], a)
        elif op == SWISH:
            for i in range(row.size):
                row[uintp(i)] = _swish(row[uintp(i)], a)
        elif row.strides[0] == 4:  # known contiguous in this branch: a vector loop
            for i in range(row.size):
                row[uintp(i)] = _value(row[uintp(i)], op, a, b)
        else:
            for i in range(row.size):
                row[uintp(i)] = _value(row[uintp(i)], op, a, b)


def _rows(x: np.ndarray) -> np.ndarray | None:
    """x as a 2-D view (rows, run) whose rows are contiguous, or None when its layout is not one."""
    shape, strides, run, k = x.shape, x.strides, 1, x.ndim
    while k and (shape[k - 1] == 1 or strides[k - 1] == run * 4):
        run *= shape[k - 1]
        k -= 1
    outer = [d for d in range(k) if shape[d] != 1]
    if any(strides[d] != strides[e] * shape[e] for d, e in zip(outer, outer[1:])):
        return None  # the outer axes do not merge into one row stride
    return x.reshape(-1, run)  # a view: the axes merge (checked above)


def _elementwise(op: int, a: float, b: float) -> Any:
    """The run callable: in place on a tile in one call; else the whole tensor in blocks of BLOCK, over the
    threads from SPLIT_ELEMENTS on."""
    a32, b32 = np.float32(a), np.float32(b)
    _into(readonly(np.zeros(1, np.float32)), np.zeros(1, np.float32), op, a32, b32, 0, 1)  # compile at build
    _in_place(np.zeros((1, 1), np.float32), op, a32, b32)
    _in_place(np.zeros((2, 2), np.float32)[:, :1], op, a32, b32)  # the strided tiles' version
    if team.available():
        _drive(readonly(np.zeros(1, np.float32)), np.zeros(1, np.float32), op, a32, b32, 1)

    def run(x, *bounds, out=None):  # Clip-11's min and max inputs are constants, taken at build: unused here
        # the team is asked only where the tensor splits over it: asking claims the run's threads (team.py)
        size = team.size() if x.size >= (SPLIT_ELEMENTS if out is x else TEAM_SPLIT_ELEMENTS) else 1
        if out is x and x.size < SPLIT_ELEMENTS and size == 1:
            # in place and not worth splitting (a fused op's activation on its output tile): one compiled call,
            # without the block machinery's Python, which cost as much as the pass on a squeeze-excite gate
            rows = x.reshape(1, -1) if x.flags.c_contiguous else _rows(x)
            if rows is not None:
                _in_place(rows, op, a32, b32)
                return x
        y = out if out is not None and out.flags.c_contiguous else np.empty(x.shape, np.float32)
        src, dst = readonly(np.ascontiguousarray(x)).reshape(-1), y.reshape(-1)
        n = src.size
        if size > 1:
            _drive(src, dst, op, a32, b32, size)
        else:
            blocks = -(-n // BLOCK)
            parts = None if n >= SPLIT_ELEMENTS and intra_op_threads() > 1 else 1

            def span(lo: int, hi: int) -> None:
                _into(src, dst, op, a32, b32, lo * BLOCK, min(n, hi * BLOCK))

            parallel_for(blocks, span, parts=parts)
        if out is not None and y is not out:
            np.copyto(out, y)
            return out
        return y

    run.strided = True  # type: ignore[attr-defined]  # writes a tile with contiguous rows in place (see above)
    return run


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 input."""
    return is_float32(ctx)


def _bound(ctx: Any, index: int) -> float | None:
    """Clip-11's bound ``index`` (1: min, 2: max) as a float: None when it is given but not a float32 constant."""
    t = input_type(ctx, index)
    if t is None:
        return np.inf if index == 2 else -np.inf  # absent: no bound, which max and min against +-inf leave so
    value = ctx.constants[index] if index < len(ctx.constants) else None
    if value is None or t.dtype != np.float32 or np.size(value) != 1:
        return None
    return float(np.asarray(value).reshape(()))


def _applies_clip(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 input, each bound absent or a float32 constant."""
    return is_float32(ctx) and _bound(ctx, 1) is not None and _bound(ctx, 2) is not None


def _applies_leaky(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 input, alpha > 0 (where x if x >= 0 else alpha * x is numpy's max(x, alpha * x) bit for bit)."""
    return is_float32(ctx) and float(attrs.get("alpha", 0.01)) > 0


# inplace: each element is read before it is written
@kernel("Relu", since=6, priority=PRIORITY, prepare=True, out=True, inplace=(0,), views=False, applies=_applies)
def relu(ctx):
    """Relu-6: max(x, 0)."""
    return _elementwise(CLIP, 0.0, np.inf)


@kernel("Clip", since=11, priority=PRIORITY, prepare=True, out=True, inplace=(0,), views=False,
        applies=_applies_clip)
def clip(ctx):
    """Clip-11: min(max(x, min), max), the bounds constant inputs (absent: no bound)."""
    return _elementwise(CLIP, _bound(ctx, 1), _bound(ctx, 2))


@kernel("Clip", since=6, priority=PRIORITY, prepare=True, out=True, inplace=(0,), views=False, applies=_applies)
def clip_6(ctx, *, max=F32_MAX, min=-F32_MAX):  # noqa: A002 - ONNX attribute names
    """Clip-6: min(max(x, min), max), the bounds attributes defaulting to the float32 range."""
    return _elementwise(CLIP, min, max)


@kernel("LeakyRelu", since=6, priority=PRIORITY, prepare=True, out=True, inplace=(0,), views=False,
        applies=_applies_leaky)
def leaky_relu(ctx, *, alpha=0.01):
    """LeakyRelu-6: x if x >= 0 else alpha * x."""
    return _elementwise(LEAKY_RELU, alpha, 0.0)


@kernel("HardSigmoid", since=6, priority=PRIORITY, prepare=True, out=True, inplace=(0,), views=False,
        applies=_applies)
def hard_sigmoid(ctx, *, alpha=0.2, beta=0.5):
    """HardSigmoid-6: max(0, min(1, alpha * x + beta))."""
    return _elementwise(HARD_SIGMOID, alpha, beta)


@kernel("HardSwish", since=14, priority=PRIORITY, prepare=True, out=True, inplace=(0,), views=False,
        applies=_applies)
def hard_swish(ctx):
    """HardSwish-14: x * max(0, min(1, x / 6 + 1 / 2))."""
    return _elementwise(HARD_SWISH, 1 / 6, 0.5)


@kernel("Swish", since=24, priority=PRIORITY, prepare=True, out=True, inplace=(0,), views=False, applies=_applies)
def swish(ctx, *, alpha=1.0):
    """Swish-24: x * sigmoid(alpha * x), within a few ulps of the numpy kernel (the module docstring)."""
    return _elementwise(SWISH, alpha, 0.0)
