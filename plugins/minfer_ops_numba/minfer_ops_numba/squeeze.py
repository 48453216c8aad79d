"""ai.minfer::SqueezeExcite (float32): a squeeze-and-excitation block in one compiled call.

minfer-passes' ``squeeze_excite_fusion`` makes the node of MobileNetV3's and
PP-LCNet's SE blocks: Y = X * act2(W2 @ act1(W1 @ mean(X) + B1) + B2), the
mean over each channel's H x W. Unfused, a block was four steps (a pooling,
two 1x1 convs on the pooled map, a Mul) of a few microseconds of work each,
most of their time the steps' own calls; minfer-passes' numpy kernel makes it
one step of a dozen numpy calls; here it is one compiled call (`_excite`;
`_excite_team` from TEAM_SPLIT elements, the pooling's and the product's
rows over a native team):

- each channel's sum in eight accumulators (a chain of dependent adds, as a
  plain loop, waits on the add's latency: numba does not reorder float sums),
  then divided by H x W;
- the two products as ``cblas_sgemm`` calls from compiled code (`team.gemm`)
  on the weights transposed at build (held instead of them: ``packed``);
- the activations by activation.py's formulas (team.py's `activation_form`
  codes: Relu, Clip, LeakyRelu, HardSigmoid, HardSwish, Swish; others leave
  the node to the numpy kernel);
- the gate's product over X, in place when the engine gives X's memory.

The sums' order differs from the numpy kernel's (numpy's pairwise row sums,
its matmul's products): within float32 rounding of it
(tests/plugins/test_numba_squeeze.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import kernel

from . import team
from .team import NONE, prange  # noqa: F401 (prange: the team driver's, compiled)
from ._jit import F32, PRIORITY, input_type, jit, readonly, uintp  # noqa: F401 (uintp: compiled code's)
from .activation import SWISH, _swish, _value  # noqa: F401 (compiled code calls them)

OP = "SqueezeExcite"
DOMAIN = "ai.minfer"
# from this many elements of X the pooling and the product split over a native team (team.py), as activation.py's
# passes do: MobileNetV3-small's 8x16x56x56 block (400k) 94 us on one thread
TEAM_SPLIT = 1 << 17
SMALL_CALL, COLUMN_BLOCK = 1 << 19, 16  # linear.py's: OpenBLAS's small-matrix kernel up to ~5e5 multiply-adds


@jit
def _act(v, op, a, b):  # pragma: no cover - compiled
    """activation.py's ``op`` on one value (`NONE`: v; Swish's own function: `_value` leaves it out)."""
    if op == NONE:
        return v
    return _swish(v, a) if op == SWISH else _value(v, op, a, b)


@jit
def _pool(x, mean, r0, r1):  # pragma: no cover - compiled
    """mean[r] = the mean of row r of x (N * C, HW) for rows r0..r1: eight accumulators (numba keeps a float sum's
    order as written: one accumulator waits on each add's latency)."""
    hw = x.shape[1]
    count = np.float32(hw)
    for r in range(r0, r1):
        row = x[uintp(r)]
        s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0)
        k = 0
        while k + 8 <= hw:
            s0 += row[uintp(k)]
            s1 += row[uintp(k + 1)]
            s2 += row[uintp(k + 2)]
            s3 += row[uintp(k + 3)]
            s4 += row[uintp(k + 4)]
            s5 += row[uintp(k + 5)]
            s6 += row[uintp(k + 6)]
            s7 += row[uintp(k + 7)]
            k += 8
        while k < hw:
            s0 += row[uintp(k)]
            k += 1
        mean[uintp(r)] = (((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))) / count


@jit
def _products(address, a, w, y):  # pragma: no cover - compiled
    """y (N, J) = a (N, K) @ w for w (K, J), in calls of at most about SMALL_CALL multiply-adds: OpenBLAS packs B
    first above that, and for a few rows the packing is most of the time (linear.py's measurements)."""
    n, k = a.shape
    j = w.shape[1]
    step = max(COLUMN_BLOCK, SMALL_CALL // max(n * k, 1) // COLUMN_BLOCK * COLUMN_BLOCK)
    a0, w0, y0 = np.int64(a.ctypes.data), np.int64(w.ctypes.data), np.int64(y.ctypes.data)
    for j0 in range(0, j, step):
        gemm(address, n, min(step, j - j0), k, a0, k, w0 + 4 * j0, j, y0 + 4 * j0, j, np.float32(0))


@jit
def _gates(address, mean, w1, b1, w2, b2, gate, op1, a1, c1, op2, a2, c2):  # pragma: no cover - compiled
    """gate (N, C) = act2(act1(mean @ w1 + b1) @ w2 + b2) for mean (N, C), w1 (C, M) and w2 (M, C) (the convs'
    weights transposed at build: as given, cblas' transposed B, OpenBLAS took twice as long for 8 rows of 960 x
    240), b1 and b2 of M and C values or none: ``cblas_sgemm`` calls (`team.gemm`: numpy's BLAS, as the unfused 1x1
    convs' products), the biases and activations after each."""
    n, c = mean.shape
    m = w1.shape[1]
    hidden, sums = np.empty((n, m), np.float32), np.empty((n, c), np.float32)
    _products(address, mean, w1, hidden)
    for i in range(n):
        for j in range(m):
            v = hidden[i, uintp(j)] + b1[uintp(j)] if b1.size else hidden[i, uintp(j)]
            hidden[i, uintp(j)] = _act(v, op1, a1, c1)
    _products(address, hidden, w2, sums)
    for i in range(n):
        for ch in range(c):
            v = sums[i, uintp(ch)] + b2[uintp(ch)] if b2.size else sums[i, uintp(ch)]
            gate[i, uintp(ch)] = _act(v, op2, a2, c2)


@jit
def _scale(x, y, gate, r0, r1):  # pragma: no cover - compiled
    """y[r] = x[r] * gate[r] for rows r0..r1 of x, y (N * C, HW); in place when they are one array."""
    hw = x.shape[1]
    if x.ctypes.data == y.ctypes.data:  # one array: an unbroken vector loop (on two, LLVM tests their overlap)
        for r in range(r0, r1):
            g = gate[uintp(r)]
            out = y[uintp(r)]
            for k in range(hw):
                out[uintp(k)] *= g
    else:
        for r in range(r0, r1):
            g = gate[uintp(r)]
            row, out = x[uintp(r)], y[uintp(r)]
            for k in range(hw):
                out[uintp(k)] = row[uintp(k)] * g


@jit
def _excite(address, x, w1, b1, w2, b2, y, n, op1, a1, c1, op2, a2, c2):  # pragma: no cover - compiled
    """y = x * act2(w2 @ act1(w1 @ mean(x) + b1) + b2) for n images, x and y (N * C, HW) (y may be x)."""
    rows = x.shape[0]
    mean, gate = np.empty(rows, np.float32), np.empty(rows, np.float32)
    _pool(x, mean, 0, rows)
    _gates(address, mean.reshape(n, rows // n), w1, b1, w2, b2, gate.reshape(n, rows // n), op1, a1, c1, op2, a2, c2)
    _scale(x, y, gate, 0, rows)


@jit(parallel=True)
def _excite_team(address, x, w1, b1, w2, b2, y, n, op1, a1, c1, op2, a2, c2, parts):  # pragma: no cover - compiled
    """`_excite` with the pooling's and the product's rows in ``parts`` contiguous shares over a native team
    (team.py); the gates (a few products of a few hundred values) on one thread between them."""
    rows = x.shape[0]
    mean, gate = np.empty(rows, np.float32), np.empty(rows, np.float32)
    for t in prange(parts):
        _pool(x, mean, rows * t // parts, rows * (t + 1) // parts)
    _gates(address, mean.reshape(n, rows // n), w1, b1, w2, b2, gate.reshape(n, rows // n), op1, a1, c1, op2, a2, c2)
    for t in prange(parts):
        _scale(x, y, gate, rows * t // parts, rows * (t + 1) // parts)


def _form(activation: str, params: Any) -> tuple[int, np.float32, np.float32] | None:
    return team.activation_form(activation or "", tuple(float(p) for p in params or ()))


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 X of rank 4 with known channels, constant float32 weights and biases (or none), activations with a
    compiled form (none, Relu, Clip, LeakyRelu alpha > 0, HardSigmoid, HardSwish, Swish), and numpy's BLAS reachable
    from compiled code."""
    x = input_type(ctx, 0)
    if x is None or x.dtype != F32 or x.shape is None or len(x.shape) != 4 or not isinstance(x.shape[1], int):
        return False
    consts = tuple(ctx.constants) + (None,) * 5
    for i in (1, 3):
        if consts[i] is None or consts[i].dtype != F32 or consts[i].ndim != 4:
            return False
    for i in (2, 4):
        if input_type(ctx, i) is not None and (consts[i] is None or consts[i].dtype != F32):
            return False
    return (_form(attrs.get("inner_activation"), attrs.get("inner_activation_params")) is not None
            and _form(attrs.get("activation"), attrs.get("activation_params")) is not None and bool(team.gemm_address()))


# inplace: each element of X is read (its channel's sum, then its product) before its element of Y is written
@kernel(OP, domain=DOMAIN, since=1, priority=PRIORITY, prepare=True, out=True, inplace=(0,), views=False,
        packed=(1, 3), applies=_applies)
def squeeze_excite(ctx, *, inner_activation="", inner_activation_params=None, activation="", activation_params=None):
    """ai.minfer::SqueezeExcite-1 (float32): the block in one compiled call (the module docstring)."""
    consts = tuple(ctx.constants) + (None,) * 5
    w1, w2 = consts[1], consts[3]
    address = team.gemm_address()
    globals()["gemm"] = team.install()  # before the functions compile: compiled code looks the name up here
    w1m = readonly(np.ascontiguousarray(w1.reshape(w1.shape[0], -1).T))  # (C, M) and (M, C): held instead (packed)
    w2m = readonly(np.ascontiguousarray(w2.reshape(w2.shape[0], -1).T))
    none = readonly(np.zeros(0, F32))
    b1 = none if consts[2] is None else readonly(np.ascontiguousarray(consts[2].reshape(-1)))
    b2 = none if consts[4] is None else readonly(np.ascontiguousarray(consts[4].reshape(-1)))
    first = _form(inner_activation, inner_activation_params)
    second = _form(activation, activation_params)
    c = w2.shape[0]
    probe = readonly(np.zeros((c, 1), F32))
    _excite(address, probe, w1m, b1, w2m, b2, np.zeros((c, 1), F32), 1, *first, *second)  # compile now, not in a run

    def run(x, w1_in=None, b1_in=None, w2_in=None, b2_in=None, *, out=None):
        if (w1_in is not None and w1_in is not w1) or (w2_in is not None and w2_in is not w2) or x.shape[1] != c:
            raise ValueError(f"SqueezeExcite: X {list(x.shape)} with other weights than the node's constants")
        same = out is x and x.flags.c_contiguous  # in place, as the engine may call it (`inplace`)
        y = out if out is not None and out.flags.c_contiguous else np.empty(x.shape, F32)
        n = x.shape[0]
        if y.size == 0:
            return y
        if not x.flags.c_contiguous:
            x = np.ascontiguousarray(x)
        x2, y2 = x.reshape(n * c, -1), y.reshape(n * c, -1)
        src = x2 if same else readonly(x2)
        # the team is asked only where the block splits over it: asking claims the run's threads (team.py)
        size = team.size() if x.size >= TEAM_SPLIT else 1
        if size > 1:
            _excite_team(address, src, w1m, b1, w2m, b2, y2, n, *first, *second, min(size, n * c))
        else:
            _excite(address, src, w1m, b1, w2m, b2, y2, n, *first, *second)
        if out is not None and y is not out:
            np.copyto(out, y)
            return out
        return y

    return run
