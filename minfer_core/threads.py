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
