"""Kernels: activations (Relu, Sigmoid, Gelu, Clip, ...) and the Softmax family."""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np

from minfer_core import kernel, parallel_for, scratch

from .elementwise import (SPLIT_CHEAP, SPLIT_COSTLY, arr, as_float, declare, erf, erf32, into, is_exotic, on_1d,
                          scalar, split_flat, unary_kernels)
from .elementwise import erf32_block  # erf32's elementwise step, on blocks of our size

F32_MAX = 3.4028234663852886e38
BLOCK = 1 << 16  # elements per block of the blocked kernels below: their scratch stays in L2


def _apply(x: np.ndarray, fn: Callable[[np.ndarray], Any]) -> np.ndarray:
    """fn on x in a dtype numpy computes well, returned in x's dtype."""
    with np.errstate(all="ignore"):  # overflow to inf inside exp is expected and harmless
        return arr(on_1d(fn, as_float(x)), x.dtype)


def _blocks(x: np.ndarray, out: np.ndarray | None, step: Callable[..., None]) -> np.ndarray:
    """``step(x_block, out_block)`` over flat blocks of at most BLOCK elements (out may be x)."""
    res = out if out is not None and out.flags.c_contiguous else np.empty(x.shape, x.dtype)
    flat, dst = np.ascontiguousarray(x).reshape(-1), res.reshape(-1)  # res is C-contiguous: a view
    for i in range(0, flat.size, BLOCK):
        step(flat[i:i + BLOCK], dst[i:i + BLOCK])
    if out is not None and res is not out:
        np.copyto(out, res)
        return out
    return res


def _sigmoid_block(x: np.ndarray, y: np.ndarray) -> None:
    e = np.abs(x)
    np.negative(e, out=e)
    np.exp(e, out=e)  # exp only ever sees -|x|
    num = np.greater_equal(x, 0).astype(x.dtype)  # 1 for x >= 0, 0 below (and for nan)
    np.maximum(num, e, out=num)  # 1 for x >= 0, exp(x) below: e/(1+e) keeps negatives accurate; nan stays
    e += 1
    np.divide(num, e, out=y)  # x (maybe y) was read whole above


def sigmoid(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Logistic function without overflow, in blocks (np.where against a 0-d one was ~8x slower)."""
    return _blocks(x, out, _sigmoid_block)


@functools.lru_cache(maxsize=16)
def _filled(dtype: np.dtype, value: float, size: int) -> np.ndarray:
    """A shared read-only block of ``value``: numpy 2.4's max/min against an array run 3-5x faster than
    against a 0-d bound (a slow path for that case)."""
    block = np.full(size, value, dtype)
    block.flags.writeable = False
    return block


def _relu(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    if x.dtype.kind != "f" or x.size < 1024:
        return np.maximum(x, np.zeros((), dtype=x.dtype), out=out)
    zeros = _filled(x.dtype, 0.0, BLOCK)  # one size for every input: the cache never churns
    return _blocks(x, out, lambda a, y: np.maximum(a, zeros[: a.size], out=y))


sigmoid.writes_out = _relu.writes_out = True  # type: ignore[attr-defined]

def _softplus(x: np.ndarray) -> np.ndarray:
    return np.logaddexp(np.zeros((), dtype=x.dtype), x)


def _mish(x: np.ndarray) -> np.ndarray:
    """x * tanh(softplus(x)) with tanh(log(1 + e)) = n / (n + 2), n = e * (e + 2), e = exp(x)."""
    e = np.exp(np.minimum(x, 20))  # beyond 20 the ratio is 1 in every float type
    n = e + 2
    n *= e
    out = n + 2
    np.divide(n, out, out=out)
    out *= x
    return out


KERNELS: list = []  # records made by factories below; kernels_in finds the decorated ones by themselves
KERNELS += unary_kernels("Relu", _relu, 1, legacy=True, name="max(x, 0)", at=SPLIT_CHEAP)
KERNELS += unary_kernels("Sigmoid", sigmoid, 1, legacy=True, name="1 / (1 + exp(-x))")
KERNELS += unary_kernels("Tanh", np.tanh, 1, legacy=True, name="tanh")
KERNELS += unary_kernels("Softplus", _softplus, 1, name="log(1 + exp(x))")
KERNELS += unary_kernels("Softsign", lambda x: x / (np.ones((), dtype=x.dtype) + np.abs(x)), 1, name="x / (1 + |x|)")
KERNELS += unary_kernels("Mish", _mish, 18, name="x * tanh(softplus(x))")


def _hard_sigmoid(x: np.ndarray, alpha: float, beta: float) -> np.ndarray:
    t = np.asarray(scalar(alpha, x) * x + scalar(beta, x), dtype=x.dtype)
    return _clip(t, 0.0, 1.0, t if t.ndim else None)


KERNELS += unary_kernels("HardSwish", lambda x: x * _hard_sigmoid(x, 1 / 6, 0.5), 14, name="x * hardsigmoid(x)")


def _elu(x: np.ndarray, alpha: float) -> np.ndarray:
    return _apply(x, lambda v: np.where(v > 0, v, scalar(alpha, v) * np.expm1(v)))


@kernel("Elu", since=6)
def elu(x, *, alpha=1.0):
    """Elu-6: x if x > 0 else alpha * (exp(x) - 1)."""
    return _elu(x, alpha)


@kernel("Elu", since=1)
def elu_1(x, *, alpha=1.0, consumed_inputs=None):
    """Elu-1: as Elu-6."""
    return _elu(x, alpha)


def _selu(x: np.ndarray, alpha: float, gamma: float) -> np.ndarray:
    def fn(v):
        return scalar(gamma, v) * np.where(v > 0, v, scalar(alpha, v) * np.expm1(v))

    return _apply(x, fn)


@kernel("Selu", since=6)
def selu(x, *, alpha=1.67326319217681884765625, gamma=1.05070102214813232421875):
    """Selu-6: gamma * (x if x > 0 else alpha * (exp(x) - 1))."""
    return _selu(x, alpha, gamma)


@kernel("Selu", since=1)
def selu_1(x, *, alpha=1.6732, gamma=1.0507, consumed_inputs=None):
    """Selu-1: as Selu-6 with the older, shorter default constants."""
    return _selu(x, alpha, gamma)


@kernel("Celu", since=12)
def celu(x, *, alpha=1.0):
    """Celu-12: max(0, x) + min(0, alpha * (exp(x / alpha) - 1))."""

    def fn(v):
        a = scalar(alpha, v)
        return np.maximum(v, 0) + np.minimum(0, a * np.expm1(v / a))

    return _apply(x, fn)


def _leaky_relu(x: np.ndarray, alpha: float, out: np.ndarray | None = None) -> np.ndarray:
    if not 0 < alpha < math.inf:
        # the max/min below would be wrong: with alpha 0, +inf's product is NaN; with a negative alpha, -0.0's
        # product is +0.0, a tie numpy's maximum breaks toward its second operand
        with np.errstate(invalid="ignore"):
            return into(out, _apply(x, lambda v: np.where(v >= 0, v, v * scalar(alpha, v))))
    # max(x, alpha*x) picks x for x >= 0 when 0 < alpha <= 1; min does when alpha > 1
    pick = np.maximum if alpha <= 1 else np.minimum
    if out is None or is_exotic(x.dtype):
        return into(out, _apply(x, lambda v: pick(v, v * scalar(alpha, v))))
    return pick(x, x * scalar(alpha, x), out=out)


@kernel("LeakyRelu", since=6, out=True, inplace=(0,))
def leaky_relu(x, *, alpha=0.01, out=None):
    """LeakyRelu-6: x if x >= 0 else alpha * x."""
    if out is not None and not is_exotic(x.dtype) and split_flat(
            lambda v, out: _leaky_relu(v, alpha, out), (x,), out, SPLIT_CHEAP):
        return out
    return _leaky_relu(x, alpha, out)


@kernel("LeakyRelu", since=1)
def leaky_relu_1(x, *, alpha=0.01, consumed_inputs=None):
    """LeakyRelu-1: as LeakyRelu-6."""
    return _leaky_relu(x, alpha)


@kernel("PRelu", since=6)
def prelu(x, slope):
    """PRelu-6: x if x >= 0 else slope * x, slope broadcast to x."""
    with np.errstate(all="ignore"):
        xf, sf = as_float(x), as_float(slope)
        return arr(np.where(xf >= 0, xf, xf * sf), x.dtype)


@kernel("PRelu", since=1)
def prelu_1(x, slope, *, consumed_inputs=None):
    """PRelu-1: as PRelu-6."""
    return prelu.fn(x, slope)


@kernel("HardSigmoid", since=6)
def hard_sigmoid(x, *, alpha=0.2, beta=0.5):
    """HardSigmoid-6: max(0, min(1, alpha * x + beta))."""
    return _apply(x, lambda v: _hard_sigmoid(v, alpha, beta))


@kernel("HardSigmoid", since=1)
def hard_sigmoid_1(x, *, alpha=0.2, beta=0.5, consumed_inputs=None):
    """HardSigmoid-1: as HardSigmoid-6."""
    return hard_sigmoid.fn(x, alpha=alpha, beta=beta)


@kernel("ThresholdedRelu", since=10)
def thresholded_relu(x, *, alpha=1.0):
    """ThresholdedRelu-10: x if x > alpha else 0."""
    return _apply(x, lambda v: np.where(v > scalar(alpha, v), v, 0))


@kernel("Shrink", since=9)
def shrink(x, *, bias=0.0, lambd=0.5):
    """Shrink-9: x + bias below -lambd, x - bias above lambd, else 0 (any numeric dtype)."""
    v = x.astype(np.float64) if x.dtype.kind in "iu" else as_float(x)
    b = scalar(bias, v)
    out = np.where(v < -lambd, v + b, np.where(v > lambd, v - b, 0))
    return arr(out, x.dtype)


@kernel("Swish", since=24)
def swish(x, *, alpha=1.0):
    """Swish-24: x * sigmoid(alpha * x)."""
    return _apply(x, lambda v: v * sigmoid(scalar(alpha, v) * v))


@kernel("SwiGLU", since=28)
def swiglu(a, b, *, alpha=1.0):
    """SwiGLU-28: swish_alpha(A) * B."""
    return arr(swish.fn(a, alpha=alpha) * b, a.dtype)


def _gelu_tanh(v: np.ndarray) -> np.ndarray:
    c = scalar(math.sqrt(2 / math.pi), v)
    return scalar(0.5, v) * v * (1 + np.tanh(c * (v + scalar(0.044715, v) * v * v * v)))


@kernel("Gelu", since=20, out=True, inplace=(0,))
def gelu(x, *, approximate="none", out=None):
    """Gelu-20: 0.5 * x * (1 + erf(x / sqrt(2))), or the tanh approximation."""
    if out is not None and split_flat(lambda v, out: _gelu(v, approximate, out), (x,), out, SPLIT_COSTLY):
        return out
    return _gelu(x, approximate, out)


def _gelu(x: np.ndarray, approximate: str, out: np.ndarray | None) -> np.ndarray:
    if approximate == "tanh":
        return into(out, _apply(x, _gelu_tanh))
    if x.dtype == np.float64:  # the precise erf, and the formula in float64
        y = erf(x * math.sqrt(0.5))
        y += 1.0
        y *= x
        y *= 0.5
        return into(out, y)
    if x.dtype == np.float32 and x.ndim and (out is None or out.flags.c_contiguous):
        return _gelu32(x, np.empty(x.shape, x.dtype) if out is None else out)
    v = x if x.dtype == np.float32 else as_float(x).astype(np.float32)
    y = np.multiply(v, np.float32(math.sqrt(0.5)), out=np.empty(v.shape, np.float32))  # a real array even 0-d
    erf32(y, y)
    y += np.float32(1.0)
    if v is x:  # the last two steps land in out (maybe x itself): each reads x before writing it
        y = np.multiply(y, x, out=y if out is None else out)
        y *= np.float32(0.5)
        return y
    y *= v
    y *= np.float32(0.5)
    return into(out, arr(y, x.dtype))


# Elements per block of the float32 Gelu. Each block takes ~30 numpy calls, and
# with two threads every call may wait for the other thread's GIL hand-over, so
# few long calls beat cache-sized blocks: Gelu-20 on (8, 128, 1024) in a 2-thread
# session took 5.9-6.4 ms split in erf32's 32k blocks, 4.6 ms not split, and
# split in blocks of 64k 4.5 ms, 128k 3.3-3.5, 256k 3.1, 512k 3.4.
GELU_BLOCK = 1 << 18


def _gelu32(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Gelu of float32 x into out (which may be x), block by block: x*sqrt(1/2), erf, +1, *x, *0.5."""
    flat, res = x.reshape(-1), out.reshape(-1)  # out is C-contiguous (planned or fresh): a view
    n = flat.size
    block = min(n, GELU_BLOCK)
    e, a, u, s, t = _scratch((5, block), np.dtype(np.float32))
    with np.errstate(all="ignore"):  # inf inputs make nan polynomial values the erf's selection drops
        for i in range(0, n, block):
            m = min(n, i + block) - i
            v, y, ei = flat[i:i + m], res[i:i + m], e[:m]
            np.multiply(v, np.float32(math.sqrt(0.5)), out=ei)
            erf32_block(ei, ei, a[:m], u[:m], s[:m], t[:m])
            ei += np.float32(1.0)
            np.multiply(ei, v, out=y)  # v is read here for the last time: y may be v
            y *= np.float32(0.5)
    return out


# --- Clip --------------------------------------------------------------------


def _clip(x: np.ndarray, lo: Any, hi: Any, out: np.ndarray | None = None) -> np.ndarray:
    """max then min, so lo > hi yields hi everywhere, as ONNX specifies."""
    if is_exotic(x.dtype):
        return into(out, arr(_clip(as_float(x), lo, hi), x.dtype))
    if x.dtype.kind == "f" and x.size >= 1024 and (lo is not None or hi is not None):
        return _clip_blocks(x, lo, hi, out)
    v = x
    with np.errstate(all="ignore"):  # float16 turns the default FLT_MAX bounds into inf
        if lo is not None:
            v = np.maximum(v, np.asarray(lo).astype(x.dtype), out=out)
        if hi is not None:
            reuse = out if v is x else v  # a 0-d max comes back as a numpy scalar: not reusable
            v = np.minimum(v, np.asarray(hi).astype(x.dtype), out=reuse if isinstance(reuse, np.ndarray) else None)
    return into(out, v) if v is x else arr(v)


def _clip_blocks(x: np.ndarray, lo: Any, hi: Any, out: np.ndarray | None) -> np.ndarray:
    """_clip of a float array in blocks, against blocks of each bound (same results, 3x faster)."""
    size = BLOCK  # one size for every input: the cache holds one block per bound
    with np.errstate(all="ignore"):  # float16 turns the default FLT_MAX bounds into inf
        bounds = [(f, _filled(x.dtype, float(np.asarray(b).astype(x.dtype)), size))
                  for f, b in ((np.maximum, lo), (np.minimum, hi)) if b is not None]

    def step(a: np.ndarray, y: np.ndarray) -> None:
        v = a
        for f, block in bounds:
            f(v, block[: a.size], out=y)
            v = y

    return _blocks(x, out, step)


@kernel("Clip", since=11, out=True, inplace=(0,))
def clip(x, lo=None, hi=None, *, out=None):
    """Clip-11: bounds come as optional 0-d inputs."""
    if out is not None and split_flat(lambda v, out: _clip(v, lo, hi, out), (x,), out, SPLIT_CHEAP):
        return out
    return _clip(x, lo, hi, out)


@kernel("Clip", since=6, out=True, inplace=(0,))
def clip_6(x, *, max=F32_MAX, min=-F32_MAX, out=None):  # noqa: A002 - ONNX attribute names
    """Clip-6: bounds are attributes defaulting to the float32 range."""
    if out is not None and split_flat(lambda v, out: _clip(v, min, max, out), (x,), out, SPLIT_CHEAP):
        return out
    return _clip(x, min, max, out)


@kernel("Clip", since=1)
def clip_1(x, *, consumed_inputs=None, max=None, min=None):  # noqa: A002
    """Clip-1: a missing bound does not clip."""
    return _clip(x, min, max)




# --- Softmax family ----------------------------------------------------------


# Each takes an optional ``out`` (which may be v itself): the row maxima are taken
# before anything is written. A row of all -inf gives nan, as in onnxruntime.


def softmax(v: np.ndarray, axis: int, out: np.ndarray | None = None) -> np.ndarray:
    """Softmax of v along one axis, in v's dtype."""
    e = np.subtract(v, np.max(v, axis=axis, keepdims=True), out=out)
    np.exp(e, out=e)
    e /= np.sum(e, axis=axis, keepdims=True)
    return e


def log_softmax(v: np.ndarray, axis: int, out: np.ndarray | None = None) -> np.ndarray:
    """LogSoftmax of v along one axis, in v's dtype."""
    shifted = np.subtract(v, np.max(v, axis=axis, keepdims=True), out=out)
    shifted -= np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))
    return shifted


def hardmax(v: np.ndarray, axis: int, out: np.ndarray | None = None) -> np.ndarray:
    """One-hot of the first maximum along axis."""
    idx = np.expand_dims(np.argmax(v, axis=axis), axis)
    hot = np.zeros(v.shape, dtype=v.dtype)
    np.put_along_axis(hot, idx, 1, axis=axis)
    return into(out, hot)


# Rows along the last axis go in large blocks, split over the intra-op threads
# when large: each numpy call costs ~1 us and a contended GIL far more, so few
# long calls beat cache-sized blocks (Softmax over 4096 rows of 128 floats, one
# thread: 8K-element blocks 600 us, 256K-element ones 307). numpy reduces short
# rows slowly (max over rows of 128 floats: 0.65 ns an element, more than exp's
# 0.37), so row sums are matrix-vector products and Softmax shifts by the row
# maximum only where it must.
ROW_BLOCK = 1 << 18  # elements per block of rows
SPLIT_ROWS = 1 << 17  # elements from which rows are split over the threads


@functools.lru_cache(maxsize=16)
def ones(size: int, dtype: np.dtype) -> np.ndarray:
    """A shared read-only vector of ones: ``rows @ ones(n)`` sums short rows ~6x faster than np.sum."""
    v = np.ones(size, dtype)
    v.flags.writeable = False
    return v


def _scratch(shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """This thread's working rows for Gelu and Softmax (one at a time), valid until its next call here."""
    return scratch("activation", shape, dtype)


def by_rows(step: Callable[[int, int], None], rows: int, cols: int, at: int | None = None) -> None:
    """``step(lo, hi)`` over blocks of rows [lo, hi) of a (rows, cols) array.

    Blocks depend on the shape only (not on the thread count), so each row is
    computed the same way with one thread or two; there are at least two once
    the array has ``at`` elements (default SPLIT_ROWS), and then they are split
    over the intra-op threads.
    """
    at = SPLIT_ROWS if at is None else at
    per = max(1, ROW_BLOCK // max(cols, 1))
    if rows * cols >= at:
        per = min(per, -(-rows // 2))
    count = -(-rows // per)

    def part(lo: int, hi: int) -> None:
        with np.errstate(all="ignore"):  # each thread has its own numpy error state
            for k in range(lo, hi):
                step(k * per, min(rows, (k + 1) * per))

    if count > 1 and rows * cols >= at:
        parallel_for(count, part)
    else:
        part(0, count)


def _softmax_rows(x: np.ndarray, y: np.ndarray) -> None:
    """Softmax of each row of x into y (which may be x).

    Rows of `LONG_ROW` or more are shifted by their maximum. Shorter rows go
    unshifted, exp(x) / sum(exp(x)), when every row sum lands in [1, max]:
    then no exp overflowed, and those that underflowed give results below the
    smallest normal float either way; it even skips the rounding of x - max.
    Otherwise the block is shifted row by row: by the log of that sum where it
    is a normal float (within log(cols) above the row's max, so as safe and as
    accurate as the max), else (overflow, every exp underflowed, inf, nan) by
    the row's max, which numpy finds slowly.
    """
    ones_ = ones(x.shape[1], x.dtype)
    if x.shape[1] >= LONG_ROW:  # long rows: their maxima come fast, and shifting by them always works
        np.subtract(x, np.max(x, axis=1, keepdims=True), out=y)
        np.exp(y, out=y)
        np.divide(y, np.matmul(y, ones_)[:, None], out=y)
        return
    e = _scratch(x.shape, x.dtype) if np.may_share_memory(x, y) else y  # x must survive for the shift
    np.exp(x, out=e)
    s = np.matmul(e, ones_)
    if not (s.min() >= 1 and s.max() <= _FMAX[x.dtype]):  # nan fails both
        shift = np.log(s)
        bad = ~((s >= _TINY_SUM) & (s <= _FMAX[x.dtype]))
        if bad.any():
            shift[bad] = _row_max(x[bad])
        np.subtract(x, shift[:, None], out=e)
        np.exp(e, out=e)
        s = np.matmul(e, ones_)
    np.divide(e, s[:, None], out=y)


# rows at least this long are shifted by their maximum: numpy finds it at ~0.1 ns an element over a 1000-class
# row, and a classifier's logits often overflow exp (the unshifted try then costs a second pass: in shufflenet
# b1 with random weights the 1000-class Softmax took 22 us alone, 8 shifted)
LONG_ROW = 512
_TINY_SUM = 2.0 ** -100  # a row sum from here up is a normal float whatever the subnormal exps in it


# rows up to this long find their maxima column by column: numpy reduces each short row slowly (the max of 768
# rows of 4 floats took 26 us along axis 1, 4 us as three np.maximum of columns; the same bits)
SHORT_ROW = 16


def _row_max(x: np.ndarray) -> np.ndarray:
    """The maximum of each row of a 2-D x (NaN where a row has one, as np.max)."""
    if x.shape[1] > SHORT_ROW:
        return np.max(x, axis=1)
    m = x[:, 0].copy()
    for k in range(1, x.shape[1]):
        np.maximum(m, x[:, k], out=m)
    return m


def _log_softmax_rows(x: np.ndarray, y: np.ndarray) -> None:
    """LogSoftmax of each row of x into y (which may be x): (x - max) - log(sum(exp(x - max))), the sum as a
    matrix-vector product."""
    np.subtract(x, _row_max(x)[:, None], out=y)
    e = np.exp(y, out=_scratch(x.shape, x.dtype))
    s = np.matmul(e, ones(x.shape[1], x.dtype))
    np.log(s, out=s)
    np.subtract(y, s[:, None], out=y)


def _per_axis(fn: Callable[..., np.ndarray], rows: Callable[..., None] | None = None) -> Callable[..., np.ndarray]:
    def run(x: np.ndarray, axis: int, out: np.ndarray | None = None) -> np.ndarray:
        if x.size == 0:
            return into(out, x.copy())
        if (rows is not None and x.ndim and x.dtype in _ROW_TYPES and axis % x.ndim == x.ndim - 1
                and (out is None or out.flags.c_contiguous)):  # the engine's buffers are: then y2 is a view
            y = np.empty(x.shape, x.dtype) if out is None else out
            x2, y2 = x.reshape(-1, x.shape[-1]), y.reshape(-1, x.shape[-1])
            if x.size < SPLIT_ROWS:  # one block, not split: by_rows' ranges would cost more than these rows
                with np.errstate(all="ignore"):
                    rows(x2, y2)
            else:
                by_rows(lambda lo, hi: rows(x2[lo:hi], y2[lo:hi]), *x2.shape)
            return y
        # Half types compute natively (numpy accumulates float16 sums in float32 anyway):
        # that is the per-op T arithmetic the conformance data was produced with.
        with np.errstate(all="ignore"):
            return arr(fn(x, axis, out), x.dtype)

    return run


_FMAX = {np.dtype(t): float(np.finfo(t).max) for t in (np.float32, np.float64)}
_ROW_TYPES = tuple(_FMAX)  # others keep their native whole-array path


def _flattened(fn: Callable[..., np.ndarray], rows: Callable[..., None] | None = None) -> Callable[..., np.ndarray]:
    """The opset<13 rule: coerce x to 2-D [prod(shape[:axis]), prod(shape[axis:])], apply on dim 1."""
    per_axis = _per_axis(fn, rows)

    def run(x: np.ndarray, axis: int, out: np.ndarray | None = None) -> np.ndarray:
        axis = axis % x.ndim if x.ndim else 0
        rows = (math.prod(x.shape[:axis]), math.prod(x.shape[axis:]))  # not (outer, -1): an empty x has no -1
        if out is None:
            return per_axis(x.reshape(rows), 1).reshape(x.shape)
        per_axis(x.reshape(rows), 1, out.reshape(rows))  # planned buffers are contiguous: a view
        return out

    return run


def _softmax_kernels(op_type: str, fn: Callable[..., np.ndarray], rows: Callable[..., None] | None = None) -> list:
    per_axis, flattened = _per_axis(fn, rows), _flattened(fn, rows)

    def v13(x, *, axis=-1, out=None):
        return per_axis(x, axis, out)

    def v1(x, *, axis=1, out=None):
        return flattened(x, axis, out)

    # every result is fresh, or ``out`` (the planned buffer, which may be x's: ``inplace``): never a view, so a
    # node whose candidates all say so is not checked each run (a classifier's Softmax output, ~2 us a run)
    kw: dict[str, Any] = {"out": True, "inplace": (0,), "views": False}
    return [
        declare(op_type, 13, v13, "along one axis (default the last).", **kw),
        declare(op_type, 1, v1, "over the 2-D coercion of x at axis (default 1), as before opset 13.", **kw),
    ]


KERNELS += _softmax_kernels("Softmax", softmax, _softmax_rows)
KERNELS += _softmax_kernels("LogSoftmax", log_softmax, _log_softmax_rows)
KERNELS += _softmax_kernels("Hardmax", hardmax)
