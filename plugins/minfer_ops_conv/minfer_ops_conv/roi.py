"""Kernels: RoiAlign and MaxRoiPool."""

from __future__ import annotations

import math

import numpy as np

from minfer_core import kernel


def _axis_samples(start: float, bin_size: float, bins: int, grid: int, size: int):
    """Bilinear taps of every sample along one axis: (low, high, frac, valid), each (bins * grid,).

    Samples sit at the centres of a grid x grid split of each bin; like
    onnxruntime, samples beyond one pixel outside the map contribute zero and
    the rest are clamped onto the map.
    """
    k = np.arange(bins)[:, None] * bin_size + (np.arange(grid)[None, :] + 0.5) * bin_size / grid
    v = (start + k).reshape(-1)
    valid = (v >= -1.0) & (v <= size)
    v = np.maximum(v, 0.0)
    low = v.astype(np.int64)
    edge = low >= size - 1
    low = np.where(edge, size - 1, low)
    high = np.where(edge, size - 1, low + 1)
    frac = np.where(edge, 0.0, v - low)
    return low, high, frac, valid


def _interp_matrix(low, high, frac, valid, bins, grid, size):
    """(bins, size) matrix averaging the samples of each bin: the separable form of avg RoiAlign."""
    m = np.zeros((bins * grid, size))
    rows = np.arange(bins * grid)
    np.add.at(m, (rows, low), (1 - frac) * valid)
    np.add.at(m, (rows, high), frac * valid)
    return m.reshape(bins, grid, size).sum(axis=1) / grid


def _roi_max(img, ys, xs, out_h, gh, out_w, gw):
    """Max over each bin's samples of the largest weighted corner (onnxruntime's max RoiAlign)."""
    (yl, yh, fy, vy), (xl, xh, fx, vx) = ys, xs
    wy = [(1 - fy) * vy, fy * vy]
    wx = [(1 - fx) * vx, fx * vx]
    best = None
    for yi, wyi in zip((yl, yh), wy):
        for xi, wxi in zip((xl, xh), wx):
            val = img[:, yi[:, None], xi[None, :]] * (wyi[:, None] * wxi[None, :])
            best = val if best is None else np.maximum(best, val)
    c = img.shape[0]
    return best.reshape(c, out_h, gh, out_w, gw).max(axis=(2, 4))


def _roi_align(x, rois, batch_indices, *, mode, out_h, out_w, sampling_ratio, spatial_scale, half_pixel):
    n_rois = rois.shape[0]
    c, h, w = x.shape[1:]
    y = np.zeros((n_rois, c, out_h, out_w), dtype=np.float64)
    offset = 0.5 if half_pixel else 0.0
    for r in range(n_rois):
        x1, y1, x2, y2 = (float(v) * spatial_scale - offset for v in rois[r])
        roi_w, roi_h = x2 - x1, y2 - y1
        if not half_pixel:  # legacy mode forces malformed rois to 1x1
            roi_w, roi_h = max(roi_w, 1.0), max(roi_h, 1.0)
        gh = sampling_ratio if sampling_ratio > 0 else max(math.ceil(roi_h / out_h), 0)
        gw = sampling_ratio if sampling_ratio > 0 else max(math.ceil(roi_w / out_w), 0)
        if gh == 0 or gw == 0:
            continue
        ys = _axis_samples(y1, roi_h / out_h, out_h, gh, h)
        xs = _axis_samples(x1, roi_w / out_w, out_w, gw, w)
        img = x[int(batch_indices[r])].astype(np.float64)
        if mode == "avg":
            ay = _interp_matrix(*ys, out_h, gh, h)
            ax = _interp_matrix(*xs, out_w, gw, w)
            y[r] = np.einsum("ph,chw,qw->cpq", ay, img, ax)
        else:
            y[r] = _roi_max(img, ys, xs, out_h, gh, out_w, gw)
    return y.astype(x.dtype)


@kernel("RoiAlign", since=10)
def roi_align_10(x, rois, batch_indices, *, mode="avg", output_height=1, output_width=1, sampling_ratio=0,
                 spatial_scale=1.0):
    """RoiAlign-10: bilinear samples averaged (or maxed) per bin, no half-pixel offset."""
    return _roi_align(x, rois, batch_indices, mode=mode, out_h=output_height, out_w=output_width,
                      sampling_ratio=sampling_ratio, spatial_scale=spatial_scale, half_pixel=False)


@kernel("RoiAlign", since=16)
def roi_align_16(x, rois, batch_indices, *, coordinate_transformation_mode="half_pixel", mode="avg",
                 output_height=1, output_width=1, sampling_ratio=0, spatial_scale=1.0):
    """RoiAlign-16/22: adds coordinate_transformation_mode (half_pixel by default)."""
    return _roi_align(x, rois, batch_indices, mode=mode, out_h=output_height, out_w=output_width,
                      sampling_ratio=sampling_ratio, spatial_scale=spatial_scale,
                      half_pixel=coordinate_transformation_mode == "half_pixel")


def _round(v: float) -> int:
    """Half away from zero, as C's round (Python's round is half to even)."""
    return int(math.floor(abs(v) + 0.5)) * (1 if v >= 0 else -1)


@kernel("MaxRoiPool", since=1)
def max_roi_pool(x, rois, *, pooled_shape, spatial_scale=1.0):
    """MaxRoiPool-1/22: max over each bin of rounded roi boxes [batch, x1, y1, x2, y2]."""
    ph_n, pw_n = pooled_shape
    h, w = x.shape[2:]
    y = np.zeros((rois.shape[0], x.shape[1], ph_n, pw_n), dtype=x.dtype)
    for r, (b, x1, y1, x2, y2) in enumerate(rois):
        sw, sh, ew, eh = (_round(float(v) * spatial_scale) for v in (x1, y1, x2, y2))
        bin_h = max(eh - sh + 1, 1) / ph_n
        bin_w = max(ew - sw + 1, 1) / pw_n
        img = x[int(b)]
        for ph in range(ph_n):
            hs = min(max(math.floor(ph * bin_h) + sh, 0), h)
            he = min(max(math.ceil((ph + 1) * bin_h) + sh, 0), h)
            for pw in range(pw_n):
                ws = min(max(math.floor(pw * bin_w) + sw, 0), w)
                we = min(max(math.ceil((pw + 1) * bin_w) + sw, 0), w)
                if he > hs and we > ws:
                    y[r, :, ph, pw] = img[:, hs:he, ws:we].max(axis=(1, 2))
    return y


