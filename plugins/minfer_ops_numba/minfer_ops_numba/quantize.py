"""QuantizeLinear of a float32 tensor into 8 bits, per tensor, in one compiled pass (numpy: a division, a rint, a
clip and a converting add, each a pass over the tensor; ~35-50 us for a transformer's 128x256 activation).

Computed as minfer-ops-basic's kernel does (`_quantize_8bit` in cast.py), the same float32 steps in its order:
``v = rint(x / scale)`` (a division: a multiply by 1/scale rounds some values apart), clipped to ``[lo - zp, hi -
zp]``, then ``+ zp`` converted to the 8-bit type (exact: an integer in range). The same bits, except that numpy
leaves a NaN's conversion to the C cast: a tensor holding NaN (flagged by the compiled pass) is done again by the
numpy formula, so it too gets numpy's bytes. Infinities clip like any value.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import kernel

from ._jit import F32, PRIORITY, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)

EIGHT_BIT = (np.dtype(np.int8), np.dtype(np.uint8))


@jit
def _quantize(x, q, scale, zp, low, high):  # pragma: no cover - compiled
    """q = clip(rint(x / scale), low, high) + zp for flat x (float32) into flat 8-bit q; whether x held NaN."""
    nan = False
    for i in range(x.size):
        v = np.rint(x[uintp(i)] / scale)
        nan |= v != v
        v = low if v < low else (high if v > high else v)
        q[uintp(i)] = v + zp
    return nan


def _numpy(x: np.ndarray, scale: np.float32, zp: np.float32, low: np.float32, high: np.float32,
           target: np.dtype) -> np.ndarray:
    """minfer-ops-basic's steps, for a tensor holding NaN."""
    with np.errstate(invalid="ignore"):
        v = np.rint(np.asarray(np.divide(x, scale)))
        np.clip(v, low, high, out=v)
        q = np.empty(v.shape, target)
        np.add(v, zp, out=q, casting="unsafe")
    return q


def _one(t: Any) -> bool:
    return t is None or t.shape is None or int(np.prod(t.shape)) == 1


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 x, one float32 scale, one 8-bit zero point or none, an 8-bit output, no blocks, no `precision`."""
    types = tuple(ctx.input_types) + (None, None, None)
    x, s, z = types[:3]
    out = ctx.output_types[0] if ctx.output_types else None
    if x is None or s is None or x.dtype != F32 or s.dtype != F32 or not _one(s) or not _one(z):
        return False
    if out is None or out.dtype not in EIGHT_BIT or (z is not None and z.dtype != out.dtype):
        return False
    return not attrs.get("block_size") and not attrs.get("precision")


def _operands(scale: Any, zero_point: Any, target: np.dtype) -> tuple[np.float32, ...]:
    """(scale, zp, low, high) as float32: the clip bounds are the type's less the zero point."""
    zp = 0 if zero_point is None else int(np.asarray(zero_point).reshape(-1)[0])
    info = np.iinfo(target)
    return (np.float32(np.asarray(scale).reshape(-1)[0]), np.float32(zp), np.float32(info.min - zp),
            np.float32(info.max - zp))


def _prepared(ctx: Any) -> Any:
    """The run callable, compiled (or loaded) now for this node's output type; a constant scale and zero point read
    once."""
    target = ctx.output_types[0].dtype
    _quantize(readonly(np.zeros(1, np.float32)), np.zeros(1, target), *(np.float32(1),) * 4)
    consts = tuple(ctx.constants) + (None, None, None)
    known = consts[1] is not None and (len(ctx.input_types) < 3 or ctx.input_types[2] is None or consts[2] is not None)
    fixed = _operands(consts[1], consts[2], target) if known else None

    def run(x, y_scale, y_zero_point=None):
        ops = fixed if fixed is not None else _operands(y_scale, y_zero_point, target)
        q = np.empty(x.shape, target)
        if x.size and _quantize(readonly(np.ascontiguousarray(x)).reshape(-1), q.reshape(-1), *ops):
            return _numpy(x, *ops, target)
        return q

    return run


@kernel("QuantizeLinear", since=23, priority=PRIORITY, prepare=True, applies=_applies, views=False)
def quantize_linear_23(ctx, *, axis=1, block_size=0, output_dtype=0, precision=0, saturate=1):
    """QuantizeLinear-23 (float32 into 8 bits, per tensor): one compiled pass."""
    return _prepared(ctx)


@kernel("QuantizeLinear", since=21, priority=PRIORITY, prepare=True, applies=_applies, views=False)
def quantize_linear_21(ctx, *, axis=1, block_size=0, output_dtype=0, saturate=1):
    """QuantizeLinear-21 (float32 into 8 bits, per tensor): one compiled pass."""
    return _prepared(ctx)


@kernel("QuantizeLinear", since=19, priority=PRIORITY, prepare=True, applies=_applies, views=False)
def quantize_linear_19(ctx, *, axis=1, saturate=1):
    """QuantizeLinear-19 (float32 into 8 bits, per tensor): one compiled pass."""
    return _prepared(ctx)


@kernel("QuantizeLinear", since=13, priority=PRIORITY, prepare=True, applies=_applies, views=False)
def quantize_linear_13(ctx, *, axis=1):
    """QuantizeLinear-13 (float32 into 8 bits, per tensor): one compiled pass."""
    return _prepared(ctx)


@kernel("QuantizeLinear", since=10, priority=PRIORITY, prepare=True, applies=_applies, views=False)
def quantize_linear_10(ctx):
    """QuantizeLinear-10 (float32 into 8 bits, per tensor): one compiled pass."""
    return _prepared(ctx)
