"""minfer-parallel's hook implementations: the "threads" and "processes" executors."""

from __future__ import annotations

from typing import Callable

from minfer_core import Executor, hookimpl

from .executors import ProcessExecutor, ThreadsExecutor
from .pool import using_threads

EXECUTORS = [
    Executor("threads", ThreadsExecutor, priority=10, threads=using_threads,
             description="kernels split their work over an intra-op thread pool; optional concurrent stages"),
    # opt-in: it forks the process after build
    Executor("processes", ProcessExecutor, priority=5, threads=using_threads,
             description="spmd kernels share their output ranges with a forked worker over a shared arena"),
]


@hookimpl
def register_executors(register: Callable[..., None]) -> None:
    register(EXECUTORS)
