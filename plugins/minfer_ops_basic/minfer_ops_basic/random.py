"""Kernels: random generators (RandomNormal, RandomUniform and their -Like forms, Multinomial, Bernoulli).

With a ``seed`` attribute every run draws the same values (a generator is made
from the seed at each call), so a seeded model is reproducible across runs and
sessions; without one each run draws fresh values. numpy's generator is not
onnxruntime's, so values match no other runtime bit for bit: only their
distribution does.
"""

from __future__ import annotations

import numpy as np

import minfer_core
from minfer_core import kernel


def _generator(seed: float | None) -> np.random.Generator:
    """A fresh generator: from the seed's bits when seeded (distinct floats, distinct streams), else from the OS."""
    if seed is None:
        return np.random.default_rng()
    return np.random.default_rng(int(np.float64(seed).view(np.uint64)))


def _as(values: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """float64 draws in the output type; bfloat16 and float16 via float32 (ml_dtypes converts from float32)."""
    if dtype.itemsize < 4:
        values = values.astype(np.float32)
    return np.asarray(values.astype(dtype))


def _type(onnx_type: int | None, like: np.ndarray | None = None) -> np.dtype:
    """The output type: the dtype attribute, else (the -Like ops) the input's own type."""
    return like.dtype if onnx_type is None and like is not None else minfer_core.onnx_dtype(int(onnx_type))


@kernel("RandomNormal", since=1, views=False)
def random_normal(*, shape, dtype=1, mean=0.0, scale=1.0, seed=None):
    """RandomNormal-1/22: draws from N(mean, scale**2) of the given shape."""
    return _as(_generator(seed).normal(mean, scale, size=tuple(shape)), _type(dtype))


@kernel("RandomUniform", since=1, views=False)
def random_uniform(*, shape, dtype=1, high=1.0, low=0.0, seed=None):
    """RandomUniform-1/22: draws from U[low, high) of the given shape."""
    return _as(_generator(seed).uniform(low, high, size=tuple(shape)), _type(dtype))


@kernel("RandomNormalLike", since=1, views=False)
def random_normal_like(input, *, dtype=None, mean=0.0, scale=1.0, seed=None):
    """RandomNormalLike-1/22: RandomNormal with the input's shape (and type unless dtype says)."""
    return _as(_generator(seed).normal(mean, scale, size=input.shape), _type(dtype, input))


@kernel("RandomUniformLike", since=1, views=False)
def random_uniform_like(input, *, dtype=None, high=1.0, low=0.0, seed=None):
    """RandomUniformLike-1/22: RandomUniform with the input's shape (and type unless dtype says)."""
    return _as(_generator(seed).uniform(low, high, size=input.shape), _type(dtype, input))


@kernel("Multinomial", since=7, views=False)
def multinomial(input, *, dtype=6, sample_size=1, seed=None):
    """Multinomial-7/22: sample_size class indices per row of unnormalized log-probabilities."""
    logits = input.astype(np.float64)
    weights = np.exp(logits - logits.max(axis=1, keepdims=True))  # shifted: exp cannot overflow
    cdf = np.cumsum(weights, axis=1)
    cdf /= cdf[:, -1:]
    draws = _generator(seed).random((input.shape[0], sample_size))
    picks = np.empty(draws.shape, dtype=np.int64)
    for row in range(len(cdf)):  # the class of a draw d is how many cumulative weights are <= d
        picks[row] = np.searchsorted(cdf[row], draws[row], side="right")
    picks = np.minimum(picks, input.shape[1] - 1)  # in case cdf[-1] rounds below 1
    return picks.astype(_type(dtype))


@kernel("Bernoulli", since=15, views=False)
def bernoulli(input, *, dtype=None, seed=None):
    """Bernoulli-15/22: 1 with probability input[i], else 0, in dtype (default the input's type)."""
    ones = _generator(seed).random(input.shape) < input.astype(np.float64)
    return np.asarray(ones.astype(_type(dtype, input)))
