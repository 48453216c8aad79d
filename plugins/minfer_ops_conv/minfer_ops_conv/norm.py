"""Kernels: BatchNormalization (inference), LRN, InstanceNormalization, LpNormalization."""

from __future__ import annotations

import numpy as np

from minfer_core import intra_op_threads, kernel, parallel_for


def _channel_param(p: np.ndarray, ndim: int, spatial: int) -> np.ndarray:
    """Per-channel params broadcast as (C, 1, ..., 1); spatial=0 params already match x.shape[1:]."""
    if spatial and p.ndim == 1:
        return p.reshape((-1,) + (1,) * (ndim - 2))
    return p


def _affine(scale, bias, mean, var, epsilon):
    """Fold inference BN into y = a*x + b, computed in float64 for accuracy (training statistics)."""
    a = scale.astype(np.float64) / np.sqrt(var.astype(np.float64) + epsilon)
    return a, bias.astype(np.float64) - mean.astype(np.float64) * a


def inference_affine(scale, bias, mean, var, epsilon: float, dtype) -> tuple[np.ndarray, np.ndarray]:
    """Inference BN as y = a*x + b, a and b of ``dtype`` rounded as onnxruntime's CPU kernel rounds them.

    In ``dtype`` (float16/bfloat16: float32), each step rounded: 1 / sqrt(var + eps), times scale, then
    bias - mean * a. Folding in float64 instead moves a or b by an ulp on a few channels: an ulp on a value a
    DynamicQuantizeLinear reads next can become a whole quantization step.
    """
    t = np.dtype(dtype) if np.dtype(dtype) in (np.float32, np.float64) else np.dtype(np.float32)
    scale, bias, mean, var = (np.asarray(p, dtype=t) for p in (scale, bias, mean, var))
    with np.errstate(divide="ignore", invalid="ignore"):  # var + eps <= 0 gives inf/nan, as in onnxruntime
        a = t.type(1) / np.sqrt(var + t.type(epsilon))
        a = a * scale
        b = bias - mean * a
    return a.astype(dtype, copy=False), b.astype(dtype, copy=False)


def _batch_norm(ctx, epsilon: float, spatial: int = 1):
    consts = ctx.constants[1:5]
    fixed = len(consts) == 4 and all(c is not None for c in consts)
    cache: dict = {}

    def params(x, scale, bias, mean, var):
        a, b = inference_affine(scale, bias, mean, var, epsilon, x.dtype)
        return _channel_param(a, x.ndim, spatial), _channel_param(b, x.ndim, spatial)

    def run(x, scale, bias, mean, var, *, out=None):
        key = (x.ndim, x.dtype)
        if not fixed:
            a, b = params(x, scale, bias, mean, var)
        else:
            if key not in cache:
                cache[key] = params(x, *consts)
            a, b = cache[key]
        y = np.multiply(x, a, out=out)  # out may be x itself: elementwise, so safe
        y += b
        extra = (mean, var, mean, var)[: ctx.num_outputs - 1]
        return (y, *extra) if extra else y

    return run


@kernel("BatchNormalization", since=1, prepare=True, out=True, inplace=(0,), views=False)
def batch_norm_1(ctx, *, consumed_inputs, epsilon=1e-5, is_test=0, momentum=0.9, spatial=1):
    """BatchNormalization-1: inference with running statistics (is_test ignored)."""
    return _batch_norm(ctx, epsilon, spatial)


@kernel("BatchNormalization", since=6, prepare=True, out=True, inplace=(0,), views=False)
def batch_norm_6(ctx, *, epsilon=1e-5, is_test=0, momentum=0.9, spatial=1):
    """BatchNormalization-6: inference with running statistics (is_test ignored)."""
    return _batch_norm(ctx, epsilon, spatial)


@kernel("BatchNormalization", since=7, prepare=True, out=True, inplace=(0,), views=False)
def batch_norm_7(ctx, *, epsilon=1e-5, momentum=0.9, spatial=1):
    """BatchNormalization-7: inference with running statistics."""
    return _batch_norm(ctx, epsilon, spatial)


@kernel("BatchNormalization", since=9, prepare=True, out=True, inplace=(0,), views=False)
def batch_norm_9(ctx, *, epsilon=1e-5, momentum=0.9):
    """BatchNormalization-9: per-channel inference normalization."""
    return _batch_norm(ctx, epsilon)


def _batch_norm_training(ctx, epsilon: float, momentum: float):
    """Normalize with the batch's own statistics and return the updated running ones."""

    def run(x, scale, bias, mean, var, *, out=None):
        axes = (0,) + tuple(range(2, x.ndim))
        batch_mean = x.mean(axis=axes, dtype=np.float64)
        batch_var = x.var(axis=axes, dtype=np.float64)
        a, b = (_channel_param(v, x.ndim, 1) for v in _affine(scale, bias, batch_mean, batch_var, epsilon))
        y = (x * a + b).astype(x.dtype)
        if out is not None and ctx.num_outputs <= 1:
            np.copyto(out, y)
            y = out
        running_mean = (mean * momentum + batch_mean * (1 - momentum)).astype(mean.dtype)
        running_var = (var * momentum + batch_var * (1 - momentum)).astype(var.dtype)
        return (y, running_mean, running_var)[: max(ctx.num_outputs, 1)] if ctx.num_outputs > 1 else y

    return run


@kernel("BatchNormalization", since=14, prepare=True, out=True, inplace=(0,), views=False)
def batch_norm_14(ctx, *, epsilon=1e-5, momentum=0.9, training_mode=0):
    """BatchNormalization-14/15: running statistics, or batch statistics when training_mode=1."""
    if training_mode:
        return _batch_norm_training(ctx, epsilon, momentum)
    return _batch_norm(ctx, epsilon)


# one LRN chunk's channels x spatial: small enough for its squares and sums to stay in L2
_LRN_CHUNK_BYTES = 384 * 1024
# below this an LRN (~0.3 ms per MB) is cheaper done whole than split between two threads: 1x192x55x55
# (2.3 MB) split wins by 20-35%; 1x64x55x55 (775 KB) went either way in repeated runs, so it stays whole
_LRN_SPLIT_BYTES = 1024 * 1024


def _window_rows(q: np.ndarray, size: int, rows: int) -> np.ndarray:
    """Sums of ``size`` consecutive rows of q (a scratch array of rows + size - 1 rows, overwritten).

    By doubling (level k holds sums of 2**k rows), so ~2*log2(size) passes, each
    over contiguous rows: size 5 is 3 additions instead of 4.
    """
    parts, off, span, level = [], 0, 1, q
    while size:
        if size & 1:
            parts.append(level[off : off + rows])
            off += span
        size >>= 1
        if size:
            level = level[:-span] + level[span:]
            span *= 2
    acc = parts[0]  # every part lies in a different scratch level, so adding in place is safe
    for part in parts[1:]:
        acc += part
    return acc


def _lrn_chunk(x: np.ndarray, y: np.ndarray, lo: int, hi: int, *, size, alpha, beta, bias, dtype) -> None:
    """y[lo:hi] of one image, x and y shaped (C, S): each channel over the squares of its window's channels."""
    before, after = (size - 1) // 2, size // 2
    c = x.shape[0]
    q = np.zeros((hi - lo + size - 1, x.shape[1]), dtype=dtype)
    a, b = max(0, lo - before), min(c, hi + after)
    np.square(x[a:b], out=q[a - (lo - before) : b - (lo - before)], dtype=dtype)
    s = _window_rows(q, size, hi - lo)
    s *= dtype.type(alpha / size)
    s += dtype.type(bias)
    if beta == 0.75:  # s**-0.75 = 1 / (sqrt(s) * sqrt(sqrt(s))): two sqrt passes beat a float power
        r = np.sqrt(s)
        np.sqrt(r, out=s)
        s *= r
    elif beta == 0.5:
        np.sqrt(s, out=s)
    elif beta != 1.0:
        np.power(s, dtype.type(beta), out=s)
    np.divide(x[lo:hi], s, out=y[lo:hi], casting="unsafe")


@kernel("LRN", since=1, out=True, views=False)
def lrn(x, *, alpha=0.0001, beta=0.75, bias=1.0, size, out=None):
    """LRN-1/13: x / (bias + alpha/size * sum of squares over a channel window)^beta."""
    y = np.empty(x.shape, dtype=x.dtype) if out is None else out
    n, c = x.shape[:2]
    spatial = int(np.prod(x.shape[2:]))
    xs, ys = x.reshape(n, c, spatial), y.reshape(n, c, spatial)
    # float16 and bfloat16 squares and sums would lose digits: those compute in float32
    dtype = x.dtype if x.dtype in (np.float32, np.float64) else np.dtype(np.float32)
    rows = max(1, min(c, _LRN_CHUNK_BYTES // max(1, spatial * dtype.itemsize)))
    per_image = -(-c // rows)
    threads = intra_op_threads() if x.nbytes >= _LRN_SPLIT_BYTES else 1
    while (n * per_image) % threads and per_image < c:  # as many chunks per thread: none waits on the last
        per_image += 1
    attrs = dict(size=size, alpha=alpha, beta=beta, bias=bias, dtype=dtype)

    def chunks(first: int, last: int) -> None:
        for k in range(first, last):
            i, j = divmod(k, per_image)
            lo = j * c // per_image
            _lrn_chunk(xs[i], ys[i], lo, (j + 1) * c // per_image, **attrs)

    if threads == 1:
        chunks(0, n * per_image)
    else:
        parallel_for(n * per_image, chunks)
    return y


def _instance_norm(x, scale, bias, epsilon):
    axes = tuple(range(2, x.ndim))
    xd = x.astype(np.float64)
    mean = xd.mean(axis=axes, keepdims=True)
    var = xd.var(axis=axes, keepdims=True)
    shape = (-1,) + (1,) * (x.ndim - 2)
    y = (xd - mean) / np.sqrt(var + epsilon) * scale.reshape(shape) + bias.reshape(shape)
    return y.astype(x.dtype, copy=False)


@kernel("InstanceNormalization", since=1)
def instance_norm_1(x, scale, bias, *, consumed_inputs=None, epsilon=1e-5):
    """InstanceNormalization-1: normalize each (n, c) over its spatial dims."""
    return _instance_norm(x, scale, bias, epsilon)


@kernel("InstanceNormalization", since=6)
def instance_norm_6(x, scale, bias, *, epsilon=1e-5):
    """InstanceNormalization-6/22: normalize each (n, c) over its spatial dims."""
    return _instance_norm(x, scale, bias, epsilon)


@kernel("LpNormalization", since=1)
def lp_normalization(x, *, axis=-1, p=2):
    """LpNormalization-1/22: x divided by its L1 or L2 norm along axis (zero norms give 0)."""
    if p == 1:
        norm = np.sum(np.abs(x), axis=axis, keepdims=True)
    else:
        norm = np.sqrt(np.sum(np.square(x), axis=axis, keepdims=True))
    with np.errstate(invalid="ignore", divide="ignore"):
        y = np.where(norm == 0, 0, x / norm)
    return y.astype(x.dtype, copy=False)


