"""Conv when depthwise (group == C == M, 2-D, float32): compiled tap loops per (image, channel block).

numpy computes a depthwise conv as a few long passes over copies of the
input (minfer-ops-conv's depthwise.py): padded copies, tap products, sums,
each a numpy call with its overhead. Compiled (loops.py), in two kernels
the core times against each other (and numpy's) per node: `conv` copies
each channel into zero-bordered phase planes (one per stride phase: a
single plane at stride 1) and adds each tap over the whole plane in one
contiguous loop, at any stride; `conv_rows` accumulates each output row tap
by tap in L1, reading the input in place. The output is cut into (image,
channel block) units small enough that a unit's input and output stay in
L2 until the fused op's epilogue (residual, activation) has run on it; the
units go over the intra-op threads (`parallel_for`), and since the loops
release the GIL both cores compute. Where a native team runs (team.py) and
the epilogue has a compiled form, a compiled driver (`drive`) runs the
units and their epilogue over numba's threads instead: its hand-over
costs a small fraction of parallel_for's (team.py), so much smaller convs
split (`MIN_TEAM_MACS`). Both kernels sum the taps in onnxruntime's order
(loops.py): they give its MLAS Conv's bits, on either path.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from minfer_core import intra_op_threads, kernel, parallel_for, spmd

from . import team
from ._jit import F32, PRIORITY, is_float32, jit, readonly
from .loops import weighted_rows, wide_rows
from .phases import phase_rows
from .team import NOTHING, finish, prange  # noqa: F401 (compiled: the driver's)
from .vector_rows import fits, install, vector_rows
from .window import Window, window

Epilogue = Callable[[np.ndarray, tuple], None]

# a unit's input and output planes take about this much: they stay in L2 (1 MB here, per core) from the
# loop to the epilogue
UNIT_BYTES = 256 << 10
# below this many multiply-adds a conv runs on one thread: ~150 us of compiled work here (1x192x28x28, 1.4M, took
# 77 us), while a hand-over to the other thread costs 10-50 us and more on a loaded host
MIN_SPLIT_MACS = 2_000_000
# the same over a native team (team.py), whose hand-over costs about a microsecond: below this a split lost to
# one thread on MobileNetV2's layers (bench/results/session12/team-depthwise.txt)
MIN_TEAM_MACS = 150_000
# the loop `drive` runs (its ``kind``): `_phase`'s, `_rows`' and `_vector`'s picks
PHASE, WIDE, WEIGHTED, VECTOR = 0, 1, 2, 3


def units(n: int, c: int, plane_bytes: int, macs: int, threads: int,
          native: bool = False) -> tuple[list[tuple[int, int, int]], int]:
    """(image, c0, c1) units of about UNIT_BYTES, at least one per thread when the conv is worth splitting
    (from MIN_SPLIT_MACS multiply-adds, MIN_TEAM_MACS over a native team: ``native``), and how many parts to split
    them in. A team's parts get as many channels each: its small convs have few units, and one part's extra
    unit (960x7x7: 41 and 19 blocks of 16 channels) was the whole conv's time."""
    per = max(1, min(c, UNIT_BYTES // max(plane_bytes, 1)))
    split = threads > 1 and macs >= (MIN_TEAM_MACS if native else MIN_SPLIT_MACS)
    if split and native and n % threads:  # each image's units a multiple of the parts, of one size
        per = max(1, math.ceil(c / (math.ceil(math.ceil(c / per) / threads) * threads)))
    elif split and n * math.ceil(c / per) < threads:
        per = max(1, math.ceil(c / math.ceil(threads / n)))
    found = [(i, c0, min(c, c0 + per)) for i in range(n) for c0 in range(0, c, per)]
    return found, min(threads, len(found)) if split else 1


def compiled_epilogue(epilogue: Any, y: np.ndarray) -> tuple[np.ndarray, int, np.float32, np.float32] | None:
    """`team.finish`'s (z, op, a, b) for an epilogue a driver applies in compiled code (None: no epilogue), z the
    residual flat (or `team.NOTHING`); or None when it cannot (`team.native` knows no compiled form, a residual
    not float32, C-contiguous and shaped like y, or y itself not C-contiguous)."""
    fused = team.PLAIN if epilogue is None else team.native(epilogue)
    if not y.flags.c_contiguous:
        return None
    if fused is None or not team.fits(fused[3], y.shape):
        return AFTER
    op, a, b, z = fused
    return (NOTHING if z is None else readonly(z.reshape(-1))), op, a, b


# `compiled_epilogue`'s answer for an epilogue without a compiled form (a quantized conv's requantization): the
# driver leaves the sums, and the whole output goes to the epilogue in one call after it (`finished`), rather than
# unit by unit over parallel_for, which runs serially in a run whose threads a team claimed
AFTER = (NOTHING, team.NONE, np.float32(0), np.float32(0))


def finished(epilogue: Any, y: np.ndarray, native: tuple[Any, ...]) -> None:
    """After a driver: the epilogue the driver could not apply (`AFTER`), on the whole output at once."""
    if native is AFTER and epilogue is not None:
        epilogue(y, (slice(None),) * y.ndim)


def path(epilogue: Any, y: np.ndarray) -> tuple[int, tuple[np.ndarray, int, np.float32, np.float32] | None]:
    """The threads to cut a run's units for, and `compiled_epilogue`'s answer when they are a native team's (the
    driver's path), else None (parallel_for's). The team is asked for last: asking claims the run's threads."""
    threads = intra_op_threads()
    native = compiled_epilogue(epilogue, y) if threads > 1 else None
    if native is None:
        return threads, None
    size = team.size()
    return (size, native) if size > 1 else (intra_op_threads(), None)


@jit
def units_of(kind, x, w, bias, y, table, lo, hi, sh, sw, ph, pw, dh, dw, z, op, a, b):  # pragma: no cover - compiled
    """Units lo..hi of ``table`` (rows image, c0, c1): each unit's loop (``kind``: `PHASE`, `WIDE`, `WEIGHTED`,
    `VECTOR`) on x (N, C, H, W) into y (N, C, OH, OW), then its epilogue by `team.finish` (z: the residual flat,
    or none; the activation ``op``) while it is in L2. The bias stays in the loops' sums, added last as
    onnxruntime adds it."""
    c, cells = y.shape[1], y.shape[2] * y.shape[3]
    flat = y.reshape(-1)
    for u in range(lo, hi):
        i, c0, c1 = table[u, 0], table[u, 1], table[u, 2]
        if kind == PHASE:
            phase_rows(x[i], w, bias, y[i], c0, c1, sh, sw, ph, pw, dh, dw)
        elif kind == WIDE:
            wide_rows(x[i], w, bias, y[i], c0, c1, sh, sw, ph, pw, dh, dw)
        elif kind == VECTOR:
            vector_rows(x[i], w, bias, y[i], c0, c1, sh, sw, ph, pw, dh, dw)
        else:
            weighted_rows(x[i], w, bias, y[i], c0, c1, sh, sw, ph, pw, dh, dw)
        finish(flat, z, (i * c + c0) * cells, 1, (c1 - c0) * cells, 0, NOTHING, 0, op, a, b)


@jit(parallel=True)
def drive(kind, x, w, bias, y, table, parts, sh, sw, ph, pw, dh, dw, z, op, a, b):  # pragma: no cover - compiled
    """`units_of` over a native team (team.py): the units of ``table`` in ``parts`` contiguous shares."""
    count = table.shape[0]
    for t in prange(parts):
        units_of(kind, x, w, bias, y, table, count * t // parts, count * (t + 1) // parts, sh, sw, ph, pw, dh, dw,
                 z, op, a, b)


def applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """A 2-D float32 depthwise conv (group == C == M, one input channel per group) with constant weights and
    non-negative pads."""
    w = ctx.constants[1] if len(ctx.constants) > 1 else None
    if not is_float32(ctx, 0, rank=4) or w is None or w.ndim != 4 or w.dtype != F32:
        return False
    channels, group = ctx.input_types[0].shape[1], int(attrs.get("group", 1))
    return (group > 1 and channels == group == w.shape[0] and w.shape[1] == 1
            and min(attrs.get("pads") or [0]) >= 0 and min(attrs.get("strides") or [1]) >= 1)


def applies_vector(ctx: Any, attrs: dict[str, Any]) -> bool:
    """`applies`, for a geometry vector_rows.py's loop computes (`fits`: 3x3 or 5x5, stride 1 or 2, dilation 1)."""
    if not applies(ctx, attrs):
        return False
    kernel = tuple(attrs.get("kernel_shape") or ctx.constants[1].shape[2:])
    return fits(kernel, tuple(attrs.get("strides") or (1, 1)), tuple(attrs.get("dilations") or (1, 1)))


def _factory(name: str, pick: Callable[[tuple[int, ...]], Any], doc: str) -> Callable[..., Any]:
    """The preparing kernel running the loop of kind ``pick(strides)`` (`_loop`), named
    ``name``: the core stores a timed choice under the kernel's module and qualified name."""

    def conv(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
        return _prepare(ctx, pick, auto_pad, dilations, kernel_shape, pads, strides)

    conv.__doc__, conv.__name__, conv.__qualname__ = doc, name, name
    return conv


def _phase(strides: tuple[int, ...]) -> int:
    return PHASE


def _rows(strides: tuple[int, ...]) -> int:
    return WIDE if strides == (1, 1) else WEIGHTED


def _vector(strides: tuple[int, ...]) -> int:
    return VECTOR


def _loop(kind: int) -> Any:
    """The loop of ``kind`` (each one's docstring in loops.py and phases.py), looked up when a node is prepared."""
    return phase_rows if kind == PHASE else wide_rows if kind == WIDE else vector_rows if kind == VECTOR else \
        weighted_rows


# Two kernels for one node, which the core times on the node's real input (and numpy's with them): the phase
# planes' contiguous loops are 1.3-3x faster on an input in cache (1x72x56x56 5x5 stride 2: 137 against 431 us),
# but a 56x56 or larger plane read from memory (batch 8) took them 2-2.8x longer than the row loops, which read
# the input in place while they compute (bench/kernels.py, README)
_DECLARED = dict(prepare=True, out=True, views=False, packed=(1, 2), epilogue=True, applies=applies)
conv = kernel("Conv", since=1, priority=PRIORITY, **_DECLARED)(_factory(
    "conv", _phase, "Conv-1/11/22, depthwise only (see `applies`): phase planes, one loop per tap and plane."))
conv_rows = kernel("Conv", since=1, priority=PRIORITY - 1, **_DECLARED)(_factory(
    "conv_rows", _rows, "Conv-1/11/22, depthwise only (see `applies`): row loops reading the input in place."))
# a fifth candidate, below depthwise_blocked.py's (MINFER_TUNE=0 keeps taking the phase planes): on 112x112 and
# 56x56 planes its in-place vector rows took 0.65-0.75 of the phase planes' time at stride 2 (no copy of the
# input, whose split into phase planes was over half of theirs) and 0.75 at stride 1 on 112x112; on 56x56 and
# smaller planes at stride 1, where most runs of 16 columns reach an edge (masked loads), the others win
conv_vector = kernel("Conv", since=1, priority=PRIORITY - 4, **{**_DECLARED, "applies": applies_vector})(_factory(
    "conv_vector", _vector, "Conv-1/11/22, depthwise 3x3 or 5x5 only (see `applies_vector`): vector_rows.py's "
    "16-column vectors, reading the input in place."))


def _prepare(ctx: Any, pick: Callable[[tuple[int, ...]], int], auto_pad: str, dilations: Any, kernel_shape: Any,
             pads: Any, strides: Any) -> Callable[..., Any]:
    """The run callable for one node (weights copied and reshaped once)."""
    w = ctx.constants[1]
    # copies (packed=(1, 2)): the engine frees the initializers, so nothing here may be a view of them
    weights = readonly(np.array(w.reshape(w.shape[0], w.shape[2], w.shape[3]), np.float32, copy=True))
    kernel = weights.shape[1:]
    st = tuple(strides or (1, 1))
    dl = tuple(dilations or (1, 1))
    b = ctx.constants[2] if len(ctx.constants) > 2 else None
    fixed_bias = None if b is None else readonly(b.astype(np.float32))
    zeros = readonly(np.zeros(weights.shape[0], np.float32))
    geometry: dict[tuple[int, ...], Window] = {}
    cuts: dict[tuple[int, ...], tuple[list[tuple[int, int, int]], int, np.ndarray]] = {}
    kind = pick(st)
    loop = _loop(kind)
    _warm(kind, weights, st, dl)

    # a serial call's compiled arguments by (input shape, epilogue): a fused node's epilogue is one object for
    # all its calls (minfer-passes' act_only), so a small model's steady runs skip the planning below
    quick: dict[tuple[Any, ...], tuple[Any, ...]] = {}

    def run(x, w=None, b=None, *, out=None, epilogue=None):
        fast = quick.get((x.shape, epilogue)) if out is not None and (b is None or fixed_bias is not None) else None
        if fast is not None and intra_op_threads() == 1 and out.flags.c_contiguous:
            units_of(kind, readonly(np.ascontiguousarray(x)), weights, fast[0], out, *fast[1:])
            return out
        n, c = x.shape[:2]
        if x.shape[1:] not in geometry:
            geometry[x.shape[1:]] = window(x.shape[2:], kernel, st, dl, pads, auto_pad, clamp_same=True)
        begin, _, out_shape = geometry[x.shape[1:]]
        y = out if out is not None else np.empty((n, c) + out_shape, np.float32)
        if y.size == 0:
            return y
        bias = fixed_bias if fixed_bias is not None else zeros if b is None else readonly(np.ascontiguousarray(b))
        threads, native = path(epilogue, y)
        if native is None and threads == 1:  # one thread: the units and their epilogue in one compiled call too
            native = compiled_epilogue(epilogue, y)
        key = (n, threads, native is not None) + x.shape[1:]
        if key not in cuts:
            plane = (x.shape[2] * x.shape[3] + math.prod(out_shape)) * 4
            macs = n * c * math.prod(out_shape) * math.prod(kernel)
            found, parts = units(n, c, plane, macs, threads, native is not None)
            cuts[key] = found, parts, readonly(np.array(found, np.int64).reshape(-1, 3))  # the compiled table
        found, parts, table = cuts[key]
        xs = readonly(np.ascontiguousarray(x))  # one compiled signature, whether x is a feed or not
        geo = (st[0], st[1], begin[0], begin[1], dl[0], dl[1])
        if native is not None and threads == 1:  # compiled end to end on this thread, no pool to share it
            units_of(kind, xs, weights, bias, y, table, 0, len(found), *geo, *native)
            finished(epilogue, y, native)
            if native[0] is NOTHING and native is not AFTER and (b is None or fixed_bias is not None):
                quick[(x.shape, epilogue)] = (bias, table, 0, len(found), *geo, *native)  # no residual: the same
            return y
        if native is not None:  # compiled end to end: over the team when worth a split, else on this thread

            def whole(lo: int, hi: int) -> None:
                if parts > 1:
                    drive(kind, xs, weights, bias, y, table, parts, *geo, *native)
                else:
                    units_of(kind, xs, weights, bias, y, table, 0, len(found), *geo, *native)
                finished(epilogue, y, native)

            # one range, which the driver splits itself: a process team's ranks still write y only in here
            parallel_for(1, whole, parts=1, outputs_only=True)
            return y

        def span(lo: int, hi: int) -> None:
            for i, c0, c1 in found[lo:hi]:
                loop(xs[i], weights, bias, y[i], c0, c1, *geo)
                if epilogue is not None:
                    epilogue(y, (slice(i, i + 1), slice(c0, c1)))

        parallel_for(len(found), span, parts=parts, outputs_only=True)  # a unit writes only its y block
        return y

    # every unit writes only its own block of y, inside parallel_for(outputs_only=True): a process team may share it
    return spmd(run)


def _warm(kind: int, weights: np.ndarray, strides: tuple[int, ...], dilations: tuple[int, ...]) -> None:
    """Compile (or load from the cache) at build, not in the first run, where it would also skew the timing
    of the kernels the core compares: the loop, and the team's driver where a native team may run. `units_of`
    compiles every kind's loop, vector_rows.py's intrinsic among them: it is made first."""
    install()
    x = readonly(np.zeros((1, 1, 4, 4), np.float32))
    y, bias = np.zeros((1, 1, 2, 2), np.float32), readonly(np.zeros(1, np.float32))
    geo = (strides[0], strides[1], 0, 0, dilations[0], dilations[1])
    _loop(kind)(x[0], weights[:1], bias, y[0], 0, 1, *geo)
    table = readonly(np.array([[0, 0, 1]], np.int64))
    units_of(kind, x, weights[:1], bias, y, table, 0, 1, *geo, NOTHING, team.NONE, np.float32(0), np.float32(0))
    if team.available():
        drive(kind, x, weights[:1], bias, y, table, 1, *geo, NOTHING, team.NONE, np.float32(0), np.float32(0))
