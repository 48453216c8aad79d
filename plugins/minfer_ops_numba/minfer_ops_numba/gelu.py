"""minfer-passes' ``ai.minfer::Gelu`` (float32) in one compiled pass instead of ~17 numpy passes.

The formula is the numpy kernel's (see minfer_passes.gelu): with t = min(|x|, 4 sqrt 2),
``gelu(x) = max(x, 0) - t * e / 2`` where ``e = erfc(t / sqrt 2) = exp(t * P(t))``, P the same degree-5
float32 polynomial, evaluated in the same order. Only exp differs: the fused elementwise kernel's
vectorizable float32 exp (`elementwise.EXP_CONSTANTS`, within 3 ulps of np.exp) instead of numpy's, so
the result stays within 3.2e-7 of the exact GELU, as the numpy kernel's does (the two differ by a few
ulps of t * e / 2, at most ~5e-8). numba calls libm's exp one element at a time, which would leave the
loop scalar: this exp keeps it in vector registers.

The coefficients are the op's definition here, as they are in minfer-passes: a plugin imports only
minfer_core, so they are written out again (a test checks them against minfer-passes' when installed).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minfer_core import intra_op_threads, kernel, parallel_for, scratch

from . import team
from ._jit import PRIORITY, is_float32, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)
from .activation import pow2  # noqa: F401 (compiled code calls it)
from .elementwise import EXP_CONSTANTS
from .team import prange  # noqa: F401 (the driver's, compiled)

# t * P(t) = ln erfc(t / sqrt 2), P's coefficients from the constant term up (minfer-passes' `gelu._P`)
P = np.array([-0.7979143261909485, -0.3180961012840271, -0.03690189868211746, 0.0055295554921031,
              -0.0005128415068611503, 2.0741816115332767e-05], dtype=np.float32)  # fmt: skip
_G0, _G1, _G2, _G3, _G4, _G5 = (np.float32(c) for c in P)
_T_MAX = np.float32(4 * math.sqrt(2))  # erfc(4) = 1.5e-8: beyond, 1 - e/2 rounds to 1 in float32
_HALF, _ONE, _ZERO = np.float32(0.5), np.float32(1), np.float32(0)

_exp_names: dict[str, Any] = {"np": np}
exec(EXP_CONSTANTS, _exp_names)  # the one definition of the exp's constants (elementwise.py)
_L2E, _LN2HI, _LN2LO = _exp_names["_L2E"], _exp_names["_LN2HI"], _exp_names["_LN2LO"]
_EXP_HI, _EXP_LO = _exp_names["_EXP_HI"], _exp_names["_EXP_LO"]
_P0, _P1, _P2, _P3, _P4, _P5 = _exp_names["_EXP_P"]

BLOCK = 1 << 16  # elements per parallel_for range
SPLIT_ELEMENTS = 1 << 18  # from this size (~100 us of work) the blocks go over the intra-op threads
# the same over a native team (team.py: a hand-over of a few us): rows.py's Softmax bound, for a pass as costly (a
# polynomial and an exp an element)
TEAM_SPLIT_ELEMENTS = 1 << 14
LINE = 16  # elements per cache line: a team's shares start on one, so that no line is written by two threads


@jit(inline=True)
def gelu_value(v):  # pragma: no cover - compiled
    """GELU of one float32 element; NaN stays NaN (a loop calling it vectorizes: numba puts its body, and
    `pow2`'s, in the loop's)."""
    t = abs(v)
    t = t if (t <= _T_MAX or t != t) else _T_MAX  # np.minimum: NaN kept
    p = t * _G5
    p = (p + _G4) * t
    p = (p + _G3) * t
    p = (p + _G2) * t
    p = (p + _G1) * t
    p = (p + _G0) * t
    # e = exp(p), p <= 0 (elementwise.py's exp, inlined)
    a = _EXP_HI if p > _EXP_HI else (_EXP_LO if p < _EXP_LO else (p if p == p else _ZERO))
    n = np.floor(a * _L2E + _HALF)
    r = a - n * _LN2HI
    r = r - n * _LN2LO
    e = (((((_P0 * r + _P1) * r + _P2) * r + _P3) * r + _P4) * r + _P5) * (r * r)
    e = e + r + _ONE
    e = e * pow2(np.int32(n))
    e = e if p == p else p
    e = e * t
    e = e * _HALF
    m = v if (v >= _ZERO or v != v) else _ZERO  # np.maximum(x, 0): NaN kept
    return m - e


@jit
def _gelu(x, y, lo, hi):  # pragma: no cover - compiled
    """y = GELU(x) over flat elements lo..hi (y may be x: then unvectorized, see `_span`)."""
    for i in range(lo, hi):
        y[uintp(i)] = gelu_value(x[uintp(i)])


@jit(parallel=True)
def _drive(x, y, tmp, parts):  # pragma: no cover - compiled
    """`_gelu` of flat x into y over ``parts`` contiguous shares on a native team (team.py). In place (``tmp`` has
    rows: one per thread, of BLOCK elements) each share goes through its thread's row of ``tmp``, as `_span`."""
    n = x.size
    for t in prange(parts):
        lo = n * t // parts // LINE * LINE
        hi = n if t == parts - 1 else n * (t + 1) // parts // LINE * LINE
        if tmp.shape[0] == 0:
            _gelu(x, y, lo, hi)
        else:
            buf = tmp[t]
            for at in range(lo, hi, buf.size):
                end = min(hi, at + buf.size)
                _gelu(x[at:end], buf, 0, end - at)
                y[at:end] = buf[:end - at]


def _span(x: np.ndarray, y: np.ndarray, lo: int, hi: int) -> None:
    """GELU of flat elements lo..hi of x into y. In place (x's memory is y's), through this thread's scratch: the
    compiled loop checks its operands for overlap and runs unvectorized when they do (9x slower)."""
    if not np.may_share_memory(x, y):
        _gelu(x, y, lo, hi)
        return
    tmp = scratch("minfer_ops_numba-gelu", (hi - lo,), np.float32)
    _gelu(x[lo:hi], tmp, 0, hi - lo)
    np.copyto(y[lo:hi], tmp)


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 input."""
    return is_float32(ctx)


# inplace: each element is read before it is written
@kernel("Gelu", domain="ai.minfer", since=1, priority=PRIORITY, prepare=True, out=True, inplace=(0,), views=False,
        applies=_applies)
def gelu(ctx):
    """ai.minfer::Gelu-1 (float32): x * Phi(x), the numpy kernel's formula in one compiled pass."""
    _gelu(readonly(np.zeros(1, np.float32)), np.zeros(1, np.float32), 0, 1)  # compile (or load) at build
    if team.available():
        _drive(readonly(np.zeros(1, np.float32)), np.zeros(1, np.float32), np.zeros((0, BLOCK), np.float32), 1)

    def run(x, *, out=None):
        y = out if out is not None else np.empty(x.shape, np.float32)
        flat, dst = readonly(np.ascontiguousarray(x)).reshape(-1), y.reshape(-1)
        n = flat.size
        # the team is asked only where the tensor splits over it: asking claims the run's threads (team.py)
        size = team.size() if n >= TEAM_SPLIT_ELEMENTS else 1
        if size > 1:
            shared = np.may_share_memory(flat, dst)
            tmp = scratch("minfer_ops_numba-gelu-team", (size if shared else 0, BLOCK), np.float32)
            _drive(flat, dst, tmp, size)
            return y
        if n < SPLIT_ELEMENTS or intra_op_threads() < 2:
            _span(flat, dst, 0, n)
            return y

        def span(lo: int, hi: int) -> None:
            _span(flat, dst, lo * BLOCK, min(n, hi * BLOCK))

        parallel_for(-(-n // BLOCK), span)
        return y

    return run
