"""Kernels: comparisons, boolean logic, bitwise ops, IsNaN/IsInf."""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from minfer_core import kernel

from .elementwise import arr, as_float, binary_kernels


def _compare(fn: Callable[..., Any]) -> Callable[..., np.ndarray]:
    def run(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        return fn(as_float(a), as_float(b), out=out)

    return run


KERNELS: list = []  # records made by factories below; kernels_in finds the decorated ones by themselves
for _op, _fn in (("Equal", np.equal), ("Greater", np.greater), ("Less", np.less)):
    # a bool output never fits in a numeric input's buffer: no inplace
    KERNELS += binary_kernels(_op, _compare(_fn), consumed=False, inplace=False)
for _op, _fn in (("And", np.logical_and), ("Or", np.logical_or), ("Xor", np.logical_xor)):
    KERNELS += binary_kernels(_op, _compare(_fn), consumed=False)
KERNELS += binary_kernels("GreaterOrEqual", _compare(np.greater_equal), legacy=False, since=12, inplace=False)
KERNELS += binary_kernels("LessOrEqual", _compare(np.less_equal), legacy=False, since=12, inplace=False)
KERNELS += binary_kernels("BitwiseAnd", np.bitwise_and, legacy=False, since=18)
KERNELS += binary_kernels("BitwiseOr", np.bitwise_or, legacy=False, since=18)
KERNELS += binary_kernels("BitwiseXor", np.bitwise_xor, legacy=False, since=18)


@kernel("Not", since=1)
def not_(x):
    """Not-1: elementwise logical negation."""
    return arr(np.logical_not(x))


@kernel("BitwiseNot", since=18)
def bitwise_not(x):
    """BitwiseNot-18: flips every bit."""
    return arr(np.invert(x))


@kernel("BitShift", since=11)
def bit_shift(x, y, *, direction):
    """BitShift-11: shift X by Y bits; out-of-range shifts give only the sign fill (0 or -1)."""
    x, y = np.broadcast_arrays(x, y)
    bits = x.dtype.itemsize * 8
    # numpy (like C) leaves shifts >= the width undefined, so mask them out and fill explicitly
    too_far = (y >= bits) | (y < 0) if y.dtype.kind == "i" else y >= bits
    shift = np.where(too_far, 0, y).astype(x.dtype)
    if direction == "LEFT":
        out, fill = np.left_shift(x, shift), np.zeros((), x.dtype)
    else:
        out = np.right_shift(x, shift)
        fill = np.where(x < 0, -1, 0).astype(x.dtype) if x.dtype.kind == "i" else np.zeros((), x.dtype)
    return arr(np.where(too_far, fill, out), x.dtype)


@kernel("IsNaN", since=9)
def is_nan(x):
    """IsNaN-9: true where x is NaN."""
    return arr(np.isnan(as_float(x)))


@kernel("IsInf", since=10)
def is_inf(x, *, detect_negative=1, detect_positive=1):
    """IsInf-10: true at +inf and/or -inf, as the detect_* flags select."""
    v = as_float(x)
    out = np.zeros(v.shape, dtype=np.bool_)
    if detect_positive:
        out |= np.isposinf(v)
    if detect_negative:
        out |= np.isneginf(v)
    return out


