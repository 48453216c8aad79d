"""minfer-parallel: executors that run a model's kernels over threads or a forked process team.

Installed, it is the default executor ("threads"): kernels' `parallel_for`
ranges run on an intra-op thread pool, BLAS runs one thread per call
(threadpoolctl), and independent branches may run as concurrent stages
(``inter_op``). ``parallel="processes"`` opts into a forked worker that
shares each ``spmd`` kernel's output ranges over a shared arena.
"""

from __future__ import annotations

from .blas import get_blas_threads, set_blas_threads
from .pool import ThreadPool, using_threads

__all__ = ["ThreadPool", "get_blas_threads", "set_blas_threads", "using_threads"]
