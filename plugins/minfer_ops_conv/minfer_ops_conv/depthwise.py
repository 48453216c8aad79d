"""Depthwise convolution (group == C == M): few, long numpy passes per (image, channel block).

Each tap of a depthwise conv is a per-channel weight times a shifted input,
and numpy is only fast when each call covers many elements in long
contiguous rows. The input block is copied once into a zero-bordered buffer
that stays allocated per thread and geometry (its borders are written once),
so every tap is then a strided *view* of that buffer, never a copy. Three
layouts, because none wins everywhere (the first run times them):

- channels first ("first"), for large planes. The block is split into
  stride phase planes (stride 2 in 2-D: four quarter planes), so that every
  tap is one plane shifted by a constant and its rows run over whole output
  rows plus the few padding columns between them ("wide" rows, computed and
  then dropped). One multiply per phase writes every weighted tap into a
  product stack (taps, block); one BLAS matrix-vector product with a vector
  of ones sums the stack, which beats T - 1 numpy additions over the block.
- channels last ("last"), for small planes (14x14, 7x7 at hundreds of
  channels), whose channel-first rows would be a few dozen elements: numpy's
  per-row cost would dominate. The block is transposed into (*padded, C)
  and a single einsum over a (*kernel, *out, C) view sums all taps with
  rows running over channels.
- tap copies ("copies", 2-D only; depthwise_copies.py): each tap copied
  into a (C, taps, outputs) matrix and one matmul per channel multiplies and
  sums them; no padding columns, so no cropping copy. Wins at 56x56 to 14x14.

Measured on shufflenet's 16 depthwise layers (bench/depthwise_layers.py, 2 threads, medians
over runs that varied by a third on this shared machine): batch 1, the whole-tensor tap method
this replaces 6.4-8.3 ms, this 2.5-3.2 ms, onnxruntime 0.5 ms; batch 8, 52-83 / 20-24 / 4.5-7 ms.
numpy's multiply (~10 G elements/s here) and einsum (~6 G multiply-adds/s: SSE loops) bound it;
the rest is the pad and transpose copies, whose rows are short. The copies layout then took the
16 layers' sum at batch 1 from 2.7 ms (the better of first/last per layer) to 2.0 ms in the same
run (onnxruntime 0.5), and shufflenet b1 from 8.0 to 7.6 ms (in-process A/B, 80 runs each).

The taps are summed in BLAS's and einsum's orders, so the last bit may differ from onnxruntime's;
minfer-ops-numba's loops, which outrank these where numba is installed, add them in its MLAS
Conv's order, bit for bit (their loops.py). That order here would cost: at MobileNetV2's shapes
the ordered adds took 1.1-1.6x as long as the first layout's product with ones, and a multiply
with ordered adds 2.3-5x as long as the copies layout's matmul (one thread, session 10).
"""

from __future__ import annotations

import math
import os
import threading
import time
from typing import Any, Callable, NamedTuple

import numpy as np

from minfer_core import choose, intra_op_threads, parallel_for, release_scratch, scratch

from . import _geometry as geo
from .depthwise_copies import Copies

Epilogue = Callable[[np.ndarray, tuple], None]
Plan = Callable[[np.ndarray, Any, np.ndarray, "np.ndarray | None", "Epilogue | None"], None]

# a block's scratch stays under this: measured flat from 2 MB to whole images at shufflenet's shapes
# (per-call costs outweigh L2 misses; L3 is 32 MB), slower at 512 kB
BLOCK_BYTES = 4 << 20
# below this many multiply-adds a conv runs on one thread: an empty 2-thread parallel_for costs ~50 us
# here, and two threads making short numpy calls wait on each other for the GIL. Interleaved A/B at
# shufflenet's shapes: 272x14x14 (0.48M) 128 -> 145 us split; 136x28x28 (0.96M) even; batch 8's
# 544x7x7 (1.9M) 635 -> 484 us and 272x14x14 stride 2 (0.96M) 379 -> 292 us.
MIN_SPLIT_MACS = 800_000
# splitting one image's channels needs more: inside shufflenet (batch 1), the first 136x28x28 layer
# took 430-560 us split and 300-360 us not (its neighbours' evictions, the worker's wake-up)
MIN_CHANNEL_SPLIT_MACS = 2_000_000
# TRY_SPLIT: the tuner also times each layout with one image's channels split over the threads, from
# MIN_TRY_SPLIT_MACS on, and keeps a split only when SPLIT_HANDICAP times its time still wins. Off: inside
# shufflenet b1 it chose no split (8.25 ms either way, 120 interleaved runs) while the trials grew the
# worker's scratch, peak memory 15.1 -> 19.7 MB. Worth turning on once the hand-over (~45 us now) is cheaper:
# alone, 136x28x28 took 171 us serial and 131 split, 112x56x56 s2 247 and 221.
TRY_SPLIT = False
MIN_TRY_SPLIT_MACS = 300_000
SPLIT_HANDICAP = 1.15
# output planes of at most this many cells, with at least this many channels, try channels-last first
# (shufflenet: 28x28 stride 2 to 14x14 took 98 us last, 140 first; 28x28 stride 1, 225 first, 296 last)
SMALL_PLANE = 400
MIN_LAST_CHANNELS = 32
# each thread keeps its zero-bordered input buffers (one per geometry and block size) up to this much
# (shufflenet batch 1: 5.3 MB, both layouts having been tried; the scratch stack and result add 2.6 MB)
PADDED_BYTES = 32 << 20
NUMPY2 = int(np.__version__.split(".")[0]) >= 2
# MINFER_CONV_TUNE=0 (as for conv.py): no timing at the first run, the layout follows the plane size
TUNE = os.environ.get("MINFER_CONV_TUNE", "1") != "0"


class _Group(NamedTuple):
    """The taps that read one phase plane: a regular grid of offsets into it."""

    phase: int
    row: int  # first product-stack row
    counts: tuple[int, ...]  # taps per spatial dim
    steps: tuple[int, ...]  # plane offset between neighbouring taps, per dim
    start: int  # plane offset of the first tap
    taps: list[int]  # flat kernel index of each product row


class _First:
    """Channels-first geometry: phase planes of per-dim length ``lengths``, one per stride phase used."""

    def __init__(self, w: geo.Window) -> None:
        rank = len(w.kernel)
        # plane u of phase a holds padded position u*s + a; tap t reads plane (t*d) % s from offset (t*d) // s
        self.lengths = tuple(o + (k - 1) * d // s for o, k, d, s in zip(w.out_shape, w.kernel, w.dilations, w.strides))
        rows = [math.prod(self.lengths[i + 1 :]) for i in range(rank)]
        dims = list(zip(w.kernel, w.dilations, w.strides, rows))
        self.phases = _product([sorted({t * d % s for t in range(k)}) for k, d, s, _ in dims])
        self.wide = w.out_shape[0] * rows[0]
        self.taps = math.prod(w.kernel)
        self.groups: list[_Group] = []
        for index, phase in enumerate(self.phases):
            per_dim = [[t for t in range(k) if t * d % s == a] for a, (k, d, s, _) in zip(phase, dims)]
            steps = tuple((ts[1] - ts[0]) * d // s * r if len(ts) > 1 else 0 for ts, (_, d, s, r) in zip(per_dim, dims))
            start = sum(ts[0] * d // s * r for ts, (_, d, s, r) in zip(per_dim, dims))
            taps = [int(np.ravel_multi_index(t, w.kernel)) for t in _product(per_dim)]
            row = sum(len(g.taps) for g in self.groups)
            self.groups.append(_Group(index, row, tuple(map(len, per_dim)), steps, start, taps))
        self.order = [t for g in self.groups for t in g.taps]
        reach = sum((k - 1) * d // s * r for k, d, s, r in dims)
        self.plane = max(math.prod(self.lengths), reach + self.wide)
        # (phase, plane slices, input slices) filling each plane's interior
        self.copies: list[tuple[int, tuple[slice, ...], tuple[slice, ...]]] = []
        for index, phase in enumerate(self.phases):
            cut = _interiors([_interior(a, n, b, s, size)
                              for a, n, b, s, size in zip(phase, w.in_shape, w.begin, w.strides, self.lengths)])
            if cut is not None:
                self.copies.append((index,) + cut)
        self.keep = (slice(None), slice(None)) + tuple(slice(0, o) for o in w.out_shape[1:])

    def scratch_per_channel(self) -> int:
        return self.taps * self.wide + len(self.phases) * self.plane + self.wide


class _Last:
    """Channels-last geometry: one (*padded, C) buffer, taps as a (*kernel, *out, C) view of it."""

    def __init__(self, w: geo.Window) -> None:
        rank = len(w.kernel)
        self.padded = tuple((o - 1) * s + (k - 1) * d + 1 for o, k, d, s in zip(w.out_shape, w.kernel, w.dilations, w.strides))
        self.copy = _interiors([_interior(0, n, b, 1, size) for n, b, size in zip(w.in_shape, w.begin, self.padded)])
        self.rows = [math.prod(self.padded[i + 1 :]) for i in range(rank)]  # times C: element strides
        self.kernel, self.out = w.kernel, w.out_shape
        self.steps = tuple(d * r for d, r in zip(w.dilations, self.rows)) + tuple(s * r for s, r in zip(w.strides, self.rows))
        letters_k, letters_o = "ijk"[:rank], "xyz"[:rank]
        self.spec = f"{letters_k}{letters_o}c,{letters_k}c->{letters_o}c"
        self.to_last = tuple(range(1, rank + 1)) + (0,)
        self.to_first = (rank,) + tuple(range(rank))

    def scratch_per_channel(self) -> int:
        return math.prod(self.padded) + math.prod(self.out)


def _interior(a: int, n: int, b: int, s: int, size: int) -> tuple[slice, slice] | None:
    """Cells u < size of phase a (padded position u*s + a) that hold input data: (cells, input slice)."""
    lo = max(0, -((a - b) // s))  # first u with u*s + a - b >= 0
    hi = min(size, -((a - b - n) // s))  # first u with u*s + a - b >= n
    if hi <= lo:
        return None
    first = lo * s + a - b
    return slice(lo, hi), slice(first, first + (hi - lo - 1) * s + 1, s)


def _interiors(cuts: list[tuple[slice, slice] | None]) -> tuple[tuple[slice, ...], tuple[slice, ...]] | None:
    """Per-dim interiors joined into (cells, input slices); None when some dim has no data at all."""
    found = [c for c in cuts if c is not None]
    if len(found) < len(cuts):
        return None
    return tuple(c[0] for c in found), tuple(c[1] for c in found)


def _product(lists: list[list[int]]) -> list[tuple[int, ...]]:
    result: list[tuple[int, ...]] = [()]
    for values in lists:
        result = [r + (v,) for r in result for v in values]
    return result


_local = threading.local()


def _thread_pool(attr: str, registry: list[dict]) -> dict:
    """This thread's buffer dict ``attr``, made (and listed in ``registry``, to be trimmed from any thread) once."""
    pool = _local.__dict__.get(attr)
    if pool is None:
        pool = _local.__dict__[attr] = {}
        registry.append(pool)
    return pool


_SCRATCH = ("depthwise-stack", "depthwise-acc")  # names of this module's per-thread scratch (minfer_core.scratch)


_all_padded: list[dict[tuple, np.ndarray]] = []  # every thread's padded-buffer pool, to drop a layout's from all


def _padded(key: tuple, size: int, dtype: np.dtype) -> np.ndarray:
    """A zeroed buffer per thread and key: callers only write its interior, so its borders stay zero."""
    pool = _thread_pool("padded", _all_padded)
    buf = pool.get(key)
    if buf is None:
        if sum(b.nbytes for b in pool.values()) + size * dtype.itemsize > PADDED_BYTES:
            pool.clear()  # many geometries: start over rather than hold them all
        buf = pool[key] = np.zeros(size, dtype=dtype)
    return buf


class _Choice(NamedTuple):
    layout: str
    units: list[tuple[int, int, int]]  # (image, c0, c1)
    parts: int  # ranges of units for parallel_for: 1 when the conv is too small to split


class _Depthwise:
    """The plan for one window: ``run(x, p, y, bias, epilogue)``, see `plan`."""

    def __init__(self, w: geo.Window, layout: str | None = None) -> None:
        self.window = w
        self.layout = layout
        self.first = _First(w)
        self.last = _Last(w)
        self.copies = Copies(w) if Copies.applies(w) else None
        self._key = (w.in_shape, w.kernel, w.strides, w.dilations, w.begin, w.out_shape)
        self._weights: tuple[Any, np.dtype, np.ndarray, np.ndarray, np.ndarray] | None = None
        self._choices: dict[tuple, _Choice] = {}
        self._prior: str | None = None  # the layout and split an earlier input shape chose: a new one takes them
        self._ones: dict[np.dtype, np.ndarray] = {}

    def __call__(self, x: np.ndarray, p: Any, y: np.ndarray, bias: np.ndarray | None,
                 epilogue: Epilogue | None) -> None:
        n, c = x.shape[:2]
        if y.size == 0:
            return
        work = x.dtype if x.dtype in (np.float32, np.float64) else np.dtype(np.float32)
        threads = intra_op_threads()
        key = (n, c, work, threads)
        choice = self._choices.get(key)
        if choice is None:
            choice = self._choices[key] = self._choose(x, p, y, work, threads)
        self._run(choice, x, p, y, bias, epilogue, work)

    def _prepared(self, p: Any, dtype: np.dtype) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Weights (taps, C) in kernel order and in product-stack order, and (C, 1, taps) rows for the copies
        layout's matmul; kept while p.depthwise is the same."""
        cached = self._weights
        if cached is None or cached[0] is not p.depthwise or cached[1] != dtype:
            weights = np.ascontiguousarray(p.depthwise.T, dtype=dtype)
            rows = np.ascontiguousarray(p.depthwise, dtype=dtype).reshape(p.depthwise.shape[0], 1, -1)
            cached = self._weights = (p.depthwise, dtype, weights, np.ascontiguousarray(weights[self.first.order]), rows)
        return cached[2], cached[3], cached[4]

    def _macs(self, n: int, c: int) -> int:
        return n * c * self.first.taps * math.prod(self.window.out_shape)

    def _cut(self, layout: str, n: int, c: int, itemsize: int, threads: int, split: bool | None = None) -> _Choice:
        """(image, channel block) units whose scratch fits BLOCK_BYTES, split over threads as asked (None: when
        the conv has enough multiply-adds)."""
        per_channel = self._geometry(layout).scratch_per_channel()
        blocks = math.ceil(c * per_channel * itemsize / BLOCK_BYTES)
        if split is None:
            split = self._macs(n, c) >= (MIN_SPLIT_MACS if n >= threads else MIN_CHANNEL_SPLIT_MACS)
        split = split and threads > 1
        if split and n * blocks < threads:
            blocks = math.ceil(threads / n)
        step = math.ceil(c / min(c, blocks))
        units = [(i, c0, min(c, c0 + step)) for i in range(n) for c0 in range(0, c, step)]
        return _Choice(layout, units, min(threads, len(units)) if split else 1)

    def _geometry(self, layout: str) -> _First | _Last | Copies:
        geometry = self.first if layout == "first" else self.last if layout == "last" else self.copies
        if geometry is None:
            raise ValueError(f"the {layout!r} layout does not apply to window {self.window}")
        return geometry

    def _choose(self, x: np.ndarray, p: Any, y: np.ndarray, work: np.dtype, threads: int) -> _Choice:
        """The forced layout, else the quickest layout (TUNE: timed or as stored), else by plane size.

        With TRY_SPLIT, tuning also times each layout split over the threads and not, when there are fewer
        images than threads: whether splitting one image's channels pays depends on more than the
        multiply-adds (112x56x56 stride 2, 0.8M, spends most of its time copying its large input). Images
        are split by the rule (MIN_SPLIT_MACS): timing that too picked the serial run for some of
        shufflenet's batch-8 layers, by noise.
        """
        n, c = x.shape[:2]
        if self.layout:
            layouts = [self.layout]
        elif math.prod(self.window.out_shape) <= SMALL_PLANE and c >= MIN_LAST_CHANNELS:
            layouts = ["last", "copies", "first"]
        else:
            layouts = ["copies", "first", "last"]
        if self.copies is None and not self.layout:
            layouts.remove("copies")
        choices = [self._cut(layout, n, c, work.itemsize, threads) for layout in layouts]
        if self.layout or not TUNE:
            return choices[0]
        if TRY_SPLIT and 1 < threads and n < threads and self._macs(n, c) >= MIN_TRY_SPLIT_MACS:
            choices += [self._cut(ch.layout, n, c, work.itemsize, threads, split=ch.parts == 1) for ch in choices]
        def seconds(i: int) -> float:
            start = time.perf_counter()
            self._run(choices[i], x, p, y, None, None, work)
            # a split must win clearly: inside a model the other thread wakes up slower than here
            return (time.perf_counter() - start) * (SPLIT_HANDICAP if choices[i].parts > 1 else 1)

        # stored by the core (minfer_core.choose) per window and input: a later process skips the timing
        names = [f"{ch.layout}/{ch.parts}/{len(ch.units)}" for ch in choices]
        same = [name for name in names if name.rsplit("/", 1)[0] == self._prior]  # the layout and split, any units
        won = choose(f"depthwise|{self._key}|n={n}|c={c}|{work}|threads={threads}", names, seconds, (same or [None])[0])
        best, self._prior = choices[won], names[won].rsplit("/", 1)[0]
        # the losers' zero-bordered buffers (other layouts, other block sizes) would stay cached for nothing
        # (shufflenet b1: 4 MB)
        kept = {(best.layout, c1 - c0) for _, c0, c1 in best.units}
        for pool in list(_all_padded):
            # list(pool) copies the keys in one step under the GIL: another thread may be adding to its pool
            for key in [k for k in list(pool) if k[:2] not in kept and k[3:] == self._key]:
                pool.pop(key, None)
        if best.parts == 1 and any(ch.parts > 1 for ch in choices):
            # a losing split grew the other threads' scratch (shufflenet b1: 4.5 MB more peak memory); a
            # plan that does split makes it again at its next run
            release_scratch(*_SCRATCH, others_only=True)
        return best

    def _run(self, choice: _Choice, x: np.ndarray, p: Any, y: np.ndarray, bias: np.ndarray | None,
             epilogue: Epilogue | None, work: np.dtype) -> None:
        in_order, by_group, rows = self._prepared(p, work)
        bias_col = None if bias is None else bias.reshape((x.shape[1],) + (1,) * (x.ndim - 2))
        layout = choice.layout
        units = choice.units

        def span(lo: int, hi: int) -> None:
            with np.errstate():
                # numpy 2 copies strided operands whose rows are shorter than its ufunc buffer into that
                # buffer (2-3x slower here): a buffer shorter than any row lets it read them in place.
                # numpy 2 scopes the setting to this errstate block; numpy 1 would keep it for the thread
                if NUMPY2:
                    np.setbufsize(64)
                for i, c0, c1 in units[lo:hi]:
                    b = None if bias_col is None else bias_col[c0:c1]
                    if layout == "copies":
                        self._block_copies(x[i, c0:c1], rows[c0:c1], y[i, c0:c1], work, b)
                    elif layout == "first":
                        self._block_first(x[i, c0:c1], by_group[:, c0:c1], y[i, c0:c1], work, b)
                    else:
                        self._block_last(x[i, c0:c1], in_order[:, c0:c1], y[i, c0:c1], work, b)
                    if epilogue is not None:
                        epilogue(y, (slice(i, i + 1), slice(c0, c1)))

        parallel_for(len(units), span, parts=choice.parts, outputs_only=True)  # a unit writes only its y block

    def _block_first(self, x: np.ndarray, weights: np.ndarray, y: np.ndarray, work: np.dtype,
                     bias: np.ndarray | None) -> None:
        """One channels-first block: x (cb, *in) -> y (cb, *out); weights (taps, cb) in stack order."""
        g, cb, item = self.first, x.shape[0], work.itemsize
        planes = _padded(("first", cb, work) + self._key, len(g.phases) * cb * g.plane, work)
        grid = planes.reshape(len(g.phases), cb, g.plane)[:, :, : math.prod(g.lengths)]
        for index, cells, part in g.copies:
            np.copyto(grid[index].reshape((cb,) + g.lengths)[(slice(None),) + cells], x[(slice(None),) + part],
                      casting="same_kind")
        stack = scratch(_SCRATCH[0], (g.taps, cb, g.wide), work)
        for group in g.groups:
            rows = slice(group.row, group.row + len(group.taps))
            taps = np.ndarray(group.counts + (cb, g.wide), work, planes, (group.phase * cb * g.plane + group.start) * item,
                              tuple(s * item for s in group.steps) + (g.plane * item, item))
            np.multiply(taps, weights[rows].reshape(group.counts + (cb, 1)),
                        out=stack[rows].reshape(group.counts + (cb, g.wide)))
        acc = scratch(_SCRATCH[1], (cb * g.wide,), work)
        ones = self._ones.get(work)
        if ones is None:
            ones = self._ones[work] = np.ones(g.taps, dtype=work)
        np.dot(ones, stack.reshape(g.taps, -1), out=acc)
        if bias is not None:  # here, where rows are long, not on y's short rows
            wide = acc.reshape(cb, g.wide)
            wide += bias.reshape(cb, 1)
        np.copyto(y, acc.reshape((cb, self.window.out_shape[0]) + g.lengths[1:])[g.keep], casting="same_kind")

    def _block_copies(self, x: np.ndarray, weights: np.ndarray, y: np.ndarray, work: np.dtype,
                      bias: np.ndarray | None) -> None:
        """One copies block: x (cb, H, W) -> y (cb, oh, ow); weights (cb, 1, taps)."""
        g, cb = self.copies, x.shape[0]
        assert g is not None
        planes = _padded(("copies", cb, work) + self._key, len(g.phases) * cb * g.plane, work)
        cols = scratch(_SCRATCH[0], (cb * g.taps * g.outputs,), work)
        acc = None if g.direct(y, work) else scratch(_SCRATCH[1], (cb, 1, g.outputs), work)
        g.block(x, weights, y, planes.reshape(len(g.phases), cb, g.plane), cols.reshape(cb, g.taps, g.outputs),
                acc, bias)

    def _block_last(self, x: np.ndarray, weights: np.ndarray, y: np.ndarray, work: np.dtype,
                    bias: np.ndarray | None) -> None:
        """One channels-last block: x (cb, *in) -> y (cb, *out); weights (taps, cb) in kernel order."""
        g, cb, item = self.last, x.shape[0], work.itemsize
        buf = _padded(("last", cb, work) + self._key, math.prod(g.padded) * cb, work)
        if g.copy is not None:
            cells, part = g.copy
            np.copyto(buf.reshape(g.padded + (cb,))[cells], x[(slice(None),) + part].transpose(g.to_last),
                      casting="same_kind")
        taps = np.ndarray(g.kernel + g.out + (cb,), work, buf, 0, tuple(s * cb * item for s in g.steps) + (item,))
        acc = scratch(_SCRATCH[1], g.out + (cb,), work)
        np.einsum(g.spec, taps, weights.reshape(g.kernel + (cb,)), out=acc)
        if bias is not None:  # here, where rows run over channels, not on y's short rows
            acc += bias.reshape(cb)
        np.copyto(y, acc.transpose(g.to_first), casting="same_kind")


def plan(w: geo.Window, layout: str | None = None) -> Plan:
    """The depthwise method for one input geometry: ``run(x, p, y, bias, epilogue)``.

    ``x`` (N, C, *in), any strides (each layout copies it once) and float dtype (float16 is computed in
    float32); ``p.depthwise`` (C, prod(kernel)) weights in `Window.taps` order; ``y`` (N, C, *out)
    C-contiguous, written whole; ``bias`` None or C values (shaped (C,) or (C, 1, ..., 1));
    ``epilogue(y, region)`` is called once per finished (image, channel block), ``region = (slice(i, i + 1),
    slice(c0, c1))``, possibly from several threads at once. ``layout`` forces "first" or "last"
    (channels) or "copies" (2-D only, see depthwise_copies.py), for tests and benchmarks.
    """
    return _Depthwise(w, layout)
