"""The memory planner: liveness over the execution order, alias groups, offsets in one arena.

Every intermediate value (a node output) is a *buffer* unless it shares memory
with another value: a view (Reshape, Flatten, a kernel returning its input)
or an in-place result. Values that share memory form an alias group whose
one buffer must stay reserved from the first definition to the last use of
any member. Buffers whose lifetimes do not overlap may share bytes: each gets
an offset in one arena, chosen greedily largest-first at the lowest gap that
fits (TFLite's "greedy by size"), which lands close to the live-set lower
bound on CNN-shaped graphs.

This module knows no operator: the engine hands it sizes, definition and
last-use steps, and alias edges.
"""

from __future__ import annotations

from typing import Iterable, Mapping, Sequence

import attrs

ALIGN = 64  # cache-line alignment keeps SIMD loads in numpy on their fast path


@attrs.frozen
class Block:
    """One buffer to place: ``size`` bytes live from step ``start`` to step ``end`` inclusive."""

    key: int
    size: int
    start: int
    end: int


@attrs.frozen
class ArenaPlan:
    """Where each block lives in the arena, and the numbers `Engine.memory_report` shows."""

    offsets: Mapping[int, int]
    arena_bytes: int
    naive_bytes: int
    live_set_bytes: int


def align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


def live_set_bytes(blocks: Iterable[Block], steps: int) -> int:
    """The largest total size of blocks live at one step: no plan can use less."""
    delta = [0] * (steps + 2)
    for b in blocks:
        delta[b.start] += b.size
        delta[b.end + 1] -= b.size
    best = cur = 0
    for d in delta:
        cur += d
        best = max(best, cur)
    return best


def place(blocks: Sequence[Block]) -> tuple[dict[int, int], int]:
    """Offsets for ``blocks`` so that blocks live at the same step never overlap in bytes.

    Largest first; each goes into the smallest gap between already-placed,
    time-overlapping blocks that holds it (best fit), else above them all.
    """
    placed: list[Block] = []
    offsets: dict[int, int] = {}
    top = 0
    for b in sorted(blocks, key=lambda b: (-b.size, b.start, b.key)):
        size = align(b.size)
        busy = sorted((offsets[p.key], align(p.size)) for p in placed if p.start <= b.end and b.start <= p.end)
        offsets[b.key] = _best_gap(busy, size)
        top = max(top, offsets[b.key] + size)
        placed.append(b)
    return offsets, top


def _best_gap(busy: list[tuple[int, int]], size: int) -> int:
    best: tuple[int, int] | None = None  # (gap size, offset)
    cursor = 0
    for off, length in busy:
        gap = off - cursor
        if gap >= size and (best is None or gap < best[0]):
            best = (gap, cursor)
        cursor = max(cursor, off + length)
    return best[1] if best is not None else cursor


def plan_arena(blocks: Sequence[Block], steps: int, naive_bytes: int) -> ArenaPlan:
    """Place ``blocks`` in one arena and measure the result against the live-set bound."""
    offsets, top = place(blocks)
    return ArenaPlan(offsets, top, naive_bytes, live_set_bytes(blocks, steps))


class AliasSets:
    """Union-find over value keys: values that may share memory end up in one set."""

    def __init__(self) -> None:
        self._parent: dict[int, int] = {}

    def find(self, key: int) -> int:
        parent = self._parent.setdefault(key, key)
        if parent != key:
            parent = self._parent[key] = self.find(parent)
        return parent

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra != rb:
            # the smaller key (defined earlier in the order) stays the root
            lo, hi = sorted((ra, rb))
            self._parent[hi] = lo


def group_ends(keys: Iterable[int], last_use: Mapping[int, int], sets: AliasSets) -> dict[int, int]:
    """Per alias-set root, the last step at which any member is read."""
    ends: dict[int, int] = {}
    for k in keys:
        root = sets.find(k)
        ends[root] = max(ends.get(root, -1), last_use.get(k, -1))
    return ends

