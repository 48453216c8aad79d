"""ai.minfer::QuantizeDequantize (float32): the rounding, ``* M``, ``+ A`` and the second rounding in one pass.

minfer-passes' QDQ kernels end each Dequant{Conv,Gemm,MatMul} tile with this op's registered kernel (see its
qdq_ops module): numpy spends ten passes over the tile there (divide, rint, clip, multiply; multiply; add; the
same four again), this loop one. The arithmetic is numpy's, in float32 and in the same order (a division by
the scale, not a multiplication by its inverse; rint rounds half to even; NaN passes the clip), so the
results are the same bits.

A tile is a strided view of the output (some channels and rows of one image): the loop walks it as
(outer, channel, inner) with each channel's inner run contiguous, through a flat window over the memory
from the tile's first element to its last, so the inner loop vectorizes (an array of numba's strided
layout would not). M and A are scalars or vary along one axis (the channel's), which `applies` checks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import KernelError, intra_op_threads, kernel

from . import team
from ._jit import PRIORITY, F32, input_type, is_float32, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)
from .team import prange  # noqa: F401 (rebound to numba's at compile)

DOMAIN = "ai.minfer"


@jit
def _value(v, mc, ac, mul, add, scale, low, high, post, plow, phigh):  # pragma: no cover - compiled
    """R(v) [* mc] [+ ac] [then R on the post grid when post is not 0]."""
    v = np.rint(v / scale)
    v = low if v < low else v
    v = high if v > high else v
    v = v * scale
    if mul:
        v = v * mc
    if add:
        v = v + ac
    if post != 0:
        v = np.rint(v / post)
        v = plow if v < plow else v
        v = phigh if v > phigh else v
        v = v * post
    return v


@jit
def _requantize(src, dst, walk, m, a, params):  # pragma: no cover - compiled
    """dst[i] = `_value`(src[i]) for i = o*s0 + c*s1 + j, with m[c] and a[c] (``walk``: n0, s0, nc, s1, nl, then
    whether to multiply and to add; ``params``: scale, low, high, then the post grid's, scale 0 for none). In place
    when ``src`` is ``dst``: a loop of its own, as the two-array one's overlap check fails then and it runs unvectorized.
    Few arguments: numba's dispatch costs ~0.3 us an argument, on every call."""
    n0, s0, nc, s1, nl, mul, add = walk[0], walk[1], walk[2], walk[3], walk[4], walk[5], walk[6]
    scale, low, high, post, plow, phigh = params[0], params[1], params[2], params[3], params[4], params[5]
    mstep = 1 if m.size > 1 else 0
    astep = 1 if a.size > 1 else 0
    same = src.ctypes.data == dst.ctypes.data
    if nl == 1 and s1 == 1 and mstep == 1 and astep == 1:  # the channels are the contiguous run (a MatMul's bias)
        for o in range(n0):
            out = dst[uintp(o * s0):uintp(o * s0 + nc)]
            if same:
                for c in range(nc):
                    out[uintp(c)] = _value(out[uintp(c)], m[uintp(c)], a[uintp(c)], mul, add, scale, low, high, post,
                                           plow, phigh)
            else:
                row = src[uintp(o * s0):uintp(o * s0 + nc)]
                for c in range(nc):
                    out[uintp(c)] = _value(row[uintp(c)], m[uintp(c)], a[uintp(c)], mul, add, scale, low, high, post,
                                           plow, phigh)
        return
    for o in range(n0):
        for c in range(nc):
            base = o * s0 + c * s1
            mc = m[uintp(c * mstep)]
            ac = a[uintp(c * astep)]
            if same:
                row = dst[uintp(base):uintp(base + nl)]
                for j in range(nl):
                    row[uintp(j)] = _value(row[uintp(j)], mc, ac, mul, add, scale, low, high, post, plow, phigh)
            else:
                out = dst[uintp(base):uintp(base + nl)]
                row = src[uintp(base):uintp(base + nl)]
                for j in range(nl):
                    out[uintp(j)] = _value(row[uintp(j)], mc, ac, mul, add, scale, low, high, post, plow, phigh)


@jit(parallel=True)
def _qdq_team(src, dst, walk, m, a, params, parts):  # pragma: no cover - compiled
    """`_requantize` over a native team (team.py), in `_walk_part`'s ranges (in place too: each range reads its own
    elements before it writes them). The same operations on each value: the same bits."""
    for t in prange(parts):
        part, lo, hi, at, by_channel = _walk_part(walk, t, parts)
        if hi > lo and by_channel:
            _requantize(src[at:], dst[at:], part, _rq_part(m, lo, hi), _rq_part(a, lo, hi), params)
        elif hi > lo:
            _requantize(src[at:], dst[at:], part, m, a, params)


def _channel_axis(shape: tuple[int, ...] | None, rank: int) -> int | None:
    """The axis of an operand broadcasting into a tensor of ``rank`` along which it varies: -1 for a scalar, None
    when it varies along more than one (or its shape is unknown)."""
    if shape is None or any(not isinstance(d, int) for d in shape) or len(shape) > rank:
        return None
    varying = [rank - len(shape) + i for i, d in enumerate(shape) if d != 1]
    return -1 if not varying else varying[0] if len(varying) == 1 else None


def _walk(shape: tuple[int, ...], strides: tuple[int, ...], axis: int) -> tuple[int, int, int, int, int] | None:
    """(n0, s0, nc, s1, nl) in elements: the array as (outer, ``axis``, inner), inner contiguous; None when its
    dims do not merge so (then the caller copies)."""
    item = F32.itemsize
    if any(s % item or s < 0 for s in strides):
        return None
    dims = [(n, s // item) for n, s in zip(shape, strides)]
    nl = 1
    for n, s in reversed(dims[axis + 1:]):
        if n != 1 and s != nl:
            return None
        nl *= n
    n0, s0 = 1, 0
    for n, s in reversed(dims[:axis]):
        if n == 1:
            continue
        if n0 == 1:
            s0 = s
        elif s != s0 * n0:
            return None
        n0 *= n
    return (n0, s0, *dims[axis], nl)


def _per_axis(v: np.ndarray, channels: int) -> np.ndarray:
    """An operand as a flat read-only float32 array: one value for every channel, or one for each."""
    if v.size != 1 and v.size != channels:
        raise KernelError(f"ai.minfer::QuantizeDequantize (minfer-ops-numba): an operand of shape {v.shape} for "
                          f"{channels} channels; its node's types said it varies along the channel axis only")
    return readonly(v.reshape(-1) if v.dtype == F32 else v.astype(F32).reshape(-1))


def _spread(v: np.ndarray, channels: int) -> np.ndarray:
    """A one-value operand as one value per channel."""
    return v if v.size == channels else readonly(np.full(channels, v[0], np.float32))


def _window(y: np.ndarray, extent: int) -> np.ndarray:
    """A flat view of y's memory from its first element to its last (``extent`` elements)."""
    if y.flags.c_contiguous:
        return y.reshape(-1)
    return np.lib.stride_tricks.as_strided(y, shape=(extent,), strides=(F32.itemsize,))


Walk = tuple[int, np.ndarray, int]  # the channels, the walk as `_requantize` takes it, the window's extent


def _runner(axis: int | None, scale: float, low: float, high: float, post: float, plow: float, phigh: float) -> Any:
    """The run callable; ``axis``: the channel axis M and A vary along (None: none does, the rank decides)."""
    params = readonly(np.asarray([scale, low, high, post, plow, phigh], np.float32))
    one, zero = readonly(np.ones(1, np.float32)), readonly(np.zeros(1, np.float32))
    walk, y = np.asarray([1, 0, 1, 0, 1, 1, 1], np.int64), np.ones(1, np.float32)
    for src in (one, y):  # compiles now, at build: into another array, and in place (the team's driver too)
        _requantize(src, y, walk, one, one, params)
        if team.available():
            _qdq_team(src, y, walk, one, one, params, 1)
    # per (shape, strides, whether M and A are given): a tile's walk (a conv's tiles repeat run after run)
    walks: dict[tuple[Any, ...], Walk | None] = {}

    def walk_of(y: np.ndarray, mul: bool, add: bool) -> Walk | None:
        key = (y.shape, y.strides, mul, add)
        found = walks.get(key, False)
        if found is False:
            if (axis is None or y.ndim == 0) and y.flags.c_contiguous:  # one run: no channel to follow
                dims: tuple[int, ...] | None = (1, 0, 1, 0, y.size)
            else:  # a tile: by channels (axis 1 when M and A vary along none), each channel's rows one run
                dims = _walk(y.shape, y.strides, min(1, y.ndim - 1) if axis is None else axis)
            found = None if dims is None else (dims[2], np.asarray((*dims, mul, add), np.int64),
                                               (dims[0] - 1) * dims[1] + (dims[2] - 1) * dims[3] + dims[4])
            walks[key] = found  # a racing thread may make it too: the same value
        return found  # type: ignore[return-value]

    def apply(x: np.ndarray, y: np.ndarray, m: Any, a: Any) -> None:
        """y = the chain of x: x is y, or both are C-contiguous (the same walk serves both)."""
        found = walk_of(y, m is not None, a is not None)
        if found is None:  # dims that do not merge (never a conv's tile): work on a contiguous copy
            tmp = np.ascontiguousarray(x)
            apply(tmp, tmp, m, a)
            np.copyto(y, tmp)
            return
        channels, walk, extent = found
        mv = one if m is None else _per_axis(m, channels)
        av = zero if a is None else _per_axis(a, channels)
        if walk[4] == 1 and channels > 1:  # the channels are innermost: per-channel operands keep the loop vectorized
            mv, av = (_spread(v, channels) for v in (mv, av))
        dst = _window(y, extent)
        src = dst if x is y else readonly(_window(x, extent))
        size = team.size() if y.size >= TEAM_VALUES and intra_op_threads() > 1 and (walk[2] > 1 or walk[0] == 1) else 1
        if size > 1:  # a whole output at once (a conv's rounding, after its units): shared over the team
            _qdq_team(src, dst, walk, mv, av, params, size)
        else:
            _requantize(src, dst, walk, mv, av, params)

    def run(x, m=None, a=None, *, out=None):
        y = out if out is not None else np.empty(x.shape, np.float32)
        if y is not x and not (x.flags.c_contiguous and y.flags.c_contiguous):
            np.copyto(y, x)
            x = y
        if y.size:
            apply(x, y, m, a)
        return y

    return run


def applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 X of known rank, M and A (when given) float32 scalars or varying along the same one axis."""
    x = input_type(ctx, 0)
    if not is_float32(ctx) or x.rank is None:
        return False
    axes = set()
    for i in (1, 2):
        t = input_type(ctx, i)
        if t is None:
            continue
        if t.dtype != F32 or (axis := _channel_axis(t.shape, x.rank)) is None:
            return False
        axes.add(axis)
    return len(axes - {-1}) <= 1


# inplace: each element is read before it is written
@kernel("QuantizeDequantize", domain=DOMAIN, priority=PRIORITY, prepare=True, out=True, inplace=(0,), views=False,
        applies=applies)
def quantize_dequantize(ctx, *, scale, low, high, post_scale=0.0, post_low=0.0, post_high=0.0):
    """ai.minfer::QuantizeDequantize-1: clip(rint(x / scale), low, high) * scale [* m] [+ a] [rounded again]."""
    rank = input_type(ctx, 0).rank
    axes = {_channel_axis(t.shape, rank) for t in (input_type(ctx, 1), input_type(ctx, 2)) if t is not None} - {-1}
    return _runner(axes.pop() if axes else None, scale, low, high, post_scale, post_low, post_high)


NO_CHAIN = (team.NOTHING, team.NOTHING, readonly(np.zeros(2, np.int64)), team.NOTHING)  # `Chains.of`'s for none


class Chains:
    """A conv kernel's rounding chains: an epilogue describing minfer-passes' Dequant* rounding (``epilogue.rounding``:
    (scale, low, high), M, A, the second grid or None) as `_requantize`'s operands for a (N, channels, ...) output,
    so that the kernel applies it to each block of its output while in cache (liveconv.py's units, pointwise.py's
    pixel blocks) instead of over the whole output after. Kept per epilogue: a DequantConv's is one object for all
    its runs."""

    def __init__(self, channels: int, rank: int) -> None:
        self.channels, self.rank = channels, rank
        self._found: dict[Any, Any] = {}

    def of(self, epilogue: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """(m, a, [multiply, add] flags, params) for ``epilogue``, None when it describes no rounding or M or A
        varies along another axis than the channels'. Only described epilogues are kept: one made per run (a
        residual's, holding that run's Z) must not be, which would keep its arrays alive."""
        chain = getattr(epilogue, "rounding", None)
        if chain is None:
            return None
        found = self._found.get(epilogue, False)
        if found is False:
            if len(self._found) > 8:  # described epilogues made per run would pile up here
                self._found.clear()
            found = self._found[epilogue] = self._operands(chain)
        return found

    def _operands(self, chain: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        grid, mul, add, post = chain
        operands = []
        for v in (mul, add):
            if v is not None and (_channel_axis(v.shape, self.rank) not in (-1, 1) or v.size not in (1, self.channels)):
                return None
            operands.append(readonly(np.ones(1, np.float32) if v is None else np.asarray(v, np.float32).reshape(-1)))
        params = readonly(np.asarray([*grid, *(post or (0.0, 0.0, 0.0))], np.float32))
        return operands[0], operands[1], readonly(np.asarray([mul is not None, add is not None], np.int64)), params


# ---- ai.minfer::Requantize (minfer-ops-conv's integer convs' input conversion and output epilogue) ----------------

RQ_ACTS = {"": 0, "Relu": 1, "Clip": 2}


@jit
def _rq_scale(src, out, nl, cc, mc, hc, divide, rounding, low, high, out_scale):  # pragma: no cover - compiled
    """out = R((src + cc) * mc) [* out_scale] (/ mc with ``divide``; + cc only when ``hc``): each combination its own
    branch-free loop, so that each vectorizes (one loop testing the flags per element ran 50x slower)."""
    if rounding and divide:
        for j in range(nl):
            v = src[uintp(j)] / mc
            v = low if v < low else v
            v = high if v > high else v
            out[uintp(j)] = np.rint(v)
    elif rounding and hc:
        for j in range(nl):
            v = (src[uintp(j)] + cc) * mc
            v = low if v < low else v
            v = high if v > high else v
            out[uintp(j)] = np.rint(v)
    elif rounding:
        for j in range(nl):
            v = src[uintp(j)] * mc
            v = low if v < low else v
            v = high if v > high else v
            out[uintp(j)] = np.rint(v)
    elif hc:
        for j in range(nl):
            out[uintp(j)] = (src[uintp(j)] + cc) / mc if divide else (src[uintp(j)] + cc) * mc
    elif divide:
        for j in range(nl):
            out[uintp(j)] = src[uintp(j)] / mc
    else:
        for j in range(nl):
            out[uintp(j)] = src[uintp(j)] * mc
    if out_scale != 0:
        for j in range(nl):
            out[uintp(j)] = out[uintp(j)] * out_scale


@jit
def _rq_affine(out, nl, sc, bc, hs, hb, act, p0, p1):  # pragma: no cover - compiled
    """out = act(out * sc + bc) in place, ChannelAffine's kernel's operations (product rounded, then the sum)."""
    zero = np.float32(0)
    if hs and hb:
        for j in range(nl):
            out[uintp(j)] = out[uintp(j)] * sc + bc
    elif hs:
        for j in range(nl):
            out[uintp(j)] = out[uintp(j)] * sc
    elif hb:
        for j in range(nl):
            out[uintp(j)] = out[uintp(j)] + bc
    # "p0 if v < p0 else v" is "v if (v >= p0 or v != v) else p0" (the affine kernel's form: NaN kept, -0.0 too)
    # in a form that vectorizes
    if act == 1:
        for j in range(nl):
            v = out[uintp(j)]
            out[uintp(j)] = zero if v < zero else v
    elif act == 2:
        for j in range(nl):
            v = out[uintp(j)]
            v = p0 if v < p0 else v
            out[uintp(j)] = p1 if v > p1 else v


@jit
def _rq_post(out, nl, ps, plo, phi, pq):  # pragma: no cover - compiled
    """out = clip(rint(out / ps), plo, phi) * pq in place: the next QuantizeLinear, centered (pq 1: an exact identity),
    or a QuantizeDequantize (pq = ps)."""
    for j in range(nl):
        v = out[uintp(j)] / ps
        v = plo if v < plo else v
        v = phi if v > phi else v
        out[uintp(j)] = np.rint(v) * pq


@jit
def _rq_fused(src, dst, n0, s0, nc, s1, nl, m, c, s, b, rounding, act_lo, act_hi, params):  # pragma: no cover
    """The chain without division, (outer, channel, inner) as `_rq_rows` walks it, in one loop a row: act(R((v + c)
    * m) * out_scale * s + b) [then the post grid], absent steps as exact identities (+ -0.0, * 1, a clip to
    +-inf: every float, -0.0 and NaN included, comes out as it went in). The loops index src and dst directly:
    a call per channel (numba passes each slice as a new array) cost 1280-channel 7x7 maps 80 us."""
    low, high, osc, ps, plo, phi, pq = params[0], params[1], params[2], params[5], params[6], params[7], params[8]
    osc = osc if osc != 0 else np.float32(1)
    hc, hs, hb = c.size > 0, s.size > 0, b.size > 0
    ms, cs, ss, bs = m.size > 1, c.size > 1, s.size > 1, b.size > 1
    for o in range(n0):
        for ch in range(nc):
            base = o * s0 + ch * s1
            mc = m[uintp(ch if ms else 0)]
            cc = c[uintp(ch if cs else 0)] if hc else np.float32(-0.0)
            sc = s[uintp(ch if ss else 0)] if hs else np.float32(1)
            bc = b[uintp(ch if bs else 0)] if hb else np.float32(-0.0)
            if not rounding:  # a ConvInteger's Cast and Mul: the product, then the affine
                for j in range(nl):
                    v = (src[uintp(base + j)] + cc) * mc * osc * sc + bc
                    v = act_lo if v < act_lo else v
                    dst[uintp(base + j)] = act_hi if v > act_hi else v
            elif ps != 0:
                for j in range(nl):
                    v = (src[uintp(base + j)] + cc) * mc
                    v = low if v < low else v
                    v = high if v > high else v
                    v = np.rint(v) * osc * sc + bc
                    v = act_lo if v < act_lo else v
                    v = act_hi if v > act_hi else v
                    v = v / ps
                    v = plo if v < plo else v
                    v = phi if v > phi else v
                    dst[uintp(base + j)] = np.rint(v) * pq
            else:
                for j in range(nl):
                    v = (src[uintp(base + j)] + cc) * mc
                    v = low if v < low else v
                    v = high if v > high else v
                    v = np.rint(v) * osc * sc + bc
                    v = act_lo if v < act_lo else v
                    dst[uintp(base + j)] = act_hi if v > act_hi else v


@jit
def _rq_rows(src, dst, walk, m, c, s, b, params):  # pragma: no cover - compiled
    """dst = act(R((src + c) * m) * out_scale * s + b) over (outer, channel, inner) as ``walk`` gives it (n0, s0, nc,
    s1, nl, then divide, rounding, activation); ``params``: low, high, out_scale, the Clip bounds, then the post grid
    (scale 0: none) and the factor its integers are multiplied by (1, or its scale: a QuantizeDequantize). An empty c, s or b is absent; m, c, s, b hold one value or one a channel. Channel row by channel
    row (in cache), stage by stage."""
    n0, s0, nc, s1, nl = walk[0], walk[1], walk[2], walk[3], walk[4]
    divide, rounding, act = walk[5], walk[6], walk[7]
    low, high, out_scale, p0, p1 = params[0], params[1], params[2], params[3], params[4]
    post, plo, phi, pq = params[5], params[6], params[7], params[8]
    hc, hs, hb = c.size > 0, s.size > 0, b.size > 0
    ms, cs, ss, bs = m.size > 1, c.size > 1, s.size > 1, b.size > 1
    zero = np.float32(0)
    if not divide and (rounding or post == 0):  # an epilogue: one loop (each step's float32 operation, in order)
        act_lo = p0 if act == 2 else (zero if act == 1 else np.float32(-np.inf))  # float32: a float64 bound would
        act_hi = p1 if act == 2 else np.float32(np.inf)  # turn the rest of the chain into float64
        _rq_fused(src, dst, n0, s0, nc, s1, nl, m, c, s, b, rounding, act_lo, act_hi, params)
        return
    for o in range(n0):
        for ch in range(nc):
            base = o * s0 + ch * s1
            cc = c[uintp(ch if cs else 0)] if hc else zero
            out = dst[uintp(base):uintp(base + nl)]
            _rq_scale(src[uintp(base):uintp(base + nl)], out, nl, cc, m[uintp(ch if ms else 0)], hc, divide, rounding,
                      low, high, out_scale)
            if hs or hb or act:
                sc = s[uintp(ch if ss else 0)] if hs else zero
                _rq_affine(out, nl, sc, b[uintp(ch if bs else 0)] if hb else zero, hs, hb, act, p0, p1)
            if post != 0:
                _rq_post(out, nl, post, plo, phi, pq)


@jit
def _rq_part(v, c0, c1):  # pragma: no cover - compiled
    """Channels c0..c1 of a per-channel operand; one value or none as it is."""
    return v[c0:c1] if v.size > 1 else v[0 : v.size]


@jit
def _walk_part(walk, t, parts):  # pragma: no cover - compiled
    """Range t of ``parts`` of a walk (n0, s0, nc, s1, nl, ...): of its channels when it has several, else (one
    channel and one outer run) of its inner run: (the range's walk, lo, hi, its first element's offset, whether the
    range is of channels: per-channel operands are sliced to it then)."""
    nc, s1, nl = walk[2], walk[3], walk[4]
    count = nc if nc > 1 else nl
    lo, hi = count * t // parts, count * (t + 1) // parts
    part = walk.copy()
    if nc > 1:
        part[2] = hi - lo
        return part, lo, hi, lo * s1, True
    part[4] = hi - lo
    return part, lo, hi, lo, False


@jit(parallel=True)
def _rq_team(src, dst, walk, m, c, s, b, params, parts):  # pragma: no cover - compiled
    """`_rq_rows` over a native team (team.py), in `_walk_part`'s ranges, each one team thread's. The same
    operations on each value: the same bits."""
    for t in prange(parts):
        part, lo, hi, at, by_channel = _walk_part(walk, t, parts)
        if hi > lo and by_channel:
            _rq_rows(src[at:], dst[at:], part, _rq_part(m, lo, hi), _rq_part(c, lo, hi), _rq_part(s, lo, hi),
                     _rq_part(b, lo, hi), params)
        elif hi > lo:
            _rq_rows(src[at:], dst[at:], part, m, c, s, b, params)


# values from which a native team shares a Requantize call (~15 us of one thread's work; its hand-over ~1 us)
TEAM_VALUES = 1 << 16


def _rq_operand(v: np.ndarray | None) -> np.ndarray:
    if v is None:
        return _EMPTY
    if v.ndim == 1 and v.dtype == F32 and not v.flags.writeable:  # as the conv kernels pass them: no new view
        return v
    return readonly(v.reshape(-1) if v.dtype == F32 else v.astype(F32).reshape(-1))


_EMPTY = readonly(np.zeros(0, np.float32))


def _rq_applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 X of rank 2 or more, float32 operands, an activation this loop computes."""
    x = input_type(ctx, 0)
    operands = [input_type(ctx, i) for i in range(1, 5)]
    return (is_float32(ctx) and x.rank is not None and x.rank >= 2 and (attrs.get("activation") or "") in RQ_ACTS
            and all(t is None or t.dtype == F32 for t in operands))


@kernel("Requantize", domain=DOMAIN, priority=PRIORITY, prepare=True, out=True, views=False, applies=_rq_applies)
def requantize(ctx, *, low=-np.inf, high=np.inf, divide=0, rounding=1, out_scale=0.0, activation="",
               activation_params=None, post_scale=0.0, post_low=-np.inf, post_high=np.inf, post_dequantize=0):
    """ai.minfer::Requantize-1 (float32): minfer-ops-conv's numpy steps in one compiled pass, the same operations."""
    act = RQ_ACTS[activation or ""]
    lo, hi = ([float(v) for v in activation_params or []] + [-np.inf, np.inf])[:2] if act == 2 else (0.0, 0.0)
    factor = post_scale if post_dequantize else 1.0
    params = readonly(np.asarray([low, high, out_scale, lo, hi, post_scale, post_low, post_high, factor], np.float32))
    flags = (int(divide), int(rounding), act)
    one = readonly(np.ones(1, np.float32))
    _rq_rows(one, np.ones(1, np.float32), np.asarray((1, 0, 1, 0, 1, *flags), np.int64), one, one, one, one, params)
    if team.available():  # the team's driver too: compiled in a timed run, it would lose the core's timing
        _rq_team(one, np.ones(1, np.float32), np.asarray((1, 0, 1, 0, 1, *flags), np.int64), one, one, one, one,
                 params, 1)
    walks: dict[tuple[Any, ...], Any] = {}  # per (shape, strides): a tile's walk (a conv's tiles repeat run after run)

    def walk_of(y: np.ndarray, per_channel: bool) -> Any:
        key = (y.shape, y.strides, per_channel)
        found = walks.get(key, False)
        if found is False:  # one run when no operand varies by channel (a small map's channels each cost a call)
            flat = not per_channel and y.flags.c_contiguous
            dims = (1, 0, 1, 0, y.size) if flat else _walk(y.shape, y.strides, 1)
            found = None if dims is None else (np.asarray((*dims, *flags), np.int64),
                                               (dims[0] - 1) * dims[1] + (dims[2] - 1) * dims[3] + dims[4])
            walks[key] = found  # a racing thread may make it too: the same value
        return found

    def run(x, m, c=None, s=None, b=None, *, out=None):
        y = out if out is not None else np.empty(x.shape, np.float32)
        if not y.size:
            return y
        per_channel = any(v is not None and v.size > 1 for v in (m, c, s, b))
        found = walk_of(y, per_channel) if x.strides == y.strides and x.dtype == F32 else None
        if found is None:  # dims that do not merge or strides that differ (never a conv's tile): a contiguous copy
            tmp = np.ascontiguousarray(x, np.float32)
            dst = np.empty(x.shape, np.float32)
            run(tmp, m, c, s, b, out=dst)
            np.copyto(y, dst)
            return y
        walk, extent = found
        operands = (_rq_operand(m), _rq_operand(c), _rq_operand(s), _rq_operand(b))
        src, dst = readonly(_window(x, extent)), _window(y, extent)
        size = team.size() if y.size >= TEAM_VALUES and intra_op_threads() > 1 and (walk[2] > 1 or walk[0] == 1) else 1
        if size > 1:  # a whole output at once (a depthwise conv's, after its loops): shared over the team
            _rq_team(src, dst, walk, *operands, params, size)
        else:
            _rq_rows(src, dst, walk, *operands, params)
        return y

    run.steps = (params, readonly(np.asarray(flags, np.int64)))  # a conv's team driver calls `_rq_rows` with them
    return run
