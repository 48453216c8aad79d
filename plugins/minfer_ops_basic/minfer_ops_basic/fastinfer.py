"""Output types of elementwise ops, Transpose, MatMul and Gemm, computed directly: a new input shape's fast path.

The engine re-infers every node downstream of an input whose shape changed;
onnx's per-node inference costs ~30-60 us a node, these a few. Each returns
None (onnx's inference decides) outside the plain case: a dim that is not a
known int, inputs that do not broadcast or differ in dtype, a perm that is
not one, a 1-D MatMul operand. tests/runtime/test_fast_infer.py checks them
against onnx's inference over real models.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np

from minfer_core import TensorType, onnx_op


def _static(t: Any) -> bool:
    return isinstance(t, TensorType) and t.shape is not None and all(type(d) is int and d >= 0 for d in t.shape)


def same_type(x: Any, *_rest: Any, **_attrs: Any) -> list[TensorType] | None:
    """Ops whose output has the type of their first input (unary elementwise, activations, Softmax)."""
    return [x] if _static(x) else None


def broadcast_types(*inputs: Any, **_attrs: Any) -> list[TensorType] | None:
    """Multidirectional broadcasting ops whose inputs and output share one dtype."""
    if not inputs or not all(_static(t) and t.dtype == inputs[0].dtype for t in inputs):
        return None
    try:
        return [TensorType(inputs[0].dtype, np.broadcast_shapes(*(t.shape for t in inputs)))]
    except ValueError:  # shapes that do not broadcast: onnx's inference words the error
        return None


def transpose_types(x: Any, *, perm: Sequence[int] | None = None) -> list[TensorType] | None:
    """Transpose: the dims in ``perm``'s order (reversed without it)."""
    if not _static(x):
        return None
    perm = list(perm) if perm is not None else list(range(len(x.shape)))[::-1]
    return [TensorType(x.dtype, tuple(x.shape[p] for p in perm))] if sorted(perm) == list(range(len(x.shape))) else None


def matmul_types(a: Any, b: Any, **_attrs: Any) -> list[TensorType] | None:
    """MatMul of two inputs of rank 2 or more: the broadcast batch dims, then (rows of a, columns of b)."""
    if not (_static(a) and _static(b)) or a.dtype != b.dtype or min(len(a.shape), len(b.shape)) < 2:
        return None
    if a.shape[-1] != b.shape[-2]:
        return None
    try:
        return [TensorType(a.dtype, (*np.broadcast_shapes(a.shape[:-2], b.shape[:-2]), a.shape[-2], b.shape[-1]))]
    except ValueError:
        return None


def gemm_types(a: Any, b: Any, c: Any = None, *, transA: int = 0, transB: int = 0, **_attrs: Any) -> list[TensorType] | None:
    """Gemm: (M, N) from A (M, K) and B (K, N), each transposed first as asked; C must broadcast to it."""
    if not (_static(a) and _static(b)) or a.dtype != b.dtype or len(a.shape) != 2 or len(b.shape) != 2:
        return None
    (m, k), (k2, n) = a.shape[::-1] if transA else a.shape, b.shape[::-1] if transB else b.shape
    out = TensorType(a.dtype, (m, n))
    return [out] if k == k2 and (c is None or broadcast_types(out, c) == [out]) else None


SAME = """Abs Acos Acosh Asin Asinh Atan Atanh Ceil Celu Clip Cos Cosh Elu Erf Exp Floor Gelu HardSigmoid HardSwish
Hardmax LeakyRelu Log LogSoftmax Mish Neg Reciprocal Relu Round Selu Shrink Sigmoid Sign Sin Sinh Softmax Softplus
Softsign Sqrt Swish Tan Tanh ThresholdedRelu""".split()
FAST = {**dict.fromkeys(SAME, same_type), **dict.fromkeys("Add Sub Mul Div Max Min Mean Sum".split(), broadcast_types),
        "Transpose": transpose_types, "MatMul": matmul_types, "Gemm": gemm_types}


def claim(op_types: Sequence[str], domain: str) -> list[Any]:
    """`onnx_op` claims of these ops, with the fast ``infer=`` of the standard ones in `FAST`."""
    return [d for t in op_types for d in onnx_op(t, domain=domain, infer=FAST.get(t) if domain == "" else None)]
