"""Sliding-window geometry shared by conv and pooling: pads, output sizes, strided views."""

from __future__ import annotations

import itertools
import math
from typing import Iterator, Sequence

import attrs
import numpy as np
from numpy.lib.stride_tricks import as_strided


@attrs.frozen
class Window:
    """Where a sliding window goes over the spatial dims of one input shape.

    ``begin``/``end`` are the pads applied before and after each spatial dim;
    ``end`` may exceed the declared pads when ceil_mode lets the last window
    run past the padded input (those cells never count as data).
    """

    in_shape: tuple[int, ...]
    kernel: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    begin: tuple[int, ...]
    end: tuple[int, ...]
    declared_end: tuple[int, ...]
    out_shape: tuple[int, ...]

    @property
    def padded(self) -> bool:
        return any(self.begin) or any(self.end)

    def taps(self) -> Iterator[tuple[slice, ...]]:
        """One tuple of spatial slices per kernel tap, each selecting that tap over all outputs."""
        ranges = [range(k) for k in self.kernel]
        for tap in itertools.product(*ranges):
            yield tuple(
                slice(t * d, t * d + (o - 1) * s + 1, s)
                for t, d, o, s in zip(tap, self.dilations, self.out_shape, self.strides)
            )


def _ints(value: Sequence[int] | None, n: int, fill: int) -> tuple[int, ...]:
    return tuple(int(v) for v in value) if value else (fill,) * n


def window(
    in_shape: Sequence[int],
    kernel: Sequence[int],
    *,
    strides: Sequence[int] | None = None,
    dilations: Sequence[int] | None = None,
    pads: Sequence[int] | None = None,
    auto_pad: str = "NOTSET",
    ceil_mode: int = 0,
    clamp_same: bool = False,
) -> Window:
    """Resolve pads and output size the way onnxruntime does for Conv and the pools.

    ``clamp_same``: Conv never pads SAME by a negative amount; the pools do.
    """
    n = len(in_shape)
    strides = _ints(strides, n, 1)
    dilations = _ints(dilations, n, 1)
    kernel = tuple(int(k) for k in kernel)
    span = [(k - 1) * d + 1 for k, d in zip(kernel, dilations)]
    if auto_pad in ("SAME_UPPER", "SAME_LOWER"):
        out = [math.ceil(i / s) for i, s in zip(in_shape, strides)]
        # negative when stride > kernel: onnxruntime then skips leading cells, and so do we
        total = [(o - 1) * s + e - i for o, s, e, i in zip(out, strides, span, in_shape)]
        if clamp_same:
            total = [max(0, t) for t in total]
        # C-style truncating halves, as onnxruntime computes them (matters for negative totals)
        upper = [int(t / 2) for t in total]
        lower = [int((t + 1) / 2) for t in total]
        begin = upper if auto_pad == "SAME_UPPER" else lower
        end = [t - b for t, b in zip(total, begin)]
    else:
        if auto_pad == "VALID":
            pads = None
        p = _ints(pads, 2 * n, 0)
        begin, end = list(p[:n]), list(p[n:])
        out = []
        for i, s, e, b, f in zip(in_shape, strides, span, begin, end):
            size = (i + b + f - e) / s + 1
            o = math.ceil(size) if ceil_mode else math.floor(size)
            # the last window must start inside the input or the leading pad
            if ceil_mode and (o - 1) * s >= i + b:
                o -= 1
            out.append(max(o, 0))
    declared_end = tuple(end)
    # ceil_mode may need more trailing cells than the declared pads provide
    end = [max(f, (o - 1) * s + e - i - b) for f, o, s, e, i, b in zip(end, out, strides, span, in_shape, begin)]
    return Window(tuple(in_shape), kernel, strides, dilations, tuple(begin), tuple(end), declared_end, tuple(out))


def pad(x: np.ndarray, w: Window, value: float = 0.0) -> np.ndarray:
    """x padded on its trailing spatial dims as ``w`` asks (x itself when no pad is needed)."""
    if not w.padded:
        return x
    lead = x.ndim - len(w.in_shape)
    if any(b < 0 for b in w.begin) or any(e < 0 for e in w.end):
        crop = tuple(slice(max(0, -b), i - max(0, -e)) for b, e, i in zip(w.begin, w.end, w.in_shape))
        x = x[(slice(None),) * lead + crop]
        w = attrs.evolve(w, in_shape=x.shape[lead:], begin=tuple(max(0, b) for b in w.begin),
                         end=tuple(max(0, e) for e in w.end))
        if not w.padded:
            return x
    shape = x.shape[:lead] + tuple(i + b + e for i, b, e in zip(w.in_shape, w.begin, w.end))
    out = np.full(shape, value, dtype=x.dtype)
    inner = (slice(None),) * lead + tuple(slice(b, b + i) for b, i in zip(w.begin, w.in_shape))
    out[inner] = x
    return out


def im2col_view(xp: np.ndarray, w: Window) -> np.ndarray:
    """A (N, C, *kernel, *out) strided view of padded input xp: no copy."""
    n, c = xp.shape[:2]
    sp = xp.strides[2:]
    shape = (n, c) + w.kernel + w.out_shape
    strides = xp.strides[:2] + tuple(st * d for st, d in zip(sp, w.dilations))
    strides += tuple(st * s for st, s in zip(sp, w.strides))
    if not xp.flags.c_contiguous:
        return as_strided(xp, shape, strides, writeable=False)
    # the same view made directly on xp's buffer: ~1 us against as_strided's ~5 (more while another thread
    # holds the GIL; profiled inside resnet50 b1, as_strided was a seventh of all the time the GIL was held)
    view = np.ndarray(shape, xp.dtype, xp, 0, strides)
    view.flags.writeable = False
    return view


def tap_counts(w: Window, include_pad: bool) -> np.ndarray:
    """How many taps of each output window fall on data (or on data and declared pads)."""
    counts = np.ones((), dtype=np.float64)
    for i, k, s, d, b, f, o in zip(w.in_shape, w.kernel, w.strides, w.dilations, w.begin, w.declared_end, w.out_shape):
        pos = np.arange(o)[:, None] * s - b + np.arange(k)[None, :] * d
        lo, hi = (-b, i + f) if include_pad else (0, i)
        per_dim = ((pos >= lo) & (pos < hi)).sum(axis=1)
        counts = np.multiply.outer(counts, per_dim)
    return counts


@attrs.frozen
class Segment:
    """One kernel tap along one spatial axis: outputs ``lo:hi`` read inputs ``start, start + step, ...``."""

    lo: int
    hi: int
    start: int
    step: int

    @property
    def dst(self) -> slice:
        return slice(self.lo, self.hi)

    @property
    def src(self) -> slice:
        return slice(self.start, self.start + (self.hi - self.lo - 1) * self.step + 1, self.step)


def axis_segments(w: Window, axis: int) -> list[Segment]:
    """Per kernel tap along spatial ``axis``, the outputs whose tap falls on data; widest first, empty ones dropped.

    Reading only these ranges reduces a window without a padded copy: a pad
    cell never contributes, so max and sum simply skip it.
    """
    n_in, k, s, d, b, n_out = (v[axis] for v in (w.in_shape, w.kernel, w.strides, w.dilations, w.begin, w.out_shape))
    segments = []
    for t in range(k):
        first = t * d - b  # input position of this tap for output 0
        lo = max(0, -(first // s))  # smallest o with o*s + first >= 0
        hi = min(n_out, (n_in - 1 - first) // s + 1)
        if hi > lo:
            segments.append(Segment(lo, hi, lo * s + first, s))
    return sorted(segments, key=lambda g: g.lo - g.hi)


def covers_input(w: Window) -> bool:
    """True when there is a single output window and it reads every input cell (a global pool)."""
    return all(
        o == 1 and set(range(i)) <= {t * d - b for t in range(k)}
        for i, k, d, b, o in zip(w.in_shape, w.kernel, w.dilations, w.begin, w.out_shape)
    )


@attrs.frozen
class PaddedAxis:
    """One spatial axis laid out padded: ``before`` fill cells, input cells ``crop:crop + keep``, then fill up to ``length``."""

    crop: int
    keep: int
    before: int
    length: int


def padded_axis(w: Window, axis: int) -> PaddedAxis:
    """The padded layout of spatial ``axis`` (negative pads crop the input, as `pad` does)."""
    n, b, e = w.in_shape[axis], w.begin[axis], w.end[axis]
    crop, keep = max(0, -b), max(0, n - max(0, -b) - max(0, -e))
    return PaddedAxis(crop, keep, max(0, b), max(0, b) + keep + max(0, e))


def phase_taps(w: Window, axis: int) -> tuple[tuple[int, int], ...]:
    """Per kernel tap along ``axis``: (row offset, phase) when the padded axis is split into ``stride`` phases.

    Phase p holds padded cells p, p + s, p + 2s, ...; output o's tap t reads
    padded cell o*s + t*d, which is row o + offset of phase (t*d) % s: each tap
    is then one contiguous run of a phase, whatever the stride.
    """
    s, d = w.strides[axis], w.dilations[axis]
    return tuple(divmod(t * d, s) for t in range(w.kernel[axis]))


def clip_segments(segments: list[Segment], lo: int, hi: int) -> list[Segment]:
    """The segments restricted to outputs ``lo:hi``, renumbered from ``lo``; widest first."""
    out = []
    for g in segments:
        a, b = max(g.lo, lo), min(g.hi, hi)
        if b > a:
            out.append(Segment(a - lo, b - lo, g.start + (a - g.lo) * g.step, g.step))
    return sorted(out, key=lambda g: g.lo - g.hi)
