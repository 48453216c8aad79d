"""How many threads numpy's BLAS uses, set at run time (onnxruntime's ``intra_op_num_threads``).

numpy reads OPENBLAS_NUM_THREADS only at import, so the engine talks to the
loaded OpenBLAS through ctypes instead. Why it matters on a small machine:
OpenBLAS workers spin after each call, so with other processes competing for
the cores a 2-thread GEMM can be ten times slower than a 1-thread one, while
on an idle machine 2 threads nearly halve large GEMMs. The engine sets the
count the session asked for around each run and restores the caller's after.
When no OpenBLAS is found (MKL, Accelerate builds) this does nothing.
"""

from __future__ import annotations

import ctypes
import functools
from typing import Callable

_SETTERS = ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_", "openblas_set_num_threads",
            "scipy_openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "openblas_get_num_threads64_", "openblas_get_num_threads",
            "scipy_openblas_get_num_threads")


@functools.lru_cache(maxsize=1)
def _openblas() -> tuple[Callable[[int], None], Callable[[], int]] | None:
    import numpy  # noqa: F401  (loads numpy's BLAS so it shows in the process map)

    try:
        with open("/proc/self/maps") as fh:
            paths = {line.split()[-1] for line in fh if "openblas" in line.lower() and "/" in line}
    except OSError:
        return None
    for path in sorted(paths):
        lib = ctypes.CDLL(path)
        setter = next((getattr(lib, s) for s in _SETTERS if hasattr(lib, s)), None)
        getter = next((getattr(lib, g) for g in _GETTERS if hasattr(lib, g)), None)
        if setter is not None and getter is not None:
            setter.argtypes, setter.restype = [ctypes.c_int], None
            getter.argtypes, getter.restype = [], ctypes.c_int
            return setter, getter
    return None


def get_blas_threads() -> int | None:
    """numpy's BLAS thread count, or None when it cannot be controlled."""
    lib = _openblas()
    return None if lib is None else int(lib[1]())


def set_blas_threads(n: int) -> int | None:
    """Set numpy's BLAS thread count; returns the previous one (None when uncontrollable)."""
    lib = _openblas()
    if lib is None:
        return None
    old = int(lib[1]())
    if old != n:
        lib[0](int(n))
    return old


class AutoThreads:
    """Pick numpy's BLAS thread count per run: all cores when the machine is otherwise idle, else one.

    OpenBLAS threads meet at barriers and spin; when another process holds a
    core, a 2-thread GEMM waits for its descheduled half and was measured ten
    times slower than a 1-thread one, while on an idle machine 2 threads
    nearly halve big GEMMs. So between runs this samples /proc/stat (at most
    every ``interval`` seconds, ~20 us a read) and subtracts this process's
    own CPU time: if other processes kept more than ``busy`` cores working,
    the next runs use 1 thread.
    """

    def __init__(self, max_threads: int | None = None, *, interval: float = 0.05, busy: float = 0.5) -> None:
        self.max_threads = max_threads or _usable_cpus()
        self.interval = interval
        self.busy = busy
        self.others = 0.0  # cores other processes kept busy, smoothed
        self._last: tuple[float, float, float] | None = None
        self.choice = self.max_threads

    def choose(self) -> int:
        """The thread count for the next run."""
        import time

        now = time.perf_counter()
        if self._last is not None and now - self._last[0] < self.interval:
            return self.choice
        sample = _cpu_sample()
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


def _usable_cpus() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. under taskset or a cpuset), else the count."""
    import os

    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _cpu_sample() -> tuple[float, float] | None:
    """(CPU-seconds all processes have been busy, CPU-seconds of this process), or None off Linux.

    This process's time includes its process team's worker (procs.py), live or reaped: the worker spins
    on a core during runs, and counted as another process's load it would make the next run use 1 thread.
    """
    import os
    import resource

    try:
        with open("/proc/stat") as fh:
            fields = fh.readline().split()[1:]
    except OSError:
        return None
    ticks = [int(f) for f in fields]
    busy = sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)  # all but idle and iowait
    from .procs import worker_cpu_seconds

    usage = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)  # workers already replaced and reaped
    own = usage.ru_utime + usage.ru_stime + children.ru_utime + children.ru_stime + worker_cpu_seconds()
    return busy / os.sysconf("SC_CLK_TCK"), own
