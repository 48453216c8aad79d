"""Output types of Conv and the pools, computed directly: the fast path of a new input shape's inference.

The engine re-infers every node downstream of an input whose shape changed;
onnx's per-node inference costs ~30-60 us a node, these a few. Each returns
None (onnx's inference decides) outside the plain case: a dim that is not a
known int, ``auto_pad``, ``ceil_mode``, a window larger than the padded input,
inputs that do not fit together. tests/runtime/test_fast_infer.py checks them
against onnx's inference over real models.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from minfer_core import TensorType, onnx_op


def _static(t: Any) -> tuple[int, ...] | None:
    if not isinstance(t, TensorType) or t.shape is None or not all(type(d) is int and d >= 0 for d in t.shape):
        return None
    return t.shape  # type: ignore[return-value]


def _spatial(x: tuple[int, ...], kernel: Sequence[int], strides: Any, dilations: Any, pads: Any) -> list[int] | None:
    """The output's spatial dims (floor mode, explicit pads), or None when onnx's inference must decide."""
    n = len(x) - 2
    strides, dilations, pads = strides or [1] * n, dilations or [1] * n, pads or [0] * (2 * n)
    if n < 1 or not len(kernel) == len(strides) == len(dilations) == n or len(pads) != 2 * n:
        return None
    if min(*strides, *dilations) < 1:
        return None
    out = [(i + b + e - (k - 1) * d - 1) // s + 1
           for i, k, s, d, b, e in zip(x[2:], kernel, strides, dilations, pads[:n], pads[n:])]
    return out if min(out) >= 1 else None


def conv_types(x: Any, w: Any, b: Any = None, *, auto_pad: str = "NOTSET", dilations: Any = None, group: int = 1,
               kernel_shape: Any = None, pads: Any = None, strides: Any = None, **_: Any) -> list[TensorType] | None:
    """Conv: (N, M, *out) for X (N, C, *in) and W (M, C / group, *kernel)."""
    xs, ws = _static(x), _static(w)
    if xs is None or ws is None or auto_pad != "NOTSET" or len(xs) != len(ws) or xs[1] != ws[1] * group:
        return None
    kernel = list(kernel_shape or ws[2:])
    out = _spatial(xs, kernel, strides, dilations, pads) if kernel == list(ws[2:]) else None
    return None if out is None else [TensorType(x.dtype, (xs[0], ws[0], *out))]


def pool_types(x: Any, *, auto_pad: str = "NOTSET", ceil_mode: int = 0, dilations: Any = None, kernel_shape: Any = None,
               pads: Any = None, strides: Any = None, **_: Any) -> list[TensorType] | None:
    """MaxPool and AveragePool: (N, C, *out); MaxPool's optional Indices have that shape too."""
    xs = _static(x)
    if xs is None or auto_pad != "NOTSET" or ceil_mode or not kernel_shape:
        return None
    out = _spatial(xs, kernel_shape, strides, dilations, pads)
    return None if out is None else [TensorType(x.dtype, (*xs[:2], *out)), TensorType(np.int64, (*xs[:2], *out))]


def global_pool_types(x: Any, **_: Any) -> list[TensorType] | None:
    """GlobalAveragePool and GlobalMaxPool: (N, C, 1, ...)."""
    xs = _static(x)
    return None if xs is None or len(xs) < 3 else [TensorType(x.dtype, (*xs[:2], *[1] * (len(xs) - 2)))]


FAST = {"Conv": conv_types, "MaxPool": pool_types, "AveragePool": pool_types,
        "GlobalAveragePool": global_pool_types, "GlobalMaxPool": global_pool_types}


def claim(op_types: Sequence[str]) -> list[Any]:
    """`onnx_op` claims of these standard ops, with the fast ``infer=`` of those in `FAST`."""
    return [d for t in op_types for d in onnx_op(t, infer=FAST.get(t))]
