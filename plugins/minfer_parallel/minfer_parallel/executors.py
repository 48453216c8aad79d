"""The "threads" executor (intra-op pool, BLAS thread policy, concurrent stages) and the "processes" one.

Both subclass the core's `SequentialExecutor`: its `PlanCache` keeps the
per-signature plans and the arena; these add the per-run thread count,
the stages each signature runs concurrently (inter-op, stages.py), and
for "processes" a forked worker that shares the arena (procs.py).
"""

from __future__ import annotations

import hashlib
import os
import time
import weakref
from typing import Any, Mapping, Sequence

import numpy as np

from minfer_core import Program, SequentialExecutor, Stage, intra_op_threads, using_pool
from minfer_core import choose as choose_timed

from . import procs
from .autothreads import AutoThreads, usable_cpus
from .blas import blas_threads, get_blas_threads, set_blas_threads
from .loops import execute_staged, execute_team, execute_timed
from .pool import ThreadPool, acquire_pool, made_before_fork, release_pool
from .stages import SEQUENTIAL_RUNS, Calibration, Item, choose, compose, producers
from .warmup import touched

INTER_OP = ("auto", "always", "never")
INTER_OP_ENV = "MINFER_INTER_OP"

Signature = Any
# runs shorter than this (seconds) also time one thread alone: a small model's splits may cost more in hand-overs
# than they save, and a serial trial run costs at most this much more than a parallel one
SERIAL_RUN = 0.002
# how much faster another mode's best trial must be than the first mode's to replace it (minfer_core.choose's
# ``margin``; kernels' choices keep its MARGIN, 1.1): whole runs, timed in three rounds, vary less than one kernel's
# call. At 1.1 the YOLO-style detector kept the team (235-417 us a run, loaded host) over serial (218-347) in two
# fresh processes of three; at 1.04 (with `TRIAL_RUNS`) in none of six (bench/results/session23/executor-modes.txt)
MODE_MARGIN = 1.04
# a trial's timed runs after its settling one, the best kept, while a run takes under SERIAL_RUN (else one)
TRIAL_RUNS = 3


class ThreadsExecutor(SequentialExecutor):
    """Kernels split their work over the session's threads; independent branches may run as stages.

    ``threads``: a count, "auto" (all usable cores unless other processes
    keep one busy: autothreads.py), or None (kernels run serially and
    numpy's BLAS setting is left alone). While a run uses two threads or
    more, BLAS runs one thread per call: the kernels split their own work.

    ``inter_op`` (default ``MINFER_INTER_OP``, else "never"): "auto" times
    the next runs of each new input shape and keeps the concurrent stages
    that pay; "always" runs every run of independent steps concurrently;
    "never" keeps the sequential loop. Outputs do not depend on it.
    """

    def __init__(self, program: Program, options: Mapping[str, Any], allocate: Any = None) -> None:
        super().__init__(program, options, touched(allocate))  # arena pages fault in as it is made (warmup.py)
        self.inter_op = options.get("inter_op") or os.environ.get(INTER_OP_ENV, "never")
        if self.inter_op not in INTER_OP:
            raise ValueError(f"inter_op must be one of {INTER_OP}, not {self.inter_op!r}")
        self.threads = options.get("threads", "auto")
        self.auto = AutoThreads() if self.threads == "auto" else None
        most = usable_cpus() if self.threads == "auto" else self.threads or 1
        self.pool = self._acquire(most) if most > 1 else None
        if self.threads is not None:  # every run sets BLAS's threads then (threads=1 too): found at build
            get_blas_threads()  # finds the BLAS (threadpoolctl: 20-30 ms, once per process) at build, not in a run
        self.deps = producers([sp.ins for sp in program.specs], [sp.outs for sp in program.specs])
        self.branchy = _branchy(self.deps)
        self.stages: dict[Signature, tuple[list[Stage], list[float] | None]] = {}  # stages, branch costs
        self.staged: dict[Signature, tuple[list[Item], list[int]]] = {}  # the staged loop (stages.compose)
        self.pending: set[Signature] = set()  # signatures still timing their stages
        self.calibrations: dict[Signature, Calibration] = {}
        self.teams: dict[Signature, str] = {}  # per shape, its mode (procs.TEAM, THREADS or SERIAL): `_choose_mode`
        self.digest = _digest(program)

    def _acquire(self, threads: int) -> ThreadPool:
        pool = acquire_pool(threads)
        # the last session using the pool ends its threads; at exit nothing is joined (they are daemons)
        weakref.finalize(self, release_pool, pool).atexit = False
        return pool

    def want(self) -> int | None:
        """This run's thread count (None: leave BLAS alone, kernels serial)."""
        if self.auto is not None:
            return self.auto.choose()
        return self.threads

    def run(self, vals: list[Any], sig: Signature, observers: Sequence[Any], fresh: bool = False) -> Any:
        want = self.want()
        pool = self.pool if want and want > 1 else None
        if pool is not None and made_before_fork(pool):  # a forked child (a process pool's worker): own threads
            pool = self.pool = self._acquire(pool.threads)
        first = pool is not None and not fresh and not observers and sig not in self.plans.bound
        fed, claims = (list(vals), pool.claims) if first else (None, 0)  # the weights and feeds, for the trials
        result = self._run_in(vals, sig, observers, fresh, want, pool, self.teams.get(sig))
        if fed is not None and sig in self.plans.bound and sig not in self.teams:  # this run planned the shape
            self.teams[sig] = self._choose_mode(fed, sig, want, pool, pool.claims > claims)
        return result

    def _run_in(self, vals: list[Any], sig: Signature, observers: Sequence[Any], fresh: bool, want: int | None,
                pool: ThreadPool | None, mode: str | None) -> Any:
        """One run in ``mode`` (None: the pool's threads, kernels may claim them: a shape's first run)."""
        # kernels split their own work over the pool's threads; numpy's BLAS runs one thread per call
        previous = set_blas_threads(1) if want else None
        try:
            if pool is None:
                return super().run(vals, sig, observers, fresh)
            pool.claimable = mode in (None, procs.TEAM)
            if mode != procs.SERIAL:
                pool.enter()
                if mode == procs.TEAM:
                    pool.claim()  # from the start: no kernel before the first team's wakes the pool's threads
            try:
                with using_pool(None if mode == procs.SERIAL else pool):
                    return super().run(vals, sig, observers, fresh)
            finally:
                if mode != procs.SERIAL:
                    pool.leave()
                pool.claimable = True  # this run's say only: the pool is shared (other sessions, using_threads)
        finally:
            if previous is not None and previous != 1:
                set_blas_threads(previous)

    def _choose_mode(self, fed: list[Any], sig: Signature, want: int | None, pool: ThreadPool, claimed: bool) -> str:
        """How this shape's runs use the threads, chosen in its first run, right after the run that planned it, by
        timing runs of the plan each way (`minfer_core.choose`: stored with the kernels' choices, so a later
        process times nothing; a later shape takes the last one's choice untimed, serial only when one run of it
        takes under `SERIAL_RUN`, else that shape times them): "team" (kernels may claim the threads for a
        compiled team of their own, other kernels' parallel_for then runs serially: MobileNetV2 at batch 1 3.9 ms
        against 5.4; offered when this run claimed), "threads" (the pool splits kernels, none claims), "serial"
        (one thread, no pool; offered while another mode's best run is under `SERIAL_RUN`: on a small model the
        hand-overs cost more than the splits save, an orientation classifier 345 us against 449).
        A trial runs its mode once untimed, then times a run (the best of `TRIAL_RUNS` while a run takes under
        `SERIAL_RUN`): right after another mode's run, that mode's threads still spin for a while and slow the first
        (a one-conv model's team runs timed 153 us so, 88 steadily).
        Each mode is timed in each of choose's rounds, its best kept: timed once, one disturbed run chose the
        threads mode for a transformer block whose team mode ran 20% faster (the choice is stored); the second
        round costs MobileNetV2 b1 ~20 ms more of a ~170 ms first run.
        Timing here, not in later runs, keeps every later run of the shape as fast as its mode."""
        modes = ((procs.TEAM,) if claimed else ()) + (procs.THREADS,) + \
            ((procs.SERIAL,) if self.inter_op == "never" else ())  # one thread alone: the stages need the pool
        if sig in self.pending:  # the next runs time their stages (inter_op "auto"): those timings would be these
            return modes[0]
        best: dict[str, float] = {}

        def trial(i: int) -> float:
            mode = modes[i]
            if mode == procs.SERIAL and min(best.values(), default=0.0) >= SERIAL_RUN:
                return float("inf")  # a long run: one thread alone would lose more than the hand-overs cost
            self._run_in(list(fed), sig, (), False, want, pool, mode)  # not this run's values: a run frees slots
            took = float("inf")
            for _ in range(TRIAL_RUNS):  # a short run's best of a few: one such run swings by 10-40% here
                start = time.perf_counter()
                self._run_in(list(fed), sig, (), False, want, pool, mode)
                took = min(took, time.perf_counter() - start)
                if took >= SERIAL_RUN:  # a long run: one timed run (no serial trial to compare with so closely)
                    break
            best[mode] = min(took, best.get(mode, took))
            return took

        prior = next(reversed(self.teams.values()), None)  # the last shape's mode: this one's, untimed
        if prior == procs.SERIAL and procs.SERIAL in modes:  # unless this shape runs too long for one thread
            start = time.perf_counter()
            self._run_in(list(fed), sig, (), False, want, pool, procs.SERIAL)
            prior = prior if time.perf_counter() - start < SERIAL_RUN else None
        key = f"executor-mode|{self.digest}|{_shapes(sig)}|threads={want}"
        return modes[choose_timed(key, modes, trial, prior, margin=MODE_MARGIN)]

    def run_bound(self, sig: Signature, vals: list[Any], steps: list[Any], observers: Sequence[Any]) -> None:
        threads = intra_op_threads()
        if observers or threads < 2:  # observers see the nodes one at a time, in order
            self.run_steps(vals, steps, observers)
        elif sig in self.pending:
            self._calibrate(sig, vals, threads)
        elif sig in self.staged:
            execute_staged(vals, *self.staged[sig], self.pool)
        else:
            self.run_steps(vals, steps, observers)

    # ---- stages --------------------------------------------------------------

    def plan_input(self, sig: Signature, inp: Any) -> None:
        if self.inter_op == "always":
            # every run of independent steps as a stage (tests, and graphs known to pay)
            inp.stages = choose(self.deps, [1.0] * len(self.deps), overhead=0.0, min_gain=0.0, min_share=0.0)
        elif self.inter_op == "auto" and self.branchy and self.threads not in (1, None):
            self.pending.add(sig)
        self.stages[sig] = (list(inp.stages), None)

    def rebound(self, sigs: list[Signature]) -> None:
        for s in sigs:
            self.staged.pop(s, None)
            st, cost = self.stages.get(s, ([], None))
            if st:
                self.staged[s] = compose(self.plans.bound[s], st, cost)

    def forget(self, sig: Signature | None) -> None:
        for cache in (self.stages, self.staged, self.calibrations, self.teams):
            if sig is None:
                cache.clear()
            else:
                cache.pop(sig, None)
        if sig is None:
            self.pending.clear()
        else:
            self.pending.discard(sig)

    def _calibrate(self, sig: Signature, vals: list[Any], threads: int) -> None:
        """One timed run of a signature still choosing its stages (stages.Calibration); re-plans when decided."""
        cal = self.calibrations.get(sig)
        if cal is None or cal.workers != threads:  # the thread count changed (auto): start over
            cal = self.calibrations[sig] = Calibration(self.deps, threads)
            if self.stages[sig][0]:
                self._replan(sig, [], None)
        if cal.serial_runs < SEQUENTIAL_RUNS:
            trial = cal.add_serial(execute_timed(vals, self.plans.bound[sig]))
            if trial:
                self._replan(sig, trial, cal.serial)
            elif trial is not None:
                self._settle(sig)
            return
        walls: dict[int, float] = {}
        execute_staged(vals, *self.staged[sig], self.pool, walls)
        final = cal.add_trial(walls)
        if final is not None:
            if final != cal.trial:
                self._replan(sig, final, cal.serial)
            self._settle(sig)

    def _replan(self, sig: Signature, stages: list[Stage], cost: list[float] | None) -> None:
        inp = self.plans.inputs[sig]
        inp.stages = stages
        self.stages[sig] = (stages, cost)
        self.rebound(self.plans.install(sig, inp))

    def _settle(self, sig: Signature) -> None:
        self.pending.discard(sig)
        self.calibrations.pop(sig, None)


class ProcessExecutor(ThreadsExecutor):
    """Kernels that declare ``spmd`` split their output ranges with a forked worker (procs.py).

    The arena lives in shared memory; per signature the team first times
    which steps pay shared (`procs.Dispatch`), then team against threads
    (`procs.ModeChoice`). Runs with observers, ``intermediate=True``, or
    fewer than two threads use the threads executor's path.
    """

    def __init__(self, program: Program, options: Mapping[str, Any]) -> None:
        super().__init__(program, options, procs.shared_empty)
        for value in program.template:
            if isinstance(value, np.ndarray):
                procs.freeze(value)  # initializers: the worker has them as they are
        procs.state_changed()
        self.shared: dict[Signature, procs.Dispatch] = {}  # per bound signature: which steps the team shares
        self.modes: dict[Signature, procs.ModeChoice] = {}  # per shape: team or threads, once timed
        self.feed_stage: dict[int, np.ndarray] = {}  # per input slot: shared memory its feed is copied to

    def run(self, vals: list[Any], sig: Signature, observers: Sequence[Any], fresh: bool = False) -> Any:
        want = self.want()
        mode = team = None
        if want and want >= 2 and not fresh and not observers and sig in self.plans.bound:
            mode = self.modes.get(sig)
            if mode is None or mode.want_team():
                team = procs.team()
                if team is not None and not team.begin():
                    team = None
        if team is None:
            start = time.perf_counter()
            result = super().run(vals, sig, observers, fresh)
            if mode is not None and mode.team is None and not mode.want_team():
                mode.record(False, time.perf_counter() - start)
            return result
        return self._run_team(vals, sig, team, mode)

    def _run_team(self, vals: list[Any], sig: Signature, team: procs.Team, mode: procs.ModeChoice | None) -> Any:
        start = time.perf_counter()
        staged: dict[int, np.ndarray] = {}
        plans = self.plans
        locked = plans.lock.acquire(blocking=False)
        try:
            # steps the worker does not share run here alone, seeing the team's thread count (see SoloPool)
            with blas_threads(1), using_pool(team.solo):
                if locked:
                    self._execute_team(sig, vals, plans.bound[sig], team, staged)
                    plans.last = sig
                else:
                    self.run_steps(vals, self.program.steps, ())
        finally:
            if locked:
                plans.lock.release()
            team.end()
        # a run in which the worker failed (its share recomputed here) times the failure, not the team
        if mode is not None and mode.team is None and mode.want_team() and not team.broken:
            mode.record(True, time.perf_counter() - start)
        return staged

    def _execute_team(self, sig: Signature, vals: list[Any], steps: list[Any], team: procs.Team,
                      staged: dict[int, np.ndarray]) -> None:
        """A run with the process team: feeds that shared steps read are copied into shared memory first."""
        dispatch = self.shared[sig]
        flags = dispatch.trial() if team.usable() else None
        for slot in self._feed_slots(dispatch):
            value = vals[slot]
            if value is not None and value.nbytes:
                vals[slot] = staged[slot] = self._stage(slot, value)
        if flags is None:
            execute_team(vals, steps, dispatch.flags or dispatch.candidates, team)
            return
        times = [0.0] * len(steps)
        execute_team(vals, steps, flags, team, times)
        dispatch.record(flags, times)
        if dispatch.flags is not None:  # decided: now the team against the threads, run for run
            self.modes[sig] = procs.ModeChoice(None if any(dispatch.flags) else False)

    def _feed_slots(self, dispatch: procs.Dispatch) -> list[int]:
        """The input slots that the steps ``dispatch`` shares read (computed once per set of flags)."""
        flags = dispatch.flags or dispatch.candidates
        if dispatch.feeds is None or dispatch.feeds[0] is not flags:
            p = self.program
            inputs = {p.slots[n] for n in p.graph.inputs}
            dispatch.feeds = (flags, sorted({s for st, f in zip(p.steps, flags) if f for s in st[1]} & inputs))
        return dispatch.feeds[1]

    def _stage(self, slot: int, value: np.ndarray) -> np.ndarray:
        """``value`` copied into this executor's shared staging memory for feed ``slot`` (grown when needed)."""
        buf = self.feed_stage.get(slot)
        if buf is None or buf.nbytes < value.nbytes:
            buf = self.feed_stage[slot] = procs.shared_empty(_align(value.nbytes))  # a re-fork follows
        staged = buf[: value.nbytes].view(value.dtype).reshape(value.shape)
        np.copyto(staged, value)
        return staged

    def discover(self, sig: Signature, vals: list[Any], observers: Sequence[Any]) -> None:
        super().discover(sig, vals, observers)
        procs.state_changed()  # kernels made their first-call choices (the conv tuner's) in this run

    def rebound(self, sigs: list[Signature]) -> None:
        super().rebound(sigs)
        for s in sigs:
            self.shared[s] = procs.Dispatch(procs.shareable(self.plans.bound[s]))

    def forget(self, sig: Signature | None) -> None:
        super().forget(sig)
        for cache in (self.shared, self.modes):
            if sig is None:
                cache.clear()
            else:
                cache.pop(sig, None)


def _align(n: int) -> int:
    return (n + 63) // 64 * 64


def _branchy(deps: Sequence[Sequence[int]]) -> bool:
    """Whether some steps are independent: a step read by two others, or two steps reading no step."""
    readers = [0] * len(deps)
    for d in deps:
        for p in d:
            readers[p] += 1
    return max(readers, default=0) > 1 or sum(1 for d in deps if not d) > 1


def _digest(program: Program) -> str:
    """The program as the speed of its runs depends on it: each step's node, kernel and slots, the weights' shapes."""
    steps = [(n.op_type, getattr(sp.kernel, "plugin", ""), getattr(getattr(sp.kernel, "fn", None), "__qualname__", ""),
              sp.ins, sp.outs)
             for n, sp in zip(program.step_nodes, program.specs)]
    weights = [(i, v.shape, str(v.dtype)) for i, v in enumerate(program.template) if isinstance(v, np.ndarray)]
    return hashlib.sha256(repr((steps, weights)).encode()).hexdigest()[:16]


def _shapes(sig: Signature) -> str:
    """A signature's shapes and dtypes as text."""
    return repr([(shape, str(dtype)) for shape, dtype in sig]) if isinstance(sig, tuple) else repr(sig)
