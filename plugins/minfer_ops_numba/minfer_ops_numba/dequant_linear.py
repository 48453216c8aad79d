"""ai.minfer::DequantGemm and DequantMatMul of one row (a classifier at batch 1), over the 8-bit weight as it lies.

minfer-passes' kernel for these nodes dequantizes the whole weight into float32 scratch on every run, then runs
the float GEMM on it: for one row, 4 bytes a weight written and read again (a QDQ MobileNetV2's 1280x1000
classifier: 271 us in the planned run against 190 for its float twin's GEMM). Here the weight is read once, 1 byte
a value: each weight as DequantizeLinear rounds it, ``(float32(w) - zp) * scale``, times A's value, added into the
output row by one fused multiply-add, k after k, the columns shared over the intra-op threads.

The products are DequantizeLinear's float32 weights times A's values, as in the numpy kernel; their sum goes in
the order of K, where BLAS picks its own order (and fused multiply-adds too): the values are the float GEMM's
within its rounding. Then C (Gemm's bias) is added and the node's rounding (``activation`` QuantizeDequantize:
divide, rint, clip, multiply) applied with its float32 operations. ``applies``: one row, a constant 2-D weight with
a per-tensor or per-column scale and zero point, Gemm's alpha and beta 1 with a constant bias along the columns
(or none), and no epilogue beyond that rounding. Past one row the weight's dequantization a run pays for itself
(an earlier loop of this kind over eight rows: 819 us against minfer-passes' 230); the core times this kernel
against minfer-passes' per node.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from minfer_core import kernel, parallel_for, scratch, spmd

from ._jit import PRIORITY, input_type, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)
from .qconv import EIGHT_BIT, MINFER, _constant, _given
# columns a thread's range is cut in (whole cache lines of the output rows)
COLUMNS = 64
NO_BIAS = readonly(np.zeros(0, np.float32))
NO_GRID = readonly(np.zeros(0, np.float32))


def fma(a, b, c):  # pragma: no cover - replaced
    """a * b + c rounded once (LLVM's fma): a stand-in, made numba's intrinsic when a kernel is first prepared
    (`_install`). numba's ``fastmath=False`` never contracts a multiply and an add into one."""
    raise RuntimeError("dequant_linear.fma runs compiled only")


def _install() -> None:
    """Make `fma` numba's intrinsic, importing numba now (never at import: _jit.py's docstring)."""
    if getattr(fma, "_is_intrinsic", False):
        return
    from numba.extending import intrinsic

    def typer(typingctx, a, b, c):
        def codegen(context, builder, sig, args):
            return builder.fma(*args)

        return a(a, b, c), codegen

    made = intrinsic(typer)
    made._is_intrinsic = True
    globals()["fma"] = made


@jit
def _row(x, w, zero, scale, centered, row, n0, n1):  # pragma: no cover - compiled
    """row[:n1 - n0] = x @ DequantizeLinear(w)[:, n0:n1] for one row x (K,) float32 and w (K, N) 8-bit, zero and
    scale one a column: each weight as DequantizeLinear rounds it, ``(float32(w) - zp) * scale`` (no
    subtraction unless ``centered``, some zero point not 0: w - 0 is w), times x[k], added by one fused multiply-add
    (as BLAS's kernels add), k after k; four k at once, the sum held in a register between them."""
    for j in range(n1 - n0):
        row[uintp(j)] = np.float32(0)
    kk = x.shape[0]
    for k in range(0, kk - kk % 4, 4):
        x0, x1, x2, x3 = x[uintp(k)], x[uintp(k + 1)], x[uintp(k + 2)], x[uintp(k + 3)]
        if centered:
            for j in range(n0, n1):
                sj = scale[uintp(j)]
                zj = zero[uintp(j)]
                v = fma(x0, (np.float32(w[uintp(k), uintp(j)]) - zj) * sj, row[uintp(j - n0)])
                v = fma(x1, (np.float32(w[uintp(k + 1), uintp(j)]) - zj) * sj, v)
                v = fma(x2, (np.float32(w[uintp(k + 2), uintp(j)]) - zj) * sj, v)
                row[uintp(j - n0)] = fma(x3, (np.float32(w[uintp(k + 3), uintp(j)]) - zj) * sj, v)
        else:
            for j in range(n0, n1):
                sj = scale[uintp(j)]
                v = fma(x0, np.float32(w[uintp(k), uintp(j)]) * sj, row[uintp(j - n0)])
                v = fma(x1, np.float32(w[uintp(k + 1), uintp(j)]) * sj, v)
                v = fma(x2, np.float32(w[uintp(k + 2), uintp(j)]) * sj, v)
                row[uintp(j - n0)] = fma(x3, np.float32(w[uintp(k + 3), uintp(j)]) * sj, v)
    for k in range(kk - kk % 4, kk):
        xv = x[uintp(k)]
        for j in range(n0, n1):
            sj = scale[uintp(j)]
            zj = zero[uintp(j)]
            row[uintp(j - n0)] = fma(xv, (np.float32(w[uintp(k), uintp(j)]) - zj) * sj, row[uintp(j - n0)])


@jit
def _finish(row, bias, grid, y, n0, n1):  # pragma: no cover - compiled
    """y[n0:n1] = row[:n1 - n0] + bias (one value or one a column; none when empty), then, when ``grid`` (scale, low,
    high) is given, QuantizeDequantize's rounding: clip(rint(v / scale), low, high) * scale, in float32."""
    per_column = bias.size > 1
    rounding = grid.size > 0
    scale = grid[0] if rounding else np.float32(1)
    low = grid[1] if rounding else np.float32(0)
    high = grid[2] if rounding else np.float32(0)
    for j in range(n0, n1):
        v = row[uintp(j - n0)]
        if bias.size:
            v += bias[uintp(j)] if per_column else bias[0]
        if rounding:
            v = np.rint(v / scale)
            v = low if v < low else (high if v > high else v)
            v = v * scale
        y[uintp(j)] = v


def _layout(ctx: Any, gemm: bool, attrs: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(W as (K, N), its zero point and scale as float32, one a column), when the weight fits."""
    w, ws, wz = _constant(ctx, 1), _constant(ctx, 2), _constant(ctx, 3)
    if w is None or w.ndim != 2 or w.dtype not in EIGHT_BIT or w.size == 0 or ws is None or ws.dtype != np.float32:
        return None
    if wz is None and _given(ctx, 3) or wz is not None and (wz.dtype != w.dtype or wz.size not in (1, ws.size)):
        return None
    trans = gemm and bool(attrs.get("transB", 0))
    kn = w.T if trans else w
    if ws.size > 1:  # one a column: the axis of W's N (dim 0 when transposed)
        if ws.ndim != 1 or ws.size != kn.shape[1] or int(attrs.get("axis", 1)) % 2 != (0 if trans else 1):
            return None
    n = kn.shape[1]  # one zero point and scale a column (8 bytes a column), so that no loop asks which
    zero = np.broadcast_to(np.zeros(1, np.float32) if wz is None else np.asarray(wz, np.float32).reshape(-1), (n,))
    scale = np.broadcast_to(np.asarray(ws, np.float32).reshape(-1), (n,))
    return readonly(np.ascontiguousarray(kn)), readonly(zero.copy()), readonly(scale.copy())


def _bias(ctx: Any, n: int) -> np.ndarray | None:
    """Gemm's C as float32 (one value or one a column), or NO_BIAS; None when it does not broadcast so."""
    if not _given(ctx, 4):
        return NO_BIAS
    c = _constant(ctx, 4)
    if c is None or c.dtype != np.float32 or c.ndim > 2 or c.size not in (1, n) or c.size == n and c.shape[-1] != n:
        return None
    return readonly(np.ascontiguousarray(c).reshape(-1))


def _grid(attrs: dict) -> np.ndarray | None:
    """The rounding's (scale, low, high), NO_GRID for none, None for another epilogue."""
    act = attrs.get("activation") or ""
    if attrs.get("post_activation") or attrs.get("residual_params") is not None or act not in ("", "QuantizeDequantize"):
        return None
    if not act:
        return NO_GRID
    params = list(attrs.get("activation_params") or [])
    return readonly(np.asarray(params, np.float32)) if len(params) == 3 and params[0] > 0 else None


def _fits(ctx: Any, attrs: dict, gemm: bool) -> bool:
    x = input_type(ctx, 0)
    if x is None or x.dtype != np.float32 or x.shape is None or len(x.shape) < 2 or len(x.shape) > 2 and gemm:
        return False
    if not all(isinstance(d, int) for d in x.shape) or math.prod(x.shape[:-1]) != 1:
        return False
    if gemm and (attrs.get("transA", 0) or float(attrs.get("alpha", 1.0)) != 1.0 or float(attrs.get("beta", 1.0)) != 1.0):
        return False
    if any(_given(ctx, i) for i in (5, 6, 7)) or (not gemm and _given(ctx, 4)):
        return False
    out = ctx.output_types[0] if ctx.output_types else None
    if out is None or out.dtype != np.float32 or _grid(attrs) is None:
        return False
    layout = _layout(ctx, gemm, attrs)
    return layout is not None and layout[0].shape[0] == x.shape[-1] and _bias(ctx, layout[0].shape[1]) is not None


def _prepared(ctx: Any, attrs: dict, gemm: bool) -> Any:
    w, zero, scale = _layout(ctx, gemm, attrs)
    bias, grid = _bias(ctx, w.shape[1]), _grid(attrs)
    k, n = w.shape
    chunks, centered = -(-n // COLUMNS), bool(np.any(zero))
    _install()  # before _row compiles: it looks `fma` up here
    # compiled (or loaded from numba's cache) now, at build, with a run's argument types
    row = np.zeros(1, np.float32)
    _row(readonly(np.zeros(1, np.float32)), readonly(np.zeros((1, 1), w.dtype)), zero[:1], scale[:1], centered, row, 0,
         1)
    _finish(row, bias, grid, np.zeros(1, np.float32), 0, 1)

    def run(x, wq=None, w_scale=None, w_zero_point=None, c=None, m=None, a=None, z=None, *, out=None):
        if x.size != k:
            raise ValueError(f"{'Gemm' if gemm else 'MatMul'}: A is {x.shape}, the weight has {k} rows: this kernel "
                             f"takes one row of {k}")
        shape = x.shape[:-1] + (n,)
        y = out if out is not None and out.flags.c_contiguous and out.shape == shape else np.empty(shape, np.float32)
        a_row, flat = readonly(np.ascontiguousarray(x, np.float32)).reshape(k), y.reshape(n)

        def part(lo: int, hi: int) -> None:
            n0, n1 = lo * COLUMNS, min(n, hi * COLUMNS)
            acc = scratch("minfer_ops_numba-dequant-linear", (n1 - n0,), np.float32)
            _row(a_row, w, zero, scale, centered, acc, n0, n1)
            _finish(acc, bias, grid, flat, n0, n1)

        parallel_for(chunks, part, outputs_only=True)
        if out is not None and y is not out:
            np.copyto(out, y)
            return out
        return y

    return spmd(run)


@kernel("DequantGemm", domain=MINFER, since=1, priority=PRIORITY, prepare=True, out=True, views=False,
        packed=(1, 2, 3, 4), applies=lambda ctx, attrs: _fits(ctx, attrs, True))
def dequant_gemm(ctx, *, alpha=1.0, beta=1.0, transA=0, transB=0, axis=1, activation="", activation_params=None,
                 post_activation="", post_activation_params=None, residual_params=None):
    """ai.minfer::DequantGemm-1 of one row: the 8-bit weight read as it lies (the module docstring)."""
    return _prepared(ctx, dict(transB=transB, axis=axis, activation=activation, activation_params=activation_params),
                     True)


@kernel("DequantMatMul", domain=MINFER, since=1, priority=PRIORITY, prepare=True, out=True, views=False,
        packed=(1, 2, 3), applies=lambda ctx, attrs: _fits(ctx, attrs, False))
def dequant_matmul(ctx, *, axis=1, activation="", activation_params=None, post_activation="",
                   post_activation_params=None, residual_params=None):
    """ai.minfer::DequantMatMul-1 of one row: the 8-bit weight read as it lies (the module docstring)."""
    return _prepared(ctx, dict(axis=axis, activation=activation, activation_params=activation_params), False)
