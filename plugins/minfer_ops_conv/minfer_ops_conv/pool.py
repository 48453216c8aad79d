"""Kernels: MaxPool, AveragePool, LpPool and the global pools, as loops over strided kernel taps."""

from __future__ import annotations

from typing import Callable

import numpy as np

from minfer_core import kernel

from . import _geometry as geo

_ALL = (slice(None), slice(None))


def _lowest(dtype: np.dtype):
    return -np.inf if dtype.kind == "f" else np.iinfo(dtype).min


def _tap_views(x: np.ndarray, w: geo.Window, fill) -> list[np.ndarray]:
    xp = geo.pad(x, w, fill)
    return [xp[_ALL + taps] for taps in w.taps()]


def _max(x: np.ndarray, w: geo.Window) -> np.ndarray:
    views = _tap_views(x, w, _lowest(x.dtype))
    out = views[0].copy()
    for v in views[1:]:
        np.maximum(out, v, out=out)
    return out


def _max_with_indices(x: np.ndarray, w: geo.Window, storage_order: int):
    """Max and the flat NCHW (or NCWH when storage_order=1) index of the first maximum."""
    views = _tap_views(x, w, _lowest(x.dtype))
    out = views[0].copy()
    best = np.zeros(out.shape, dtype=np.int64)
    for t, v in enumerate(views[1:], 1):
        better = v > out
        np.copyto(out, v, where=better)
        best[better] = t
    taps = np.unravel_index(best, w.kernel)
    n, c = x.shape[:2]
    spatial = w.in_shape
    coords = []
    for i, (s, d, b) in enumerate(zip(w.strides, w.dilations, w.begin)):
        o = np.arange(w.out_shape[i]).reshape((-1,) + (1,) * (len(spatial) - 1 - i))
        coords.append(o * s - b + taps[i] * d)
    if storage_order:
        flat = np.ravel_multi_index(coords[::-1], spatial[::-1], mode="clip")
    else:
        flat = np.ravel_multi_index(coords, spatial, mode="clip")
    base = np.arange(n * c, dtype=np.int64).reshape((n, c) + (1,) * len(spatial)) * int(np.prod(spatial))
    return out, flat + base


def _sum(x: np.ndarray, w: geo.Window) -> np.ndarray:
    views = _tap_views(x, w, 0)
    out = views[0].copy()
    for v in views[1:]:
        out += v
    return out


def _cached(make: Callable[[tuple[int, ...]], Callable[[np.ndarray], object]]):
    """Per-input-shape memo of the plan ``make`` builds, so geometry is resolved once per shape."""
    plans: dict = {}

    def run(x):
        key = x.shape
        plan = plans.get(key)
        if plan is None:
            plan = plans[key] = make(key)
        return plan(x)

    return run


def _geometry(kernel_shape, strides, pads, auto_pad, dilations=None, ceil_mode=0):
    def at(shape):
        return geo.window(shape[2:], kernel_shape, strides=strides, dilations=dilations, pads=pads,
                          auto_pad=auto_pad, ceil_mode=ceil_mode)
    return at


def _max_pool(ctx, geometry, storage_order=0):
    indices = ctx.num_outputs > 1

    def make(shape):
        w = geometry(shape)
        if indices:
            return lambda x: _max_with_indices(x, w, storage_order)
        return lambda x: _max(x, w)

    return _cached(make)


@kernel("MaxPool", since=1, prepare=True)
def max_pool_1(ctx, *, auto_pad="NOTSET", kernel_shape, pads=None, strides=None):
    """MaxPool-1: max over windows, pads never win."""
    return _max_pool(ctx, _geometry(kernel_shape, strides, pads, auto_pad))


@kernel("MaxPool", since=8, prepare=True)
def max_pool_8(ctx, *, auto_pad="NOTSET", kernel_shape, pads=None, storage_order=0, strides=None):
    """MaxPool-8: adds the Indices output and storage_order."""
    return _max_pool(ctx, _geometry(kernel_shape, strides, pads, auto_pad), storage_order)


@kernel("MaxPool", since=10, prepare=True)
def max_pool_10(ctx, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, pads=None,
                storage_order=0, strides=None):
    """MaxPool-10/11/12/22: adds dilations and ceil_mode."""
    return _max_pool(ctx, _geometry(kernel_shape, strides, pads, auto_pad, dilations, ceil_mode), storage_order)


def _average_pool(geometry, count_include_pad):
    def make(shape):
        w = geometry(shape)
        counts = geo.tap_counts(w, bool(count_include_pad))

        def run(x):
            out = _sum(x, w)
            out /= counts.astype(out.dtype)
            return out

        return run

    return _cached(make)


@kernel("AveragePool", since=1, prepare=True)
def average_pool_1(ctx, *, auto_pad="NOTSET", kernel_shape, pads=None, strides=None):
    """AveragePool-1: mean over windows, pads excluded from the count."""
    return _average_pool(_geometry(kernel_shape, strides, pads, auto_pad), 0)


@kernel("AveragePool", since=7, prepare=True)
def average_pool_7(ctx, *, auto_pad="NOTSET", count_include_pad=0, kernel_shape, pads=None, strides=None):
    """AveragePool-7: adds count_include_pad."""
    return _average_pool(_geometry(kernel_shape, strides, pads, auto_pad), count_include_pad)


@kernel("AveragePool", since=10, prepare=True)
def average_pool_10(ctx, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, kernel_shape, pads=None,
                    strides=None):
    """AveragePool-10/11: adds ceil_mode."""
    return _average_pool(_geometry(kernel_shape, strides, pads, auto_pad, None, ceil_mode), count_include_pad)


@kernel("AveragePool", since=19, prepare=True)
def average_pool_19(ctx, *, auto_pad="NOTSET", ceil_mode=0, count_include_pad=0, dilations=None, kernel_shape,
                    pads=None, strides=None):
    """AveragePool-19/22: adds dilations."""
    return _average_pool(_geometry(kernel_shape, strides, pads, auto_pad, dilations, ceil_mode), count_include_pad)


def _lp_pool(geometry, p):
    def make(shape):
        w = geometry(shape)

        def run(x):
            powered = np.abs(x) ** x.dtype.type(p)
            return (_sum(powered, w) ** x.dtype.type(1.0 / p)).astype(x.dtype, copy=False)

        return run

    return _cached(make)


@kernel("LpPool", since=1, prepare=True)
def lp_pool_1(ctx, *, auto_pad="NOTSET", kernel_shape=None, p=2.0, pads=None, strides=None):
    """LpPool-1: (sum |x|^p)^(1/p) over windows, float p."""
    return _lp_pool(_geometry(kernel_shape, strides, pads, auto_pad), p)


@kernel("LpPool", since=2, prepare=True)
def lp_pool_2(ctx, *, auto_pad="NOTSET", kernel_shape, p=2, pads=None, strides=None):
    """LpPool-2/11: integer p."""
    return _lp_pool(_geometry(kernel_shape, strides, pads, auto_pad), p)


@kernel("LpPool", since=18, prepare=True)
def lp_pool_18(ctx, *, auto_pad="NOTSET", ceil_mode=0, dilations=None, kernel_shape, p=2, pads=None, strides=None):
    """LpPool-18/22: adds ceil_mode and dilations."""
    return _lp_pool(_geometry(kernel_shape, strides, pads, auto_pad, dilations, ceil_mode), p)


def _spatial_axes(x: np.ndarray) -> tuple[int, ...]:
    return tuple(range(2, x.ndim))


@kernel("GlobalAveragePool", since=1)
def global_average_pool(x):
    """GlobalAveragePool-1/22: mean over all spatial dims, kept as size 1."""
    return np.mean(x, axis=_spatial_axes(x), keepdims=True).astype(x.dtype, copy=False)


@kernel("GlobalMaxPool", since=1)
def global_max_pool(x):
    """GlobalMaxPool-1/22: max over all spatial dims, kept as size 1."""
    return np.max(x, axis=_spatial_axes(x), keepdims=True)


def _global_lp(x, p):
    s = np.sum(np.abs(x) ** p, axis=_spatial_axes(x), keepdims=True)
    return (s ** (1.0 / p)).astype(x.dtype, copy=False)


@kernel("GlobalLpPool", since=1)
def global_lp_pool_1(x, *, p=2.0):
    """GlobalLpPool-1: float p."""
    return _global_lp(x, p)


@kernel("GlobalLpPool", since=2)
def global_lp_pool_2(x, *, p=2):
    """GlobalLpPool-2/22: integer p."""
    return _global_lp(x, p)


def _max_unpool(x, indices, output_shape, kernel_shape, pads, strides):
    """Indices address the unpooled shape inferred from the attributes; a larger output_shape
    just gets that block in its leading corner (as onnx's reference and onnxruntime do)."""
    rank = x.ndim - 2
    st = strides or [1] * rank
    p = pads or [0] * 2 * rank
    spatial = [(i - 1) * s + k - p[d] - p[d + rank] for d, (i, s, k) in enumerate(zip(x.shape[2:], st, kernel_shape))]
    inferred = tuple(x.shape[:2]) + tuple(spatial)
    y = np.zeros(int(np.prod(inferred)), dtype=x.dtype)
    y[indices.reshape(-1)] = x.reshape(-1)
    y = y.reshape(inferred)
    if output_shape is None or tuple(int(v) for v in output_shape) == inferred:
        return y
    out = np.zeros(tuple(int(v) for v in output_shape), dtype=x.dtype)
    out[tuple(slice(0, n) for n in inferred)] = y
    return out


@kernel("MaxUnpool", since=9)
def max_unpool(x, indices, output_shape=None, *, kernel_shape, pads=None, strides=None):
    """MaxUnpool-9/11/22: scatter values to the flat positions MaxPool's Indices recorded, zeros elsewhere."""
    return _max_unpool(x, indices, output_shape, kernel_shape, pads, strides)


KERNELS = [
    max_unpool,
    max_pool_1, max_pool_8, max_pool_10,
    average_pool_1, average_pool_7, average_pool_10, average_pool_19,
    lp_pool_1, lp_pool_2, lp_pool_18,
    global_average_pool, global_max_pool, global_lp_pool_1, global_lp_pool_2,
]
