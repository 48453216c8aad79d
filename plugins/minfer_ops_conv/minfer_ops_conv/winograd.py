"""Winograd F(2x2, 3x3) for 3x3 stride-1 convs: 16 GEMMs of [M, C] x [C, tiles].

Each m x m output tile needs an (m+2) x (m+2) input tile; in the transformed
domain the convolution is an elementwise product, which summed over channels
becomes one GEMM per transformed position: 2.25x fewer multiplies than im2col.
The transforms are sparse combinations of image planes. F(4x4, 3x3) (4x fewer
multiplies) was measured too: accurate to 1e-5 but its larger transforms made it
no faster here, so only m = 2 is kept; the code stays written for a general m.
"""

from __future__ import annotations

import math

import numpy as np

from . import _geometry as geo
from . import tiles
from .tiles import Tile, cut, run_tiles

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
# (1.2x at 32, 1.5x at 16), where the transforms cost more than the multiplies they save
MIN_TILES = 16
MIN_CHANNELS = 64
TILE = 2
BLOCK_BYTES = 4 << 20
# small images are transformed together, up to about this many tiles per GEMM: a 7x7 map has only 16 tiles,
# and 16 GEMMs of [M, C] x [C, 16] spend more time packing the weights than multiplying
MERGE_TILES = 128
# band sizes the conv's tuner tries (measured best on resnet50's 3x3 layers: 2 MiB at batch 1, 4 MiB at 8)
TUNE_BYTES = (2 << 20, 4 << 20)


def transform_weights(w: np.ndarray, m: int = TILE) -> np.ndarray:
    """G g G^T per (M, C) filter, as an (alpha^2, M, C) stack, computed in float64."""
    g = _MATRICES[m][1]
    out_c, in_c = w.shape[:2]
    u = np.einsum("ij,mcjk,lk->ilmc", g, w.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape(-1, out_c, in_c).astype(w.dtype))


def applies(w: geo.Window, p) -> bool:
    """3x3, stride 1, no dilation, one group, enough channels and tiles to pay for the transforms."""
    if not p.constant or p.group != 1 or p.kernel != (3, 3) or w.strides != (1, 1) or w.dilations != (1, 1):
        return False
    tiles = math.ceil(w.out_shape[0] / TILE) * math.ceil(w.out_shape[1] / TILE)
    return tiles >= MIN_TILES and min(p.out_channels, p.matrix.shape[2] // 9) >= MIN_CHANNELS


def _combine(mat: np.ndarray, planes: list[np.ndarray], out: np.ndarray, scratch: np.ndarray) -> None:
    """out[a] = sum_j mat[a, j] * planes[j], skipping zero coefficients and multiplying only when != +-1."""
    for a in range(mat.shape[0]):
        first = True
        for j in np.flatnonzero(mat[a]):
            c = mat[a, j]
            if first:
                if c == 1:
                    np.copyto(out[a], planes[j])
                else:
                    np.multiply(planes[j], out.dtype.type(c), out=out[a])
                first = False
            elif c == 1:
                out[a] += planes[j]
            elif c == -1:
                out[a] -= planes[j]
            else:
                np.multiply(planes[j], out.dtype.type(c), out=scratch)
                out[a] += scratch


def _input_transform(xp: np.ndarray, th: int, tw: int, m: int) -> np.ndarray:
    """B^T d B for every (m+2)-square tile (stride m) of padded planes xp (C, *images, rows, cols).

    Returns (alpha^2, C, images * th * tw). Rows first on whole contiguous image rows, then columns on
    the row-transformed planes.
    """
    bt = _MATRICES[m][0]
    alpha = m + 2
    lead, wp = xp.shape[:-2], xp.shape[-1]
    rows = tiles.scratch("winograd-rows", (alpha,) + lead + (th, wp), xp.dtype)
    spare = tiles.scratch("winograd-spare", lead + (th, wp), xp.dtype)
    _combine(bt, [xp[..., i : i + m * th : m, :] for i in range(alpha)], rows, spare)
    v = tiles.scratch("winograd-v", (alpha, alpha) + lead + (th, tw), xp.dtype)
    spare = spare.reshape(-1)[: math.prod(lead) * th * tw].reshape(lead + (th, tw))
    for a in range(alpha):
        _combine(bt, [rows[a][..., j : j + m * tw : m] for j in range(alpha)], v[a], spare)
    return v.reshape(alpha * alpha, lead[0], -1)


def _output_transform(prod: np.ndarray, y: np.ndarray, th: int, tw: int, m: int) -> None:
    """A^T p A for every tile, scattered into y (M, *images, rows, ow) with stride-m interleaving."""
    at = _MATRICES[m][2]
    alpha = m + 2
    p = prod.reshape((alpha, alpha) + y.shape[:-2] + (th, tw))
    s = tiles.scratch("winograd-s", (m, alpha) + p.shape[2:], prod.dtype)
    _combine(at, list(p), s, tiles.scratch("winograd-spare", p.shape[1:], prod.dtype))
    o = tiles.scratch("winograd-o", (m,) + p.shape[2:], prod.dtype)
    scratch = tiles.scratch("winograd-spare", p.shape[2:], prod.dtype)
    for r in range(m):
        rows = y[..., r::m, :]
        if rows.shape[-2] == 0:
            continue
        _combine(at, list(s[r]), o, scratch)
        for q in range(m):
            cols = rows[..., q::m]
            cols[...] = o[q][..., : rows.shape[-2], : cols.shape[-1]]


def plan(w: geo.Window, m: int | None = None, budget: int | None = None):
    """The Winograd plan for one input geometry (output tiles m x m, TILE by default).

    Tiles of the conv output (tiles.py) are bands of Winograd tile rows (and, for small images, output-channel
    ranges); each band pads its own input rows, transforms them, runs the alpha^2 GEMMs and writes its rows.
    """
    m = m or TILE
    alpha = m + 2
    oh, ow = w.out_shape
    th, tw = math.ceil(oh / m), math.ceil(ow / m)
    bh, bw = w.begin
    cache: dict[tuple[int, int, int], list[Tile]] = {}

    def run(x: np.ndarray, p, y: np.ndarray, bias, epilogue) -> None:
        n, c, h, wd = x.shape
        u = p.winograd_weights()
        m_out = u.shape[1]
        key = (n, c, m_out)
        if key not in cache:
            cache[key] = cut(n, m_out, th, tw, alpha * alpha * (c + m_out) * tw * x.itemsize, budget or BLOCK_BYTES,
                             n * m_out * c * th * tw * alpha * alpha, merge_columns=MERGE_TILES)

        def band(t: Tile) -> None:
            t0, t1, k = t.r0, t.r1, t.images
            # zero canvas holding this band's input tiles, channels first so that the transformed tiles of
            # all its images form one GEMM operand; x sits at the leading pad offsets
            xp = tiles.scratch("winograd-canvas", (c, k, m * (t1 - t0) + 2, m * tw + 2), x.dtype)
            top = m * t0 - bh  # input row at canvas row 0
            lo, hi = max(0, top), min(h, top + xp.shape[2])
            right = min(wd, m * tw + 2 - bw)
            xp[...] = 0
            if hi > lo:
                xp[:, :, lo - top : hi - top, bw : bw + right] = \
                    x[t.image : t.image + k, :, lo:hi, :right].transpose(1, 0, 2, 3)
            v = _input_transform(xp, t1 - t0, tw, m)
            prod = tiles.scratch("winograd-prod", (v.shape[0], t.m1 - t.m0, v.shape[2]), x.dtype)
            for j in range(v.shape[0]):
                np.matmul(u[j, t.m0 : t.m1], v[j], out=prod[j])
            target = y[t.image : t.image + k, t.m0 : t.m1, m * t0 : m * t1].transpose(1, 0, 2, 3)
            _output_transform(prod, target, t1 - t0, tw, m)
            _finish(y, t._replace(r0=m * t0, r1=min(oh, m * t1)), bias, epilogue)

        run_tiles(cache[key], band)

    run.winograd = True  # type: ignore[attr-defined]  (the conv drops Winograd weights no chosen plan uses)
    return run


def _finish(y: np.ndarray, t: Tile, bias, epilogue) -> None:
    region = t.region
    if bias is not None:
        part = y[region]
        part += bias[t.m0 : t.m1]
    if epilogue is not None:
        epilogue(y, region)
