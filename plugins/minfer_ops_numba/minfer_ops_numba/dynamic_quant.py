"""DynamicQuantizeLinear (float32): the quantizing in one compiled pass instead of numpy's four.

minfer-ops-basic's kernel takes the max, the min, then divides, rounds, clips and adds the zero point
converting to uint8, each a numpy pass. Here the min and max come from one pass (`value_range`: a small
intrinsic folding 16-lane compare-and-select minima and maxima, with a mask of the lanes that saw a NaN; a
compiled scalar loop was 10x slower than numpy's reductions, not being allowed to reorder them; numpy's two
passes took 50 us on a 144x56x56 tensor in cache, 93 from memory, one pass 30 and 71), the scale and zero point
are computed by the same Python float32 arithmetic as that kernel's, and one pass quantizes each element with its
operations in its order (float32 division, round half to even, clip to [-zp, 255 - zp], + zp), so the results
are the same. A tensor holding NaN or an infinity (whose uint8 conversion numpy leaves to the C cast) or no
element goes to the numpy formula instead. The quantized convs' dynamic inputs (qconv.py, qdepthwise.py) take
their range from `value_range` too.

Inside a run with a native team (team.py), a range of at least TEAM_RANGE values is taken in as many even parts,
one a team thread's, then folded (`_range_team`): the minimum and maximum of the parts' are the whole's, NaN where
any part saw one. Dynamic MobileNetV2's conv inputs took 0.6 ms of one thread's time a run so (96x112x112: 55
us) while the other core waited.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import kernel

from . import team
from ._jit import PRIORITY, is_float32, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)
from .team import prange  # noqa: F401 (rebound to numba's at compile)
from .vector_rows import LANES

ACCUMULATORS = 4  # vectors in flight a step of `_range`, to hide the minimum's latency
TEAM_RANGE = 1 << 16  # values from which a native team shares the range's pass (~10 us of one thread's)


@jit
def _range(flat, out):  # pragma: no cover - compiled
    """out[0], out[1] = the min and max of flat (float32, C-contiguous, not empty), NaN in both if any is NaN."""
    minmax(flat, out)


@jit(parallel=True)
def _range_team(flat, parts, out):  # pragma: no cover - compiled
    """`_range` over a native team: ``parts`` even ranges of flat (each at least one value), one a team thread's,
    into ``parts`` (parts, 2), then folded into out: the least minimum and the greatest maximum, NaN in both where a
    part saw NaN (its row is NaN then)."""
    count = parts.shape[0]
    for t in prange(count):
        minmax(flat[flat.size * t // count:flat.size * (t + 1) // count], parts[t])
    _fold(parts, out)


@jit
def _fold(parts, out):  # pragma: no cover - compiled
    """out = the least minimum and the greatest maximum of the rows of ``parts`` (min, max), NaN in both where a row
    is NaN."""
    low, high, nan = parts[0, 0], parts[0, 1], False
    for t in range(parts.shape[0]):
        nan = nan or parts[t, 0] != parts[t, 0]
        low = parts[t, 0] if parts[t, 0] < low else low
        high = parts[t, 1] if parts[t, 1] > high else high
    out[0] = np.float32(np.nan) if nan else low
    out[1] = np.float32(np.nan) if nan else high


@jit
def _grid_of(parts, weight_scale, quant, m):  # pragma: no cover - compiled
    """`grid_operands` of the range folded from ``parts`` (written into its first row) when finite; whether it is."""
    _fold(parts, parts[0])
    mn, mx = parts[0, 0], parts[0, 1]
    if not (-np.inf < mn and mx < np.inf):  # NaN compares false
        return False
    grid_operands(mn, mx, weight_scale, quant, m)
    return True


@jit
def range_part(flat, parts, t):  # pragma: no cover - compiled
    """parts[t] = the min and max (`minmax`) of part t of flat cut into as many even parts as ``parts`` has rows."""
    count = parts.shape[0]
    minmax(flat[flat.size * t // count:flat.size * (t + 1) // count], parts[t])


@jit
def _grid_one(flat, parts, weight_scale, quant, m):  # pragma: no cover - compiled
    """`_grid_team` on the calling thread alone."""
    range_part(flat, parts[:1], 0)
    return _grid_of(parts[:1], weight_scale, quant, m)


@jit(parallel=True)
def _grid_team(flat, parts, weight_scale, quant, m):  # pragma: no cover - compiled
    """x's range (flat: at least one value per row of ``parts``) over a native team as `_range_team` takes it, then
    its `grid_operands` in the same call: whether the range is finite."""
    for t in prange(parts.shape[0]):
        range_part(flat, parts, t)
    return _grid_of(parts, weight_scale, quant, m)


def dynamic_grid(x: np.ndarray, weight_scale: np.float32, size: int = 0) -> tuple[np.ndarray, np.ndarray] | None:
    """(quant, m) of `grid_operands` (read-only) for a float32 x of at least one value whose range is finite, else
    None: `value_range` and `grid_operands` in one compiled call (a dynamic conv's ~5 us of Python less, and one
    team hand-over). ``size``: the native team the caller's conv runs on, when it asked already."""
    _install()
    flat = readonly(np.ascontiguousarray(x, np.float32)).reshape(-1)
    size = (size or team.size()) if flat.size >= TEAM_RANGE else 1
    parts = np.empty((size, 2), np.float32)
    quant, m = np.empty(4, np.float32), np.empty(1, np.float32)
    if not (_grid_team if size > 1 else _grid_one)(flat, parts, weight_scale, quant, m):
        return None
    return readonly(quant), readonly(m)


def minmax(flat, out):  # pragma: no cover - replaced
    """A stand-in, made numba's intrinsic when `value_range` first runs (`_install`)."""
    raise RuntimeError("dynamic_quant.minmax runs compiled only")


def value_range(x: np.ndarray) -> tuple[np.float32, np.float32]:
    """(min, max) of a float32 array of at least one element, as np.min and np.max give them (NaN in both where
    x holds one; -0.0 and 0.0 alike for the callers' formulas), in one compiled pass (shared by a native team from
    TEAM_RANGE values, when one runs)."""
    _install()
    out = np.empty(2, np.float32)
    flat = readonly(np.ascontiguousarray(x, np.float32)).reshape(-1)
    threads = team.size() if flat.size >= TEAM_RANGE else 1
    if threads > 1:
        _range_team(flat, np.empty((threads, 2), np.float32), out)
    else:
        _range(flat, out)
    return out[0], out[1]


def warm_range() -> None:
    """Compile `value_range`'s passes and `grid_operands` (or load them from numba's cache) now, at a kernel's
    build, not in a run."""
    mn, mx = value_range(np.zeros(1, np.float32))
    grid_operands(mn, mx, np.float32(1), np.empty(4, np.float32), np.empty(1, np.float32))
    dynamic_grid(np.zeros(1, np.float32), np.float32(1), 1)
    if team.available():
        _range_team(readonly(np.zeros(2, np.float32)), np.empty((2, 2), np.float32), np.empty(2, np.float32))
        _grid_team(readonly(np.zeros(2, np.float32)), np.empty((2, 2), np.float32), np.float32(1),
                   np.empty(4, np.float32), np.empty(1, np.float32))


def _install() -> None:
    """Make `minmax` numba's intrinsic (importing numba now, never at import: _jit.py's docstring)."""
    if getattr(minmax, "_is_intrinsic", False):
        return
    from numba import types
    from numba.extending import intrinsic

    def typer(typingctx, flat, out):
        return types.void(flat, out), _minmax_ir

    made = intrinsic(typer)
    made._is_intrinsic = True
    globals()["minmax"] = made


def _minmax_ir(context: Any, builder: Any, sig: Any, args: tuple[Any, ...]) -> Any:
    """`minmax`'s code: ACCUMULATORS vectors of LANES each for the minimum, the maximum and whether a lane saw a
    NaN, over the whole vectors (a comparison and a select each: x86's vminps and vmaxps, which drop a NaN, hence
    the third), the lanes then folded and the rest taken one by one; NaN in both where any was NaN."""
    from llvmlite import ir
    from numba.core import cgutils

    flat, out = (context.make_array(sig.args[i])(context, builder, args[i]) for i in (0, 1))
    data, n = flat.data, flat.nitems
    f32, i64, i32 = ir.FloatType(), ir.IntType(64), ir.IntType(32)
    vec, mask = ir.VectorType(f32, LANES), ir.VectorType(ir.IntType(1), LANES)
    step = LANES * ACCUMULATORS

    def fold(lo, hi, nan, v):  # the running (min, max, NaN seen) with v
        return (builder.select(builder.fcmp_ordered("<", v, lo), v, lo),
                builder.select(builder.fcmp_ordered(">", v, hi), v, hi),
                builder.or_(nan, builder.fcmp_unordered("uno", v, v)))

    def start(kind, value):
        return cgutils.alloca_once_value(builder, ir.Constant(kind, value))

    acc = [(start(vec, [float("inf")] * LANES), start(vec, [float("-inf")] * LANES), start(mask, [0] * LANES))
           for _ in range(ACCUMULATORS)]
    whole = builder.sdiv(n, ir.Constant(i64, step))
    with cgutils.for_range(builder, whole) as loop:
        base = builder.mul(loop.index, ir.Constant(i64, step))
        for a, slots in enumerate(acc):
            at = builder.add(base, ir.Constant(i64, a * LANES))
            v = builder.load(builder.bitcast(builder.gep(data, [at]), vec.as_pointer()), align=4)
            for slot, value in zip(slots, fold(*(builder.load(s) for s in slots), v)):
                builder.store(value, slot)
    low, high, nan = (builder.load(s) for s in acc[0])
    for slots in acc[1:]:
        lo, hi, seen = (builder.load(s) for s in slots)
        low = builder.select(builder.fcmp_ordered("<", lo, low), lo, low)
        high = builder.select(builder.fcmp_ordered(">", hi, high), hi, high)
        nan = builder.or_(nan, seen)
    lanes = [(builder.extract_element(low, i32(j)), builder.extract_element(high, i32(j)),
              builder.extract_element(nan, i32(j))) for j in range(LANES)]
    mn, mx, bad = (cgutils.alloca_once_value(builder, v) for v in lanes[0])
    for lo, hi, seen in lanes[1:]:
        builder.store(builder.select(builder.fcmp_ordered("<", lo, builder.load(mn)), lo, builder.load(mn)), mn)
        builder.store(builder.select(builder.fcmp_ordered(">", hi, builder.load(mx)), hi, builder.load(mx)), mx)
        builder.store(builder.or_(builder.load(bad), seen), bad)
    done = builder.mul(whole, ir.Constant(i64, step))
    with cgutils.for_range(builder, builder.sub(n, done)) as loop:
        v = builder.load(builder.gep(data, [builder.add(done, loop.index)]))
        for slot, value in zip((mn, mx, bad), fold(builder.load(mn), builder.load(mx), builder.load(bad), v)):
            builder.store(value, slot)
    nan_value = ir.Constant(f32, float("nan"))
    flagged = builder.load(bad)
    builder.store(builder.select(flagged, nan_value, builder.load(mn)), builder.gep(out.data, [ir.Constant(i64, 0)]))
    builder.store(builder.select(flagged, nan_value, builder.load(mx)), builder.gep(out.data, [ir.Constant(i64, 1)]))
    return context.get_dummy_value()


@jit
def _quantize(x, q, scale, zp):  # pragma: no cover - compiled
    """q = uint8(clip(rint(x / scale), -zp, 255 - zp) + zp), each step in float32."""
    low = -zp
    high = np.float32(255) - zp
    for i in range(x.size):
        v = np.rint(x[uintp(i)] / scale)
        v = low if v < low else (high if v > high else v)
        q[uintp(i)] = np.uint8(v + zp)


def scale_and_zero_point(mn: float, mx: float) -> tuple[np.float32, np.float32]:
    """minfer-ops-basic's scale and zero point (float32) of a tensor whose min and max are these (finite): its
    float32 operations, its clip to [0, 255] as two comparisons (numpy's clip of one value costs ~6 us)."""
    hi = np.float32(max(0.0, mx))
    lo = np.float32(min(0.0, mn))
    scale = np.float32(1.0 if hi == lo else hi - lo) / np.float32(255)
    zp = np.float32(0) - lo / scale  # >= 0: lo <= 0 < scale
    return scale, np.rint(zp if zp <= np.float32(255) else np.float32(255))


@jit
def grid_operands(mn, mx, weight_scale, quant, m):  # pragma: no cover - compiled
    """`scale_and_zero_point` of a finite [mn, mx] in compiled code, its float32 operations in its order, written as
    the quantized convs take it (qdepthwise.py's `dynamic_operands`): quant = (scale, -zp, 255 - zp, 0), m = scale *
    weight_scale (the numpy kernel's Mul of two float32 scalars). ~5 us less a node than in Python."""
    hi = mx if mx > np.float32(0) else np.float32(0)
    lo = mn if mn < np.float32(0) else np.float32(0)
    scale = (np.float32(1) if hi == lo else hi - lo) / np.float32(255)
    zp = np.float32(0) - lo / scale
    zero = np.rint(zp if zp <= np.float32(255) else np.float32(255))
    quant[0], quant[1], quant[2], quant[3] = scale, -zero, np.float32(255) - zero, np.float32(0)
    m[0] = scale * weight_scale


def _numpy_scale_and_zero_point(mn: float, mx: float) -> tuple[np.float32, np.float32]:
    """minfer-ops-basic's scale and zero point as it computes them, NaN and infinities included."""
    hi = np.float32(max(0.0, mx))
    lo = np.float32(min(0.0, mn))
    scale = np.float32(1.0 if hi == lo else hi - lo) / np.float32(255)
    return scale, np.rint(np.clip(np.float32(0) - lo / scale, 0, 255))


def _numpy(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """minfer-ops-basic's formula (NaN, infinities, empty tensors)."""
    scale, zp = _numpy_scale_and_zero_point(float(np.min(x)) if x.size else 0.0, float(np.max(x)) if x.size else 0.0)
    with np.errstate(invalid="ignore"):
        y = np.rint(np.divide(x, scale, dtype=np.float32))
        np.clip(y, -zp, np.float32(255) - zp, out=y)
        q = np.empty(y.shape, np.uint8)
        np.add(y, zp, out=q, casting="unsafe")
        return q, np.asarray(scale, dtype=x.dtype), np.asarray(zp, dtype=np.uint8)


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 input."""
    return is_float32(ctx)


@kernel("DynamicQuantizeLinear", since=11, priority=PRIORITY, prepare=True, applies=_applies, views=False)
def dynamic_quantize_linear(ctx):
    """DynamicQuantizeLinear-11 (float32): uint8 quantization whose range includes 0; y, scale, zero point."""
    _quantize(readonly(np.zeros(1, np.float32)), np.zeros(1, np.uint8), np.float32(1), np.float32(0))  # at build
    warm_range()

    def run(x):
        flat = readonly(np.ascontiguousarray(x)).reshape(-1)
        if flat.size == 0:
            return _numpy(x)
        mn, mx = value_range(flat)  # NaN propagates into both
        if not (np.isfinite(mn) and np.isfinite(mx)):
            return _numpy(x)
        scale, zp = scale_and_zero_point(float(mn), float(mx))
        q = np.empty(x.shape, np.uint8)
        _quantize(flat, q.reshape(-1), scale, np.float32(zp))
        return q, np.asarray(scale, dtype=np.float32), np.asarray(zp, dtype=np.uint8)

    return run
