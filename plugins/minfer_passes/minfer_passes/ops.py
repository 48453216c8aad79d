"""minfer's own fused operators (domain ``ai.minfer``), their inference and their kernels.

Fused nodes the passes create:

- ``FusedConv(X, W, [B], [Z])``, ``FusedGemm(A, B, [C])``, ``FusedMatMul(A, B)``:
  the base op's attributes unchanged, plus ``activation`` (an ONNX op name:
  Relu, LeakyRelu, Clip, Sigmoid, HardSigmoid, HardSwish, Tanh, Swish; absent
  or empty: none) and ``activation_params`` (floats: alpha for LeakyRelu and
  Swish, [min, max] for Clip, [alpha, beta] for HardSigmoid). FusedConv's optional
  ``Z`` (the residual of a ResNet block) has exactly the output's shape and
  is added before the activation: ``activation(Conv(X, W, B) + Z)``. The
  kernel computes the base op with the *registered* kernel of the standard
  op, looked up through the public registry (this plugin cannot import the
  one that implements Conv or Gemm, and should not: a faster Conv from any
  plugin then speeds up FusedConv too), into the engine's planned buffer
  (``out=``) when the base kernel accepts one, then adds Z and applies the
  activation in place there. Each declares ``packed`` the constant weights
  its base kernel packs (Conv: W, B; Gemm: B, C; MatMul: B), so the engine
  frees the originals and holds those weights once.
- ``BinaryScalar(X; op, scalar, reverse)``: ``X op scalar`` (or ``scalar op X``
  when ``reverse``) for op in Add/Sub/Mul/Div, with a 0-d ``scalar`` tensor.
- ``WeightedSum(A, B; weights)``: ``A*weights[0] + B*weights[1]`` with the
  products rounded to the inputs' dtype first, exactly as Mul, Mul, Add would.

All of them expand back to standard ops (`minfer_passes.portable`).
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
import onnx
from onnx import helper

from minfer_core import KernelContext, TensorType, get_registry, kernel, op, prepare_node, spmd

from ._util import MINFER_DOMAIN

BASE_OPS = {"FusedConv": "Conv", "FusedGemm": "Gemm", "FusedMatMul": "MatMul"}
NEWEST = 10_000  # fused kernels use the newest kernel of their base op: Conv, Gemm-7+ and MatMul agree across versions


# ---- activations, applied in place --------------------------------------------


_ZEROS: dict[np.dtype, np.ndarray] = {}


def zeros_like(y: np.ndarray) -> np.ndarray:
    """A read-only zero array of y's shape and dtype, a view of one shared block (grown when needed).

    numpy 2.4's maximum runs ~5x faster against an array than against a 0-d zero (measured on a
    (1, 128, 56, 56) conv tile: 129 -> 26 us).
    """
    block = _ZEROS.get(y.dtype)
    if block is None or block.size < y.size:
        block = np.zeros(max(y.size, 1 << 16), y.dtype)
        block.flags.writeable = False
        _ZEROS[y.dtype] = block  # a racing thread may make its own: both are zeros
    return block[: y.size].reshape(y.shape)


def _relu(y: np.ndarray, p: list[float]) -> None:
    np.maximum(y, zeros_like(y), out=y)


def _leaky_relu(y: np.ndarray, p: list[float]) -> None:
    alpha = p[0] if p else 0.01
    np.multiply(y, y.dtype.type(alpha), out=y, where=y < 0)


def _clip_ufunc() -> Any:
    """numpy's clip ufunc, which np.clip calls after ~1 us of Python (_methods._clip): the same loop, the same
    bits, at a cost that counts on a MobileNet's ~100 small tiles a run. np.clip itself where it is not found."""
    core = getattr(np, "_core", None) or getattr(np, "core", None)  # numpy 2's private name; numpy 1's
    found = getattr(getattr(core, "umath", None), "clip", None)
    return found if isinstance(found, np.ufunc) else np.clip


CLIP = _clip_ufunc()


def _clip(y: np.ndarray, p: list[float]) -> None:
    # np.clip's loop: NaN kept; on a tie x is kept (Clip(-0.0, 0, 6) is -0.0 here, +0.0 from minfer-ops-basic's
    # maximum-then-minimum kernel and minfer-ops-numba's, which numpy's maximum makes return its second operand)
    lo, hi = (p + [-np.inf, np.inf])[:2] if p else (-np.inf, np.inf)
    CLIP(y, y.dtype.type(lo), y.dtype.type(hi), out=y)


def _sigmoid(y: np.ndarray, p: list[float]) -> None:
    with np.errstate(over="ignore"):
        np.negative(y, out=y)
        np.exp(y, out=y)
        y += 1
        np.reciprocal(y, out=y)


def _hard_sigmoid(y: np.ndarray, p: list[float]) -> None:
    alpha, beta = (p + [0.2, 0.5][len(p):])[:2]
    y *= y.dtype.type(alpha)
    y += y.dtype.type(beta)
    CLIP(y, 0, 1, out=y)


def _hard_swish(y: np.ndarray, p: list[float]) -> None:
    gate = y * y.dtype.type(1 / 6) + y.dtype.type(0.5)
    CLIP(gate, 0, 1, out=gate)
    y *= gate


def _swish(y: np.ndarray, p: list[float]) -> None:
    """y * Sigmoid(alpha * y), p = [alpha]: the Mul, Sigmoid and Mul it replaces, in their order."""
    gate = np.multiply(y, y.dtype.type(p[0] if p else 1.0))
    _sigmoid(gate, [])
    y *= gate


def _tanh(y: np.ndarray, p: list[float]) -> None:
    np.tanh(y, out=y)


def _quantize_dequantize(y: np.ndarray, p: list[float]) -> None:
    """p = [scale, low, high]: y on the grid of a QuantizeLinear -> DequantizeLinear pair (see `qdq`)."""
    s = y.dtype.type(p[0])
    np.divide(y, s, out=y)  # QuantizeLinear divides (a multiply by 1/scale rounds some values apart)
    np.rint(y, out=y)
    CLIP(y, p[1], p[2], out=y)
    np.multiply(y, s, out=y)


ACTIVATIONS: dict[str, Callable[[np.ndarray, list[float]], None]] = {
    "Relu": _relu,
    "LeakyRelu": _leaky_relu,
    "Clip": _clip,
    "Sigmoid": _sigmoid,
    "HardSigmoid": _hard_sigmoid,
    "HardSwish": _hard_swish,
    "Tanh": _tanh,
    "Swish": _swish,
    "QuantizeDequantize": _quantize_dequantize,
}


# ---- fused base op (+ residual) + activation -----------------------------------------

# Inputs of the base op; FusedConv's input 3 (Z, the residual) is the fused op's own.
ARITY = {"Conv": 3, "Gemm": 3, "MatMul": 2}
# Inputs the fused kernel declares ``packed``: those the installed base kernels pack (minfer-ops-conv's Conv:
# W, B; minfer-ops-basic's Gemm: B, C; its MatMul: B). A kernel record is fixed before the registry knows which
# base kernel a build will select, so should the selected one not pack an input declared here, the factory
# holds its own copy of that constant and passes it (see `_fused`): the declaration stays true, and the
# weight is still held once.
PACKED = {"Conv": (1, 2), "Gemm": (1, 2), "MatMul": (1,)}


def _split(inputs: tuple[np.ndarray | None, ...], arity: int, held: dict[int, np.ndarray]) -> tuple[list[Any], Any]:
    """The base op's arguments (with the held constants in place) and the residual Z (or None)."""
    args = list(inputs[:arity])
    for i, value in held.items():
        if i < len(args):
            args[i] = value
    return args, inputs[arity] if len(inputs) > arity else None


def _with_epilogue(fn: Callable[..., Any], arity: int, held: dict[int, np.ndarray],
                   act: Callable[..., Any] | None, params: list[float], activation: str = "",
                   inputs: int = 4) -> Callable[..., Any]:
    """The fused run for a base kernel that takes ``epilogue=``: residual and activation per finished tile.

    The base kernel writes each tile (into ``out``, never into an input: it declared ``out``) and hands it
    over while it is still in cache; the tiles cover the output once, possibly from several threads. Each
    epilogue describes itself (``spec``: activation, params, residual; docs/kernel-contract.md), so that a
    compiled kernel may apply it in its own code instead of calling it.
    """

    def act_only(y: np.ndarray, region: tuple[slice, ...]) -> None:
        act(y[region], params)  # type: ignore[misc]

    act_only.spec = (activation, tuple(params), None)  # type: ignore[attr-defined]
    if not held and inputs <= arity:
        # the base op's inputs as they come, one epilogue for every call: the base run callable itself, its
        # epilogue bound (a partial calls from C: a Python wrapper cost ~0.3 us a node on small models)
        if act is None:
            return fn
        direct = functools.partial(fn, epilogue=act_only)
        return spmd(direct) if getattr(fn, "spmd", False) else direct

    def run(*inputs: np.ndarray | None, out: np.ndarray | None = None) -> np.ndarray:
        args, z = _split(inputs, arity, held)
        if z is None and act is None:
            return fn(*args, out=out)

        def finish(y: np.ndarray, region: tuple[slice, ...]) -> None:
            part = y[region]
            if z is not None:
                np.add(part, z[region], out=part)
            if act is not None:
                act(part, params)

        finish.spec = (activation, tuple(params), z)  # type: ignore[attr-defined]
        return fn(*args, out=out, epilogue=finish)

    # the epilogue runs inside the base kernel's output tiles: a process team may share them when it may
    return spmd(run) if getattr(fn, "spmd", False) else run


# activations (with the ONNX names of their activation_params) whose registered kernel the epilogue calls, in
# place, on each tile that is C-contiguous, when the kernel writes in place (declares ``out`` and ``inplace``
# of its input, as the engine calls those: on one C-contiguous buffer) and outranks the standard kernels
# (priority above 0): a plugin's one-pass kernel (minfer-ops-numba's) then replaces the numpy passes above,
# which on the small tiles of MobileNets and PP-LCNet cost more in calls than in work. (minfer-ops-basic's own
# in-place Relu, Clip and LeakyRelu go through their whole-tensor machinery: dearer per tile than these.)
REGISTERED = {"Relu": (), "LeakyRelu": ("alpha",), "Clip": ("min", "max"), "HardSigmoid": ("alpha", "beta"),
              "HardSwish": (), "Swish": ("alpha",)}
# activations whose params are the op's constant inputs after x, not attributes (Clip from opset 11: min, max)
AS_INPUTS = {"Clip"}


def _activation(ctx: Any, activation: str, params: list[float]) -> Callable[[np.ndarray, list[float]], None]:
    """A fused op's activation: the registered in-place kernel of the op on C-contiguous tiles (and on strided
    ones when its run callable says ``strided``: it writes a view in place), else numpy's."""
    numpy_act = ACTIVATIONS[activation]
    names = REGISTERED.get(activation)
    out_type = ctx.output_types[0] if names is not None and ctx.output_types else None
    if out_type is None:
        return numpy_act
    attrs, inputs = dict(zip(names, params)), ()
    if activation in AS_INPUTS:  # 0-d constants of the output's dtype, as an exporter writes them
        attrs, inputs = {}, tuple(np.asarray(v, dtype=out_type.dtype) for v in params)
    types = (out_type, *(TensorType(out_type.dtype, ()) for _ in inputs))
    act_ctx = KernelContext(ctx.node_name, activation, NEWEST, types, (out_type,), (None, *inputs), 1)
    kern = get_registry().select_kernel("", activation, NEWEST, "numpy", act_ctx, attrs)
    if kern is None or kern.priority <= 0 or not kern.out or 0 not in kern.inplace:
        return numpy_act
    fn = kern.prepared(act_ctx, attrs)
    strided = getattr(fn, "strided", False) is True

    def act(y: np.ndarray, p: list[float]) -> None:
        if strided or y.flags.c_contiguous:
            fn(y, *inputs, out=y)
        else:
            numpy_act(y, p)

    return act


def _fused(base: str) -> Callable[..., Any]:
    arity, packed = ARITY[base], PACKED[base]

    def factory(ctx: Any, *, activation: str = "", activation_params: list[float] | None = None, **attrs: Any) -> Any:
        consts = list(ctx.constants[:arity])
        inner_ctx = KernelContext(ctx.node_name, base, NEWEST, tuple(ctx.input_types[:arity]), (None,), tuple(consts), 1)
        # the base op's kernel as the core picks it for this node: the highest priority that applies, or a timed
        # choice among every installed plugin's kernels that apply (a numba depthwise conv and numpy's, say)
        found = get_registry().kernel_candidates("", base, NEWEST, "numpy", inner_ctx, attrs)
        if not found:
            raise LookupError(f"Fused{base} needs a kernel for {base}; none is installed")
        params = [float(v) for v in (activation_params or [])]
        act = _activation(ctx, activation, params) if activation else None
        # a declared-packed constant the base kernel does not pack: hold a copy (the engine frees the original)
        held: dict[int, np.ndarray] = {}
        for i in packed:
            if i < len(consts) and consts[i] is not None and not all(k.prepare and i in k.packed for k in found):
                consts[i] = held[i] = np.array(consts[i], copy=True)
        inner_ctx = KernelContext(ctx.node_name, base, NEWEST, tuple(ctx.input_types[:arity]), (None,), tuple(consts), 1)
        inner, fn = prepare_node(get_registry(), inner_ctx, attrs)  # type: ignore[misc]
        del inner_ctx
        del consts  # the closure below must not keep the originals (packed) alive
        writes_out = inner.out
        # a kernel that promised views=False never returns an input's memory: skip the overlap test
        may_alias = inner.views is not False
        if inner.epilogue and writes_out:
            return _with_epilogue(fn, arity, held, act, params, activation, len(ctx.input_types))

        def run(*inputs: np.ndarray | None, out: np.ndarray | None = None) -> np.ndarray:
            args, z = _split(inputs, arity, held)
            y = fn(*args, out=out) if writes_out else fn(*args)
            if out is not None:
                if y is not out:
                    np.copyto(out, y)
                    y = out
            elif not y.flags.writeable or (may_alias and any(np.may_share_memory(y, x) for x in inputs if x is not None)):
                y = y.copy()  # the residual and the activation write into y: never into an input's memory
            if z is not None:
                np.add(y, z, out=y)
            if act is not None:
                act(y, params)
            return y

        return run

    factory.__doc__ = (f"ai.minfer::Fused{base}-1: {base} with the registered kernel (into out when it can), "
                       + ("+ Z, " if base == "Conv" else "") + "then the activation in place.")
    return factory


# out=True: the base result lands in the planned buffer (directly when the base kernel takes out=, else copied),
# and the residual and activation are applied there. views=False: the result never shares an input's memory.
fused_conv = kernel("FusedConv", domain=MINFER_DOMAIN, prepare=True, out=True, views=False,
                    packed=PACKED["Conv"])(_fused("Conv"))
fused_gemm = kernel("FusedGemm", domain=MINFER_DOMAIN, prepare=True, out=True, views=False,
                    packed=PACKED["Gemm"])(_fused("Gemm"))
fused_matmul = kernel("FusedMatMul", domain=MINFER_DOMAIN, prepare=True, out=True, views=False,
                      packed=PACKED["MatMul"])(_fused("MatMul"))

BINARY = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}


@kernel("BinaryScalar", domain=MINFER_DOMAIN, out=True, inplace=(0,), views=False)
def binary_scalar(x, *, op, scalar, reverse=0, out=None):
    """ai.minfer::BinaryScalar-1: x op scalar (scalar op x when reverse) for Add/Sub/Mul/Div."""
    s = np.asarray(scalar, dtype=x.dtype)
    return np.asarray(BINARY[op](s, x, out=out) if reverse else BINARY[op](x, s, out=out))


@kernel("WeightedSum", domain=MINFER_DOMAIN, out=True, views=False)
def weighted_sum(a, b, *, weights, out=None):
    """ai.minfer::WeightedSum-1: a*weights[0] + b*weights[1], each product rounded to the dtype."""
    # not in place: with out aliasing a, the first product would overwrite b when b is a too
    w = np.asarray(weights, dtype=a.dtype)
    first = np.multiply(a, w[0], out=out if out is not None and out.shape == a.shape else None)
    return np.asarray(np.add(first, np.multiply(b, w[1]), out=out))


KERNELS = [fused_conv, fused_gemm, fused_matmul, binary_scalar, weighted_sum]


# ---- shape and dtype inference ---------------------------------------------------


def _type_proto(t: TensorType | None) -> onnx.TypeProto | None:
    if t is None:
        return None
    # a negative dim_value (an exporter's "unknown") is unknown to onnx's inference too
    shape = None if t.shape is None else [None if isinstance(d, int) and d < 0 else d for d in t.shape]
    return helper.make_tensor_type_proto(helper.np_dtype_to_tensor_dtype(t.dtype), shape)


def _from_proto(tp: onnx.TypeProto) -> TensorType | None:
    tt = tp.tensor_type
    if not tt.elem_type:
        return None
    dims = None
    if tt.HasField("shape"):
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tt.shape.dim]
    return TensorType(helper.tensor_dtype_to_np_dtype(tt.elem_type), dims)


def _infer_as(base: str) -> Callable[..., list[TensorType | None]]:
    def infer(*types: TensorType | None, activation: str = "", activation_params: Any = None, **attrs: Any) -> list:
        types = types[:ARITY[base]]  # FusedConv's Z has the output's shape: it changes nothing
        # the base op's fast infer= (a new input shape's run), found as its kernel is: through the registry
        standard = get_registry().op_def("", base)
        fast = None if standard is None or standard.infer is None else standard.infer(*types, **attrs)
        if fast is not None:
            return list(fast)
        # an omitted optional input (FusedConv without B) has no type: onnx's node reads it as ""
        names = [f"i{i}" if t is not None else "" for i, t in enumerate(types)]
        while names and not names[-1]:
            names.pop()
        node = helper.make_node(base, names, ["y"], **attrs)
        known = {n: _type_proto(t) for n, t in zip(names, types) if t is not None}
        schema = onnx.defs.get_schema(base, 21)
        out = onnx.shape_inference.infer_node_outputs(schema, node, known, opset_imports=[helper.make_opsetid("", 21)])
        return [_from_proto(out["y"]) if "y" in out else None]

    return infer


def _infer_weighted_sum(a: TensorType | None, b: TensorType | None, **attrs: Any) -> list[TensorType | None]:
    if a is None or b is None:
        return [None]
    if a.is_static and b.is_static and min((*a.shape, *b.shape, 0)) >= 0:  # type: ignore[misc]
        return [TensorType(a.dtype, np.broadcast_shapes(a.shape, b.shape))]  # type: ignore[arg-type]
    return [a if a.shape == b.shape else TensorType(a.dtype, None)]


OPS = [
    op("FusedConv", domain=MINFER_DOMAIN, infer=_infer_as("Conv"),
       doc="Conv, plus an optional residual Z, followed by an optional activation, in one kernel"),
    op("FusedGemm", domain=MINFER_DOMAIN, infer=_infer_as("Gemm"), doc="Gemm followed by an activation, in one kernel"),
    op("FusedMatMul", domain=MINFER_DOMAIN, infer=_infer_as("MatMul"), doc="MatMul followed by an activation"),
    op("BinaryScalar", domain=MINFER_DOMAIN, doc="Add/Sub/Mul/Div of a tensor and a scalar attribute"),
    op("WeightedSum", domain=MINFER_DOMAIN, infer=_infer_weighted_sum, doc="A*w0 + B*w1"),
]
