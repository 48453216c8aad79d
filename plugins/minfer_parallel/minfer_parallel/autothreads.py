"""``threads="auto"``: all cores while the machine is otherwise idle, one while other processes keep one busy."""

from __future__ import annotations

import os
import resource
import time
from typing import Callable

from . import procs


class AutoThreads:
    """Pick the intra-op thread count per run from the load other processes put on the machine.

    Threads meet at barriers and spin; when another process holds a core, a
    2-thread split waits for its descheduled half (a 2-thread GEMM was
    measured ten times slower than a 1-thread one), while on an idle machine
    2 threads nearly halve big kernels. So between runs this samples the
    machine's busy CPU time and this process's own (``sample``, at most every
    ``interval`` seconds of ``clock``): if other processes kept more than
    ``busy`` cores working, the next runs use 1 thread. ``clock`` and
    ``sample`` are parameters so tests decide what they see.
    """

    def __init__(self, max_threads: int | None = None, *, interval: float = 0.05, busy: float = 0.5,
                 clock: Callable[[], float] = time.perf_counter,
                 sample: Callable[[], tuple[float, float] | None] | None = None) -> None:
        self.max_threads = max_threads or usable_cpus()
        self.interval = interval
        self.busy = busy
        self.clock = clock
        self.sample = sample or cpu_sample
        self.others = 0.0  # cores other processes kept busy, smoothed
        self._last: tuple[float, float, float] | None = None
        self.choice = self.max_threads

    def choose(self) -> int:
        """The thread count for the next run."""
        now = self.clock()
        if self._last is not None and now - self._last[0] < self.interval:
            return self.choice
        sample = self.sample()
        if sample is None:
            return self.choice
        busy, own = sample
        if self._last is not None:
            wall = now - self._last[0]
            others = max(0.0, (busy - self._last[1]) - (own - self._last[2])) / wall
            self.others = 0.5 * self.others + 0.5 * others
            self.choice = 1 if self.others > self.busy else self.max_threads
        self._last = (now, busy, own)
        return self.choice


def usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. under taskset or a cpuset), else the count."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def cpu_sample() -> tuple[float, float] | None:
    """(CPU-seconds all processes have been busy, CPU-seconds of this process), or None off Linux.

    This process's time includes its process team's worker (procs.py), live or reaped:
    the worker spins on a core during runs, and counted as another process's load it would make the next
    run use 1 thread.
    """
    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()[1:]
    except OSError:
        return None
    ticks = [int(f) for f in fields]
    busy = sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)  # all but idle and iowait
    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # workers already replaced and reaped
    own = usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime + procs.worker_cpu_seconds()
    return busy / os.sysconf("SC_CLK_TCK"), own
