"""The memory planner: liveness over the execution order, alias groups, offsets in one arena.

Every intermediate value (a node output) is a *buffer* unless it shares memory
with another value: a view (Reshape, Flatten, a kernel returning its input)
or an in-place result. Values that share memory form an alias group whose
one buffer must stay reserved from the first definition to the last use of
any member. Buffers whose lifetimes do not overlap may share bytes: each gets
an offset in one arena, chosen greedily (best-fit gap, blocks taken largest
first as in TFLite's "greedy by size", or by lifetime; the better order wins),
which lands within a few percent of the live-set lower bound on the CNNs.

This module knows no operator: the engine hands it sizes, definition and
last-use steps, and alias edges.
"""

from __future__ import annotations

import itertools
from typing import Callable, Iterable, Mapping, Sequence

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
    return max(0, *itertools.accumulate(delta))  # the live size after each step's changes


# Orders in which `place` tries the blocks: largest first is TFLite's "greedy by size";
# longest-lived or largest size x lifetime first wins on DenseNet-like graphs, where
# long-lived concat inputs otherwise fragment the arena (1.06x vs 1.11x the bound).
ORDERS: tuple[Callable[[Block], tuple[int, ...]], ...] = (
    lambda b: (-b.size, b.start, b.key),
    lambda b: (-b.size * (b.end - b.start + 1), b.start, b.key),
    lambda b: (-(b.end - b.start), -b.size, b.key),
)


def place(blocks: Sequence[Block]) -> tuple[dict[int, int], int]:
    """Offsets for ``blocks`` so that blocks live at the same step never overlap in bytes.

    For each order in `ORDERS`, each block goes into the smallest gap between
    already-placed, time-overlapping blocks that holds it (best fit), else
    above them all; the order giving the smallest arena wins.
    """
    return min((_place_in_order(sorted(blocks, key=order)) for order in ORDERS), key=lambda placed: placed[1])


def _place_in_order(blocks: Sequence[Block]) -> tuple[dict[int, int], int]:
    placed: list[tuple[int, int, int, int]] = []  # per block: start, end, offset, aligned size
    top = 0
    for b in blocks:
        size = align(b.size)
        busy = sorted((off, n) for start, end, off, n in placed if start <= b.end and b.start <= end)
        placed.append((b.start, b.end, _best_gap(busy, size), size))
        top = max(top, placed[-1][2] + size)
    return {b.key: p[2] for b, p in zip(blocks, placed)}, top


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

