"""Kernel: DeformConv (2-D): bilinear im2col at offset positions, then the grouped GEMM."""

from __future__ import annotations

import numpy as np

from minfer_core import kernel


def _bilinear(img: np.ndarray, y: np.ndarray, x: np.ndarray) -> np.ndarray:
    """img (C, H, W) sampled at real positions y, x (same shape); cells off the map read as zero."""
    h, w = img.shape[1:]
    y0, x0 = np.floor(y), np.floor(x)
    fy, fx = y - y0, x - x0
    y0, x0 = y0.astype(np.int64), x0.astype(np.int64)
    out = np.zeros((img.shape[0],) + y.shape, dtype=np.float64)
    for dy, wy in ((0, 1 - fy), (1, fy)):
        for dx, wx in ((0, 1 - fx), (1, fx)):
            yi, xi = y0 + dy, x0 + dx
            valid = (yi >= 0) & (yi < h) & (xi >= 0) & (xi < w)
            weight = wy * wx * valid
            out += img[:, np.clip(yi, 0, h - 1), np.clip(xi, 0, w - 1)] * weight
    return out


def _deform_cols(x, offset, mask, kernel, strides, dilations, pads, offset_group):
    """(N, C, kh, kw, oh, ow) samples: tap (i, j) of output (p, q) reads x at its grid point plus offset."""
    n, c = x.shape[:2]
    kh, kw = kernel
    oh, ow = offset.shape[2:]
    off = offset.reshape(n, offset_group, kh, kw, 2, oh, ow)
    msk = None if mask is None else mask.reshape(n, offset_group, kh, kw, oh, ow)
    base_y = (np.arange(oh) * strides[0] - pads[0])[:, None]
    base_x = (np.arange(ow) * strides[1] - pads[1])[None, :]
    cg = c // offset_group
    cols = np.empty((n, c, kh, kw, oh, ow), dtype=np.float64)
    for b in range(n):
        for g in range(offset_group):
            img = x[b, g * cg : (g + 1) * cg].astype(np.float64)
            for i in range(kh):
                for j in range(kw):
                    y = base_y + i * dilations[0] + off[b, g, i, j, 0]
                    xx = base_x + j * dilations[1] + off[b, g, i, j, 1]
                    v = _bilinear(img, y, xx)
                    if msk is not None:
                        v *= msk[b, g, i, j]
                    cols[b, g * cg : (g + 1) * cg, i, j] = v
    return cols


@kernel("DeformConv", since=19)
def deform_conv(x, w, offset, b=None, mask=None, *, dilations=None, group=1, kernel_shape=None, offset_group=1,
                pads=None, strides=None):
    """DeformConv-19/22: convolution whose taps sample the input at learned offsets (and mask)."""
    kernel = tuple(w.shape[2:])
    strides = strides or [1, 1]
    dilations = dilations or [1, 1]
    pads = pads or [0, 0, 0, 0]
    cols = _deform_cols(x, offset, mask, kernel, strides, dilations, pads, offset_group)
    n = x.shape[0]
    m = w.shape[0]
    oh, ow = offset.shape[2:]
    wg = w.reshape(group, m // group, -1).astype(np.float64)
    cg = cols.reshape(n, group, -1, oh * ow)
    y = np.matmul(wg, cg).reshape(n, m, oh, ow)
    if b is not None:
        y += b.reshape(1, -1, 1, 1)
    return y.astype(x.dtype)


