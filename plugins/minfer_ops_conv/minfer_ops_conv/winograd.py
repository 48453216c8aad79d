"""Winograd F(2x2, 3x3) for 3x3 stride-1 convs: 16 GEMMs of [M, C] x [C, tiles] instead of one 9C-deep GEMM.

Each 2x2 output tile needs a 4x4 input tile; in the transformed domain the
convolution is an elementwise product, which over channels becomes 16 GEMMs
(2.25x fewer multiplies than im2col). Transforms use only adds and subtracts.
"""

from __future__ import annotations

import math

import numpy as np

from . import _geometry as geo

_G = np.array([[1.0, 0.0, 0.0], [0.5, 0.5, 0.5], [0.5, -0.5, 0.5], [0.0, 0.0, 1.0]])

# measured (OpenBLAS SkylakeX kernels): with fewer tiles per image the skinny GEMMs lose to
# im2col, and with fewer than ~96 input or output channels the transforms cost more than they save
MIN_TILES = 36
MIN_CHANNELS = 96
BLOCK_BYTES = 4 << 20


def transform_weights(w: np.ndarray) -> np.ndarray:
    """G g G^T per (M, C) filter, as a (16, M, C) stack, computed in float64."""
    m, c = w.shape[:2]
    u = np.einsum("ij,mcjk,lk->ilmc", _G, w.astype(np.float64), _G)
    return np.ascontiguousarray(u.reshape(16, m, c).astype(w.dtype))


def applies(w: geo.Window, p) -> bool:
    """3x3, stride 1, no dilation, one group, enough channels and tiles to pay for the transforms."""
    if p.winograd is None or w.strides != (1, 1) or w.dilations != (1, 1):
        return False
    tiles = math.ceil(w.out_shape[0] / 2) * math.ceil(w.out_shape[1] / 2)
    return tiles >= MIN_TILES and min(p.winograd.shape[1:]) >= MIN_CHANNELS


def _bt(d0, d1, d2, d3, out):
    """B^T applied along one axis: (d0 - d2, d1 + d2, d2 - d1, d1 - d3) into out[0..3]."""
    np.subtract(d0, d2, out=out[0])
    np.add(d1, d2, out=out[1])
    np.subtract(d2, d1, out=out[2])
    np.subtract(d1, d3, out=out[3])


def _input_transform(xp: np.ndarray, th: int, tw: int) -> np.ndarray:
    """B^T d B for every 4x4 tile (stride 2) of one padded image: (16, C, th*tw).

    Rows first on whole contiguous image rows (tiles overlap, so each row pair is
    shared by two tiles), then columns on the 4 row-transformed planes.
    """
    c, hp, wp = xp.shape
    r = [xp[:, i : i + 2 * th : 2, :] for i in range(4)]  # row i of every tile row: (C, th, Wp)
    rows = np.empty((4, c, th, wp), dtype=xp.dtype)
    _bt(r[0], r[1], r[2], r[3], rows)
    v = np.empty((4, 4, c, th, tw), dtype=xp.dtype)
    for a in range(4):
        q = [rows[a][:, :, j : j + 2 * tw : 2] for j in range(4)]
        _bt(q[0], q[1], q[2], q[3], v[a])
    return v.reshape(16, c, th * tw)


def _output_transform(m: np.ndarray, y: np.ndarray, th: int, tw: int) -> None:
    """A^T m A for every tile, scattered into y (M, rows, ow) with stride-2 interleaving."""
    m = m.reshape(4, 4, -1, th, tw)
    s0 = m[0] + m[1]
    s0 += m[2]
    s1 = m[1] - m[2]
    s1 -= m[3]
    ow = y.shape[2]
    for r, s in enumerate((s0, s1)):
        even = s[0] + s[1]
        even += s[2]
        odd = s[1] - s[2]
        odd -= s[3]
        rows = y[:, r::2]
        h = rows.shape[1]
        rows[:, :, 0::2] = even[:, :h, : (ow + 1) // 2]
        rows[:, :, 1::2] = odd[:, :h, : ow // 2]


def _block_rows(c: int, m: int, tw: int) -> int:
    """Tile rows per block, so the transformed input and products stay near cache size."""
    return max(1, BLOCK_BYTES // (16 * (c + m) * tw * 4))


def plan(w: geo.Window):
    """The Winograd plan for one input geometry."""
    oh, ow = w.out_shape
    th, tw = math.ceil(oh / 2), math.ceil(ow / 2)
    bh, bw = w.begin

    def run(x: np.ndarray, p, y: np.ndarray) -> None:
        n, c, h, wd = x.shape
        u = p.winograd
        m = u.shape[1]
        # zero canvas holding every 4x4 tile; x sits at the leading pad offsets
        xp = np.zeros((n, c, 2 * th + 2, 2 * tw + 2), dtype=x.dtype)
        xp[:, :, bh : bh + h, bw : bw + wd] = x[:, :, : 2 * th + 2 - bh, : 2 * tw + 2 - bw]
        step = _block_rows(c, m, tw)
        for i in range(n):
            for t0 in range(0, th, step):
                t1 = min(th, t0 + step)
                v = _input_transform(xp[i, :, 2 * t0 : 2 * t1 + 2], t1 - t0, tw)
                prod = np.empty((16, m, v.shape[2]), dtype=x.dtype)
                for k in range(16):
                    np.matmul(u[k], v[k], out=prod[k])
                _output_transform(prod, y[i, :, 2 * t0 : 2 * t1], t1 - t0, tw)

    return run
