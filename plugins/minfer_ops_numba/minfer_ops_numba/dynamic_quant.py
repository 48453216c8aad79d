"""DynamicQuantizeLinear (float32): the quantizing in one compiled pass instead of numpy's four.

minfer-ops-basic's kernel takes the max, the min, then divides, rounds, clips and adds the zero point
converting to uint8, each a numpy pass. Here the min and max stay numpy's (its vectorized reductions: a
compiled loop was 10x slower, not being allowed to reorder them), the scale and zero point are computed by
the same Python float32 arithmetic as that kernel's, and one pass quantizes each element with its
operations in its order (float32 division, round half to even, clip to [-zp, 255 - zp], + zp), so the
results are the same. A tensor holding NaN or an infinity (whose uint8 conversion numpy leaves to the C
cast) or no element goes to the numpy formula instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import kernel

from ._jit import PRIORITY, is_float32, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)


@jit
def _quantize(x, q, scale, zp):  # pragma: no cover - compiled
    """q = uint8(clip(rint(x / scale), -zp, 255 - zp) + zp), each step in float32."""
    low = -zp
    high = np.float32(255) - zp
    for i in range(x.size):
        v = np.rint(x[uintp(i)] / scale)
        v = low if v < low else (high if v > high else v)
        q[uintp(i)] = np.uint8(v + zp)


def scale_and_zero_point(mn: float, mx: float) -> tuple[np.float32, np.float32]:
    """minfer-ops-basic's scale and zero point (float32) of a tensor whose min and max are these (finite): its
    float32 operations, its clip to [0, 255] as two comparisons (numpy's clip of one value costs ~6 us)."""
    hi = np.float32(max(0.0, mx))
    lo = np.float32(min(0.0, mn))
    scale = np.float32(1.0 if hi == lo else hi - lo) / np.float32(255)
    zp = np.float32(0) - lo / scale  # >= 0: lo <= 0 < scale
    return scale, np.rint(zp if zp <= np.float32(255) else np.float32(255))


def _numpy_scale_and_zero_point(mn: float, mx: float) -> tuple[np.float32, np.float32]:
    """minfer-ops-basic's scale and zero point as it computes them, NaN and infinities included."""
    hi = np.float32(max(0.0, mx))
    lo = np.float32(min(0.0, mn))
    scale = np.float32(1.0 if hi == lo else hi - lo) / np.float32(255)
    return scale, np.rint(np.clip(np.float32(0) - lo / scale, 0, 255))


def _numpy(x: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """minfer-ops-basic's formula (NaN, infinities, empty tensors)."""
    scale, zp = _numpy_scale_and_zero_point(float(np.min(x)) if x.size else 0.0, float(np.max(x)) if x.size else 0.0)
    with np.errstate(invalid="ignore"):
        y = np.rint(np.divide(x, scale, dtype=np.float32))
        np.clip(y, -zp, np.float32(255) - zp, out=y)
        q = np.empty(y.shape, np.uint8)
        np.add(y, zp, out=q, casting="unsafe")
        return q, np.asarray(scale, dtype=x.dtype), np.asarray(zp, dtype=np.uint8)


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 input."""
    return is_float32(ctx)


@kernel("DynamicQuantizeLinear", since=11, priority=PRIORITY, prepare=True, applies=_applies)
def dynamic_quantize_linear(ctx):
    """DynamicQuantizeLinear-11 (float32): uint8 quantization whose range includes 0; y, scale, zero point."""
    _quantize(readonly(np.zeros(1, np.float32)), np.zeros(1, np.uint8), np.float32(1), np.float32(0))  # at build

    def run(x):
        flat = readonly(np.ascontiguousarray(x)).reshape(-1)
        if flat.size == 0:
            return _numpy(x)
        mn, mx = np.min(flat), np.max(flat)  # NaN propagates into both
        if not (np.isfinite(mn) and np.isfinite(mx)):
            return _numpy(x)
        scale, zp = scale_and_zero_point(float(mn), float(mx))
        q = np.empty(x.shape, np.uint8)
        _quantize(flat, q.reshape(-1), scale, np.float32(zp))
        return q, np.asarray(scale, dtype=np.float32), np.asarray(zp, dtype=np.uint8)

    return run
