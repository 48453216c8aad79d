"""The intra-op thread pool: kernels' `parallel_for` ranges run on its threads during a session run.

Why minfer runs its own threads instead of leaving it to numpy's BLAS: only
the GEMM inside a conv is threaded by OpenBLAS; the im2col copies,
Winograd transforms, bias, residual and activation passes, pooling and
depthwise taps are single-threaded numpy loops, and on resnet50 they were a
third of the run. numpy releases the GIL inside its ufunc loops, copies and
matmul, so two Python threads each running a kernel's half (with a
1-thread BLAS) keep both cores busy through all of it. OpenBLAS's own
threads would fight with ours (they spin after each call), so while a
session runs with more than one intra-op thread the executor sets BLAS to
one thread and every kernel that matters splits its own work.

Pools are shared per thread count and counted: `acquire_pool` /
`release_pool`; the last user's release ends the pool's threads, so a
session with an unusual thread count leaves nothing behind once it is gone.
"""

from __future__ import annotations

import contextlib
import ctypes
import itertools
import os
import threading
from typing import Any, Callable, Iterator

from minfer_core import using_pool

from .warmup import warm

def _cpu_query() -> Callable[[], int] | None:
    """libc's sched_getcpu (the CPU the calling thread runs on), or None where there is none."""
    try:
        fn = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [], ctypes.c_int
    return fn if fn() >= 0 else None


def _spin_functions() -> tuple[Callable[..., int], ...] | None:
    """libc's pthread_spin_init/lock/unlock through ctypes (which lets go of the GIL during the call), or None."""
    try:
        libc = ctypes.CDLL(None)
        fns = libc.pthread_spin_init, libc.pthread_spin_lock, libc.pthread_spin_unlock
    except (OSError, AttributeError):
        return None
    for fn in fns:
        fn.restype = ctypes.c_int
    fns[0].argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
    fns[1].argtypes = fns[2].argtypes = [ctypes.POINTER(ctypes.c_int)]
    return fns


_SPIN = _spin_functions()


class _SpinSignal:
    """A one-shot signal between two threads: ``wait`` spins in C (no GIL held, the CPU kept awake) until ``post``.

    A pthread spin lock used as a binary semaphore: taken means "not posted".
    At most one post may be outstanding (the pool's protocol guarantees it).
    """

    def __init__(self) -> None:
        init, self._lock, self._unlock = _SPIN  # type: ignore[misc]
        self._word = ctypes.c_int(0)
        self._ptr = ctypes.pointer(self._word)
        init(self._ptr, 0)
        self._lock(self._ptr)

    def post(self) -> None:
        self._unlock(self._ptr)

    def wait(self) -> None:
        self._lock(self._ptr)


class _SleepSignal:
    """The same signal for systems without pthread spin locks: the waiter sleeps."""

    def __init__(self) -> None:
        self._sem = threading.Semaphore(0)

    def post(self) -> None:
        self._sem.release()

    def wait(self) -> None:
        self._sem.acquire()


def _spin_ok(threads: int, cpus: frozenset[int] | None = None) -> bool:
    """Whether ``threads`` threads may wait spinning: spin locks exist, each thread can have a CPU of its own,
    and MINFER_POOL_SPIN is not 0."""
    if _SPIN is None or os.environ.get("MINFER_POOL_SPIN", "1") == "0":
        return False
    if cpus is None:
        try:
            cpus = frozenset(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            return False
    return len(cpus) >= threads


def signal(threads: int = 2) -> _SpinSignal | _SleepSignal:
    """A one-shot signal between ``threads`` threads that wait briefly while their cores have nothing else to
    do: the waiter spins in C with the GIL released where `_spin_ok`, else it sleeps."""
    return _SpinSignal() if _spin_ok(threads) else _SleepSignal()


_PARK = object()  # the job that sends a worker to sleep until the pool is next used
_EXIT = object()  # the job that ends a worker (the pool is closed)
_callers = threading.local()  # .saved: the CPU sets of this thread before the pools it entered pinned it


def pin_caller(where: Callable[[], int] | None = _cpu_query()) -> int | None:
    """Pin the calling thread to the CPU it is on (``where()``) until `unpin_caller`; returns that CPU, or
    None when nothing was pinned (no query, or not allowed here: placement is then left to the scheduler).
    Calls nest: each pin is undone by one unpin."""
    saved, cpu = None, None
    if where is not None:
        try:
            saved = os.sched_getaffinity(0)
            cpu = where()
            os.sched_setaffinity(0, {cpu})
        except OSError:
            saved, cpu = None, None
    _callers.__dict__.setdefault("saved", []).append(saved)
    return cpu


def unpin_caller() -> None:
    """Give the calling thread back the CPU set it had before its last `pin_caller`."""
    stack = _callers.__dict__.get("saved")
    saved = stack.pop() if stack else None
    if saved is not None:
        try:
            os.sched_setaffinity(0, saved)
        except OSError:
            pass


class ThreadPool:
    """``threads - 1`` daemon workers plus the calling thread; one `run` at a time (others run serially).

    The cost of handing work over decides which kernels may split, so while a
    session run uses the pool (`using_threads`) its workers wait for work
    spinning inside a C call (a pthread spin lock through ctypes, GIL
    released), and the caller waits for them the same way; between runs
    they sleep. Measured on this 2-vCPU VM (which halts an idle vCPU at once:
    ``haltpoll.guest_halt_poll_ns=0``), a 2-way split of a numpy call cost
    40-80 us more than half the serial call when both sides slept on a
    queue (every hand-over woke a halted vCPU), 15-27 us when the waits
    polled with sched_yield in Python (the GIL went back and forth), and
    5-12 us with the spin in C. What remains is the GIL the worker needs to
    start its Python part. While a run is on, an idle worker keeps its core
    busy, as onnxruntime's and OpenBLAS's threads do; the engine's ``auto``
    thread count uses one thread when other processes want the cores. The
    pool spins only when each of its threads can have a CPU of its own (two
    spinners sharing one wait for each other until a scheduler tick) and
    MINFER_POOL_SPIN is not 0; otherwise its waits sleep.

    Workers are kept off the CPU the calling thread is on. Without that,
    Linux often wakes a worker on its waker's CPU (cache affinity) and
    leaves it there for hundreds of milliseconds while the other core idles:
    measured here, a 2-way split GEMM then ran at 1-thread speed in one
    block of runs out of three. The calling thread stays on its CPU for as
    long as it uses the pool (`enter`) and gets its CPU set back after.
    """

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"a pool needs at least one thread, not {threads}")
        self.threads = threads
        self._busy = threading.Lock()
        helpers = threads - 1
        self._where = _cpu_query()
        try:
            self._cpus = frozenset(os.sched_getaffinity(0)) if self._where is not None else frozenset()
        except (AttributeError, OSError):
            self._cpus = frozenset()
        # Spin only where every thread of the pool can have a CPU of its own: two spinning threads on one
        # CPU wait for each other until a scheduler tick (measured: resnet50 b1 with the process limited to
        # one CPU, 240 ms instead of 56). MINFER_POOL_SPIN=0 turns spinning off (CPU quotas, busy hosts).
        self.spins = _spin_ok(threads, self._cpus)
        signal = _SpinSignal if self.spins else _SleepSignal
        self._go = [signal() for _ in range(helpers)]
        self._done = [signal() for _ in range(helpers)]
        self._jobs: list[object] = [None] * helpers
        self._errors: list[BaseException | None] = [None] * helpers
        self._wake = [threading.Semaphore(0) for _ in range(helpers)]
        self._users = 0  # using_threads blocks in progress: woken workers spin while there are any
        self._awake = False
        self._claimed = False  # a kernel's own threads have the cores (claim) until the last user leaves
        self.claimable = True  # whether `claim` lets a kernel have them (the executor's per-run choice)
        self.claims = 0  # claims granted so far (the executor learns from it whether a run had a team)
        self._users_lock = threading.Lock()
        self._tids: list[int] = []
        self.forks = 0  # (see made_before_fork)
        self.warmed = 0  # threads that ran warmup.warm's GEMM when acquire_pool made the pool
        self.workers: list[threading.Thread] = []
        started = threading.Barrier(threads)
        for i in range(helpers):
            worker = threading.Thread(target=self._work, args=(i, started), name=f"minfer-intra-op-{i + 1}",
                                      daemon=True)
            worker.start()
            self.workers.append(worker)
        if threads > 1:
            started.wait()
        self._avoided = -1

    def _place_workers(self) -> None:
        """Let the workers run anywhere but on the caller's current CPU (re-done only when the caller moves)."""
        cpu = self._where()  # type: ignore[misc]
        if cpu == self._avoided:
            return
        self._avoided = cpu
        others = self._cpus - {cpu}
        if not others:
            return
        try:
            for tid in self._tids:
                os.sched_setaffinity(tid, others)
        except OSError:  # not allowed here (some containers): leave placement to the scheduler
            self._cpus = frozenset()

    def _work(self, i: int, started: threading.Barrier) -> None:
        self._tids.append(threading.get_native_id())
        started.wait()
        self._wake[i].acquire()  # asleep until the pool is first used
        go, done = self._go[i], self._done[i]
        while True:
            go.wait()
            job = self._jobs[i]
            self._jobs[i] = None
            if job is _PARK:
                done.post()
                self._wake[i].acquire()
                continue
            if job is _EXIT:
                done.post()
                return
            try:
                job()  # type: ignore[operator]
            except BaseException as exc:  # handed to the caller, which re-raises it
                self._errors[i] = exc
            done.post()

    def enter(self) -> None:
        """A run starts using the pool. The workers are woken by its first `run` (a run with nothing to
        split pays nothing) and spin for work from then on until the last user leaves.

        The calling thread is pinned to the CPU it is on until it leaves: the workers are kept off that
        CPU, and a caller that moved onto a spinning worker's CPU (Linux wakes a thread on its waker's
        CPU) would spin there waiting for a worker that cannot run until the next scheduler tick
        (measured: a 0.5 ms conv took 4-12 ms after a pause, in multiples of ~4 ms).
        """
        with self._users_lock:
            self._users += 1
        self._pin_caller()

    def leave(self) -> None:
        """A run stops using the pool: the last one out sends awake workers to sleep (and waits until they are)."""
        with self._users_lock:
            self._users -= 1
            if self._users == 0:
                self._park_awake()
                self._claimed = False
        self._unpin_caller()

    def _park_awake(self) -> None:
        """Send awake workers to sleep and wait until they are (the caller holds ``_users_lock``)."""
        if self._awake:
            self._awake = False
            for i, go in enumerate(self._go):
                self._jobs[i] = _PARK
                go.post()
            for done in self._done:
                done.wait()

    def claim(self) -> int:
        """A kernel splits its work over threads of its own (``minfer_core.claim_threads``: minfer-ops-numba's
        OpenMP team): awake workers go to sleep and `run` calls its ranges serially until the last user leaves.
        Both sets of threads spin while they wait for work, and on a machine with a CPU each for them, a
        spinning worker on the CPU the other set needs held it off until a scheduler tick (measured: a
        MobileNetV2 run of 6 ms took 8). Returns the thread count, or 1 when the executor said no (``claimable``):
        the kernel then splits with `run` as the others do."""
        if not self.claimable:
            return 1
        if self.threads > 1 and not self._claimed:
            self.claims += 1
            self._claimed = True
            if self._busy.acquire(blocking=False):  # else another run uses the workers: its end parks them
                try:
                    with self._users_lock:
                        self._park_awake()
                finally:
                    self._busy.release()
        return self.threads

    def _pin_caller(self) -> None:
        pin_caller(self._where if self.threads > 1 and len(self._cpus) > 1 else None)

    def _unpin_caller(self) -> None:
        unpin_caller()

    def _wake_workers(self) -> None:
        with self._users_lock:
            if not self._awake:
                self._awake = True
                for wake in self._wake:
                    wake.release()

    def close(self) -> None:
        """End the workers and wait until they are gone (the pool is not used again)."""
        with self._busy, self._users_lock:
            if not self._awake:
                for wake in self._wake:
                    wake.release()
            self._awake = False
            for i, go in enumerate(self._go):
                self._jobs[i] = _EXIT
                go.post()
            for done in self._done:
                done.wait()
        for worker in self.workers:
            worker.join()
        self.workers = []

    def run(self, n: int, fn: Callable[[int, int], None], parts: int) -> None:
        """Call ``fn(lo, hi)`` over ``parts`` contiguous ranges covering [0, n), the ranges taken by whoever is free."""
        parts = max(1, min(parts, n))
        if parts == 1 or self.threads == 1 or self._claimed or not self._busy.acquire(blocking=False):
            fn(0, n)
            return
        entered = self._users == 0  # used outside a using_threads block: the workers sleep again after this call
        if entered:
            self.enter()
        if not self._awake:
            self._wake_workers()
        try:
            if len(self._cpus) > 1:
                self._place_workers()
            bounds = [n * k // parts for k in range(parts + 1)]
            ticket = itertools.count()  # next() on a count is atomic under the GIL

            def drain() -> None:
                while True:
                    k = next(ticket)
                    if k >= parts:
                        return
                    fn(bounds[k], bounds[k + 1])

            helpers = min(parts, self.threads) - 1
            for i in range(helpers):
                self._jobs[i] = drain
                self._go[i].post()
            error: BaseException | None = None
            try:
                drain()
            except BaseException as exc:
                error = exc
            for i in range(helpers):
                self._done[i].wait()
                failed, self._errors[i] = self._errors[i], None
                error = error or failed
            if error is not None:
                raise error
        finally:
            if entered:
                self.leave()
            self._busy.release()


_pools: dict[int, ThreadPool] = {}
_users: dict[int, int] = {}
_pools_lock = threading.Lock()
_forks = 0  # forks this process went through since the first pool: a pool made before one has no workers
_watching_forks = False


def _forget_pools_after_fork() -> None:
    """A forked child has none of its parent's worker threads: it makes its own pools on first use."""
    global _pools_lock, _forks
    _pools.clear()
    _users.clear()
    _pools_lock = threading.Lock()
    _forks += 1


def acquire_pool(threads: int) -> ThreadPool:
    """The process-wide pool with ``threads`` threads (made on first use, shared); pair with `release_pool`."""
    global _watching_forks
    with _pools_lock:
        if not _watching_forks and hasattr(os, "register_at_fork"):
            os.register_at_fork(after_in_child=_forget_pools_after_fork)  # once, when there is a pool to forget
            _watching_forks = True
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = ThreadPool(threads)
            pool.forks = _forks
            pool.warmed = warm(pool)  # its threads' first GEMM and hand-over now, not in a session's first run
        _users[threads] = _users.get(threads, 0) + 1
        return pool


def made_before_fork(pool: ThreadPool) -> bool:
    """Whether ``pool`` was made in the parent of this (forked) process: its workers do not exist here."""
    return pool.forks != _forks


def release_pool(pool: ThreadPool) -> None:
    """One user of ``pool`` is done; the last one ends its threads."""
    with _pools_lock:
        if _pools.get(pool.threads) is not pool:
            return  # made before a fork: its threads do not exist here
        _users[pool.threads] -= 1
        if _users[pool.threads] > 0:
            return
        del _pools[pool.threads], _users[pool.threads]
    pool.close()


def live_pools() -> dict[int, int]:
    """Thread count -> users, of the pools alive in this process (tests and diagnostics)."""
    with _pools_lock:
        return dict(_users)


@contextlib.contextmanager
def using_threads(threads: int) -> Iterator[None]:
    """Within the block, `parallel_for` in this thread spreads work over ``threads`` threads."""
    if threads < 2:
        with using_pool(None):
            yield
        return
    pool = acquire_pool(threads)
    try:
        with entered(pool):
            yield
    finally:
        release_pool(pool)


@contextlib.contextmanager
def entered(pool: ThreadPool) -> Iterator[None]:
    """Within the block ``pool`` answers `parallel_for` in this thread, its workers spinning for work."""
    pool.enter()
    try:
        with using_pool(pool):
            yield
    finally:
        pool.leave()
