"""The `Executor` record: a way of running a built model's steps, contributed through ``register_executors``.

The core ships "sequential" (sequential.py); an executor plugin
(minfer-parallel) adds threads and a process team. A session chooses by
name (``parallel=``, else ``MINFER_PARALLEL``), else the installed one with
the highest priority runs.
"""

from __future__ import annotations

import numbers
import os
from typing import Any, Callable, ContextManager, Mapping, Sequence

import attrs

PARALLEL_ENV = "MINFER_PARALLEL"


@attrs.frozen
class Executor:
    """How runs execute: ``factory(program, options)`` makes the per-session executor object.

    ``options`` holds the session's ``threads`` and ``inter_op``. The object
    has ``run(vals, signature, observers, fresh)`` (runs the steps over the
    slot list, returns the feeds it staged in memory of its own, or None)
    and ``memory_report()``. ``threads``, when given, makes a context manager
    within which `parallel_for` in the calling thread uses that many threads
    (``minfer_core.parallel.using_threads``: kernels' tests and benchmarks).
    """

    name: str
    factory: Callable[[Any, Mapping[str, Any]], Any]
    priority: int = 0
    threads: Callable[[int], ContextManager[None]] | None = None
    description: str = ""
    plugin: str | None = None


def select(available: Sequence[Executor], name: str | None) -> Executor:
    """The executor called ``name`` (else ``MINFER_PARALLEL``'s, else the highest priority); unknown is an error."""
    name = name or os.environ.get(PARALLEL_ENV) or None
    if name is None:
        return max(available, key=lambda e: e.priority)
    found = [ex for ex in available if ex.name == name]
    if len(found) > 1:
        raise ValueError(f"executor {name!r} is registered by {sorted(str(e.plugin) for e in found)}: uninstall one")
    if found:
        return found[0]
    names = ", ".join(repr(e.name) for e in sorted(available, key=lambda e: -e.priority))
    hint = "" if len(available) > 1 else "; pip install minfer-parallel for 'threads' and 'processes'"
    raise ValueError(f"parallel={name!r} names no installed executor: the installed ones are {names}{hint}")


def check_threads(threads: Any) -> int | str | None:
    """``threads`` if it is a positive count, "auto" or None; else a TypeError or ValueError saying what is accepted."""
    if threads is None or threads == "auto":
        return threads
    if isinstance(threads, bool) or not isinstance(threads, numbers.Integral):
        if isinstance(threads, str):
            raise ValueError(f"threads={threads!r}: expected a positive int, 'auto' or None")
        raise TypeError(f"threads={threads!r} is a {type(threads).__name__}: expected a positive int, 'auto' or None")
    if threads < 1:
        raise ValueError(f"threads={threads}: expected a positive int (1 runs kernels serially), 'auto' or None")
    return int(threads)
