"""A concurrent stage's threads: each runs whole branches, then helps the others' `parallel_for`.

A stage (stages.py) hands its branches to a `Team` of the intra-op pool's
threads. Each thread takes the next branch not yet started and runs its
steps in order. Inside a branch, kernels see the session's thread count
(`intra_op_threads()`), cut their work as in the sequential loop and call
`parallel_for`; the team publishes those ranges, the calling thread works
through them, and a thread that has run out of branches takes ranges too.
So a stage never runs more threads than the pool has, a long branch is not
left to one core once the short ones are done (a squeezenet fire module's
3x3 expand conv gets the second core as soon as its 1x1 neighbour ends),
and every kernel computes exactly what it computes in the sequential loop:
same method, same cuts, each range written once.

A `parallel_for` inside a range that a thread runs for a team is serial, as
one nested in the pool's is.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any, Callable, Sequence

from minfer_core import using_pool

from . import pool

_local = threading.local()  # .helping: this thread is inside a published range (nested parallel_for is serial)


def _signal() -> Any:
    """A one-shot signal whose waiter spins in C with the GIL released (pool.py's, as the pool's workers use).

    A waiter that slept instead would cost 40-80 us to wake on this VM, which
    halts an idle vCPU at once: more than a stage saves. Only threads of a
    running stage wait on these, while their core has nothing else to do.
    """
    return pool.signal()


class _Ranges:
    """One `parallel_for` call published to a team: ranges taken by ticket, finished ones counted."""

    def __init__(self, n: int, fn: Callable[[int, int], None], parts: int) -> None:
        self.fn = fn
        self.parts = parts
        self.bounds = [n * k // parts for k in range(parts + 1)]
        self.tickets = itertools.count()  # next() on a count is atomic under the GIL
        self.ended = itertools.count(1)
        self.open = True  # some range is still untaken
        self.error: BaseException | None = None
        self.finished = _signal()  # posted once, by whichever thread ends the last range

    def work(self) -> None:
        """Run untaken ranges until none is left (any thread, any number at once)."""
        outer = getattr(_local, "helping", False)
        _local.helping = True
        try:
            while True:
                k = next(self.tickets)
                if k >= self.parts:
                    self.open = False
                    return
                try:
                    self.fn(self.bounds[k], self.bounds[k + 1])
                except BaseException as exc:  # handed to the publishing thread once every range has ended
                    self.error = self.error or exc
                if next(self.ended) == self.parts:
                    self.finished.post()
        finally:
            _local.helping = outer


class Team:
    """The threads running one stage's ``branches`` (callables), sharing their `parallel_for` ranges.

    Every thread of the stage calls `work`; it returns when all branches
    have ended. ``threads`` is what `intra_op_threads()` reports inside a
    branch. The first exception a branch raises is kept in ``error``, and no
    branch starts after it.
    """

    def __init__(self, branches: Sequence[Callable[[], None]], threads: int) -> None:
        self.branches = branches
        self.threads = threads
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._next = 0
        self._running = 0
        self._idle: list[Any] = []  # signals of the threads waiting for a branch's ranges or the end
        self._open: list[_Ranges] = []

    def run(self, n: int, fn: Callable[[int, int], None], parts: int) -> None:
        """`parallel_for` inside a branch: publish the ranges, work through them, wait for helpers' ones."""
        parts = max(1, min(parts, n))
        if parts == 1 or getattr(_local, "helping", False):
            fn(0, n)
            return
        job = _Ranges(n, fn, parts)
        with self._lock:
            self._open.append(job)
            self._wake_idle()
        job.work()
        with self._lock:
            self._open.remove(job)
        job.finished.wait()
        if job.error is not None:
            raise job.error

    def work(self) -> None:
        """One thread's share: start branches while any is left, then help with published ranges."""
        with _team_as_pool(self):
            while True:
                branch, job = self._next_task()
                if job is not None:
                    job.work()
                elif branch is None:
                    return
                else:
                    self._run(branch)

    def _next_task(self) -> tuple[Callable[[], None] | None, _Ranges | None]:
        while True:
            with self._lock:
                if self._next < len(self.branches) and self.error is None:
                    self._next += 1
                    self._running += 1
                    return self.branches[self._next - 1], None
                job = next((j for j in self._open if j.open), None)
                if job is not None or self._running == 0:
                    return None, job
                signal = _idle_signal()
                self._idle.append(signal)
            signal.wait()  # until a branch publishes ranges or ends

    def _wake_idle(self) -> None:
        # under self._lock: each waiting thread was registered once and is posted once
        for signal in self._idle:
            signal.post()
        self._idle.clear()

    def _run(self, branch: Callable[[], None]) -> None:
        try:
            branch()
        except BaseException as exc:
            with self._lock:
                self.error = self.error or exc
        finally:
            with self._lock:
                self._running -= 1
                self._wake_idle()


def _idle_signal() -> Any:
    """This thread's signal for waiting idle in a team (made once per thread)."""
    signal = getattr(_local, "idle", None)
    if signal is None:
        signal = _local.idle = _signal()
    return signal


def _team_as_pool(team: Team) -> Any:
    """parallel_for and intra_op_threads inside a branch answer from the team, as from a pool."""
    return using_pool(team)
