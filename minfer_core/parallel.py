"""Intra-op parallelism: kernels split their work with `parallel_for`, the engine says over how many threads.

Why minfer runs its own threads instead of leaving it to numpy's BLAS: only
the GEMM inside a conv is threaded by OpenBLAS; the im2col copies,
Winograd transforms, bias, residual and activation passes, pooling and
depthwise taps are single-threaded numpy loops, and on resnet50 they were a
third of the run. numpy releases the GIL inside its ufunc loops, copies and
matmul, so two Python threads each running a kernel's half (with a
1-thread BLAS) keep both cores busy through all of it. OpenBLAS's own
threads would fight with ours (they spin ~0.1 s after each call), so while
a session runs with more than one intra-op thread the engine sets BLAS to
one thread and every kernel that matters splits its own work.

Outside a session run, or with ``threads=1``, `parallel_for` just calls
``fn(0, n)``: kernels need no second code path. A `parallel_for` inside
another runs serially (workers have no pool), so nesting cannot deadlock.
"""

from __future__ import annotations

import contextlib
import contextvars
import ctypes
import itertools
import os
import queue
import threading
from typing import Callable, Iterator

_POOL: contextvars.ContextVar["ThreadPool | None"] = contextvars.ContextVar("minfer_intra_op_pool", default=None)


def _cpu_query() -> Callable[[], int] | None:
    """libc's sched_getcpu (the CPU the calling thread runs on), or None where there is none."""
    try:
        fn = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [], ctypes.c_int
    return fn if fn() >= 0 else None


class ThreadPool:
    """``threads - 1`` daemon workers plus the calling thread; one `run` at a time (others run serially).

    Workers block on a queue between calls (no spinning), so an idle pool
    costs nothing; handing work over costs a few microseconds, which is why
    kernels split only work of a few hundred microseconds or more.

    Workers are kept off the CPU the calling thread is on. Without that,
    Linux often wakes a worker on its waker's CPU (cache affinity) and
    leaves it there for hundreds of milliseconds while the other core idles:
    measured here, a 2-way split GEMM then ran at 1-thread speed in one
    block of runs out of three. The calling thread is never pinned.
    """

    def __init__(self, threads: int) -> None:
        if threads < 1:
            raise ValueError(f"a pool needs at least one thread, not {threads}")
        self.threads = threads
        self._busy = threading.Lock()
        self._inboxes: list[queue.SimpleQueue] = []
        self._done: queue.SimpleQueue = queue.SimpleQueue()
        self._tids: list[int] = []
        started = threading.Barrier(threads)
        for i in range(threads - 1):
            inbox: queue.SimpleQueue = queue.SimpleQueue()
            worker = threading.Thread(target=self._work, args=(inbox, started), name=f"minfer-intra-op-{i + 1}",
                                      daemon=True)
            worker.start()
            self._inboxes.append(inbox)
        if threads > 1:
            started.wait()
        self._where = _cpu_query()
        try:
            self._cpus = frozenset(os.sched_getaffinity(0)) if self._where is not None else frozenset()
        except (AttributeError, OSError):
            self._cpus = frozenset()
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

    def _work(self, inbox: queue.SimpleQueue, started: threading.Barrier) -> None:
        self._tids.append(threading.get_native_id())
        started.wait()
        while True:
            job = inbox.get()
            error = None
            try:
                job()
            except BaseException as exc:  # handed to the caller, which re-raises it
                error = exc
            self._done.put(error)

    def run(self, n: int, fn: Callable[[int, int], None], parts: int) -> None:
        """Call ``fn(lo, hi)`` over ``parts`` contiguous ranges covering [0, n), the ranges taken by whoever is free."""
        parts = max(1, min(parts, n))
        if parts == 1 or self.threads == 1 or not self._busy.acquire(blocking=False):
            fn(0, n)
            return
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

            helpers = self._inboxes[: parts - 1]
            for inbox in helpers:
                inbox.put(drain)
            error: BaseException | None = None
            try:
                drain()
            except BaseException as exc:
                error = exc
            for _ in helpers:
                failed = self._done.get()
                error = error or failed
            if error is not None:
                raise error
        finally:
            self._busy.release()


_pools: dict[int, ThreadPool] = {}
_pools_lock = threading.Lock()


def _forget_pools_after_fork() -> None:
    """A forked child has none of its parent's worker threads: it makes its own pools on first use."""
    global _pools_lock
    _pools.clear()
    _pools_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_pools_after_fork)


def get_pool(threads: int) -> ThreadPool:
    """The process-wide pool with ``threads`` threads (made on first use, shared by sessions)."""
    with _pools_lock:
        pool = _pools.get(threads)
        if pool is None:
            pool = _pools[threads] = ThreadPool(threads)
        return pool


@contextlib.contextmanager
def using_threads(threads: int) -> Iterator[None]:
    """Within the block, `parallel_for` in this thread spreads work over ``threads`` threads."""
    token = _POOL.set(get_pool(threads) if threads > 1 else None)
    try:
        yield
    finally:
        _POOL.reset(token)


def intra_op_threads() -> int:
    """How many threads a kernel running now may split its work over (1 outside a parallel session run)."""
    pool = _POOL.get()
    return 1 if pool is None else pool.threads


def parallel_for(n: int, fn: Callable[[int, int], None], *, parts: int | None = None) -> None:
    """Call ``fn(lo, hi)`` on disjoint ranges that cover ``range(n)``, concurrently when threads are available.

    ``fn`` must only write memory no other range writes. ``parts`` is how
    many ranges to cut (default: one per thread; more balances uneven
    work at some hand-over cost). With one thread this is ``fn(0, n)``.
    Exceptions raised by any range propagate to the caller once all ranges end.
    """
    if n <= 0:
        return
    pool = _POOL.get()
    if pool is None:
        fn(0, n)
        return
    pool.run(n, fn, parts if parts is not None else pool.threads)
