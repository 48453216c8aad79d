"""Pad-11 and later (float32, constant pads of at least zero): one compiled copy into the output.

minfer-ops-basic's kernel pads by numpy slices, an axis at a time (np.pad for wider reflections): a dozen numpy
calls, and in a run, where their Python has left the cache since the node last ran, the OCR recognizer's
1x48x16x32 reflect Pad took 28.5 us of its 230. Pad's modes are gathers along each axis, one after another
(np.pad pads the axes in turn, a corner from values already padded): output index i of an axis reads input index
``map[i]`` of that axis, where the map is np.pad of the axis's indices in the node's mode (-1 where a constant
pads). So the whole output is one pass (`_gather`): each output row (the last axis) copies its input row's run
where every other axis maps inside, the constant where one does not, and the last axis's borders by its map.
Each value is copied, never computed: numpy's bytes (NaN payloads and -0.0 too).

``applies``: float32 data of known rank, pads (and axes, and the constant value) constant, no pad below zero
(a negative pad crops: numpy's view), one of the four modes (wrap from Pad-19, as the schema says).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import kernel

from ._jit import F32, PRIORITY, delivered, input_type, jit, readonly, target, uintp  # noqa: F401 (uintp: numba's)

MODES = ("constant", "reflect", "edge", "wrap")


@jit
def _gather(x, out, shape, strides, maps, value, begin, inner):  # pragma: no cover - compiled
    """out (flat, of ``shape``) = x (flat) gathered along each axis: output index i of axis a reads input index
    maps[a, i] (-1: ``value``), x's axis a ``strides[a]`` elements apart; on the last axis the run
    begin..begin + inner reads inner consecutive values (a copy), the rest by its map."""
    rank = shape.size
    width = shape[rank - 1]
    last = maps[rank - 1]
    at = np.zeros(rank, np.int64)  # the output row's index on each axis but the last
    for row in range(out.size // width if width else 0):
        base, inside = 0, True
        for a in range(rank - 1):
            m = maps[a, at[a]]
            if m < 0:
                inside = False
                break
            base += m * strides[a]
        o = row * width
        if not inside:
            for j in range(width):
                out[uintp(o + j)] = value
        else:
            for j in range(begin):
                m = last[j]
                out[uintp(o + j)] = value if m < 0 else x[uintp(base + m * strides[rank - 1])]
            src = base + last[begin] * strides[rank - 1] if inner else 0
            for j in range(inner):
                out[uintp(o + begin + j)] = x[uintp(src + j)]
            for j in range(begin + inner, width):
                m = last[j]
                out[uintp(o + j)] = value if m < 0 else x[uintp(base + m * strides[rank - 1])]
        for a in range(rank - 2, -1, -1):  # the next row
            at[a] += 1
            if at[a] < shape[a]:
                break
            at[a] = 0


def _maps(shape: tuple[int, ...], widths: list[tuple[int, int]], mode: str) -> tuple[np.ndarray, np.ndarray, int, int]:
    """(the output shape, the maps (rank, longest output axis), the last axis's begin pad and input length): each
    axis's map np.pad's of its indices in ``mode`` (-1 where a constant pads). np.pad's errors (a reflection of an
    empty axis) are the kernel's, as minfer-ops-basic's."""
    out_shape = tuple(n + b + e for n, (b, e) in zip(shape, widths))
    maps = np.full((len(shape), max(out_shape, default=0) or 1), -1, np.int64)
    for a, (n, (b, e)) in enumerate(zip(shape, widths)):
        index = np.arange(n, dtype=np.int64)
        if mode == "constant":
            found = np.pad(index, (b, e), mode="constant", constant_values=-1)
        else:
            found = np.pad(index, (b, e), mode=mode) if b or e else index
        maps[a, :found.size] = found
    begin, inner = widths[-1][0], shape[-1]
    if mode != "constant" and not (inner and np.array_equal(maps[-1, begin:begin + inner], np.arange(inner))):
        inner = 0  # (a map np.pad made otherwise: the whole row by the map)
    return out_shape, readonly(maps), begin, inner


def _widths(rank: int, pads: np.ndarray, axes: np.ndarray | None) -> list[tuple[int, int]] | None:
    """Each axis's (begin, end) pad from Pad's pads over its axes (all when None), None where they do not fit."""
    pads = [int(p) for p in np.asarray(pads).reshape(-1)]
    given = None if axes is None else [int(a) for a in np.asarray(axes).reshape(-1)]
    axes = list(range(rank)) if given is None else [a + rank if a < 0 else a for a in given]
    if len(pads) != 2 * len(axes) or any(not 0 <= a < rank for a in axes) or len(set(axes)) != len(axes):
        return None
    widths = [(0, 0)] * rank
    for i, axis in enumerate(axes):
        widths[axis] = (pads[i], pads[len(axes) + i])
    return widths


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 data of known rank (at least 1), constant pads of at least zero fitting it (and constant axes and
    value when given), a known mode (wrap from Pad-19)."""
    x = input_type(ctx, 0)
    if x is None or x.dtype != F32 or x.rank is None or x.rank < 1:
        return False
    mode = attrs.get("mode", "constant")
    mode = mode.decode() if isinstance(mode, bytes) else mode
    if mode not in MODES or (mode == "wrap" and ctx.opset < 19):
        return False
    consts = tuple(ctx.constants) + (None,) * 4
    given = [i < len(ctx.input_types) and ctx.input_types[i] is not None for i in range(4)]
    if consts[1] is None or any(given[i] and consts[i] is None for i in (2, 3)):
        return False
    widths = _widths(x.rank, consts[1], consts[3])
    value = consts[2]
    return widths is not None and all(b >= 0 and e >= 0 for b, e in widths) and (value is None or value.size == 1)


def _prepare(ctx: Any, mode: Any) -> Any:
    """The run callable: the output by `_gather` over the maps made once an input shape."""
    consts = tuple(ctx.constants) + (None,) * 4
    mode = mode.decode() if isinstance(mode, bytes) else mode
    rank = input_type(ctx, 0).rank
    widths = _widths(rank, consts[1], consts[3])
    value = F32.type(0) if consts[2] is None else F32.type(np.asarray(consts[2]).reshape(-1)[0])
    plans: dict[tuple[int, ...], tuple[Any, ...]] = {}
    x0 = readonly(np.zeros((2,) * rank, F32))  # compiled (or loaded) at build, not in the first run
    shape0, maps0, begin0, inner0 = _maps(x0.shape, [(0, 0)] * rank, "constant")
    _gather(x0.reshape(-1), np.empty(x0.size, F32), np.asarray(shape0, np.int64), readonly(np.ones(rank, np.int64)),
            maps0, value, begin0, inner0)

    def run(data, pads=None, constant_value=None, axes=None, *, out=None):
        plan = plans.get(data.shape)
        if plan is None:
            out_shape, maps, begin, inner = _maps(data.shape, widths, mode)
            strides = np.cumprod((1,) + data.shape[:0:-1], dtype=np.int64)[::-1]  # C order's, in elements
            plan = plans[data.shape] = (out_shape, np.asarray(out_shape, np.int64), readonly(strides.copy()), maps,
                                        begin, inner)
        out_shape, shape, strides, maps, begin, inner = plan
        y = target(out, out_shape, F32)
        if y.size:
            x = readonly(np.ascontiguousarray(data)).reshape(-1)
            _gather(x, y.reshape(-1), shape, strides, maps, value, begin, inner)
        return delivered(y, out)

    return run


@kernel("Pad", since=11, priority=PRIORITY, prepare=True, out=True, views=False, applies=_applies)
def pad_11(ctx, *, mode="constant"):
    """Pad-11/13 (float32, constant pads >= 0): one compiled gather (the module docstring)."""
    return _prepare(ctx, mode)


@kernel("Pad", since=18, priority=PRIORITY, prepare=True, out=True, views=False, applies=_applies)
def pad_18(ctx, *, mode="constant"):
    """Pad-18 and later (float32, constant pads >= 0, constant axes): one compiled gather (the module docstring)."""
    return _prepare(ctx, mode)
