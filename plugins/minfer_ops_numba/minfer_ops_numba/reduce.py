"""ReduceMean over trailing axes and GlobalAveragePool (float32): each row's mean in one compiled pass.

minfer-ops-basic takes such a mean as x's rows (N * C, H * W) times a vector of 1/(H * W), one BLAS
matrix-vector product: 5.2 us alone for MobileNetV2's 1x1280x7x7 head, but 30-36 us inside a run (measured
with the product timed in the run: OpenBLAS's call, not the step's Python, which a compiled loop over the same
rows does not pay: 38 us in the run for a one-accumulator loop taking 31 alone). Here squeeze.py's `_pool`
sums each row in eight accumulators and divides by the count: within float32 rounding of numpy's sums (the
order of the additions differs; tests/plugins/test_numba_reduce.py).

``applies``: float32 input of known rank; ReduceMean's axes constant (an attribute, or an input known at build),
not empty, and x's last ones (negative ones counted from the end); GlobalAveragePool of rank 3 or more.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import kernel

from ._jit import F32, PRIORITY, delivered, input_type, readonly, target
from .squeeze import _pool  # compiled: each row's mean


def _trailing(rank: int, axes: Any) -> int | None:
    """How many trailing axes ``axes`` are (each once, negative ones from the end), or None when they are not the
    last ones, or none, or outside the rank."""
    if axes is None:
        return None
    found = sorted({int(a) + rank if int(a) < 0 else int(a) for a in np.asarray(axes).reshape(-1)})
    if not found or len(found) != np.asarray(axes).size or found != list(range(rank - len(found), rank)):
        return None
    return len(found) if found[0] >= 0 else None


def _means(rank: int, count: int, keep: bool) -> Any:
    """The run callable: x's rows over its last ``count`` axes averaged (`_pool`), the output shape kept with ones
    or without those axes."""
    probe = readonly(np.ones((1, 9), F32))
    _pool(probe, np.empty(1, F32), 0, 1)  # compiled (or loaded) at build, not in the first run
    shapes: dict[tuple[int, ...], tuple[tuple[int, ...], int, int]] = {}

    def run(x, axes=None, *, out=None):
        plan = shapes.get(x.shape)
        if plan is None:
            lead = x.shape[:rank - count]
            rows, cols = int(np.prod(lead, dtype=np.int64)), int(np.prod(x.shape[rank - count:], dtype=np.int64))
            plan = shapes[x.shape] = (lead + (1,) * count if keep else lead, rows, cols)
        shape, rows, cols = plan
        y = target(out if out is None or out.shape == shape else None, shape, F32)
        if not cols:  # numpy's mean of nothing: NaN (its warning aside)
            y[...] = np.nan
        elif rows:
            _pool(readonly(np.ascontiguousarray(x)).reshape(rows, cols), y.reshape(-1), 0, rows)
        return delivered(y, out)

    return run


def _float32(ctx: Any) -> Any:
    x = input_type(ctx, 0)
    return x if x is not None and x.dtype == F32 and x.rank is not None and x.rank >= 1 else None


def _mean_applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 x of known rank, constant axes that are its last ones (the attribute, or input 1 known at build)."""
    x = _float32(ctx)
    if x is None:
        return False
    axes = attrs.get("axes") if ctx.opset < 18 else (ctx.constants[1] if len(ctx.constants) > 1 else None)
    return _trailing(x.rank, axes) is not None


@kernel("ReduceMean", since=1, priority=PRIORITY, prepare=True, out=True, views=False, applies=_mean_applies)
def reduce_mean_1(ctx, *, axes=None, keepdims=1):
    """ReduceMean-1..13 over x's last axes (float32): each row's mean compiled (the module docstring)."""
    rank = input_type(ctx, 0).rank
    return _means(rank, _trailing(rank, axes), bool(keepdims))


@kernel("ReduceMean", since=18, priority=PRIORITY, prepare=True, out=True, views=False, applies=_mean_applies)
def reduce_mean_18(ctx, *, keepdims=1, noop_with_empty_axes=0):
    """ReduceMean-18 and later over x's last axes, given as a constant input (float32): as `reduce_mean_1`."""
    rank = input_type(ctx, 0).rank
    return _means(rank, _trailing(rank, ctx.constants[1]), bool(keepdims))


def _global_applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 x of rank 3 or more (N, C, spatial...)."""
    x = _float32(ctx)
    return x is not None and x.rank >= 3


@kernel("GlobalAveragePool", since=1, priority=PRIORITY, prepare=True, out=True, views=False, applies=_global_applies)
def global_average_pool(ctx):
    """GlobalAveragePool-1 (float32): each channel's mean compiled, kept as (N, C, 1, ...)."""
    rank = input_type(ctx, 0).rank
    return _means(rank, rank - 2, True)
