"""Add of two float32 tensors of one shape: one compiled pass, shared by a native team on large tensors.

The residual Adds that stay separate steps (a dynamically quantized model's: its projections are
ScaledConvIntegers, whose epilogue has no residual) ran on minfer-ops-basic's np.add: MobileNetV2's 24x56x56 Add
took 61 us in a run, the 10 of them ~150 us. Here: one compiled loop (float32 additions in x86's order, a + b:
numpy's values and NaN payloads), from TEAM_SPLIT elements in even parts over a native team (team.py).

``applies``: two float32 inputs of one known static shape (no broadcasting).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import kernel

from . import team
from ._jit import F32, PRIORITY, delivered, input_type, jit, readonly, target, uintp  # noqa: F401 (uintp: numba's)
from .team import prange  # noqa: F401 (rebound to numba's at compile)

TEAM_SPLIT = 1 << 16  # elements from which a native team shares the pass (~10 us of one thread's work)
LINE = 16  # float32 values in a 64-byte line: the team's parts start on one


@jit
def _add(a, b, y, lo, hi):  # pragma: no cover - compiled
    """y[lo:hi] = a[lo:hi] + b[lo:hi] (flat)."""
    for i in range(lo, hi):
        y[uintp(i)] = a[uintp(i)] + b[uintp(i)]


@jit(parallel=True)
def _add_team(a, b, y, parts):  # pragma: no cover - compiled
    """`_add` over ``parts`` contiguous shares, one a native team thread's, each starting on a whole line."""
    n = y.size
    for t in prange(parts):
        lo = n * t // parts // LINE * LINE
        hi = n if t == parts - 1 else n * (t + 1) // parts // LINE * LINE
        _add(a, b, y, lo, hi)


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """Two float32 inputs of the same known static shape."""
    a, b = input_type(ctx, 0), input_type(ctx, 1)
    if a is None or b is None or a.dtype != F32 or b.dtype != F32 or a.shape is None or b.shape is None:
        return False
    return tuple(a.shape) == tuple(b.shape) and all(isinstance(d, int) for d in a.shape)


def _prepare(ctx: Any) -> Any:
    one = readonly(np.zeros(1, F32))
    _add(one, one, np.zeros(1, F32), 0, 1)  # compiled (or loaded) at build, not in the first run
    if team.available():
        _add_team(one, one, np.zeros(1, F32), 1)

    def run(a, b, *, out=None):
        if a.shape != b.shape:
            raise ValueError(f"Add: the inputs' shapes {list(a.shape)} and {list(b.shape)} differ from the model's")
        y = target(out, a.shape, F32)
        x1, x2 = readonly(np.ascontiguousarray(a)).reshape(-1), readonly(np.ascontiguousarray(b)).reshape(-1)
        flat = y.reshape(-1)
        # the team is asked only where the pass splits over it: asking claims the run's threads (team.py)
        size = team.size() if flat.size >= TEAM_SPLIT else 1
        if size > 1:
            _add_team(x1, x2, flat, size)
        elif flat.size:
            _add(x1, x2, flat, 0, flat.size)
        return delivered(y, out)

    return run


@kernel("Add", since=7, priority=PRIORITY, prepare=True, out=True, views=False, applies=_applies)
def add(ctx):
    """Add-7 and later of two float32 tensors of one shape: one compiled pass (the module docstring)."""
    return _prepare(ctx)
