"""One-time costs paid at build instead of in the first runs: a new pool's threads, and a new arena's pages.

A fresh thread's first GEMM makes OpenBLAS map and fault in its packing
buffers, and its first hand-over wakes and places it (`ThreadPool.run`);
a fresh arena's pages fault in on the first run that writes them, which is
the run *after* the discovery run that made it. In a fresh process both
showed as first and second runs several times the steady one (page faults
cost microseconds each in a VM). `warm` runs one GEMM on every thread of a
new pool through the pool's own hand-over (`acquire_pool` calls it, at the
session's build); `touched` writes one byte per page of each arena as it
is made, so its faults land in the discovery run, which is slow anyway.
"""

from __future__ import annotations

import threading
from typing import Callable

import numpy as np

from .blas import blas_threads

# (m, k, n) of the warm-up GEMM: as large as a typical conv tile's, so that OpenBLAS packs panels of the
# sizes real runs do (a tiny one maps the buffer but faults in only a few of its pages)
WARM_GEMM = (128, 384, 1024)
PAGE = 4096


def warm(pool: object) -> int:
    """Run one GEMM on each of ``pool``'s threads (the caller's included), all at once; returns how many did.

    The threads meet at a barrier first, so that each takes one part (an unmet barrier gives up after a
    second: a thread that did not come is warmed by its first run instead).
    """
    threads = getattr(pool, "threads", 1)
    if threads < 2:
        return 0
    m, k, n = WARM_GEMM
    a, b = np.ones((m, k), np.float32), np.ones((k, n), np.float32)
    meet = threading.Barrier(threads)
    ran: set[int] = set()

    def job(lo: int, hi: int) -> None:
        try:
            meet.wait(timeout=1.0)
        except threading.BrokenBarrierError:
            pass
        np.matmul(a, b)
        ran.add(threading.get_ident())

    with blas_threads(1):  # each thread's own single-threaded GEMM, as in a run
        pool.run(threads, job, threads)  # type: ignore[attr-defined]
    return len(ran)


def touched(allocate: Callable[[int], np.ndarray] | None) -> Callable[[int], np.ndarray]:
    """``allocate`` (default: ``np.empty`` bytes) whose result has one byte of each page written."""
    make = allocate or (lambda n: np.empty(n, dtype=np.uint8))

    def touched_arena(nbytes: int) -> np.ndarray:
        arena = make(nbytes)
        arena.reshape(-1).view(np.uint8)[::PAGE] = 0  # the contents are undefined: writing zeros changes nothing
        return arena

    touched_arena.touches = True  # type: ignore[attr-defined]
    return touched_arena
