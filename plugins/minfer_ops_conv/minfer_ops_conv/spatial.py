"""Kernels: DepthToSpace, SpaceToDepth, GridSample."""

from __future__ import annotations

import itertools

import numpy as np

from minfer_core import kernel


def _depth_to_space(x, blocksize, mode):
    b, c, h, w = x.shape
    bs = blocksize
    if mode == "DCR":
        y = x.reshape(b, bs, bs, c // (bs * bs), h, w).transpose(0, 3, 4, 1, 5, 2)
    else:
        y = x.reshape(b, c // (bs * bs), bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    return y.reshape(b, c // (bs * bs), h * bs, w * bs)


@kernel("DepthToSpace", since=1)
def depth_to_space_1(x, *, blocksize):
    """DepthToSpace-1: DCR rearrangement of channel blocks into spatial blocks."""
    return _depth_to_space(x, blocksize, "DCR")


@kernel("DepthToSpace", since=11)
def depth_to_space_11(x, *, blocksize, mode="DCR"):
    """DepthToSpace-11/13/28: DCR or CRD rearrangement of channel blocks into spatial blocks."""
    return _depth_to_space(x, blocksize, mode)


def _space_to_depth(x, blocksize, mode):
    b, c, h, w = x.shape
    bs = blocksize
    y = x.reshape(b, c, h // bs, bs, w // bs, bs)
    y = y.transpose(0, 3, 5, 1, 2, 4) if mode == "DCR" else y.transpose(0, 1, 3, 5, 2, 4)
    return y.reshape(b, c * bs * bs, h // bs, w // bs)


@kernel("SpaceToDepth", since=1)
def space_to_depth_1(x, *, blocksize):
    """SpaceToDepth-1/13: spatial blocks moved into channels (DCR order)."""
    return _space_to_depth(x, blocksize, "DCR")


@kernel("SpaceToDepth", since=28)
def space_to_depth_28(x, *, blocksize, mode="DCR"):
    """SpaceToDepth-28: spatial blocks moved into channels, DCR or CRD order."""
    return _space_to_depth(x, blocksize, mode)


# -- GridSample ---------------------------------------------------------------


def _reflect(x: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """Fold coordinates back into [lo, hi] by repeated mirror reflection."""
    span = hi - lo
    if span <= 0:
        return np.full_like(x, lo)
    below, above = x < lo, x > hi
    d = np.where(below, lo - x, np.where(above, x - hi, 0.0))
    flips = np.floor(d / span)
    r = d - flips * span
    even = flips % 2 == 0
    out = np.where(below, np.where(even, lo + r, hi - r), x)
    return np.where(above, np.where(even, hi - r, lo + r), out)


def _cubic_weights(t: np.ndarray, a: float = -0.75) -> list[np.ndarray]:
    """Keys cubic convolution weights of the taps at -1, 0, 1, 2 for fractional offset t."""

    def near(s):  # |s| <= 1
        return ((a + 2) * s - (a + 3)) * s * s + 1

    def far(s):  # 1 < |s| < 2
        return ((a * s - 5 * a) * s + 8 * a) * s - 4 * a

    return [far(t + 1), near(t), near(1 - t), far(2 - t)]


class _Sampler:
    """Per-dimension taps (indices, weights, validity) for a GridSample call."""

    def __init__(self, sizes, align_corners, padding_mode):
        self.sizes = sizes
        self.align = align_corners
        self.padding = padding_mode

    def bounds(self, d):
        size = self.sizes[d]
        return (0.0, size - 1.0) if self.align else (-0.5, size - 0.5)

    def coordinate(self, g, d):
        """Grid values in [-1, 1] to pixel coordinates along dim d."""
        size = self.sizes[d]
        return (g + 1) / 2 * (size - 1) if self.align else ((g + 1) * size - 1) / 2

    def fix_range(self, x, d):
        """Out-of-range coordinates clamped (border) or mirrored (reflection); zeros keeps them."""
        lo, hi = self.bounds(d)
        if self.padding == "border":
            return np.where((x < lo) | (x > hi), np.clip(x, 0, self.sizes[d] - 1), x)
        if self.padding == "reflection":
            return _reflect(x, lo, hi)
        return x

    def index(self, i, d):
        """Integer tap positions -> (clamped index, valid mask) under the padding mode."""
        size = self.sizes[d]
        if self.padding == "zeros":
            valid = (i >= 0) & (i < size)
            return np.clip(i, 0, size - 1), valid
        if self.padding == "border":
            return np.clip(i, 0, size - 1), None
        lo, hi = self.bounds(d)
        r = np.trunc(_reflect(i.astype(np.float64), lo, hi)).astype(np.int64)
        return np.clip(r, 0, size - 1), None


def _grid_sample(x, grid, mode, padding_mode, align_corners):
    n, c = x.shape[:2]
    sizes = x.shape[2:]
    rank = len(sizes)
    s = _Sampler(sizes, align_corners, padding_mode)
    g = grid.astype(np.float64)
    coords = [s.coordinate(g[..., rank - 1 - d], d) for d in range(rank)]  # grid's last axis is x (reversed)
    if mode == "nearest":
        coords = [np.rint(v) for v in coords]  # half to even, as PyTorch rounds
    coords = [s.fix_range(v, d) for d, v in enumerate(coords)]
    if mode == "nearest":
        taps = [[(np.trunc(v).astype(np.int64), None)] for v in coords]
    else:
        taps = []
        for d, v in enumerate(coords):
            base = np.floor(v)
            t = v - base
            base = base.astype(np.int64)
            if mode == "linear":
                taps.append([(base, 1 - t), (base + 1, t)])
            else:
                taps.append([(base + k - 1, w) for k, w in enumerate(_cubic_weights(t))])
    batch = np.arange(n).reshape((n,) + (1,) * (grid.ndim - 2))
    out = np.zeros(grid.shape[:-1] + (c,), dtype=np.float64)
    for combo in itertools.product(*taps):
        weight = np.ones(grid.shape[:-1])
        idx = []
        for d, (i, w) in enumerate(combo):
            j, valid = s.index(i, d)
            if w is not None:
                weight = weight * w
            if valid is not None:
                weight = weight * valid
            idx.append(j)
        out += x[(batch, slice(None)) + tuple(idx)] * weight[..., None]
    return np.moveaxis(out, -1, 1).astype(x.dtype)


@kernel("GridSample", since=16)
def grid_sample_16(x, grid, *, align_corners=0, mode="bilinear", padding_mode="zeros"):
    """GridSample-16: 2-D bilinear/nearest/bicubic sampling at normalized grid positions."""
    modes = {"bilinear": "linear", "bicubic": "cubic", "nearest": "nearest"}
    return _grid_sample(x, grid, modes[mode], padding_mode, align_corners)


@kernel("GridSample", since=20)
def grid_sample_20(x, grid, *, align_corners=0, mode="linear", padding_mode="zeros"):
    """GridSample-20/22: N-D linear/nearest/cubic sampling at normalized grid positions."""
    return _grid_sample(x, grid, mode, padding_mode, align_corners)


def _base_coords(n: int, align_corners: int) -> np.ndarray:
    """Normalized pixel positions in [-1, 1]: corners (align_corners) or centres."""
    if align_corners:
        return np.linspace(-1.0, 1.0, n) if n > 1 else np.zeros(1)
    return (np.arange(n) * 2.0 + 1.0) / n - 1.0


@kernel("AffineGrid", since=20)
def affine_grid(theta, size, *, align_corners=0):
    """AffineGrid-20: theta (N, r, r+1) applied to the normalized output grid -> (N, *spatial, r)."""
    spatial = [int(v) for v in size[2:]]
    axes = [_base_coords(n, align_corners) for n in spatial]
    mesh = np.meshgrid(*axes, indexing="ij")
    # homogeneous (x, y[, z], 1) with x along the last spatial dim
    base = np.stack([m for m in mesh[::-1]] + [np.ones(spatial)], axis=-1)
    grid = np.einsum("...k,nik->n...i", base, theta.astype(np.float64))
    return grid.astype(theta.dtype)


