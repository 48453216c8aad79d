"""Inter-op parallelism: independent branches of a graph run at the same time.

At batch 1 many kernels are too small to split well over two cores (handing
work to the second thread costs 15-60 us), but branchy graphs hold nodes
that do not depend on each other: an inception module's four branches, a
squeezenet fire module's two expand convs, a shufflenet unit's pool beside
its conv chain. A `Stage` is a run of consecutive steps of the execution
order whose dependency graph falls apart into independent *branches*; the
run loop hands the branches to the intra-op pool's threads, each running
its branch's steps in order, and the kernels' own `parallel_for` ranges go
to whichever thread is free (sharing.py), so the long branch gets the second
core once the short ones are done.

Which stages pay is measured per input shape, as the conv tuner measures its
methods (`Calibration`): two timed sequential runs give each step's time;
the runs of steps that could save time if their branches overlapped
perfectly (`choose`) then run as stages twice, timed; the stages that ran
clearly faster than their steps one after another are kept, the others run
sequentially again. A stage can pay when its branches are comparable and
made of kernels that split poorly; it does not when one branch is a big conv
that already uses both cores (squeezenet's fire modules, 5-15% slower as
stages). Two kernels running at once also contend for the GIL in their
Python parts: on the 2-core VM this was written on, with the intra-op pool
handing over in ~10 us, whole-model times with every stage on were within
2% of the sequential loop's (inception_v2 b1 30.5-30.8 ms vs 31.2).

The memory plan treats a stage as one moment (the core's plan.py): every value a stage
reads lives to its end, every value it writes from its start, and a kernel
in a stage works in place only on a buffer its own branch made. Results are
bitwise those of the sequential loop: the same kernels compute the same
ranges; only the order of independent steps changes.
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import attrs

from minfer_core import Stage

Step = Any  # (callable, input slots, first output slot, output slots, slots to drop): the core's run-loop step

OVERHEAD = 50e-6  # s per stage before it is measured: pool hand-over, the GIL between two Python loops
MAX_STEPS = 64  # the longest run of steps considered as one stage
MIN_GAIN = 30e-6  # s: a stage must save at least this much ...
MIN_SHARE = 0.05  # ... and this share of its sequential time, so timing noise does not decide
SEQUENTIAL_RUNS = 2  # timed runs with the session's threads (the min per step counts)
TRIAL_RUNS = 2  # timed runs with the candidate stages (the min per stage counts)


def producers(ins: Sequence[Sequence[int]], outs: Sequence[Sequence[int]]) -> list[tuple[int, ...]]:
    """Per step, the earlier steps whose outputs it reads (slots: ``ins``/``outs`` per step; 0 is no value)."""
    made: dict[int, int] = {}
    deps: list[tuple[int, ...]] = []
    for i, (reads, writes) in enumerate(zip(ins, outs)):
        deps.append(tuple(sorted({made[s] for s in reads if s in made})))
        for s in writes:
            if s:
                made[s] = i
    return deps


def split(deps: Sequence[Sequence[int]], first: int, last: int) -> tuple[tuple[int, ...], ...]:
    """The independent branches of steps ``first..last``: the connected parts of their dependencies."""
    parent: dict[int, int] = {}

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for j in range(first, last + 1):
        parent[j] = j
        for p in deps[j]:
            if p >= first:
                parent[find(j)] = find(p)
    groups: dict[int, list[int]] = {}
    for j in range(first, last + 1):
        groups.setdefault(find(j), []).append(j)
    return tuple(tuple(g) for g in groups.values())


def choose(
    deps: Sequence[Sequence[int]],
    cost: Sequence[float],
    *,
    workers: int = 2,
    overhead: float | None = None,
    max_steps: int | None = None,
    min_gain: float | None = None,
    min_share: float | None = None,
) -> list[Stage]:
    """The stages expected to save the most time over the sequential loop.

    ``deps``: per step, the steps it reads from (`producers`); ``cost[i]``:
    step i's time in the sequential loop. A run of steps ``a..b-1`` with two
    branches or more is expected to take ``max(longest branch, total /
    workers) + overhead`` as a stage; a dynamic program over the order picks
    the runs (none overlapping) whose savings add up to the most, each
    saving at least ``min_gain`` and ``min_share`` of its sequential time.
    None takes the module's setting (`OVERHEAD`, `MAX_STEPS`, `MIN_GAIN`,
    `MIN_SHARE`).
    """
    overhead = OVERHEAD if overhead is None else overhead
    max_steps = MAX_STEPS if max_steps is None else max_steps
    min_gain = MIN_GAIN if min_gain is None else min_gain
    min_share = MIN_SHARE if min_share is None else min_share
    n = len(deps)
    before = [0.0]
    for t in cost:
        before.append(before[-1] + t)
    ending: list[list[tuple[int, float]]] = [[] for _ in range(n + 1)]  # b -> (a, saving) for runs a..b-1
    for a in range(n):
        for b, saving in _savings(deps, before, cost, a, min(n, a + max_steps), workers, overhead):
            if saving > max(min_gain, min_share * (before[b] - before[a])):
                ending[b].append((a, saving))
    best = [0.0] * (n + 1)
    start = [-1] * (n + 1)  # the stage ending before step b starts at step start[b]; -1: no stage ends there
    for b in range(1, n + 1):
        best[b] = best[b - 1]
        for a, saving in ending[b]:
            if best[a] + saving > best[b]:
                best[b], start[b] = best[a] + saving, a
    stages: list[Stage] = []
    b = n
    while b > 0:
        if start[b] < 0:
            b -= 1
        else:
            stages.append(Stage(start[b], b - 1, split(deps, start[b], b - 1)))
            b = start[b]
    return stages[::-1]


def _savings(deps: Sequence[Sequence[int]], before: Sequence[float], cost: Sequence[float], a: int, stop: int,
             workers: int, overhead: float) -> list[tuple[int, float]]:
    """(b, time saved) for each run a..b-1 (b up to ``stop``) with two branches or more."""
    parent: dict[int, int] = {}
    span: dict[int, float] = {}  # per branch (its root step), the sum of its steps' costs

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    out: list[tuple[int, float]] = []
    parts, total, longest = 0, 0.0, 0.0
    for j in range(a, stop):
        parent[j], span[j] = j, cost[j]
        parts += 1
        total += cost[j]
        for p in deps[j]:
            if p < a:
                continue
            rp, rj = find(p), find(j)
            if rp != rj:
                parent[rj] = rp
                span[rp] += span.pop(rj)
                parts -= 1
        longest = max(longest, span[find(j)])  # branches only grow, and only the one step j joined
        if parts >= 2:
            out.append((j + 1, before[j + 1] - before[a] - max(longest, total / workers) - overhead))
    return out


@attrs.frozen
class StagedRun:
    """A stage ready to run: per branch its (step index, step) pairs, and the slots to drop after it.

    A slot read by several branches is dropped only once the whole stage is
    done; one made and last read inside a branch is dropped by that branch.
    """

    stage: Stage
    branches: tuple[tuple[tuple[int, Step], ...], ...]
    free: tuple[int, ...]


Item = Any  # a Step, or a StagedRun
"""One entry of a staged run loop."""


def compose(steps: Sequence[Step], stages: Sequence[Stage], cost: Sequence[float] | None = None) -> tuple[list[Item], list[int]]:
    """The run loop with each stage's steps replaced by one `StagedRun`; and each entry's first step index.

    Branches are ordered longest first (by ``cost``) so that threads taking
    the next branch when free balance the load as well as they can.
    """
    made = {slot: i for i, (_, _, _, outs, _) in enumerate(steps) for slot in outs if slot}
    items: list[Item] = []
    index: list[int] = []
    i = 0
    for stage in sorted(stages, key=lambda s: s.first):
        items += steps[i : stage.first]
        index += range(i, stage.first)
        items.append(_staged(steps, stage, made, cost))
        index.append(stage.first)
        i = stage.last + 1
    items += steps[i:]
    index += range(i, len(steps))
    return items, index


def _staged(steps: Sequence[Step], stage: Stage, made: dict[int, int], cost: Sequence[float] | None) -> StagedRun:
    branch_of = {i: k for k, branch in enumerate(stage.branches) for i in branch}
    later: list[int] = []
    runs = []
    for k, branch in enumerate(stage.branches):
        run = []
        for i in branch:
            fn, ins, out0, outs, free = steps[i]
            mine = tuple(s for s in free if branch_of.get(made.get(s, -1)) == k)
            later += [s for s in free if s not in mine]
            run.append((i, (fn, ins, out0, outs, mine)))
        runs.append(tuple(run))
    # longest first (by ``cost``, else by step count): the first thread free takes the next one
    runs.sort(key=lambda run: -sum(cost[i] for i, _ in run) if cost is not None else -len(run))
    return StagedRun(stage, tuple(runs), tuple(later))


@attrs.define
class Calibration:
    """The timed runs of one input-shape signature that decide its stages (see the module docstring)."""

    deps: Sequence[Sequence[int]]
    workers: int
    serial: list[float] = attrs.field(init=False)  # per step, its best time in the sequential loop
    walls: dict[int, float] = attrs.Factory(dict)  # per trial stage (its first step), its best time
    serial_runs: int = 0
    trial_runs: int = 0
    trial: list[Stage] = attrs.Factory(list)

    def __attrs_post_init__(self) -> None:
        self.serial = [math.inf] * len(self.deps)

    def add_serial(self, times: Sequence[float]) -> list[Stage] | None:
        """Record a sequential run's step times; after the last such run, the stages to try (maybe none)."""
        self.serial = [min(a, b) for a, b in zip(self.serial, times)]
        self.serial_runs += 1
        if self.serial_runs < SEQUENTIAL_RUNS:
            return None
        self.trial = choose(self.deps, self.serial, workers=self.workers)
        return self.trial

    def add_trial(self, walls: Mapping[int, float]) -> list[Stage] | None:
        """Record a staged run's stage times; after the last such run, the trial stages that paid."""
        for first, wall in walls.items():
            self.walls[first] = min(self.walls.get(first, math.inf), wall)
        self.trial_runs += 1
        if self.trial_runs < TRIAL_RUNS:
            return None
        return [st for st in self.trial if self.saving(st) > max(MIN_GAIN, MIN_SHARE * self.serial_time(st))]

    def serial_time(self, stage: Stage) -> float:
        return sum(self.serial[stage.first : stage.last + 1])

    def saving(self, stage: Stage) -> float:
        """How much quicker the stage ran concurrently than its steps one after another."""
        return self.serial_time(stage) - self.walls.get(stage.first, math.inf)
