"""Winograd F(2x2, 3x3) for 3x3 stride-1 convs: 16 GEMMs of [M, C] x [C, tiles].

Each m x m output tile needs an (m+2) x (m+2) input tile; in the transformed
domain the convolution is an elementwise product, which summed over channels
becomes one GEMM per transformed position: 2.25x fewer multiplies than im2col.
The transforms are sparse combinations of image planes, written out for m = 2 as
binary numpy ops over contiguous rows. F(4x4, 3x3) (4x fewer multiplies) was
measured too, twice: accurate to 1e-5 but its larger transforms made it no faster
than F(2x2) or im2col on any vgg19/resnet50 layer here, so only m = 2 is kept.
"""

from __future__ import annotations

import math

import numpy as np

from minfer_core import scratch

from . import _geometry as geo
from .tiles import Tile, cut, finish, run_tiles

# (B^T, G, A^T) per output tile size m (Lavin & Gray, "Fast Algorithms for Convolutional Neural Networks")
_MATRICES = {
    2: (
        np.array([[1, 0, -1, 0], [0, 1, 1, 0], [0, -1, 1, 0], [0, 1, 0, -1]], dtype=np.float64),
        np.array([[1, 0, 0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0, 0, 1]]),
        np.array([[1, 1, 1, 0], [0, 1, -1, -1]], dtype=np.float64),
    ),
}

# measured with the environment's OpenBLAS Haswell sgemm (single thread, min of runs): Winograd
# took 0.6-0.9x of im2col's time from 64 channels and 16 tiles up, and lost below 64 channels
# (1.2x at 32, 1.5x at 16), where the transforms cost more than the multiplies they save. With the
# transforms laid out channels last, few *output* channels stopped mattering: densenet121's 128 -> 32
# 3x3 convs (2 threads, per layer) took 9.5 ms against im2col's 13.0 at 8x56x56, 0.79 against 1.05
# at 8x14x14 and 1.27 against 1.54 at 1x56x56; few input channels still lose (16 -> 64 at 55x55:
# 0.74 against 0.39 ms), their GEMMs being too shallow.
MIN_TILES = 16
MIN_CHANNELS = 64  # input channels
MIN_OUT_CHANNELS = 32
TILE = 2
BLOCK_BYTES = 4 << 20
# small images are transformed together, up to about this many tiles per GEMM: a 7x7 map has only 16 tiles,
# and 16 GEMMs of [M, C] x [C, 16] spend more time packing the weights than multiplying
MERGE_TILES = 128
# band sizes the conv's tuner tries (measured best on resnet50's 3x3 layers: 2 MiB at batch 1, 4 MiB at 8)
TUNE_BYTES = (2 << 20, 4 << 20)


def transform_weights(w: np.ndarray, m: int = TILE) -> np.ndarray:
    """G g G^T per (M, C) filter, as an (alpha^2, M, C) stack, computed in float64.

    One GEMM with kron(G, G) over all filters at once, not an einsum: numpy's einsum of three operands loops
    without BLAS (resnet50's 512x512 filters: 75 ms against 16, paid by the first run that tries Winograd).
    """
    g = _MATRICES[m][1]
    out_c, in_c = w.shape[:2]
    u = np.kron(g, g) @ w.astype(np.float64).reshape(out_c * in_c, -1).T  # (alpha^2, M * C)
    return u.reshape(-1, out_c, in_c).astype(w.dtype)


def applies(w: geo.Window, p) -> bool:
    """3x3, stride 1, no dilation, one group, enough channels (in and out) and tiles to pay for the transforms."""
    if not p.constant or p.group != 1 or p.kernel != (3, 3) or w.strides != (1, 1) or w.dilations != (1, 1):
        return False
    tiles = math.ceil(w.out_shape[0] / TILE) * math.ceil(w.out_shape[1] / TILE)
    return tiles >= MIN_TILES and p.matrix.shape[2] // 9 >= MIN_CHANNELS and p.out_channels >= MIN_OUT_CHANNELS


def _layout(name: str, images: int, dims: tuple[int, ...], channels: int, dtype: np.dtype, last: bool,
            outer: int = 0) -> np.ndarray:
    """Scratch seen as ([outer,] channels, images, *dims), laid out that way or with the channels last.

    Channels last, every transform step is a numpy op whose innermost loop runs over the channels. Channels
    first, a 14x14 map's steps run over rows of 7-8 numbers, and numpy's per-row overhead made the input
    transform of a 256-channel 14x14 map take 400 us (3.2x channels last). Channels last costs two
    transposing copies (NCHW in and out), which lost on wide maps with few channels (64x224x224: 22.4 ms
    against 18.9).
    """
    lead = (outer,) if outer else ()
    if not last:
        return scratch(name, lead + (channels, images) + dims, dtype)
    buf = scratch(name, lead + (images,) + dims + (channels,), dtype)
    n = len(lead)
    end = n + 1 + len(dims)
    return buf.transpose(tuple(range(n)) + (end, n) + tuple(range(n + 1, end)))


def channels_last(channels: int, tile_columns: int) -> bool:
    """Whether to lay the transforms out channels last: unless rows are long and channels few (see _layout)."""
    return tile_columns <= channels // 4


def _input_transform(xp: np.ndarray, th: int, tw: int, last: bool) -> np.ndarray:
    """B^T d B for every 4x4 tile (stride 2) of padded planes xp (C, images, 2*th + 2, 2*tw + 2).

    Returns V: (16, images * th * tw, C) when ``last`` (xp is laid out channels last too), else
    (16, C, images * th * tw). The canvas's even and odd columns are split apart once: tile column j of
    tile t is even column t (j = 0), odd t (1), even t + 1 (2) or odd t + 1 (3). B^T's rows are d0 - d2,
    d1 + d2, d2 - d1 and d1 - d3, applied to rows first and then to columns.
    """
    c, k = xp.shape[:2]
    dtype = xp.dtype
    halves = []
    for parity in (0, 1):
        half = _layout(f"winograd-cols{parity}", k, (xp.shape[-2], tw + 1), c, dtype, last)
        np.copyto(half, xp[..., parity : parity + 2 * tw + 1 : 2])
        halves.append(half)
    rows = []
    for parity, half in enumerate(halves):
        d = [half[..., i : i + 2 * th : 2, :] for i in range(4)]
        r = _layout(f"winograd-rows{parity}", k, (th, tw + 1), c, dtype, last, outer=4)
        np.subtract(d[0], d[2], out=r[0])
        np.add(d[1], d[2], out=r[1])
        np.subtract(d[2], d[1], out=r[2])
        np.subtract(d[1], d[3], out=r[3])
        rows.append(r)
    v = _layout("winograd-v", k, (th, tw), c, dtype, last, outer=16)
    even, odd = rows
    for a in range(4):
        e0, e1, o0, o1 = even[a][..., :tw], even[a][..., 1:], odd[a][..., :tw], odd[a][..., 1:]
        np.subtract(e0, e1, out=v[4 * a])
        np.add(o0, e1, out=v[4 * a + 1])
        np.subtract(e1, o0, out=v[4 * a + 2])
        np.subtract(o0, o1, out=v[4 * a + 3])
    # the scratch's own layout: reshapes without a copy
    return v.transpose(0, 2, 3, 4, 1).reshape(16, -1, c) if last else v.reshape(16, c, -1)


def _output_transform(prod: np.ndarray, y: np.ndarray, th: int, tw: int, last: bool) -> None:
    """A^T p A for every tile into y (images, M, rows, ow), a view of the NCHW output.

    ``prod`` is (16, images * th * tw, M) when ``last``, else (16, M, images * th * tw). A^T's rows are
    p0 + p1 + p2 and p1 - p2 - p3: applied to rows into scratch, then to columns into the tiles' 2x2 outputs.
    """
    k, m = y.shape[:2]
    lead = (k, th, tw, m) if last else (m, k, th, tw)
    p = prod.reshape((4, 4) + lead)
    s = scratch("winograd-s", (2, 4) + lead, prod.dtype)
    np.add(p[0], p[1], out=s[0])
    s[0] += p[2]
    np.subtract(p[1], p[2], out=s[1])
    s[1] -= p[3]
    if last:
        _columns_last(s, y, th, tw)
    else:
        _columns_first(s, y.transpose(1, 0, 2, 3))


def _columns_last(s: np.ndarray, y: np.ndarray, th: int, tw: int) -> None:
    """Channels last: the 2x2 outputs assembled in scratch, then one transposing copy into y's NCHW rows."""
    k, m = y.shape[:2]
    z = scratch("winograd-z", (k, th, 2, tw, 2, m), s.dtype)
    for r in range(2):
        t = s[r]
        np.add(t[0], t[1], out=z[:, :, r, :, 0])
        z[:, :, r, :, 0] += t[2]
        np.subtract(t[1], t[2], out=z[:, :, r, :, 1])
        z[:, :, r, :, 1] -= t[3]
    np.copyto(y, z.reshape(k, 2 * th, 2 * tw, m)[:, : y.shape[2], : y.shape[3]].transpose(0, 3, 1, 2))


def _columns_first(s: np.ndarray, y: np.ndarray) -> None:
    """Channels first: each output's last sum lands straight in its stride-2 view of y (M, images, rows, ow),
    cropped where the output size is odd."""
    o = scratch("winograd-o", s.shape[2:], s.dtype)
    for r in range(2):
        rows = y[..., r::2, :]
        if rows.shape[-2] == 0:
            continue
        t = s[r]
        for q in range(2):
            cols = rows[..., q::2]
            if cols.shape[-1] == 0:
                continue
            crop = (Ellipsis, slice(0, cols.shape[-2]), slice(0, cols.shape[-1]))
            if q == 0:
                np.add(t[0], t[1], out=o)
                np.add(o[crop], t[2][crop], out=cols)
            else:
                np.subtract(t[1], t[2], out=o)
                np.subtract(o[crop], t[3][crop], out=cols)


def plan(w: geo.Window, budget: int | None = None):
    """The Winograd F(2x2, 3x3) plan for one input geometry.

    Tiles of the conv output (tiles.py) are bands of Winograd tile rows (and, for small images, output-channel
    ranges); each band pads its own input rows, transforms them, runs the alpha^2 GEMMs and writes its rows.
    """
    m = TILE
    alpha = m + 2
    oh, ow = w.out_shape
    th, tw = math.ceil(oh / m), math.ceil(ow / m)
    bh, bw = w.begin
    cache: dict[tuple[int, int, int], list[Tile]] = {}

    def tiles_for(x: np.ndarray, p) -> list[Tile]:
        n, c = x.shape[:2]
        m_out = p.out_channels
        key = (n, c, m_out)
        if key not in cache:
            cache[key] = cut(n, m_out, th, tw, alpha * alpha * (c + m_out) * tw * x.itemsize, budget or BLOCK_BYTES,
                             n * m_out * c * th * tw * alpha * alpha, merge_columns=MERGE_TILES)
        return cache[key]

    def run(x: np.ndarray, p, y: np.ndarray, bias, epilogue) -> None:
        n, c, h, wd = x.shape
        u = p.winograd_weights()
        bands = tiles_for(x, p)
        last = channels_last(c, tw)

        def band(t: Tile) -> None:
            t0, t1, k = t.r0, t.r1, t.images
            # zero canvas holding this band's input tiles, images after channels (see _layout) so that the
            # transformed tiles of all its images form one GEMM operand; x sits at the leading pad offsets
            xp = _layout("winograd-canvas", k, (m * (t1 - t0) + 2, m * tw + 2), c, x.dtype, last)
            top = m * t0 - bh  # input row at canvas row 0
            lo, hi = max(0, top), min(h, top + xp.shape[2])
            right = min(wd, m * tw + 2 - bw)
            (xp.transpose(1, 2, 3, 0) if last else xp)[...] = 0  # in memory order: one contiguous fill
            if hi > lo:
                xp[:, :, lo - top : hi - top, bw : bw + right] = \
                    x[t.image : t.image + k, :, lo:hi, :right].transpose(1, 0, 2, 3)
            v = _input_transform(xp, t1 - t0, tw, last)
            weights = u[:, t.m0 : t.m1]
            if last:  # prod[j] = V[j] @ U[j]^T: (tiles, C) @ (C, M'), channels last for the output transform too
                prod = scratch("winograd-prod", (16, v.shape[1], t.m1 - t.m0), x.dtype)
                for j in range(16):
                    np.matmul(v[j], weights[j].T, out=prod[j])
            else:
                prod = scratch("winograd-prod", (16, t.m1 - t.m0, v.shape[2]), x.dtype)
                for j in range(16):
                    np.matmul(weights[j], v[j], out=prod[j])
            _output_transform(prod, y[t.image : t.image + k, t.m0 : t.m1, m * t0 : m * t1], t1 - t0, tw, last)
            finish(y, t._replace(r0=m * t0, r1=min(oh, m * t1)), bias, epilogue)

        run_tiles(bands, band)

    run.tiling = tiles_for  # type: ignore[attr-defined]
    # the conv drops the Winograd weights when no chosen plan uses them; the tuner makes them before timing
    run.winograd = True  # type: ignore[attr-defined]
    run.setup = lambda p: p.winograd_weights()  # type: ignore[attr-defined]
    return run
