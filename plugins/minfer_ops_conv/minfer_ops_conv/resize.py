"""Kernels: Resize (opsets 10-19) and Upsample, as one separable 1-D resampling per resized axis.

Each resized axis gets a table of taps: for output position i, source indices
idx[i, :] and weights w[i, :]. The axis is then resampled with one gather
(np.take) and a weighted sum over the tap axis.
"""

from __future__ import annotations

import math

import numpy as np

from minfer_core import kernel


def source_coords(mode: str, out_len: int, in_len: int, scale: float, roi=None) -> np.ndarray:
    """Output indices mapped to (fractional) input coordinates, per coordinate_transformation_mode.

    Like onnx's reference, align_corners, pytorch_half_pixel and tf_crop_and_resize
    measure the resized length as in_len * scale, which is fractional when the
    output size was rounded down from the scales.
    """
    y = np.arange(out_len, dtype=np.float64)
    length = in_len * scale
    if abs(length - out_len) < 1e-6 * max(1, out_len):
        length = out_len  # scales derived from sizes: undo the rounding of in * (out / in)
    if mode == "asymmetric":
        return y / scale
    if mode == "align_corners":
        return np.zeros(out_len) if length == 1 else y * (in_len - 1) / (length - 1)
    if mode == "pytorch_half_pixel":
        # the spec (and onnxruntime) map a length-1 output to 0; onnx's reference says -0.5
        return np.zeros(out_len) if length == 1 else (y + 0.5) / scale - 0.5
    if mode == "half_pixel":
        return (y + 0.5) / scale - 0.5
    if mode == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / (scale * in_len))
        return offset + (y + 0.5) / scale - 0.5
    if mode == "tf_crop_and_resize":
        start, end = roi
        if length == 1:
            return np.full(out_len, (end - start) * (in_len - 1) / 2 + start * (in_len - 1))
        return y * (end - start) * (in_len - 1) / (length - 1) + start * (in_len - 1)
    raise ValueError(f"Resize: unknown coordinate_transformation_mode {mode!r}")


def _nearest(x: np.ndarray, rule: str) -> np.ndarray:
    if rule == "round_prefer_floor":
        return np.ceil(x - 0.5)
    if rule == "round_prefer_ceil":
        return np.floor(x + 0.5)
    if rule == "floor":
        return np.floor(x)
    if rule == "ceil":
        return np.ceil(x)
    raise ValueError(f"Resize: unknown nearest_mode {rule!r}")


def _cubic(s: np.ndarray, a: float) -> np.ndarray:
    """Keys cubic convolution kernel at distances s."""
    s = np.abs(s)
    near = ((a + 2) * s - (a + 3)) * s * s + 1
    far = ((a * s - 5 * a) * s + 8 * a) * s - 4 * a
    return np.where(s <= 1, near, np.where(s < 2, far, 0.0))


def _filter_taps(x: np.ndarray, mode: str, scale: float, antialias: int, cubic_a: float):
    """(indices, weights) of the linear or cubic filter around coordinates x.

    The base is the pixel left of x (one further left when x is an integer),
    so the fraction lies in (0, 1]; antialiasing widens the filter by 1/scale.
    """
    base = np.floor(x)
    frac = x - base
    whole = frac == 0
    base = np.where(whole, base - 1, base).astype(np.int64)
    frac = np.where(whole, 1.0, frac)
    s = min(scale, 1.0) if antialias else 1.0
    reach = 1 if mode == "linear" else 2
    start = math.floor(-reach / s) + 1
    offsets = np.arange(start, 1 - start + 1)
    dist = (offsets[None, :] - frac[:, None]) * s
    if mode == "linear":
        w = np.clip(1 - np.abs(dist), 0, 1)
    else:
        w = _cubic(dist, cubic_a)
    if antialias:
        w = w / w.sum(axis=1, keepdims=True)
    return base[:, None] + offsets[None, :], w


def axis_taps(in_len, out_len, scale, *, mode, coord_mode, nearest_mode, antialias, cubic_a, exclude_outside, roi):
    """(indices, weights or None, extrapolated mask or None) for one resized axis."""
    x = source_coords(coord_mode, out_len, in_len, scale, roi)
    outside = None
    if coord_mode == "tf_crop_and_resize":
        outside = (x < 0) | (x > in_len - 1)
    if mode == "nearest":
        idx = np.clip(_nearest(x, nearest_mode), 0, in_len - 1).astype(np.int64)
        return idx[:, None], None, outside
    idx, w = _filter_taps(x, mode, scale, antialias, cubic_a)
    if exclude_outside:
        w = np.where((idx < 0) | (idx >= in_len), 0.0, w)
        total = w.sum(axis=1, keepdims=True)
        w = w / np.where(total == 0, 1.0, total)
    return np.clip(idx, 0, in_len - 1), w, outside


def resample_axis(data: np.ndarray, axis: int, idx: np.ndarray, w, outside, extrapolation_value: float):
    """Gather the taps of every output position along axis and sum them with their weights."""
    out_len, n = idx.shape
    if w is None:
        result = np.take(data, idx[:, 0], axis=axis)
    else:
        gathered = np.take(data, idx.reshape(-1), axis=axis)
        gathered = gathered.reshape(data.shape[:axis] + (out_len, n) + data.shape[axis + 1 :])
        shape = (1,) * axis + (out_len, n) + (1,) * (data.ndim - axis - 1)
        result = (gathered * w.reshape(shape).astype(gathered.dtype, copy=False)).sum(axis=axis + 1)
    if outside is not None and outside.any():
        mask = outside.reshape((1,) * axis + (out_len,) + (1,) * (data.ndim - axis - 1))
        result = np.where(mask, np.asarray(extrapolation_value, dtype=result.dtype), result)
    return result


def _compute_dtype(dtype: np.dtype) -> np.dtype:
    return dtype if dtype in (np.float32, np.float64) else np.dtype(np.float64)


def _finish(y: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Back to the input dtype; integers are rounded and saturated."""
    if dtype.kind in "iub":
        info = np.iinfo(dtype) if dtype.kind != "b" else None
        y = np.round(y)
        if info is not None:
            y = np.clip(y, info.min, info.max)
    return y.astype(dtype, copy=False)


def _axes_taps(shape, scales, sizes, roi, *, mode, coord_mode, nearest_mode, antialias=0, cubic_a=-0.75,
               exclude_outside=0, extrapolation_value=0.0):
    """[(axis, indices, weights, outside)] for every axis whose scale or size changes."""
    rank = len(shape)
    steps = []
    for axis in range(rank):
        in_len, out_len, scale = shape[axis], int(sizes[axis]), float(scales[axis])
        r = None if roi is None else (float(roi[axis]), float(roi[axis + rank]))
        cropping = coord_mode == "tf_crop_and_resize" and r != (0.0, 1.0)
        if scale == 1.0 and out_len == in_len and not cropping:
            continue
        steps.append((axis, *axis_taps(in_len, out_len, scale, mode=mode, coord_mode=coord_mode,
                                       nearest_mode=nearest_mode, antialias=antialias, cubic_a=cubic_a,
                                       exclude_outside=exclude_outside, roi=r)))
    return steps


def _repeats(shape, steps) -> tuple[int, ...] | None:
    """Per axis how many times each input cell repeats, when every step is a nearest gather of whole repeats
    (an integer up-scale: idx == [0]*k + [1]*k + ...), else None."""
    if not steps:
        return None  # nothing resized: x itself, as the taps path returns it
    reps = [1] * len(shape)
    for axis, idx, w, outside in steps:
        n, m = shape[axis], len(idx)
        if w is not None or outside is not None or m % n or not np.array_equal(idx[:, 0], np.arange(m) // (m // n)):
            return None
        reps[axis] = m // n
    return tuple(reps) if max(reps) > 1 else None


def _run_taps(x, steps, reps, mode, extrapolation_value):
    """Resample x by the axes' taps (an integer nearest up-scale by np.repeat instead: the same values)."""
    if reps is not None:  # np.repeat per axis, the last first (a broadcast copy with an inner run of 2 was 2x slower)
        y = x
        for axis in range(x.ndim - 1, -1, -1):
            if reps[axis] > 1:
                y = np.repeat(y, reps[axis], axis=axis)
        return y
    y = x if mode == "nearest" else x.astype(_compute_dtype(x.dtype), copy=False)
    for axis, idx, w, outside in steps:
        y = resample_axis(y, axis, idx, w, outside, extrapolation_value)
    return _finish(y, x.dtype) if y.dtype != x.dtype else np.ascontiguousarray(y)


def resize_nd(x, scales, sizes, roi, *, mode, coord_mode, nearest_mode, antialias=0, cubic_a=-0.75,
              exclude_outside=0, extrapolation_value=0.0):
    """Resample every axis whose scale or size changes; scales/sizes/roi cover all axes."""
    steps = _axes_taps(x.shape, scales, sizes, roi, mode=mode, coord_mode=coord_mode, nearest_mode=nearest_mode,
                       antialias=antialias, cubic_a=cubic_a, exclude_outside=exclude_outside)
    return _run_taps(x, steps, None, mode, extrapolation_value)


def _targets(shape, scales, sizes, axes, policy):
    """Full-rank (scales, sizes) from the Resize inputs, honouring axes and keep_aspect_ratio_policy."""
    rank = len(shape)
    axes = [a % rank for a in axes] if axes else list(range(rank))
    full_scales = [1.0] * rank
    full_sizes = list(shape)
    if sizes is not None and sizes.size:
        wanted = [int(v) for v in sizes]
        ratios = [w / shape[a] for w, a in zip(wanted, axes)]
        if policy in ("not_larger", "not_smaller"):
            common = min(ratios) if policy == "not_larger" else max(ratios)
            ratios = [common] * len(axes)
            wanted = [int(common * shape[a] + 0.5) for a in axes]
        for a, r, w in zip(axes, ratios, wanted):
            full_scales[a], full_sizes[a] = r, w
    else:
        for a, sc in zip(axes, scales):
            full_scales[a] = float(sc)
            full_sizes[a] = int(math.floor(shape[a] * float(sc)))
    return full_scales, full_sizes, axes


def _full_roi(roi, rank, axes):
    if roi is None or roi.size == 0:
        return None
    if len(axes) == rank:
        return [float(v) for v in roi]
    full = [0.0] * rank + [1.0] * rank
    for i, a in enumerate(axes):
        full[a], full[a + rank] = float(roi[i]), float(roi[i + len(axes)])
    return full


def _legacy(x, scales, mode):
    """Resize-10 and Upsample: asymmetric coordinates; nearest truncates up-sampling, ceils down-sampling."""
    scales = [float(s) for s in scales]
    sizes = [int(math.floor(n * s)) for n, s in zip(x.shape, scales)]
    if mode == "nearest":
        y = x
        for axis, (n, s, m) in enumerate(zip(x.shape, scales, sizes)):
            if s == 1.0 and n == m:
                continue
            src = np.arange(m) / s
            src = np.ceil(src) if s < 1 else np.floor(src)
            y = np.take(y, np.clip(src, 0, n - 1).astype(np.int64), axis=axis)
        return np.ascontiguousarray(y)
    return resize_nd(x, scales, sizes, None, mode="linear", coord_mode="asymmetric", nearest_mode="floor")


@kernel("Resize", since=10)
def resize_10(x, scales, *, mode="nearest"):
    """Resize-10: nearest or linear with asymmetric coordinates (Upsample's rules)."""
    return _legacy(x, scales, mode)


_PLANS: dict = {}  # (shape, roi, scales, sizes, attributes) -> (taps, repeats), for every Resize of the process
_MAX_PLANS = 256  # a process meeting more than this (dynamic shapes or scales) starts the table afresh


def _key(v) -> object:
    """A hashable stand-in for a roi, scales or sizes input (an array as its bytes: one C call)."""
    if v is None or not isinstance(v, np.ndarray):
        return v if v is None else tuple(np.asarray(v).reshape(-1).tolist())
    return v.dtype.char, v.shape, v.tobytes()


def _resize(x, roi, scales, sizes, *, axes=None, policy="stretch", **kw):
    """Resize x; the taps of each axis are worked out once per input shape, inputs and attributes (recomputing
    them took most of a small Resize: 28 us of a 1x16x8x8 to 16x16 nearest one)."""
    key = (x.shape, _key(roi), _key(scales), _key(sizes), None if axes is None else tuple(axes), policy,
           tuple(sorted(kw.items())))
    plan = _PLANS.get(key)
    if plan is None:
        scales_, sizes_, axes_ = _targets(x.shape, scales, sizes, axes, policy)
        steps = _axes_taps(x.shape, scales_, sizes_, _full_roi(roi, x.ndim, axes_), **kw)
        if len(_PLANS) >= _MAX_PLANS:
            _PLANS.clear()
        plan = _PLANS[key] = steps, _repeats(x.shape, steps) if kw["mode"] == "nearest" else None
    return _run_taps(x, plan[0], plan[1], kw["mode"], kw.get("extrapolation_value", 0.0))


@kernel("Resize", since=11)
def resize_11(x, roi=None, scales=None, sizes=None, *, coordinate_transformation_mode="half_pixel",
              cubic_coeff_a=-0.75, exclude_outside=0, extrapolation_value=0.0, mode="nearest",
              nearest_mode="round_prefer_floor"):
    """Resize-11/13: nearest/linear/cubic with coordinate transformation modes, scales or sizes."""
    return _resize(x, roi, scales, sizes, mode=mode, coord_mode=coordinate_transformation_mode,
                   nearest_mode=nearest_mode, cubic_a=cubic_coeff_a, exclude_outside=exclude_outside,
                   extrapolation_value=extrapolation_value)


@kernel("Resize", since=18)
def resize_18(x, roi=None, scales=None, sizes=None, *, antialias=0, axes=None,
              coordinate_transformation_mode="half_pixel", cubic_coeff_a=-0.75, exclude_outside=0,
              extrapolation_value=0.0, keep_aspect_ratio_policy="stretch", mode="nearest",
              nearest_mode="round_prefer_floor"):
    """Resize-18/19: adds antialias, axes and keep_aspect_ratio_policy (19: half_pixel_symmetric)."""
    return _resize(x, roi, scales, sizes, axes=axes, policy=keep_aspect_ratio_policy, mode=mode,
                   coord_mode=coordinate_transformation_mode, nearest_mode=nearest_mode, antialias=antialias,
                   cubic_a=cubic_coeff_a, exclude_outside=exclude_outside, extrapolation_value=extrapolation_value)


def _upsample_mode(mode: str) -> str:
    return "linear" if mode in ("linear", "bilinear") else "nearest"


@kernel("Upsample", since=1)
def upsample_1(x, *, height_scale, mode="nearest", width_scale):
    """Upsample-1: 4-D NCHW scaled by height_scale and width_scale."""
    return _legacy(x, [1.0, 1.0, height_scale, width_scale], _upsample_mode(mode))


@kernel("Upsample", since=7)
def upsample_7(x, *, mode="nearest", scales):
    """Upsample-7: per-axis scales attribute."""
    return _legacy(x, scales, _upsample_mode(mode))


@kernel("Upsample", since=9)
def upsample_9(x, scales, *, mode="nearest"):
    """Upsample-9/10: per-axis scales input."""
    return _legacy(x, scales, _upsample_mode(mode))


