"""ScaledMatMulInteger, MatMulInteger, QLinearMatMul and com.microsoft's QGemm on `igemm`'s exact 8-bit GEMM
(AVX-512 VNNI).

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
from ._jit import PRIORITY, delivered, input_type, jit, readonly, target, uintp  # noqa: F401 (see _jit.uintp)
from .dynamic_quant import _grid_of, _quantize as _quantize_dynamic, range_part  # noqa: F401 (compiled code calls them)

MINFER = "ai.minfer"
EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
ONE = np.float32(1)


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


def _quantized(x: np.ndarray) -> tuple[np.ndarray, Any, np.float32]:
    """DynamicQuantizeLinear(x) as minfer-ops-basic's kernel computes it: (q, zero point, scale)."""
    flat = readonly(np.ascontiguousarray(x)).reshape(-1)
    if flat.size:  # the range and scale_and_zero_point's grid of it in one compiled call (None: NaN or infinite)
        grid = dynamic_quant.dynamic_grid(flat, ONE)
        if grid is not None:
            scale, zp = grid[0][0], -grid[0][1]  # (scale, -zp, 255 - zp, 0)
            q = scratch("minfer_ops_numba-qmm-q", x.shape, np.uint8)
            dynamic_quant._quantize(flat, q.reshape(-1), scale, zp)
            return q, int(zp), scale
    q, scale, zp = dynamic_quant._numpy(x)
    return q, zp, np.float32(scale)


@jit
def _scaled_columns(q, b, za, zb, row, y, factor, bias, j0, j1):  # pragma: no cover - compiled
    """y[:, j0:j1] = float32 of the exact (q - za) @ (b - zb) (`_row_sums`), times ``factor`` (one float32), + bias
    (one a column, when it has elements): igemm's write-out of a ScaledMatMulInteger in its float32 operations (Cast,
    Mul, Add)."""
    has_bias = bias.size > 0
    for i in range(q.shape[0]):
        _row_sums(q, i, b, za, zb, row, j0, j1)
        for j in range(j0, j1):
            v = np.float32(row[uintp(j)]) * factor
            if has_bias:
                v = v + bias[uintp(j)]
            y[uintp(i), uintp(j)] = v


@jit
def _dynamic_rows(flat, parts, weight_scale, quant, m, q):  # pragma: no cover - compiled
    """x's range (flat: q's rows of K values), its grid (dynamic_quant.py's `_grid_of`: quant, and m = x's scale *
    ``weight_scale``), then q = x quantized on it as DynamicQuantizeLinear (`_quantize`): whether the range is
    finite (q not written otherwise)."""
    range_part(flat, parts, 0)
    if not _grid_of(parts, weight_scale, quant, m):
        return False
    _quantize_dynamic(flat, q.reshape(-1), quant[0], -quant[1])
    return True


@jit
def _dynamic_few(flat, parts, weight_scale, quant, m, q, b, zb, row, y, bias):  # pragma: no cover - compiled
    """A dynamic ScaledMatMulInteger of few rows in one call: `_dynamic_rows`, then `_scaled_columns` with factor m.
    Whether x's range is finite (nothing written otherwise)."""
    if not _dynamic_rows(flat, parts, weight_scale, quant, m, q):
        return False
    _scaled_columns(q, b, np.int64(-quant[1]), zb, row, y, m[0], bias, 0, b.shape[1])
    return True


EMPTY = readonly(np.zeros(0, np.float32))


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
    few = None
    if dynamic_input:  # the range, its grid and the quantizing: compiled (or loaded) at build, not in a timed run
        dynamic_quant.warm_range()
        dynamic_quant._quantize(readonly(np.zeros(1, np.float32)), np.zeros(1, np.uint8), ONE, np.float32(0))
        if k * 255 * 255 < INT32:  # `_row_sums`' int32 row holds every partial sum
            few = FewRows(b, held_zp)
    del ctx, b  # packed=(1, 3): the closure must not keep the originals alive

    def run(a, b=None, a_zero_point=None, b_zero_point=None, scale=None, bias=None, *, out=None):
        factor = np.float32(np.asarray(scale).reshape(-1)[0])
        if few is not None and b_zero_point is None and a.shape[-1:] == (k,) and 0 < a.size < FEW_ROWS * k:
            y = few(a, factor, bias, out)
            if y is not None:
                return y
        if dynamic_input:
            a, a_zero_point, x_scale = _quantized(a)
            factor = np.multiply(x_scale, factor)  # the Mul of its scale by the weight's, in float32
        zb = held_zp if b_zero_point is None else b_zero_point
        y = target(out, a.shape[:-1] + (n,), np.float32)
        column = bias is not None and bias.dtype == np.float32 and bias.shape[-1:] == (n,) and bias.size == n <= y.size
        igemm.igemm(_rows(a, k), packed, y.reshape(-1, n), _row_zero_point(a_zero_point, a), 0 if zb is None else zb,
                    factor, bias if column else None)
        if bias is not None and not column:
            np.add(y, bias, out=y)  # Add's float32 sum, broadcast as the graph's
        return delivered(y, out)

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
        y = target(out, a.shape[:-1] + (n,), np.int32)
        igemm.igemm(_rows(a, k), packed, y.reshape(-1, n), _row_zero_point(a_zero_point, a), 0 if zb is None else zb)
        return delivered(y, out)

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
        y_dtype = a.dtype if y_zero_point is None else y_zero_point.dtype
        sa = np.asarray(a_scale, dtype=np.float64)
        factor = sa.reshape(-1, 1) if sa.ndim == 1 else sa
        factor = factor * np.asarray(b_scale, dtype=np.float64) / np.asarray(y_scale, dtype=np.float64)
        matrix = packed if packed is not None else b
        shape = _product_shape(a, matrix)
        n = shape[-1]
        # one factor per column and one y zero point: requantized as written out, else through an int32 product
        direct = (sa.size == 1 and (factor.size == 1 or factor.size == factor.shape[-1] == n)
                  and factor.ndim <= len(shape) and (y_zero_point is None or y_zero_point.size == 1))
        y = target(out, shape, y_dtype) if direct else scratch("minfer_ops_numba-qmm-acc", shape, np.int32)
        how = (factor, y_zero_point) if direct else None
        rows, weight, part, za = _matrices(a, matrix, y, a_zero_point)
        igemm.igemm(rows, weight, part, za, 0 if zb is None else zb, requantize=how)
        return delivered(y, out) if direct else _requantized(y, a, a_scale, b_scale, y_scale, y_zero_point, out)

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
    y_dtype = a.dtype if y_zero_point is None else y_zero_point.dtype
    if y_zero_point is not None:
        y += y_zero_point.astype(np.float64)
    info = np.iinfo(y_dtype)
    np.rint(y, out=y)
    np.clip(y, info.min, info.max, out=y)
    if out is None or out.shape != y.shape:
        return y.astype(y_dtype)
    np.copyto(out, y, casting="unsafe")  # integers in range: exact
    return out


class FewRows:
    """A dynamic ScaledMatMulInteger of fewer than FEW_ROWS rows (a classifier at batch 1) in one compiled call,
    `_dynamic_few`, on the weight as it is held: igemm packs the weight's panels at every call (MobileNetV2's
    1280x1000 classifier: 270 us in a run, 107 of them Python; 117 so). The same exact sums and float32 operations as
    igemm's write-out: the same bits. On the calling thread: its columns over a native team of two took 199 us in the
    run (the team's second thread shares its core with another tenant here; alone 33 us a half against 50 whole)."""

    def __init__(self, b: np.ndarray, zero_point: Any) -> None:
        self.b = readonly(np.ascontiguousarray(b))
        zb = np.zeros(1, np.int64) if zero_point is None else np.asarray(zero_point, np.int64).reshape(-1)
        self.zb = readonly(zb)
        k, n = b.shape
        dynamic_quant._install()  # `minmax`, before `range_part` compiles
        flat, y = readonly(np.zeros(k, np.float32)), np.zeros((1, n), np.float32)
        args = (np.zeros((1, 2), np.float32), ONE, np.empty(4, np.float32), np.empty(1, np.float32),
                np.zeros((1, k), np.uint8), self.b, self.zb, np.zeros(n, np.int32), y)
        for bias in (EMPTY, readonly(np.zeros(n, np.float32))):  # compiled (or loaded) at build
            _dynamic_few(flat, *args, bias)

    def __call__(self, a: np.ndarray, factor: np.float32, bias: np.ndarray | None, out: np.ndarray | None
                 ) -> np.ndarray | None:
        """ScaledMatMulInteger's output for a float32 a of at least one value, or None where a's range is not finite
        or the bias is not one a column (igemm's path then)."""
        k, n = self.b.shape
        if bias is not None and not (bias.dtype == np.float32 and bias.shape[-1:] == (n,) and bias.size == n):
            return None
        y = target(out, a.shape[:-1] + (n,), np.float32)
        rows = a.size // k
        flat = readonly(np.ascontiguousarray(a)).reshape(-1)
        q = scratch("minfer_ops_numba-qmm-q", (rows, k), np.uint8)
        row = scratch("minfer_ops_numba-qmm-row", (n,), np.int32)
        done = _dynamic_few(flat, np.empty((1, 2), np.float32), factor, np.empty(4, np.float32),
                            np.empty(1, np.float32), q, self.b, self.zb, row, y.reshape(rows, n),
                            EMPTY if bias is None else readonly(np.ascontiguousarray(bias).reshape(-1)))
        return delivered(y, out) if done else None  # (the kernel is not spmd: a process team runs it in one process)


# ---- com.microsoft QGemm (QOperator models' Gemm layers: a classifier's 1280x1000 or 2048x1000 weight) ------------

MS = "com.microsoft"
INT32 = 2**31
FEW_ROWS = 4  # from here igemm (its panels of B packed at each call: ~0.2 ms for a 1280x1000 weight) pays


@jit
def _few_rows(a, b, za, zb, acc, row):  # pragma: no cover - compiled
    """acc = (a - za) @ (b - zb) exactly for a few rows of an 8-bit a (M, K) and b (K, N) (`_row_sums`). For a
    classifier at batch 1, where packing B's panels costs more than the product."""
    n = b.shape[1]
    for i in range(a.shape[0]):
        _row_sums(a, i, b, za, zb, row, 0, n)
        for j in range(n):
            acc[uintp(i), uintp(j)] = row[uintp(j)]


@jit
def _row_sums(a, i, b, za, zb, row, j0, j1):  # pragma: no cover - compiled
    """row[j0:j1] = (a[i] - za) @ (b - zb) exactly for columns j0..j1 of an 8-bit a (M, K) and b (K, N), zb one
    value or one a column: rows of b scaled by a's centered values and summed in ``row`` (a loop over b as it lies,
    which vectorizes; int32 where K * 255 * 255 fits it, else int64), then each column's zero point times the row's
    sum taken away (the result fits int32: the callers' bound)."""
    per_column = zb.size > 1
    kind = row.dtype.type
    row[j0:j1] = 0
    total = 0
    for kk in range(a.shape[1]):
        av = kind(np.int64(a[uintp(i), uintp(kk)]) - za)
        total += np.int64(av)
        if av != 0:
            for j in range(j0, j1):
                row[uintp(j)] += av * kind(b[uintp(kk), uintp(j)])
    for j in range(j0, j1):
        column = j if per_column else 0
        row[uintp(j)] = kind(np.int64(row[uintp(j)]) - total * zb[uintp(column)])


def _qgemm_weight(ctx: Any, trans_b: int) -> np.ndarray | None:
    """B as (K, N), when a constant 2-D 8-bit weight whose exact products int32 holds (|a - a_zp| <= 255 against
    each column's L1 norm less its zero point), with a constant zero point (or none) of one value or one a column."""
    b = _weight(ctx, 3)
    if b is None:
        return None
    kn = np.ascontiguousarray(b.T) if trans_b else b
    usable, zp = _zero_point(ctx, 5, kn.shape[1])
    given = len(ctx.input_types) > 5 and ctx.input_types[5] is not None
    if not usable or (given and zp is None):
        return None
    centered = np.abs(kn.astype(np.int64) - (0 if zp is None else np.asarray(zp, np.int64).reshape(-1)))
    return kn if 255 * int(centered.sum(axis=0).max(initial=0)) < INT32 else None


def _qgemm_applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """An 8-bit 2-D A, a constant weight (`_qgemm_weight`), one A scale and zero point, and VNNI."""
    a = input_type(ctx, 0)
    if a is None or a.dtype not in EIGHT_BIT or a.rank != 2 or not igemm.vnni():
        return False
    za = input_type(ctx, 2)
    if za is not None and (za.shape is None or int(np.prod(za.shape)) != 1):
        return False
    return _qgemm_weight(ctx, int(attrs.get("transB", 0))) is not None


@kernel("QGemm", domain=MS, since=1, priority=PRIORITY, prepare=True, packed=(3, 5), views=False,
        applies=_qgemm_applies)
def qgemm(ctx, *, alpha=1.0, transA=0, transB=0):
    """QGemm-1 (com.microsoft) of a constant 8-bit weight: the exact product on VNNI (int32), then minfer-ops-conv's
    steps on it: + C and float32 in float64, times the float32 alpha * a_scale * b_scale (/ y_scale), rounded
    half to even + y_zero_point, saturated; the same bits."""
    weight = readonly(_qgemm_weight(ctx, transB))  # (K, N): a copy when transposed, else the original, as `packed`
    packed, held_zp = igemm.pack_b(weight), _zero_point(ctx, 5, weight.shape[1])[1]
    k, n = weight.shape
    _compiled(np.int32)
    a_dtype = input_type(ctx, 0).dtype
    wide = np.int32 if k * 255 * 255 < INT32 else np.int64  # every partial sum of the uncentered products fits
    _few_rows(readonly(np.zeros((1, k), a_dtype)), weight, 0, readonly(np.zeros(1, np.int64)),
              np.zeros((1, n), np.int32), np.zeros(n, wide))
    held_zbv = readonly(np.zeros(1, np.int64) if held_zp is None else np.asarray(held_zp, np.int64).reshape(-1))

    def factor(a_scale: Any, b_scale: Any, y_scale: Any) -> np.ndarray:
        """The float32 factor of the exact sums, in the numpy kernel's order: alpha * a_scale * b_scale [/ y_scale]."""
        scale = np.float32(alpha) * np.float32(np.asarray(a_scale).reshape(-1)[0]) * np.asarray(
            b_scale, dtype=np.float32).reshape(-1)
        return scale if y_scale is None else scale / np.float32(np.asarray(y_scale).reshape(-1)[0])

    consts = tuple(ctx.constants) + (None,) * 9
    y_given = len(ctx.input_types) > 7 and ctx.input_types[7] is not None
    known = consts[1] is not None and consts[4] is not None and (consts[7] is not None or not y_given)
    fixed = factor(consts[1], consts[4], consts[7]) if known else None  # a quantized model's constants: once
    del ctx, consts  # packed=(3, 5)

    def run(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c=None, y_scale=None, y_zero_point=None):
        am = a.T if transA else a
        acc = scratch("minfer_ops_numba-qgemm-acc", (am.shape[0], n), np.int32)
        za = 0 if a_zero_point is None else int(np.asarray(a_zero_point).reshape(-1)[0])
        if am.shape[0] < FEW_ROWS:
            zbv = held_zbv if b_zero_point is None else readonly(np.asarray(b_zero_point, np.int64).reshape(-1))
            _few_rows(_rows(am, k), weight, za, zbv, acc, scratch("minfer_ops_numba-qgemm-row", (n,), wide))
        else:
            zb = held_zp if b_zero_point is None else b_zero_point
            igemm.igemm(_rows(am, k), packed, acc, za, 0 if zb is None else zb)
        v = acc.astype(np.float64)
        if c is not None:
            v += c.astype(np.float64)
        f = fixed if fixed is not None else factor(a_scale, b_scale, y_scale)
        if y_scale is None:
            return v.astype(np.float32) * f
        w = v.astype(np.float32) * f
        y_dtype = a.dtype if y_zero_point is None else np.asarray(y_zero_point).dtype
        info = np.iinfo(y_dtype)
        np.rint(w, out=w)
        w += np.float32(0) if y_zero_point is None else np.float32(np.asarray(y_zero_point).reshape(-1)[0])
        np.clip(w, info.min, info.max, out=w)
        return w.astype(y_dtype)

    return run
