"""How a conv method cuts its output into tiles (their scratch is `minfer_core.scratch`, per thread).

A tile is (image, output-channel range, output-row range): the unit one
thread finishes completely (copy, GEMM, bias, the fused op's epilogue)
while its operands are still in cache. Tiles are cut so that there are
enough of them to keep every core busy when the conv is worth splitting,
and small enough that a tile's scratch fits the budget the method gives.
"""

from __future__ import annotations

import math
import os
from typing import Callable, NamedTuple

import numpy as np

from minfer_core import parallel_for

# how many parts a conv worth splitting is cut into at least: one per core this process may use
SPLIT = max(1, min(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1, 8))
# below this many multiply-adds (~100 us of GEMM here) a conv runs as one tile per image: hand-over costs more.
# 4M split convs whose second half waited on the worker's wake-up: 8M took b1 OCR recognizer 0.571 -> 0.484 ms,
# MobileNetV3-small 3.78 -> 3.61, squeezenet 6.64 -> 6.41, DBNet 15.96 -> 15.26; resnet50, the detector and b8
# level (in-process A/B, quiet machine); 16M cost mobilenet_v2 2.5%
MIN_SPLIT_MACS = 8_000_000
# a GEMM given fewer output columns than this runs far below peak: split output channels instead of rows
MIN_COLUMNS = 64
CHANNEL_ALIGN = 16

Epilogue = Callable[[np.ndarray, tuple], None]
"""A fused op's finishing step: ``epilogue(y, region)`` on one finished tile of y."""


class Tile(NamedTuple):
    image: int
    m0: int
    m1: int
    r0: int
    r1: int
    images: int = 1  # a tile of a small map may span several images (methods that merge them say so)

    @property
    def region(self) -> tuple[slice, slice, slice]:
        return (slice(self.image, self.image + self.images), slice(self.m0, self.m1), slice(self.r0, self.r1))


def cut(n: int, m: int, rows: int, row_len: int, row_bytes: int, budget: int, macs: int,
        merge_columns: int = 0, prefer: str = "rows") -> list[Tile]:
    """Tiles over ``n`` images, ``m`` output channels and ``rows`` output rows of ``row_len`` columns.

    ``row_bytes``: scratch one output row needs; rows per tile keep it under ``budget``.
    ``macs``: multiply-adds of the whole conv, deciding whether splitting pays.
    ``merge_columns``: a method that can put several images in one GEMM asks for tiles of whole images,
    as many as make about this many columns, when one image has fewer (threads still each get a tile).
    ``prefer``: how an image that must give several threads work is cut: by output ``"rows"`` (each
    thread's GEMM has all the weights; output channels only when the rows are too few or too narrow), or
    by output ``"channels"`` (`_cut_channels`). Batches of enough images cut the same either way.
    """
    want = SPLIT if macs >= MIN_SPLIT_MACS else 1
    if prefer == "channels" and n < want and m >= 2 * CHANNEL_ALIGN:
        return _cut_channels(n, m, rows, row_bytes, budget, math.ceil(want / n))
    per_image = rows * row_len
    if merge_columns and n > 1 and per_image < merge_columns:
        most = min(max(1, budget // max(1, rows * row_bytes)), max(1, n // want))
        k = min(math.ceil(merge_columns / per_image), most)
        # a tile count the threads share evenly (8 images as 3 + 3 + 2 would leave one thread idle a third)
        k = next((j for j in range(k, most + 1) if math.ceil(n / j) % want == 0), k)
        if k > 1:
            return [Tile(i, 0, m, 0, rows, min(k, n - i)) for i in range(0, n, k)]
    step = max(1, min(rows, budget // max(1, row_bytes)))
    m_parts = 1
    per_image = math.ceil(want / n)
    blocks = math.ceil(rows / step)
    if blocks < per_image:
        # more parts are needed from each image: rows while a part keeps a decent GEMM width, else channels
        if rows >= per_image and math.ceil(rows / per_image) * row_len >= MIN_COLUMNS:
            blocks = per_image
        elif m >= 2 * CHANNEL_ALIGN:
            m_parts = min(per_image, m // CHANNEL_ALIGN)
    elif want > 1 and n * blocks % want:
        # a count of equal blocks the threads share evenly (17 + 11 rows would leave one thread idle a third)
        blocks = math.ceil(n * blocks / want) * want // n if want % n == 0 else blocks
    step = math.ceil(rows / blocks)
    m_bounds = [CHANNEL_ALIGN * round(m * k / m_parts / CHANNEL_ALIGN) if 0 < k < m_parts else m * k // m_parts
                for k in range(m_parts + 1)]
    return [Tile(i, m0, m1, r0, min(rows, r0 + step))
            for i in range(n) for m0, m1 in zip(m_bounds, m_bounds[1:]) for r0 in range(0, rows, step)]


def _cut_channels(n: int, m: int, rows: int, row_bytes: int, budget: int, parts: int) -> list[Tile]:
    """Tiles of each image's rows (cut only to fit the budget), each in ``parts`` equal output-channel shares.

    Each thread's GEMM then has a share of the weights and every column of the tile. Only for images that
    must give several threads work: at batch 8 (2 threads) channel shares of each image (or of merged small
    maps) were up to 20% slower than whole images per thread on resnet50's and densenet121's layers and at
    most 2% faster, but for a classifier on 1x1 maps. A tile's shares are next to each other, so the threads
    read its input at the same time.
    """
    parts = min(parts, m // CHANNEL_ALIGN)
    # equal shares first, then as aligned as they can be (a thread with 16 channels more than the other waits)
    align = next((a for a in (CHANNEL_ALIGN, 8, 4, 2) if m % (a * parts) == 0), 1)
    bounds = [align * round(m * k / parts / align) for k in range(parts + 1)]
    step = max(1, min(rows, budget // max(1, row_bytes)))
    return [Tile(i, m0, m1, r0, min(rows, r0 + step))
            for i in range(n) for r0 in range(0, rows, step) for m0, m1 in zip(bounds, bounds[1:])]


def finish(y: np.ndarray, tile: Tile, bias: np.ndarray | None, epilogue: Epilogue | None) -> None:
    """Bias (an (M, 1, ..., 1) column) and then the fused op's epilogue, on one finished tile of y."""
    region = tile.region
    if bias is not None:
        part = y[region]
        part += bias[tile.m0 : tile.m1]
    if epilogue is not None:
        epilogue(y, region)


def run_tiles(tiles: list[Tile], fn: Callable[[Tile], None]) -> None:
    """``fn(tile)`` for every tile, over the session's intra-op threads (each tile taken by whoever is free).

    A tile writes only its part of the output (and scratch), so the processes of a process team may share
    them out too (``outputs_only``): even a single tile goes through `parallel_for`, so that only one
    process computes it.
    """

    def span(lo: int, hi: int) -> None:
        for k in range(lo, hi):
            fn(tiles[k])

    parallel_for(len(tiles), span, parts=len(tiles), outputs_only=True)
