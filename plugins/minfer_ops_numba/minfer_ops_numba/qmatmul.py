"""ScaledMatMulInteger, MatMulInteger and QLinearMatMul on `igemm`'s exact 8-bit GEMM (AVX-512 VNNI).

minfer-ops-basic multiplies 8-bit operands as float32 (OpenBLAS's sgemm, exact below 2**24), converting the
weight to float32 at every run; here the product runs on ``vpdpbusd``, the weight held once as given (its column
sums computed at build, its panels interleaved into scratch at each run): 2-3.8x the numpy kernels per node on
the transformer block's shapes. The results are those of minfer-ops-basic's kernels bit for bit: the same exact
integers, then the same float operations in the same order, in igemm's write-out (Cast's float32 of the int32,
Mul's float32 product, Add's float32 sum; QLinearMatMul's float64 rescaling, rounding and saturation).
``applies``: a constant 2-D int8/uint8 weight (QLinearMatMul: also a computed 8-bit B of rank >= 2, attention's
products) on a CPU with AVX-512 VNNI (without it igemm's portable kernel is slower than sgemm); the core times
these against the numpy kernels per node.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import kernel, scratch

from . import dynamic_quant, igemm
from ._jit import PRIORITY, input_type, readonly

MINFER = "ai.minfer"
EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))


def _weight(ctx: Any, index: int) -> np.ndarray | None:
    """Input ``index`` when it is a constant 2-D 8-bit array of at least one row and column, else None."""
    consts = tuple(ctx.constants) + (None,) * (index + 1)
    b = consts[index]
    ok = b is not None and b.ndim == 2 and b.dtype in EIGHT_BIT and b.size > 0
    return b if ok else None


def _zero_point(ctx: Any, index: int, n: int) -> tuple[bool, np.ndarray | None]:
    """(usable, value) for B's zero point at ``index``: absent, computed at run, one value or one per column."""
    consts = tuple(ctx.constants) + (None,) * (index + 1)
    zp = consts[index]
    return zp is None or zp.size in (1, n), zp


def _fits(ctx: Any, a_index: int, b_index: int, zp_index: int, a_dtypes: tuple[np.dtype, ...]) -> bool:
    """A known input A of ``a_dtypes``, a constant 8-bit B with a usable zero point, and VNNI."""
    b = _weight(ctx, b_index)
    a = input_type(ctx, a_index)
    if b is None or a is None or a.dtype not in a_dtypes or not _zero_point(ctx, zp_index, b.shape[1])[0]:
        return False
    return igemm.vnni()


def _rows(a: np.ndarray, k: int) -> np.ndarray:
    """A as C-contiguous (rows, K), read-only (one compiled version for all)."""
    return readonly(np.ascontiguousarray(a).reshape(-1, k))


def _row_zero_point(zp: Any, a: np.ndarray) -> Any:
    """A's zero point: one value, or one per row of each matrix (numpy's (M,) against (..., M, K)) flattened."""
    if zp is None:
        return 0
    zp = np.asarray(zp)
    return zp if zp.size == 1 else np.broadcast_to(zp.reshape(-1), a.shape[:-1]).reshape(-1)


def _compiled(out_dtype: Any) -> None:
    """Compile (or load from numba's cache) the kernel for this out dtype now, at build, not in a timed run."""
    igemm.warm(out_dtype)


def _into(y: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """``y`` in the planned buffer when there is one (y was written elsewhere when out was not C-contiguous)."""
    if out is None or out is y:
        return y
    np.copyto(out, y)
    return out


def _target(out: np.ndarray | None, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """The planned buffer when C-contiguous, else a fresh array."""
    return out if out is not None and out.flags.c_contiguous else np.empty(shape, dtype)


def _quantized(x: np.ndarray) -> tuple[np.ndarray, Any, np.float32]:
    """DynamicQuantizeLinear(x) as minfer-ops-basic's kernel computes it: (q, zero point, scale)."""
    flat = readonly(np.ascontiguousarray(x)).reshape(-1)
    if flat.size:
        mn, mx = np.min(flat), np.max(flat)  # NaN propagates into both
        if np.isfinite(mn) and np.isfinite(mx):
            scale, zp = dynamic_quant.scale_and_zero_point(float(mn), float(mx))
            q = scratch("minfer_ops_numba-qmm-q", x.shape, np.uint8)
            dynamic_quant._quantize(flat, q.reshape(-1), scale, np.float32(zp))
            return q, int(zp), np.float32(scale)
    q, scale, zp = dynamic_quant._numpy(x)
    return q, zp, np.float32(scale)


@kernel("ScaledMatMulInteger", domain=MINFER, since=1, priority=PRIORITY, prepare=True, out=True, views=False,
        packed=(1, 3), applies=lambda ctx, attrs: _fits(ctx, 0, 1, 3, (np.dtype(np.float32),) if attrs.get(
            "dynamic_input") else EIGHT_BIT))
def scaled_matmul_integer(ctx, *, dynamic_input=0):
    """ai.minfer::ScaledMatMulInteger-1 of a constant 8-bit weight: the exact product on VNNI, as float32 *
    scale [+ bias], DynamicQuantizeLinear of a float32 a first with ``dynamic_input``."""
    b = _weight(ctx, 1)
    packed, held_zp = igemm.pack_b(b), _zero_point(ctx, 3, b.shape[1])[1]
    k, n = b.shape
    _compiled(np.float32)
    del ctx, b  # packed=(1, 3): the closure must not keep the originals alive

    def run(a, b=None, a_zero_point=None, b_zero_point=None, scale=None, bias=None, *, out=None):
        factor = np.float32(np.asarray(scale).reshape(-1)[0])
        if dynamic_input:
            a, a_zero_point, x_scale = _quantized(a)
            factor = np.multiply(x_scale, factor)  # the Mul of its scale by the weight's, in float32
        zb = held_zp if b_zero_point is None else b_zero_point
        y = _target(out, a.shape[:-1] + (n,), np.float32)
        column = bias is not None and bias.dtype == np.float32 and bias.shape[-1:] == (n,) and bias.size == n <= y.size
        igemm.igemm(_rows(a, k), packed, y.reshape(-1, n), _row_zero_point(a_zero_point, a), 0 if zb is None else zb,
                    factor, bias if column else None)
        if bias is not None and not column:
            np.add(y, bias, out=y)  # Add's float32 sum, broadcast as the graph's
        return _into(y, out)

    return run


@kernel("MatMulInteger", since=10, priority=PRIORITY, prepare=True, out=True, views=False, packed=(1, 3),
        applies=lambda ctx, attrs: _fits(ctx, 0, 1, 3, EIGHT_BIT))
def matmul_integer(ctx):
    """MatMulInteger-10 of a constant 8-bit weight: (A - a_zp) @ (B - b_zp) exact, as int32, on VNNI."""
    b = _weight(ctx, 1)
    packed, held_zp = igemm.pack_b(b), _zero_point(ctx, 3, b.shape[1])[1]
    k, n = b.shape
    _compiled(np.int32)
    del ctx, b  # packed=(1, 3)

    def run(a, b=None, a_zero_point=None, b_zero_point=None, *, out=None):
        zb = held_zp if b_zero_point is None else b_zero_point
        y = _target(out, a.shape[:-1] + (n,), np.int32)
        igemm.igemm(_rows(a, k), packed, y.reshape(-1, n), _row_zero_point(a_zero_point, a), 0 if zb is None else zb)
        return _into(y, out)

    return run


def _qlinear_applies(ctx: Any, attrs: Any) -> bool:
    """8-bit A and B of rank >= 2 (B constant, or computed: packed at each run), and VNNI."""
    a, b = input_type(ctx, 0), input_type(ctx, 3)
    if _weight(ctx, 3) is not None:
        return _fits(ctx, 0, 3, 5, EIGHT_BIT)
    known = a is not None and b is not None and a.rank is not None and b.rank is not None
    return known and a.dtype in EIGHT_BIT and b.dtype in EIGHT_BIT and min(a.rank, b.rank) >= 2 and igemm.vnni()


@kernel("QLinearMatMul", since=10, priority=PRIORITY, prepare=True, out=True, views=False, packed=(3, 5),
        applies=_qlinear_applies)
def qlinear_matmul(ctx):
    """QLinearMatMul-10 on VNNI: the exact product, rescaled in float64, rounded, saturated as it is written out
    (minfer-ops-basic's steps); a constant B packed at build, a computed one per matrix at each run."""
    b = _weight(ctx, 3)
    packed = None if b is None else igemm.pack_b(b)
    held_zp = None if b is None else _zero_point(ctx, 5, b.shape[1])[1]
    out_type = ctx.output_types[0] if ctx.output_types and ctx.output_types[0] is not None else None
    _compiled(np.int32)
    _compiled(out_type.dtype if out_type is not None and out_type.dtype in EIGHT_BIT else np.int8)
    del ctx, b  # packed=(3, 5)

    def run(a, a_scale, a_zero_point, b, b_scale, b_zero_point, y_scale, y_zero_point, *, out=None):
        zb = held_zp if b_zero_point is None else b_zero_point
        target = a.dtype if y_zero_point is None else y_zero_point.dtype
        sa = np.asarray(a_scale, dtype=np.float64)
        factor = sa.reshape(-1, 1) if sa.ndim == 1 else sa
        factor = factor * np.asarray(b_scale, dtype=np.float64) / np.asarray(y_scale, dtype=np.float64)
        matrix = packed if packed is not None else b
        shape = _product_shape(a, matrix)
        n = shape[-1]
        # one factor per column and one y zero point: requantized as written out, else through an int32 product
        direct = (sa.size == 1 and (factor.size == 1 or factor.size == factor.shape[-1] == n)
                  and factor.ndim <= len(shape) and (y_zero_point is None or y_zero_point.size == 1))
        y = _target(out, shape, target) if direct else scratch("minfer_ops_numba-qmm-acc", shape, np.int32)
        how = (factor, y_zero_point) if direct else None
        rows, weight, part, za = _matrices(a, matrix, y, a_zero_point)
        igemm.igemm(rows, weight, part, za, 0 if zb is None else zb, requantize=how)
        return _into(y, out) if direct else _requantized(y, a, a_scale, b_scale, y_scale, y_zero_point, out)

    return run


def _product_shape(a: np.ndarray, b: Any) -> tuple[int, ...]:
    """MatMul's output shape of A by a packed 2-D B, or by a B of rank >= 2 (batch dimensions broadcast)."""
    if isinstance(b, igemm.Packed):
        return a.shape[:-1] + (b.n,)
    return np.broadcast_shapes(a.shape[:-2], b.shape[:-2]) + (a.shape[-2], b.shape[-1])


def _matrices(a: np.ndarray, b: Any, y: np.ndarray, za: Any) -> tuple[Any, Any, np.ndarray, Any]:
    """`igemm`'s (A, packed B, out, A's zero point): all A's rows as one matrix for a packed B, else the (batch, M,
    K) broadcast batch (each B packed now) and a (batch, M, N) view of y."""
    if isinstance(b, igemm.Packed):
        return _rows(a, b.k), b, y.reshape(-1, b.n), _row_zero_point(za, a)
    batch = y.shape[:-2]
    a = np.broadcast_to(a, batch + a.shape[-2:]).reshape((-1,) + a.shape[-2:])
    b = np.broadcast_to(b, batch + b.shape[-2:]).reshape((-1,) + b.shape[-2:])
    return readonly(np.ascontiguousarray(a)), igemm.pack_b(b), y.reshape((-1,) + y.shape[-2:]), 0 if za is None else za


def _requantized(acc: np.ndarray, a: np.ndarray, a_scale: Any, b_scale: Any, y_scale: Any, y_zero_point: Any,
                 out: np.ndarray | None) -> np.ndarray:
    """QLinearMatMul's output from the exact int32 ``acc``: times a_scale * b_scale / y_scale in float64 (a 1-D
    a_scale per row), + y's zero point, rounded half to even, saturated; minfer-ops-basic's operations in order."""
    sa = np.asarray(a_scale, dtype=np.float64)
    sa = sa.reshape(-1, 1) if sa.ndim == 1 else sa
    factor = sa * np.asarray(b_scale, dtype=np.float64) / np.asarray(y_scale, dtype=np.float64)
    shape = np.broadcast_shapes(acc.shape, factor.shape)
    y = np.multiply(acc, factor, out=scratch("minfer_ops_numba-qmm-y", shape, np.float64), dtype=np.float64)
    target = a.dtype if y_zero_point is None else y_zero_point.dtype
    if y_zero_point is not None:
        y += y_zero_point.astype(np.float64)
    info = np.iinfo(target)
    np.rint(y, out=y)
    np.clip(y, info.min, info.max, out=y)
    if out is None or out.shape != y.shape:
        return y.astype(target)
    np.copyto(out, y, casting="unsafe")  # integers in range: exact
    return out
