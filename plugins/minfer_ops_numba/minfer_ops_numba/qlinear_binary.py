"""onnxruntime's com.microsoft QLinearAdd and QLinearMul in one compiled pass (minfer-ops-conv's numpy kernels take
six to eight passes and as many temporaries).

The same float32 operations in the same order as those kernels (qlinear.py there), so the same bits:

- QLinearAdd: ``(a - a_zp) * (a_scale / c_scale) + (b - b_zp) * (b_scale / c_scale)``;
- QLinearMul: ``(a - a_zp) * (b - b_zp) * (a_scale * b_scale / c_scale)``;

then ``+ c_zp``, rounded half to even and saturated to the output's 8-bit type (onnxruntime rounds the sum with
the zero point: a tie goes to the even output). The rounding adds and takes away 1.5 * 2**23 after the clip to the
integer bounds (exact there; rint and a clip to integers commute). A quantized transformer has eight QLinearAdds
(biases and residuals): one operand of the output's shape, the other the same or a bias along the last axes;
other broadcasts stay with the numpy kernels.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import kernel

from ._jit import PRIORITY, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)

MS = "com.microsoft"
EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))
_ROUNDER = np.float32(1.5 * 2**23)


@jit
def _add(x, y, out, mx, zx, my, zy, zc, lo, hi):  # pragma: no cover - compiled
    """out[r, c] = sat(((x[r, c] - zx) * mx + (y[c] - zy) * my) + zc) for x, out (rows, n), y (n,)."""
    for r in range(x.shape[0]):
        for c in range(x.shape[1]):
            v = (np.float32(x[uintp(r), uintp(c)]) - zx) * mx + (np.float32(y[uintp(c)]) - zy) * my
            v = v + zc
            v = lo if v < lo else (hi if v > hi else v)
            out[uintp(r), uintp(c)] = (v + _ROUNDER) - _ROUNDER


@jit
def _mul(x, y, out, m, zx, zy, zc, lo, hi):  # pragma: no cover - compiled
    """out[r, c] = sat((x[r, c] - zx) * (y[c] - zy) * m + zc) for x, out (rows, n), y (n,)."""
    for r in range(x.shape[0]):
        for c in range(x.shape[1]):
            v = (np.float32(x[uintp(r), uintp(c)]) - zx) * (np.float32(y[uintp(c)]) - zy)
            v = v * m + zc
            v = lo if v < lo else (hi if v > hi else v)
            out[uintp(r), uintp(c)] = (v + _ROUNDER) - _ROUNDER


def _trailing(shape: tuple[Any, ...]) -> tuple[Any, ...]:
    """``shape`` less its leading 1s."""
    return tuple(shape[next((i for i, d in enumerate(shape) if d != 1), len(shape)) :])


def _layout(a_shape: tuple[Any, ...] | None, b_shape: tuple[Any, ...] | None) -> bool | None:
    """Which operand is the output's shape (False: A, True: B), the other being its last axes (or all of it),
    or None for another broadcast (or unknown shapes)."""
    if a_shape is None or b_shape is None:
        return None
    for swap, (big, small) in ((False, (a_shape, b_shape)), (True, (b_shape, a_shape))):
        t = _trailing(small)
        if len(big) >= len(t) and tuple(big[len(big) - len(t) :]) == t and all(isinstance(d, int) for d in big):
            return swap
    return None


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """8-bit A and B, one of them the output's shape and the other its last axes."""
    types = tuple(ctx.input_types) + (None,) * 8
    a, b, zc = types[0], types[3], types[7]
    if a is None or b is None or a.dtype not in EIGHT_BIT or b.dtype not in EIGHT_BIT:
        return False
    if zc is not None and zc.dtype not in EIGHT_BIT:
        return False
    return _layout(a.shape, b.shape) is not None


def _f32(v: Any) -> np.float32:
    return np.float32(np.asarray(v).reshape(-1)[0])


def _zp(v: Any) -> np.float32:
    return np.float32(0) if v is None else _f32(v)


def _binary(ctx: Any, mul: bool) -> Any:
    """The run callable of QLinearAdd (or QLinearMul with ``mul``), compiled now for this node's dtypes."""
    types = tuple(ctx.input_types) + (None,) * 8
    swap = _layout(types[0].shape, types[3].shape)
    one, z = readonly(np.zeros((1, 1), types[0].dtype)), readonly(np.zeros(1, types[3].dtype))
    target = types[0].dtype if types[7] is None else types[7].dtype
    f = np.float32(0)
    if mul:  # compile (or load) at build, as they are called at run (x and y in the swapped order too)
        _mul(one, z, np.zeros((1, 1), target), f, f, f, f, f, f)
        _mul(readonly(np.zeros((1, 1), types[3].dtype)), readonly(np.zeros(1, types[0].dtype)),
             np.zeros((1, 1), target), f, f, f, f, f, f)
    else:
        _add(one, z, np.zeros((1, 1), target), f, f, f, f, f, f, f)
        _add(readonly(np.zeros((1, 1), types[3].dtype)), readonly(np.zeros(1, types[0].dtype)),
             np.zeros((1, 1), target), f, f, f, f, f, f, f)

    def operands(a_scale, a_zero_point, b_scale, b_zero_point, c_scale, c_zero_point):
        """(multipliers..., zero points..., lo, hi) of the compiled loop, x and y in its order."""
        info = np.iinfo(target)
        (sx, zx), (sy, zy) = ((b_scale, b_zero_point), (a_scale, a_zero_point)) if swap else \
            ((a_scale, a_zero_point), (b_scale, b_zero_point))
        lo, hi, zc, sc = np.float32(info.min), np.float32(info.max), _zp(c_zero_point), _f32(c_scale)
        if mul:
            return _f32(sx) * _f32(sy) / sc, _zp(zx), _zp(zy), zc, lo, hi
        return _f32(sx) / sc, _zp(zx), _f32(sy) / sc, _zp(zy), zc, lo, hi

    consts = tuple(ctx.constants) + (None,) * 8
    given = [i for i in (1, 2, 4, 5, 6, 7) if i < len(types) and types[i] is not None]
    fixed = operands(*(consts[i] for i in (1, 2, 4, 5, 6, 7))) if all(consts[i] is not None for i in given) \
        else None  # scales and zero points constant (a quantized model's): computed once, here
    loop = _mul if mul else _add

    def run(a, a_scale, a_zero_point, b, b_scale, b_zero_point, c_scale, c_zero_point=None):
        x, y = (b, a) if swap else (a, b)
        out = np.empty(x.shape, target)
        if not x.size:
            return out
        ops = fixed if fixed is not None else operands(a_scale, a_zero_point, b_scale, b_zero_point, c_scale,
                                                       c_zero_point)
        n = y.size  # y is the output's last axes (or all of it)
        loop(readonly(np.ascontiguousarray(x)).reshape(-1, n), readonly(np.ascontiguousarray(y)).reshape(-1),
             out.reshape(-1, n), *ops)
        return out

    return run


@kernel("QLinearAdd", domain=MS, since=1, priority=PRIORITY, prepare=True, applies=_applies, views=False)
def qlinear_add(ctx):
    """QLinearAdd-1 (com.microsoft; an operand of the output's shape, the other its last axes): one compiled pass."""
    return _binary(ctx, mul=False)


@kernel("QLinearMul", domain=MS, since=1, priority=PRIORITY, prepare=True, applies=_applies, views=False)
def qlinear_mul(ctx):
    """QLinearMul-1 (com.microsoft; an operand of the output's shape, the other its last axes): one compiled pass."""
    return _binary(ctx, mul=True)
