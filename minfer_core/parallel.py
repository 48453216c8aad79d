"""Intra-op parallelism's front doors: kernels split their work with `parallel_for`, an executor says how.

Kernels call `parallel_for`, `intra_op_threads` and `scratch` whether or not an executor plugin is installed: with the
core alone (or outside a session run, or with one thread) `parallel_for` is ``fn(0, n)`` and `intra_op_threads` is 1,
so kernels need no second code path. An executor plugin (minfer-parallel) installs its pool for the duration of a run
with `using_pool`; a pool is anything with a ``threads`` count and a ``run(n, fn, parts)`` method (``ranked`` ones
also ``run_outputs``, for a process team; ``claim()`` for `claim_threads`).
"""

from __future__ import annotations

import contextlib
import contextvars
from typing import Any, Callable, Iterator

_POOL: contextvars.ContextVar[Any] = contextvars.ContextVar("minfer_intra_op_pool", default=None)


class using_pool:
    """Within the ``with`` block, `parallel_for` and `intra_op_threads` in this thread answer from ``pool``
    (None: serial). A class, not a generator: an executor enters one per run."""

    __slots__ = ("pool", "token")

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    def __enter__(self) -> None:
        self.token = _POOL.set(self.pool)

    def __exit__(self, *exc: object) -> None:
        _POOL.reset(self.token)


@contextlib.contextmanager
def using_threads(threads: int) -> Iterator[None]:
    """Within the block, `parallel_for` in this thread spreads work over ``threads`` threads: the installed
    executor with the highest priority that offers them (`Executor.threads`) gives them, else the block runs
    serially. For kernels' tests and benchmarks: sessions choose their own."""
    from .plugins import get_registry

    offers = [e for e in get_registry().executors if e.threads is not None]
    if threads < 2 or not offers:
        with using_pool(None):
            yield
        return
    with max(offers, key=lambda e: e.priority).threads(threads):
        yield


def intra_op_threads() -> int:
    """How many threads a kernel running now may split its work over (1 outside a parallel session run)."""
    return getattr(_POOL.get(), "threads", 1)


def claim_threads() -> int:
    """For a kernel about to split its work over threads of its own (a compiled team): the run's pool lets its
    threads go (``pool.claim()``), `parallel_for` running serially until the run ends. The count, or 1."""
    claim = getattr(_POOL.get(), "claim", None)
    return claim() if claim is not None else 1


def spmd(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Mark a kernel's run callable as one the processes of a process team may run together.

    The promise: called with ``out=``, it writes ``out`` only inside
    ``parallel_for(..., outputs_only=True)`` ranges (even when it does not
    split, with ``parts=1``), and writes nothing else but private scratch;
    everything else it does is decided by its arguments and by state it
    set up on its first call for a shape (a tuner's timed choice), never
    by timing or randomness later. Both processes then call it with the
    same arrays and each runs its share of those ranges.
    """
    fn.spmd = True  # type: ignore[attr-defined]
    return fn


def parallel_for(n: int, fn: Callable[[int, int], None], *, parts: int | None = None,
                 outputs_only: bool = False) -> None:
    """Call ``fn(lo, hi)`` on disjoint ranges that cover ``range(n)``, concurrently when threads are available.

    ``fn`` must only write memory no other range writes. ``parts`` is how many ranges to cut (default: one per
    thread; more balances uneven work at some hand-over cost). With one thread this is ``fn(0, n)``. Exceptions
    raised by any range propagate to the caller once all ranges end.

    ``outputs_only=True`` says that ``fn`` writes nothing but the kernel's output (and its own scratch): then the
    processes of a process team each run a share of the ranges. Other ranges write memory only this process sees (a
    padded copy in scratch), so under a team each process runs all of them itself.
    """
    if n <= 0:
        return
    pool = _POOL.get()
    if pool is None:
        fn(0, n)
        return
    if outputs_only and getattr(pool, "ranked", False):
        pool.run_outputs(n, fn, parts if parts is not None else pool.threads)
        return
    pool.run(n, fn, parts if parts is not None else pool.threads)
