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


def transform_weights(w: np.ndarray, m: int = TILE) -> np.ndarray:
    """G g G^T per (M, C) filter, as an (alpha^2, M, C) stack, computed in float64."""
    g = _MATRICES[m][1]
    out_c, in_c = w.shape[:2]
    u = np.einsum("ij,mcjk,lk->ilmc", g, w.astype(np.float64), g)
    return np.ascontiguousarray(u.reshape(-1, out_c, in_c).astype(w.dtype))


def applies(w: geo.Window, p) -> bool:
    """3x3, stride 1, no dilation, one group, enough channels and tiles to pay for the transforms."""
    if p.winograd is None or w.strides != (1, 1) or w.dilations != (1, 1):
        return False
    tiles = math.ceil(w.out_shape[0] / TILE) * math.ceil(w.out_shape[1] / TILE)
    return tiles >= MIN_TILES and min(p.winograd.shape[1:]) >= MIN_CHANNELS


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
    """B^T d B for every (m+2)-square tile (stride m) of one padded image: (alpha^2, C, th*tw).

    Rows first on whole contiguous image rows, then columns on the row-transformed planes.
    """
    bt = _MATRICES[m][0]
    alpha = m + 2
    c, _, wp = xp.shape
    rows = np.empty((alpha, c, th, wp), dtype=xp.dtype)
    _combine(bt, [xp[:, i : i + m * th : m, :] for i in range(alpha)], rows, np.empty((c, th, wp), xp.dtype))
    v = np.empty((alpha, alpha, c, th, tw), dtype=xp.dtype)
    scratch = np.empty((c, th, tw), xp.dtype)
    for a in range(alpha):
        _combine(bt, [rows[a][:, :, j : j + m * tw : m] for j in range(alpha)], v[a], scratch)
    return v.reshape(alpha * alpha, c, th * tw)


def _output_transform(prod: np.ndarray, y: np.ndarray, th: int, tw: int, m: int) -> None:
    """A^T p A for every tile, scattered into y (M, rows, ow) with stride-m interleaving."""
    at = _MATRICES[m][2]
    alpha = m + 2
    p = prod.reshape(alpha, alpha, -1, th, tw)
    s = np.empty((m, alpha) + p.shape[2:], dtype=prod.dtype)
    _combine(at, list(p), s, np.empty(p.shape[1:], prod.dtype))
    o = np.empty((m,) + p.shape[2:], dtype=prod.dtype)
    scratch = np.empty(p.shape[2:], prod.dtype)
    for r in range(m):
        rows = y[:, r::m]
        if rows.shape[1] == 0:
            continue
        _combine(at, list(s[r]), o, scratch)
        for q in range(m):
            cols = rows[:, :, q::m]
            cols[...] = o[q][:, : rows.shape[1], : cols.shape[2]]


def _block_rows(c: int, m_out: int, tw: int, m: int) -> int:
    """Tile rows per block, so the transformed input and products stay near cache size."""
    alpha = m + 2
    return max(1, BLOCK_BYTES // (alpha * alpha * (c + m_out) * tw * 4))


def plan(w: geo.Window, m: int | None = None):
    """The Winograd plan for one input geometry (output tiles m x m, TILE by default)."""
    m = m or TILE
    oh, ow = w.out_shape
    th, tw = math.ceil(oh / m), math.ceil(ow / m)
    bh, bw = w.begin

    def run(x: np.ndarray, p, y: np.ndarray) -> None:
        n, c, h, wd = x.shape
        u = p.winograd
        m_out = u.shape[1]
        # zero canvas holding every input tile; x sits at the leading pad offsets
        xp = np.zeros((n, c, m * th + 2, m * tw + 2), dtype=x.dtype)
        xp[:, :, bh : bh + h, bw : bw + wd] = x[:, :, : m * th + 2 - bh, : m * tw + 2 - bw]
        step = _block_rows(c, m_out, tw, m)
        for i in range(n):
            for t0 in range(0, th, step):
                t1 = min(th, t0 + step)
                v = _input_transform(xp[i, :, m * t0 : m * t1 + 2], t1 - t0, tw, m)
                prod = np.empty((v.shape[0], m_out, v.shape[2]), dtype=x.dtype)
                for k in range(v.shape[0]):
                    np.matmul(u[k], v[k], out=prod[k])
                _output_transform(prod, y[i, :, m * t0 : m * t1], t1 - t0, tw, m)

    return run
