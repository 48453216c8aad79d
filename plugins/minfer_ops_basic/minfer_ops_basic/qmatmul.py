"""Kernel and op: ai.minfer::ScaledMatMulInteger, a dynamically quantized linear layer in one node.

onnxruntime's quantize_dynamic writes each linear layer as DynamicQuantizeLinear(x) -> MatMulInteger -> Cast to
float32 -> Mul by x_scale * w_scale -> Add(bias): five nodes, each a pass over its tensor (and the int32 product
one more conversion). minfer_passes' ``integer_matmul_fusion`` makes the last four (and the DynamicQuantizeLinear
when this node alone reads it) one node; this kernel computes the same float32 values with fewer passes:

- ``dynamic_input``: x is float32. Its scale and zero point are DynamicQuantizeLinear's (the basic kernel's formula
  run on [min(x), max(x)]: they depend on nothing else), and x is quantized straight into the centered float32
  operand clip(rint(x / scale), -zp, 255 - zp) that the product would make of the uint8 q (q - zp, exact). A
  tensor holding NaN or an infinity (or empty) runs through DynamicQuantizeLinear itself, as the graph did.
- the product: one float32 GEMM when the held weight's column-L1 bound proves every partial sum exact (linalg's
  `_HeldB`), else MatMulInteger's kernel (int32); either way the exact integers, which the epilogue rounds to
  float32 as Cast does (the same integer, the same rounding).
- the epilogue: times the scale (one float32 value), plus the bias when given, each a float32 operation as Mul's
  and Add's: the same bits as the five nodes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import TensorType, kernel, op, scratch

# the modules, not their kernel records: a record at this module's top level would be registered twice
from . import cast, linalg
from .linalg import _HeldB

MINFER = "ai.minfer"


class _Epilogue:
    """times the scale, plus the bias: run on each finished part of the (rows, N) float32 output ``y``."""

    def __init__(self, y: np.ndarray, scale: Any, bias: np.ndarray | None) -> None:
        self.y = y.reshape(-1, y.shape[-1])
        self.scale = np.float32(np.asarray(scale).reshape(-1)[0])
        self.bias = None if bias is None else np.broadcast_to(bias, y.shape).reshape(self.y.shape)

    def __call__(self, region: tuple[slice, ...]) -> None:
        part = self.y[region]
        np.multiply(part, self.scale, out=part)  # Mul's float32 product of the exact integers (Cast's float32)
        if self.bias is not None:
            np.add(part, self.bias[region], out=part)


def _dynamic(x: np.ndarray, held: _HeldB | None, y: Any, scale: np.float32, bias: Any) -> tuple[Any, Any, Any]:
    """DynamicQuantizeLinear of float32 ``x``: (q, zero point, its scale * ``scale``), q None when the product by
    the ``held`` weight was written into ``y`` with its epilogue (one float32 GEMM exact for it)."""
    if held is not None:
        mn, mx = np.min(x), np.max(x)  # NaN propagates into both
        if np.isfinite(mn) and np.isfinite(mx):
            _, x_scale, zp = cast.dynamic_quantize_linear.fn(np.asarray([mn, mx], np.float32))
            z, factor = np.float32(zp), np.multiply(x_scale, scale)  # the Mul of its scale by the weight's
            am = scratch("minfer_ops_basic-qmm-a", (x.size // x.shape[-1], x.shape[-1]), np.float32)
            np.divide(x.reshape(am.shape), x_scale, out=am, dtype=np.float32)  # its steps, in its order
            np.rint(am, out=am)
            # = float32(q) - zp: the centered operand, exact. x / scale and rint are monotonic, so every value lies
            # between those of min(x) and max(x): when both are inside the clip's bounds the clip changes nothing
            ends = np.rint(np.divide(np.asarray([mn, mx], np.float32), x_scale, dtype=np.float32))
            if ends[0] < -z or ends[1] > np.float32(255) - z:
                np.clip(am, -z, np.float32(255) - z, out=am)
            widest = max(float(z), 255.0 - float(z))  # the clip's bounds: no pass over am to find its extremes
            if held.centered_product(am, x.shape[:-1], y, _Epilogue(y, factor, bias), widest) is not None:
                return None, zp, factor
            q = np.empty(x.shape, np.uint8)
            np.add(am.reshape(x.shape), z, out=q, casting="unsafe")  # the uint8 q, for the general product
            return q, zp, factor
    q, x_scale, zp = cast.dynamic_quantize_linear.fn(x)  # NaN, infinities: the kernel itself, as the graph ran it
    return q, zp, np.multiply(x_scale, scale)


def _fast(held: _HeldB | None, a: np.ndarray, b_zero_point: Any) -> _HeldB | None:
    """The held weight when its float32 GEMM may take this A (its bound is checked on A's values)."""
    if held is None or b_zero_point is not None or held.l1 == np.inf or a.ndim < 2 or not a.size:
        return None
    return held if a.shape[-1] == held.b.shape[0] else None


@kernel("ScaledMatMulInteger", domain=MINFER, since=1, prepare=True, out=True, views=False, packed=(1, 3))
def scaled_matmul_integer(ctx, *, dynamic_input=0):
    """ai.minfer::ScaledMatMulInteger-1: Cast(MatMulInteger(a, b, a_zero_point, b_zero_point), float32) * scale
    (one float32 value) [+ bias]; with ``dynamic_input``, a is float32 and DynamicQuantizeLinear(a) = (q, s, zp)
    runs inside: the product of q with zp, scaled by s * scale (minfer_passes' integer_matmul_fusion)."""
    held = _HeldB.of(ctx, 1, 3)
    general = linalg.matmul_integer.fn(ctx)  # the exact int32 product when one float32 GEMM is not proven exact
    del ctx  # packed=(1, 3): the closure must not keep the originals alive through ctx.constants

    def run(a, b=None, a_zero_point=None, b_zero_point=None, scale=None, bias=None, *, out=None):
        scale = np.float32(np.asarray(scale).reshape(-1)[0])
        fast, y = _fast(held, a, b_zero_point), None
        if fast is not None:  # the product straight into the output, the epilogue on each finished part
            y = out if out is not None and out.flags.c_contiguous else np.empty(a.shape[:-1] + fast.b.shape[1:],
                                                                                  np.float32)
        if dynamic_input:
            a, a_zero_point, scale = _dynamic(a, fast, y, scale, bias)
            if a is None:
                return _out(y, out)
        elif fast is not None and fast.product(a, a_zero_point, y, _Epilogue(y, scale, bias)) is not None:
            return _out(y, out)
        acc = general(a, b, a_zero_point, b_zero_point)
        y = out if out is not None else np.empty(acc.shape, np.float32)
        np.copyto(y, acc, casting="unsafe")  # Cast's float32 of the int32, then Mul's and Add's float32 operations
        np.multiply(y, scale, out=y)
        if bias is not None:
            np.add(y, bias, out=y)
        return y

    return run


def _out(y: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    if out is not None and out is not y:
        np.copyto(out, y)
        return out
    return y


def _infer(a: TensorType | None, b: TensorType | None = None, *rest: TensorType | None, dynamic_input: int = 0
           ) -> list[TensorType | None]:
    """float32, of MatMul's shape for a 2-D b (else unknown)."""
    shape = None
    if a is not None and b is not None and a.shape is not None and b.shape is not None:
        if len(a.shape) >= 2 and len(b.shape) == 2:
            shape = tuple(a.shape[:-1]) + (b.shape[1],)
    return [TensorType(np.float32, shape)]


OPS = [
    op("ScaledMatMulInteger", domain=MINFER, infer=_infer,
       doc="[DynamicQuantizeLinear ->] MatMulInteger -> Cast to float32 -> Mul by a scalar [-> Add bias] in one node "
           "(see minfer_ops_basic/qmatmul.py)"),
]
