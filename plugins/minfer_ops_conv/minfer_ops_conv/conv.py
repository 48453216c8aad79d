"""Kernels: Conv, by the method that suits each shape: pointwise GEMM, im2col slabs + GEMM, Winograd, depthwise taps."""

from __future__ import annotations

import math
import os
from typing import Callable

import attrs
import numpy as np

from minfer_core import kernel, parallel_for, scratch, spmd

from . import _geometry as geo
from . import depthwise, winograd
from .tiles import SPLIT, Epilogue, Tile, cut, finish, run_tiles
from .tuner import Tuned


@attrs.define(eq=False)
class Packed:
    """Conv weights laid out once for the GEMM: ``matrix`` is (G, M/G, C/G * prod(kernel)).

    Winograd weights (16/9 the size of the conv's) are made when a shape first tries the Winograd
    method and dropped again when the tuner chose another method for every shape seen: holding them
    for every 3x3 conv cost vgg19 140 MB it mostly did not use. ``constant``: the weights are the
    model's (packed once at build); per-run weights never try Winograd (transforming them each run
    would cost more than it saves).
    """

    group: int
    out_channels: int
    kernel: tuple[int, ...]
    matrix: np.ndarray
    depthwise: np.ndarray | None  # (C, prod(kernel)) when group == C == M
    constant: bool = False
    _winograd: np.ndarray | None = None
    # (1, M, K + 1): the matrix with the model's bias as an extra column (``matrix`` is a view of it), so
    # that a method which copies its GEMM operand anyway adds the bias in the GEMM through a row of ones
    biased: np.ndarray | None = None

    def winograd_weights(self) -> np.ndarray:
        """(16, M, C): G g G^T per filter, made on first use."""
        if self._winograd is None:
            w = self.matrix.reshape((self.out_channels, -1) + self.kernel)
            self._winograd = winograd.transform_weights(w)
        return self._winograd

    def weights(self, with_bias: bool) -> np.ndarray:
        """The GEMM's left operand: ``biased`` (its last column the bias) when asked for and held, else ``matrix``."""
        return self.biased if with_bias and self.biased is not None else self.matrix

    @property
    def has_winograd_weights(self) -> bool:
        return self._winograd is not None

    def drop_winograd(self) -> None:
        self._winograd = None


def pack(w: np.ndarray, group: int, build_time: bool = False, bias: np.ndarray | None = None) -> Packed:
    """Reshape W[M, C/G, *k] into per-group GEMM matrices, plus taps for depthwise convs.

    ``bias``: the model's constant bias, held as the matrix's extra column (one group, not pointwise):
    the im2col GEMM then adds it, which saves a pass over the output (3% of resnet50 at batch 1).
    """
    m, cg = w.shape[:2]
    kernel = tuple(w.shape[2:])
    k = cg * math.prod(kernel)
    biased = None
    if bias is not None and group == 1 and build_time:
        biased = np.empty((1, m, k + 1), dtype=w.dtype)
        biased[0, :, :k] = w.reshape(m, k)
        biased[0, :, k] = bias
        matrix = biased[:, :, :k]
    else:
        matrix = np.ascontiguousarray(w.reshape(group, m // group, -1))
    depthwise = None
    if group > 1 and cg == 1 and m == group:
        depthwise = np.ascontiguousarray(w.reshape(m, -1))
    return Packed(group, m, kernel, matrix, depthwise, constant=build_time, biased=biased)


Plan = Callable[[np.ndarray, Packed, np.ndarray, "np.ndarray | None", "Epilogue | None"], None]
"""A conv method for one input geometry: ``run(x, p, y, bias, epilogue)`` writes conv(x) + bias into y, a
(N, M, *out) C-contiguous array, and calls ``epilogue(y, region)`` on each finished tile (see tiles.py)."""


def _groups(p: Packed, t: Tile) -> slice:
    """The groups tile t covers (grouped convs' tiles cover whole groups)."""
    mg = p.out_channels // p.group
    return slice(t.m0 // mg, t.m1 // mg)


def _gemm_into(p: Packed, cols: np.ndarray, dst: np.ndarray, t: Tile) -> None:
    """W @ cols for tile t of one image, per group: (G', Mg, K) @ (G', K, P) into dst (G', Mg, P).

    Plain 2-D matmuls when there is one group (numpy's stacked matmul can miss the BLAS fast path);
    then the tile may cover a range of output channels, else a range of whole groups.
    """
    if p.group == 1:
        np.matmul(p.matrix[0, t.m0 : t.m1], cols[0], out=dst[0])
    else:
        np.matmul(p.matrix[_groups(p, t)], cols, out=dst)


def _gemm_images(weights: np.ndarray, ops: np.ndarray, y: np.ndarray, t: Tile, row_len: int) -> None:
    """weights[0] (one group) @ ops for tile t, ops' columns being the tile's images one after another.

    One image lands directly in its NCHW rows; several go through scratch and one transposing copy.
    """
    m = t.m1 - t.m0
    if t.images == 1:
        rows = y[t.image].reshape(y.shape[1], -1)[t.m0 : t.m1, t.r0 * row_len : t.r1 * row_len]
        np.matmul(weights[0, t.m0 : t.m1], ops, out=rows)
        return
    out = scratch("conv-images", (m, t.images, ops.shape[1] // t.images), y.dtype)
    np.matmul(weights[0, t.m0 : t.m1], ops, out=out.reshape(m, -1))
    np.copyto(y[t.image : t.image + t.images, t.m0 : t.m1].reshape(t.images, m, -1), out.transpose(1, 0, 2))


def _out_rows(y: np.ndarray, p: Packed, t: Tile, row_len: int) -> np.ndarray:
    """Tile t's output as a (G', Mg, rows * row_len) view (rows of one image are contiguous)."""
    g = p.group
    yi = y[t.image].reshape(g, y.shape[1] // g, -1)
    rows = slice(t.r0 * row_len, t.r1 * row_len)
    return yi[:, t.m0 : t.m1, rows] if g == 1 else yi[_groups(p, t), :, rows]


# grouped convs share whole groups out between the threads from this many multiply-adds. Measured on
# shufflenet b1 (in-process A/B, 2 threads): splitting its 1x1 group-4 layers (3.6-9.8M MACs) from 1M
# on was 8% slower over the model, from 5M on level: their GEMMs are too small to pay the ~50 us
# hand-over. Large grouped convs (ResNeXt's 3x3, ~100M MACs) are what this is for.
MIN_GROUP_SPLIT_MACS = 8_000_000


def _grouped_tiles(n: int, p: Packed, rows: int, macs: int) -> list[Tile]:
    """Tiles of whole groups (all rows) for a grouped conv: one per image, or the groups split per thread."""
    g, mg = p.group, p.out_channels // p.group
    parts = min(g, math.ceil(SPLIT / n)) if macs >= MIN_GROUP_SPLIT_MACS else 1
    bounds = [g * k // parts for k in range(parts + 1)]
    return [Tile(i, g0 * mg, g1 * mg, 0, rows) for i in range(n) for g0, g1 in zip(bounds, bounds[1:])]


# a pointwise conv copies its input tile to add the bias in the GEMM (a row of ones) when it has at most this
# many input channels per output channel: the copy of C rows then costs less than the bias pass over M rows
FOLD_CHANNELS = 1.0
# a pointwise conv of one image with at most this many output cells per channel, left whole by its tiling (too
# small to split), skips the tile machinery: one GEMM straight on its input or on one plain copy (when it folds
# the bias), then the epilogue. On maps this small (squeeze-excite's 1x1, 7x7 heads) the machinery's Python
# and numpy calls cost as much as the GEMM
SMALL_MAP = 256


def _whole_image(x: np.ndarray, p: Packed, y: np.ndarray, bias: np.ndarray | None, fold: bool,
                 epilogue: Epilogue | None, t: Tile) -> None:
    """A one-group pointwise conv of one image as the single tile ``t`` (all of y): W @ x + bias (in the GEMM
    when ``fold``: x copied above a row of ones), then the epilogue. Through `parallel_for` all the same, so
    that only one process of a team computes it."""
    c = x.shape[1]
    out = y.reshape(p.out_channels, -1)

    def whole(lo: int, hi: int) -> None:
        if fold:
            ops = scratch("conv-pointwise", (c + 1, out.shape[1]), x.dtype)
            np.copyto(ops[:c], x.reshape(c, -1))
            ops[c] = 1
            np.matmul(p.weights(True)[0], ops, out=out)
        else:
            np.matmul(p.matrix[0], x.reshape(c, -1), out=out)
            if bias is not None:
                np.add(out, bias.reshape(-1, 1), out=out)
        if epilogue is not None:
            epilogue(y, t.region)

    parallel_for(1, whole, parts=1, outputs_only=True)


def _pointwise(w: geo.Window, budget: int | None = None, prefer: str = "rows") -> Plan:
    """1x1 kernel, no pad: the input is already the GEMM's right operand (strided when s > 1).

    ``prefer``: how an image is cut between threads (``tiles.cut``).
    """
    budget = budget or TILE_BYTES
    sub = (slice(None), slice(None)) + tuple(slice(None, None, s) for s in w.strides)
    strided = any(s > 1 for s in w.strides)
    rows = w.out_shape[0]
    row_len = int(np.prod(w.out_shape[1:]))
    cache: dict[tuple[int, int, int], list[Tile]] = {}

    def tiles_for(x: np.ndarray, p: Packed) -> list[Tile]:
        n, c = x.shape[:2]
        m, g = p.out_channels, p.group
        key = (n, c, m)
        if key not in cache:
            macs = n * m * c // g * rows * row_len
            cache[key] = (cut(n, m, rows, row_len, (c + m) * row_len * x.itemsize, budget, macs, MERGE_COLUMNS,
                              prefer) if g == 1 else _grouped_tiles(n, p, rows, macs))
        return cache[key]

    def run(x: np.ndarray, p: Packed, y: np.ndarray, bias: np.ndarray | None, epilogue: Epilogue | None) -> None:
        n, c = x.shape[:2]
        m, g = p.out_channels, p.group
        tiles = tiles_for(x, p)
        fold = bias is not None and p.biased is not None and (strided or c <= FOLD_CHANNELS * m)
        if n == 1 and g == 1 and not strided and len(tiles) == 1 and rows * row_len <= SMALL_MAP:
            _whole_image(x, p, y, bias, fold, epilogue, tiles[0])
            return
        xs = x[sub] if strided else x
        cols = xs.reshape(n, g, c // g, rows, row_len)

        def tile(t: Tile) -> None:
            if g == 1 and (fold or strided or t.images > 1):
                # a contiguous copy of the tile's input, image after image (a strided one would be copied by
                # reshape anyway), with a row of ones under it when the bias rides in the GEMM
                src = cols[t.image : t.image + t.images, 0, :, t.r0 : t.r1]
                ops = scratch("conv-pointwise", (c + fold, t.images, (t.r1 - t.r0) * row_len), x.dtype)
                np.copyto(ops[:c].reshape(c, t.images, t.r1 - t.r0, row_len), src.transpose(1, 0, 2, 3))
                if fold:
                    ops[c] = 1
                _gemm_images(p.weights(fold), ops.reshape(c + fold, -1), y, t, row_len)
                finish(y, t, None if fold else bias, epilogue)
                return
            src = cols[t.image, _groups(p, t) if g > 1 else slice(None), :, t.r0 : t.r1]
            _gemm_into(p, src.reshape(src.shape[0], c // g, -1), _out_rows(y, p, t, row_len), t)
            finish(y, t, bias, epilogue)

        run_tiles(tiles, tile)

    run.tiling = tiles_for  # type: ignore[attr-defined]
    return run


# A tile's operands (its im2col slab or input rows, and its output rows) take about this many bytes, so
# they stay in cache from the copy through the GEMM to the bias and the fused epilogue (a whole 224x224
# im2col would not). Smaller tiles lose more to narrow GEMMs and per-tile overhead than they gain in
# cache: measured on resnet50's layers (bias + residual + Relu epilogue, 2 threads), 128-256 KiB tiles
# were up to 2x slower than 1 MiB ones, and at batch 8 4 MiB tiles were best for most layers but not all,
# hence the two sizes the tuner tries (TUNE_BYTES).
TILE_BYTES = 1 << 20
TUNE_BYTES = (1 << 20, 4 << 20)
# a single-group conv whose output map has fewer columns than this puts several images in one GEMM (at
# batch > 1): OpenBLAS's sgemm ran at 95 GFLOP/s with 49 columns and 115 with 392 (M=512, K=4608)
MERGE_COLUMNS = 128


def _padded(x: np.ndarray, w: geo.Window) -> np.ndarray:
    """x zero-padded as ``w`` asks, in this thread's reusable scratch (a run allocates nothing).

    Only the border is zeroed; the copy of the interior is split over the intra-op threads by channel planes.
    """
    if not w.padded:
        return x
    if any(b < 0 for b in w.begin) or any(e < 0 for e in w.end):
        return geo.pad(x, w)  # SAME with stride > kernel crops: rare, keep the general path
    lead = x.ndim - len(w.in_shape)
    shape = x.shape[:lead] + tuple(i + b + e for i, b, e in zip(w.in_shape, w.begin, w.end))
    xp = scratch("conv-pad", shape, x.dtype)
    for d, (b, i) in enumerate(zip(w.begin, w.in_shape)):
        axis = (slice(None),) * (lead + d)
        xp[axis + (slice(0, b),)] = 0
        xp[axis + (slice(b + i, None),)] = 0
    inner = tuple(slice(b, b + i) for b, i in zip(w.begin, w.in_shape))
    planes, src = xp.reshape((-1,) + shape[lead:]), x.reshape((-1,) + x.shape[lead:])

    def copy(lo: int, hi: int) -> None:
        planes[(slice(lo, hi),) + inner] = src[lo:hi]

    if x.nbytes >= PARALLEL_COPY_BYTES:
        parallel_for(len(src), copy)
    else:
        copy(0, len(src))
    return xp


# copies smaller than this are not worth handing to another thread (15-50 us hand-over)
PARALLEL_COPY_BYTES = 256 << 10


def _im2col(w: geo.Window, budget: int | None = None, prefer: str = "rows") -> Plan:
    """General conv: strided im2col view of the padded input, copied slab by slab, one GEMM per slab.

    W[M, C*k] @ cols[C*k, rows*W] lands directly in the NCHW output's row range: no transpose.
    ``prefer``: how an image is cut between threads (``tiles.cut``; by channels each thread copies the whole
    slab, hence not among the `candidates`).
    """
    budget = budget or TILE_BYTES
    rows = w.out_shape[0]
    row_len = int(np.prod(w.out_shape[1:]))
    rest = (slice(None),) * (len(w.out_shape) - 1)
    spatial = len(w.out_shape)
    # the view's axes (N, C, *kernel, *out) as (C, *kernel, N, *out): images side by side (np.moveaxis, minus
    # its axis checks, which showed in profiles of the GIL at batch 1)
    images_inside = tuple(range(1, 2 + spatial)) + (0,) + tuple(range(2 + spatial, 2 + 2 * spatial))
    cache: dict[tuple[int, int, int], list[Tile]] = {}

    def tiles_for(x: np.ndarray, p: Packed) -> list[Tile]:
        n = x.shape[0]
        g, mg, k = p.matrix.shape
        key = (n, g, k)
        if key not in cache:
            macs = n * g * mg * k * rows * row_len
            cache[key] = (cut(n, mg, rows, row_len, (k + mg) * row_len * x.itemsize, budget, macs, MERGE_COLUMNS,
                              prefer) if g == 1 else _grouped_tiles(n, p, rows, macs))
        return cache[key]

    def run(x: np.ndarray, p: Packed, y: np.ndarray, bias: np.ndarray | None, epilogue: Epilogue | None) -> None:
        g, mg, k = p.matrix.shape
        tiles = tiles_for(x, p)
        view = geo.im2col_view(_padded(x, w), w)
        per_group = x.shape[1] // g
        fold = bias is not None and p.biased is not None

        def tile(t: Tile) -> None:
            width = (t.r1 - t.r0) * row_len
            if g == 1 and (fold or t.images > 1):
                # the slabs of the tile's images side by side; when the bias rides in the GEMM, a row of ones
                # under them (the bias is W's extra column)
                slabs = view[t.image : t.image + t.images][(slice(None), Ellipsis, slice(t.r0, t.r1)) + rest]
                cols = scratch("conv-im2col", (k + fold, t.images, width), x.dtype)
                dst = cols[:k].reshape(slabs.shape[1 : -spatial] + (t.images,) + slabs.shape[-spatial:])
                np.copyto(dst, slabs.transpose(images_inside))
                if fold:
                    cols[k] = 1
                _gemm_images(p.weights(fold), cols.reshape(k + fold, -1), y, t, row_len)
                finish(y, t, None if fold else bias, epilogue)
                return
            channels = slice(None) if g == 1 else slice(t.m0 // mg * per_group, t.m1 // mg * per_group)
            slab = view[t.image][(channels, Ellipsis, slice(t.r0, t.r1)) + rest]
            cols = scratch("conv-im2col", (slab.shape[0] // per_group, k, width), x.dtype)
            np.copyto(cols.reshape(slab.shape), slab)
            _gemm_into(p, cols, _out_rows(y, p, t, row_len), t)
            finish(y, t, bias, epilogue)

        run_tiles(tiles, tile)

    run.tiling = tiles_for  # type: ignore[attr-defined]
    return run


# how a pointwise conv's image is cut between threads, the usual best first (tiles.cut). Cutting by output
# channels gives each thread half the weights and every column; measured at batch 1 (2 threads, kernel medians)
# it won 3-10% on most of densenet121's 1x1 layers at 14x14 (288-992 -> 128 channels) and 5% on resnet50's
# 1024 -> 512, and lost on 56x56 ones with few channels (256 -> 64: 659 against 605 us). At batch 8 both cut
# alike and tuner.distinct times one. im2col does not try it: each thread would copy the whole slab (resnet50's 128 3x3
# stride 2: 1601 against 1406 us, densenet121's 128 -> 32 3x3: 738 against 552), and no 3x3 layer of either
# model gained beyond noise, while timing it cost densenet121's first run 150 ms more.
PREFER = ("rows", "channels")


def candidates(w: geo.Window, p: Packed, channels: int) -> list[Plan]:
    """The methods (and tile sizes) that can compute this conv, the usual best first."""
    if p.depthwise is not None and channels == p.group:
        return [depthwise.plan(w)]  # times its two layouts itself
    if all(k == 1 for k in p.kernel) and not w.padded:
        return [_pointwise(w, b, prefer) for prefer in PREFER for b in TUNE_BYTES]
    plans = [_im2col(w, b) for b in TUNE_BYTES]
    if winograd.applies(w, p):
        plans += [winograd.plan(w, budget=b) for b in winograd.TUNE_BYTES]
    return plans


# MINFER_CONV_TUNE=0: always take the first candidate (reproducible method choice, no timing at first run)
TUNE = os.environ.get("MINFER_CONV_TUNE", "1") != "0"
def plan_for(w: geo.Window, p: Packed, channels: int, settled: Callable[[], None] | None = None,
             prior: dict[str, str] | None = None) -> Plan:
    """The method for this weight and input geometry, chosen once per shape (by timing, when several apply);
    ``prior`` holds the method an earlier shape of the node chose, which `choose` reuses untimed."""
    plans = candidates(w, p, channels)
    key = f"conv|{w}|{p.out_channels}x{channels}/{p.group}"
    plan = plans[0] if len(plans) == 1 or not TUNE else Tuned(plans, settled, key, {} if prior is None else prior)
    return _one_gemm(w, p, plan) if _small_pointwise(w, p) else plan


def _small_pointwise(w: geo.Window, p: Packed) -> bool:
    """A one-group 1x1 conv, stride 1, no pads, on a map of at most `SMALL_MAP` cells (squeeze-excite's 1x1)."""
    return (p.group == 1 and all(k == 1 for k in p.kernel) and not w.padded and all(s == 1 for s in w.strides)
            and math.prod(w.out_shape) <= SMALL_MAP)


def _one_gemm(w: geo.Window, p: Packed, batches: Plan) -> Plan:
    """One image of a `_small_pointwise` conv as W @ x, + bias, then the epilogue on all of y, straight from the
    call: no tuner, tiling or scratch, and no bias row to copy x above (`_whole_image` without what surrounds it).
    Measured alone, a squeeze-excite 576 -> 144 conv + Relu took 7.0 -> 5.9 us (the bare GEMM, add and Relu: 5.6),
    144 -> 576 8.3 -> 6.6; in mobilenet_v3_small's runs without numba its SE convs took 25-35% less. Batches go
    to ``batches`` (the tuned methods)."""
    cells = math.prod(w.out_shape)
    region = (slice(0, 1), slice(0, p.out_channels), slice(0, w.out_shape[0]))

    def run(x: np.ndarray, p: Packed, y: np.ndarray, bias: np.ndarray | None, epilogue: Epilogue | None) -> None:
        if x.shape[0] != 1:
            batches(x, p, y, bias, epilogue)
            return
        out = y.reshape(p.out_channels, cells)
        src = x.reshape(x.shape[1], cells)

        def whole(lo: int, hi: int) -> None:
            np.matmul(p.matrix[0], src, out=out)
            if bias is not None:
                np.add(out, bias.reshape(p.out_channels, 1), out=out)
            if epilogue is not None:
                epilogue(y, region)

        parallel_for(1, whole, parts=1, outputs_only=True)  # one range: one process of a team computes it

    run.batches = batches  # type: ignore[attr-defined]
    return run


def _uses_winograd(plan: Plan) -> bool:
    plan = getattr(plan, "batches", plan)
    chosen = plan.chosen if isinstance(plan, Tuned) else [plan]
    return any(getattr(c, "winograd", False) for c in chosen)


def _bias_column(b: np.ndarray, rank: int, dtype: np.dtype) -> np.ndarray:
    """Bias shaped (M, 1, ..., 1) to broadcast over the spatial dims, in the output dtype."""
    return b.reshape((-1,) + (1,) * rank).astype(dtype, copy=False)


@kernel("Conv", since=1, prepare=True, out=True, views=False, packed=(1, 2), epilogue=True)
def conv(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv-1/11/22: N-D grouped convolution; weights pre-packed, method chosen per input shape."""
    consts = tuple(ctx.constants) + (None,) * 3
    # constants are kept here (packed=(1, 2)), so the engine may drop the initializers and pass None
    fixed_bias = consts[2]
    fixed = pack(consts[1], group, build_time=True, bias=fixed_bias) if consts[1] is not None else None
    columns: dict[np.dtype, np.ndarray] = {}
    plans: dict[tuple[int, ...], tuple[Plan, tuple[int, ...]]] = {}
    prior: dict[str, str] = {}  # the method an earlier input shape chose: a new shape takes it untimed (`choose`)

    def settled() -> None:
        # drop the Winograd weights when no shape's chosen method uses them (they are remade if one tries)
        if fixed is not None and fixed.has_winograd_weights and not any(_uses_winograd(pl) for pl, _ in plans.values()):
            fixed.drop_winograd()

    def run(x, w, b=None, *, out=None, epilogue=None):
        p = fixed if fixed is not None else pack(w, group)
        key = x.shape[1:]
        if key not in plans:
            win = geo.window(x.shape[2:], p.kernel, strides=strides, dilations=dilations, pads=pads, auto_pad=auto_pad,
                             clamp_same=True)
            plans[key] = (plan_for(win, p, x.shape[1], settled, prior), win.out_shape)
        plan, out_shape = plans[key]
        y = out if out is not None else np.empty((x.shape[0], p.out_channels) + out_shape, dtype=x.dtype)
        if fixed_bias is not None:
            bias = columns.get(y.dtype)
            if bias is None:
                bias = columns[y.dtype] = _bias_column(fixed_bias, y.ndim - 2, y.dtype)
        else:
            bias = None if b is None else _bias_column(b, y.ndim - 2, y.dtype)
        if y.size:
            plan(x, p, y, bias, epilogue)
        return y

    # every method writes y only in tiles (`tiles.run_tiles`, depthwise's units): a process team may share them
    return spmd(run)


