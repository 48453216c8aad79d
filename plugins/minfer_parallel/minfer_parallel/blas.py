"""How many threads numpy's BLAS uses, set around each run (onnxruntime's ``intra_op_num_threads``).

numpy reads OPENBLAS_NUM_THREADS only at import, so the executor talks to
the loaded BLAS at run time. threadpoolctl finds the BLAS libraries the
process has loaded (OpenBLAS, MKL, BLIS, on any OS). For OpenBLAS, the
BLAS numpy's wheels ship, this module then calls the library's own setter
and getter, bound once through ctypes, rather than threadpoolctl's
``set_num_threads``: that one lets only the first Python thread that sets
a limit change OpenBLAS's (a session run from a second thread would keep
BLAS's threads spinning against ours), and its wrappers cost ~4 us more per
run (bench/README.md). Other libraries go through threadpoolctl's methods.
Why it matters: OpenBLAS workers spin after each call, so with other
processes competing for the cores a 2-thread GEMM can be ten times slower
than a 1-thread one.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
from typing import Any, Callable, Iterator

Controls = tuple[Callable[[int], Any], Callable[[], int]]  # (set the thread count, get it)


@functools.lru_cache(maxsize=1)
def _controllers() -> tuple[Controls, ...]:
    import numpy  # noqa: F401  (loads numpy's BLAS, so threadpoolctl finds it)
    from threadpoolctl import ThreadpoolController

    libs = ThreadpoolController().select(user_api="blas").lib_controllers
    return tuple(_openblas(lib) or (lib.set_num_threads, lib.get_num_threads) for lib in libs)


def _openblas(lib: Any) -> Controls | None:
    """OpenBLAS's own ``openblas_set/get_num_threads`` (any of its symbol prefixes and suffixes), or None."""
    if lib.internal_api != "openblas" or getattr(lib, "threading_layer", "") == "openmp":
        return None
    try:
        dll = ctypes.CDLL(lib.filepath)
    except OSError:
        return None
    for prefix, suffix in itertools.product(("scipy_", ""), ("64_", "_64", "")):
        setter = getattr(dll, f"{prefix}openblas_set_num_threads{suffix}", None)
        getter = getattr(dll, f"{prefix}openblas_get_num_threads{suffix}", None)
        if setter is not None and getter is not None:
            setter.argtypes, setter.restype = [ctypes.c_int], None
            getter.argtypes, getter.restype = [], ctypes.c_int
            return setter, getter
    return None


def get_blas_threads() -> int | None:
    """numpy's BLAS thread count, or None when no BLAS threadpoolctl knows is loaded."""
    libs = _controllers()
    return int(libs[0][1]()) if libs else None


def set_blas_threads(n: int) -> int | None:
    """Set numpy's BLAS thread count; returns the previous one (None when uncontrollable)."""
    libs = _controllers()
    if not libs:
        return None
    old = int(libs[0][1]())
    if old != n:
        for setter, _ in libs:
            setter(int(n))
    return old


@contextlib.contextmanager
def blas_threads(n: int) -> Iterator[None]:
    """Within the block numpy's BLAS runs ``n`` threads; the caller's count comes back after."""
    previous = set_blas_threads(n)
    try:
        yield
    finally:
        if previous is not None and previous != n:
            set_blas_threads(previous)
