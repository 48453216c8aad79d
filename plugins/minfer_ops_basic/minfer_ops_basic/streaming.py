"""Few-row products against a large B (a classifier head at batch 1): B's columns split over the threads, or not.

Such a product reads each of B's megabytes once, at the bandwidth one core draws from memory, so two cores may
take about half the time (onnxruntime's 1x1280 @ 1280x1000 head: 93 us on one thread, 52 on two), but its work
is below `linalg.SPLIT_WORK`, which never splits it. A split's hand-over costs 5-50 us on a quiet host and
milliseconds on a busy one (the worker waits for a CPU: 10-18 ms per call measured here with four other busy
processes on two cores, where the whole product took 70-160 us). So whether to split is timed once per shape and
thread count, in the first run that meets it (`minfer_core.choose`, stored like the convs' choices); a shape first
met in a later run is computed whole.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import numpy as np

from minfer_core import choose, intra_op_threads

ROWS = 8  # at most this many rows: a classifier at batch 1 to 8
ELEMENTS = 1 << 19  # B of at least this many elements (2 MB of float32, a core's L2 here): it streams from memory

_CHOSEN: dict[tuple[Any, ...], bool] = {}  # (shapes, layout, dtype, threads) -> split; the choice is made once


def applies(a2: np.ndarray, b: np.ndarray) -> bool:
    """A product of a few rows against a B large enough to stream, with threads to split it over."""
    return a2.shape[0] <= ROWS and b.size >= ELEMENTS and intra_op_threads() > 1


def split(y: np.ndarray, a2: np.ndarray, b: np.ndarray, y2: np.ndarray,
          parts: Callable[[np.ndarray, tuple[int, int], Callable[[int, int], None]], None]) -> tuple[int, int] | None:
    """(y's last axis, the thread count) when splitting B's columns is faster for y2 = a2 @ b, else None.

    ``parts(y, split, part)`` is linalg's: ``part(lo, hi)`` over column ranges. The timing runs write y2.
    """
    threads = intra_op_threads()
    key = (a2.shape, b.shape, b.strides, y.dtype.str, threads)
    chosen = _CHOSEN.get(key)
    if chosen is None:
        columns = (y.ndim - 1, threads)

        def whole() -> None:
            product(a2, b, y2)

        def halves() -> None:
            parts(y, columns, lambda lo, hi: product(a2, b[:, lo:hi], y2[:, lo:hi]))

        layout = "T" if b.flags.f_contiguous and not b.flags.c_contiguous else "N"
        name = f"matmul-rows|{a2.shape[0]}x{a2.shape[1]}@{b.shape[0]}x{b.shape[1]}{layout}|{y.dtype}|threads={threads}"
        chosen = _CHOSEN[key] = choose(name, ["whole", "columns"], lambda i: _seconds((whole, halves)[i])) == 1
    return (y.ndim - 1, threads) if chosen else None


# OpenBLAS (0.3.31, SkylakeX) computes a product of at most ~5 * 10**5 multiply-adds with its small-matrix kernel and
# packs B before larger ones: for a few rows against a large B the packing is most of the time (one thread: 8x2048 @
# 2048x1000 with B transposed 1033 us in one call, 260 in calls of 32 columns; B as given 391 -> 224; 2x1024 @
# 1024x1000 476 -> 55). A single row goes to gemv, already fast; narrower calls than 32 columns lost (8x4096 @
# 4096x4096 as given: 9.7 -> 34.6 ms).
SMALL_CALL = 1 << 19
NARROWEST = 32


def product(a2: np.ndarray, b: np.ndarray, y2: np.ndarray) -> None:
    """y2 = a2 @ b (2-D), a product of 2 to 32 rows in calls OpenBLAS takes with its small-matrix kernel."""
    m, k = a2.shape
    step = SMALL_CALL // max(m * k, 1) // 16 * 16
    n = b.shape[1]
    if not 2 <= m <= 32 or step < NARROWEST or step >= n:
        np.matmul(a2, b, out=y2)
        return
    for j in range(0, n, step):
        np.matmul(a2, b[:, j:j + step], out=y2[:, j:j + step])


def _seconds(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start
