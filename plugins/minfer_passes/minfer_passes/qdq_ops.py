"""The ops ``qdq_fusion`` creates (domain ``ai.minfer``) and their kernels; the passes are in `qdq`.

- ``QuantizeDequantize(X; scale, low, high)``: ``clip(rint(X / scale), low, high) * scale``, a per-tensor
  QuantizeLinear -> DequantizeLinear pair in one pass (``low``/``high``: the integer range less the zero point).
- ``DequantConv(X, Wq, scale, zero_point, [B], [M], [A])`` (and ``DequantGemm``, ``DequantMatMul``, whose B
  input is Gemm's C, MatMul having none): the base op (its attributes) on ``DequantizeLinear(Wq, scale,
  zero_point; axis)``, then ``activation``/``activation_params`` (as on FusedConv), then ``* M`` and ``+ A``
  (constants broadcasting to the output: a ChannelAffine's S and B laid out per channel, or an Add/Mul
  bias), then ``post_activation``/``post_activation_params``. The kernel holds the 8-bit weight (declared
  ``packed``: the engine frees the originals), dequantizes it into this thread's scratch on each run, exactly
  as DequantizeLinear rounds, runs the registered kernel of the base op on it (a faster Conv from any plugin
  speeds this up too) and applies the rest in that kernel's epilogue, tile by tile while each is in cache.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from minfer_core import (Graph, KernelContext, KernelError, Node, TensorType, get_registry, kernel, op, parallel_for,
                         scratch, spmd)

from . import ops
from .ops import _infer_as as infer_as
from ._util import MINFER_DOMAIN, add_const, fresh
from .activation import activation_node

QDQ = "QuantizeDequantize"
DEQUANT = {"Conv": "DequantConv", "Gemm": "DequantGemm", "MatMul": "DequantMatMul"}
# weights of at least this many elements are dequantized by the intra-op threads, rows split between them (~100 us
# of conversion: the hand-over costs ~50 us)
SPLIT_WEIGHTS = 1 << 18


@kernel(QDQ, domain=MINFER_DOMAIN, out=True, inplace=(0,), views=False)
def quantize_dequantize(x, *, scale, low, high, out=None):
    """ai.minfer::QuantizeDequantize-1: clip(rint(x / scale), low, high) * scale, a Q -> DQ pair in one pass."""
    y = np.divide(x, x.dtype.type(scale), out=out)
    np.rint(y, out=y)
    np.clip(y, low, high, out=y)
    return np.multiply(y, x.dtype.type(scale), out=y)


def _layout(scale: np.ndarray, zero_point: np.ndarray | None, ndim: int, axis: int):
    """Scale and zero point (None when all zero) as float32 arrays broadcasting along ``axis`` of the weight."""
    shape = [1] * ndim
    if scale.size > 1:
        shape[axis] = scale.size
    s = np.ascontiguousarray(scale, dtype=np.float32).reshape(shape)
    if zero_point is None or not np.any(zero_point):
        return s, None
    return s, np.asarray(zero_point, dtype=np.float32).reshape(shape if zero_point.size > 1 else [1] * ndim)


def _part_of(c: np.ndarray, ndim: int, region: tuple) -> np.ndarray:
    """The part of constant ``c`` (broadcasting to the output) that meets output ``region``: sliced on its
    non-1 dims only, so numpy broadcasts it directly (a broadcast_to view is ~1.6x slower to read)."""
    full = c.reshape((1,) * (ndim - c.ndim) + c.shape)
    return full[tuple(r if d > 1 else slice(None) for r, d in zip(region, full.shape))]


def _chain(act: Callable | None, params: list[float], mul: np.ndarray | None, add: np.ndarray | None,
           post: Callable | None, post_params: list[float]) -> Callable[[np.ndarray, tuple], None] | None:
    """The epilogue ``fn(y, region)``: activation, then * mul and + add (broadcast to y), then the post activation."""
    if act is None and mul is None and add is None and post is None:
        return None

    def finish(y: np.ndarray, region: tuple) -> None:
        part = y[region]
        if act is not None:
            act(part, params)
        if mul is not None:
            np.multiply(part, _part_of(mul, y.ndim, region), out=part)
        if add is not None:
            np.add(part, _part_of(add, y.ndim, region), out=part)
        if post is not None:
            post(part, post_params)

    return finish


def _dequantizer(wq: np.ndarray, ws: np.ndarray, wz: np.ndarray | None, axis: int, name: str) -> Callable[[], np.ndarray]:
    """``fn()``: DequantizeLinear(wq, ws, wz) in this thread's scratch, as DequantizeLinear rounds it (float32)."""
    scale, zero = _layout(ws, wz, wq.ndim, axis % wq.ndim)

    rows = wq.shape[0]

    def row_of(v: np.ndarray | None, lo: int, hi: int) -> np.ndarray | None:
        """Rows lo:hi of a scale or zero point that varies along axis 0, else all of it (it broadcasts)."""
        return v[lo:hi] if v is not None and v.shape[0] > 1 else v

    def part(wf: np.ndarray, lo: int, hi: int) -> None:
        # a converting copy, then float products: ~2x faster than numpy's mixed int8 * float32 loop
        np.copyto(wf[lo:hi], wq[lo:hi], casting="unsafe")
        if zero is not None:
            np.subtract(wf[lo:hi], row_of(zero, lo, hi), out=wf[lo:hi])
        np.multiply(wf[lo:hi], row_of(scale, lo, hi), out=wf[lo:hi])  # (w - zp) * scale, as DequantizeLinear rounds

    def dequantized() -> np.ndarray:
        wf = scratch(name, wq.shape, np.float32)
        if wq.size >= SPLIT_WEIGHTS and rows > 1:
            parallel_for(rows, lambda lo, hi: part(wf, lo, hi))
        else:
            part(wf, 0, rows)
        return wf

    return dequantized


def _base_kernel(ctx: Any, base: str, w_shape: tuple[int, ...], bias: np.ndarray | None, attrs: dict) -> Any:
    """The registered kernel of ``base`` prepared for a per-run weight (and the constant bias), and its record."""
    inner = get_registry().select_kernel("", base, ops.NEWEST)
    if inner is None:
        raise KernelError(f"{ctx.node_name}: ai.minfer::{DEQUANT[base]} needs a kernel for {base}; none is installed")
    types = tuple(ctx.input_types) + (None,) * 5
    arity = ops.ARITY[base]
    inner_ctx = KernelContext(ctx.node_name, base, ops.NEWEST, (types[0], TensorType(np.float32, w_shape), types[4])[:arity],
                              tuple(ctx.output_types), (None, None, bias)[:arity], 1)
    return inner, inner.prepared(inner_ctx, attrs)


def _dequant(base: str) -> Callable[..., Any]:
    """The factory of Dequant{base}: dequantize the int8 weight into scratch, run {base}'s kernel, then the epilogue."""

    def factory(ctx: Any, *, axis: int = 1, activation: str = "", activation_params: list[float] | None = None,
                post_activation: str = "", post_activation_params: list[float] | None = None, **attrs: Any) -> Any:
        c = tuple(ctx.constants) + (None,) * 7
        zp_computed = len(ctx.input_types) > 3 and ctx.input_types[3] is not None and c[3] is None
        if c[1] is None or c[2] is None or zp_computed:
            raise KernelError(f"{ctx.node_name}: ai.minfer::{DEQUANT[base]} needs its weight, scale and zero point as "
                              f"initializers (the qdq_fusion pass only creates it so); got a computed one")
        dequantized = _dequantizer(c[1], c[2], c[3], axis, f"minfer_passes-dequant-{base}")
        inner, fn = _base_kernel(ctx, base, c[1].shape, c[4], attrs)
        # declared packed: a constant bias the base kernel does not pack itself is passed from here
        held_bias = c[4] if c[4] is not None and not (inner.prepare and 2 in inner.packed) else None
        finish = _chain(ops.ACTIVATIONS[activation] if activation else None, [float(v) for v in activation_params or []],
                        c[5], c[6], ops.ACTIVATIONS[post_activation] if post_activation else None,
                        [float(v) for v in post_activation_params or []])
        del ctx, c
        whole = None if finish is None else (lambda y: finish(y, (slice(None),) * y.ndim))

        def run(x, w=None, s=None, z=None, b=None, m=None, a=None, *, out=None):
            args = (x, dequantized()) if base == "MatMul" else (x, dequantized(), b if held_bias is None else held_bias)
            if inner.epilogue and inner.out:
                return fn(*args, out=out, epilogue=finish)
            y = fn(*args, out=out) if inner.out else fn(*args)
            if out is not None and y is not out:
                np.copyto(out, y)
                y = out
            if whole is not None:
                whole(y)  # the base kernel declared out=, views=False: y is its own
            return y

        # the weight goes to this process's private scratch; the base kernel's output tiles may be shared
        return spmd(run) if getattr(fn, "spmd", False) and inner.epilogue and inner.out else run

    factory.__doc__ = (f"ai.minfer::{DEQUANT[base]}-1: {base} of X and DequantizeLinear(Wq, scale, zero_point), then "
                       f"activation, * M, + A, post_activation.")
    return factory


# packed: the kernel holds the int8 weight, its scale and zero point, the bias and the epilogue's constants itself
dequant_conv = kernel("DequantConv", domain=MINFER_DOMAIN, prepare=True, out=True, views=False,
                      packed=(1, 2, 3, 4, 5, 6))(_dequant("Conv"))
dequant_gemm = kernel("DequantGemm", domain=MINFER_DOMAIN, prepare=True, out=True, views=False,
                      packed=(1, 2, 3, 4, 5, 6))(_dequant("Gemm"))
dequant_matmul = kernel("DequantMatMul", domain=MINFER_DOMAIN, prepare=True, out=True, views=False,
                        packed=(1, 2, 3, 4, 5, 6))(_dequant("MatMul"))

KERNELS = [quantize_dequantize, dequant_conv, dequant_gemm, dequant_matmul]


def _infer_dequant(base: str) -> Callable[..., list[TensorType | None]]:
    float_infer = infer_as(base)

    def infer(x: TensorType | None, wq: TensorType | None = None, *rest: TensorType | None, axis: int = 1,
              post_activation: str = "", post_activation_params: Any = None, **attrs: Any) -> list[TensorType | None]:
        """The base op's inference on X and the dequantized weight's type (the epilogue keeps the output's)."""
        w = None if wq is None or x is None else TensorType(x.dtype, wq.shape)
        bias = rest[2:3] if base != "MatMul" else ()
        return float_infer(x, w, *bias, **attrs)

    return infer


OPS = [
    op(QDQ, domain=MINFER_DOMAIN, doc="QuantizeLinear then DequantizeLinear (per tensor) as one rounding step"),
    *[op(name, domain=MINFER_DOMAIN, infer=_infer_dequant(base), doc=f"{base} of an int8 weight, dequantized per run")
      for base, name in DEQUANT.items()],
]


# ---- --portable: back to standard ops --------------------------------------------------------------------------

FLOAT_FUSED = ("FusedConv", "FusedGemm", "FusedMatMul", "ChannelAffine")


def _qdq_nodes(graph: Graph, x: str, out: str, scale: float, low: float, high: float, name: str) -> list[Node]:
    """QuantizeLinear -> DequantizeLinear (uint8, the zero point that covers [low, high]) [-> Clip to the bounds].

    The pair clips to its type's range; bounds narrower than that (a Relu or Clip folded in) clip the
    dequantized value, which is exact: min(k * s, high * s) = min(k, high) * s for a positive s.
    """
    zp = int(min(255, max(0, -low)))
    lo_range, hi_range = -zp, 255 - zp
    if low < lo_range or high > hi_range:
        raise ValueError(f"{name}: QuantizeDequantize bounds [{low}, {high}] span more than one 8-bit range")
    s, z = add_const(graph, f"{name}_scale", np.float32(scale)), add_const(graph, f"{name}_zero_point", np.uint8(zp))
    q, d = fresh(graph, f"{name}_q"), fresh(graph, f"{name}_dq") if (low, high) != (lo_range, hi_range) else out
    nodes = [Node("QuantizeLinear", [x, s, z], [q], {}, fresh(graph, f"{name}_quantize")),
             Node("DequantizeLinear", [q, s, z], [d], {}, fresh(graph, f"{name}_dequantize"))]
    if d != out:
        bounds = [float(np.float32(low) * np.float32(scale)), float(np.float32(high) * np.float32(scale))]
        nodes.append(activation_node(graph, "Clip", bounds, d, out, fresh(graph, f"{name}_bounds")))
    return nodes


def _stage(graph: Graph, act: str, params: list[float], src: str, out: str, name: str) -> list[Node]:
    if act == QDQ:
        return _qdq_nodes(graph, src, out, *params, name=name)
    return [activation_node(graph, act, params, src, out, name)]


def _lower_dequant(graph: Graph, node: Node) -> None:
    """Dequant{Conv,Gemm,MatMul} -> DequantizeLinear(W) -> the base op -> activation -> Mul/Add -> post activation."""
    attrs = dict(node.attrs)
    axis = attrs.pop("axis", 1)
    stages = [(attrs.pop("activation", ""), list(attrs.pop("activation_params", [])))]
    post = (attrs.pop("post_activation", ""), list(attrs.pop("post_activation_params", [])))
    base = next(b for b, name in DEQUANT.items() if name == node.op_type)
    inputs = (list(node.inputs) + [""] * 7)[:7]
    name = node.name or node.op_type
    w = fresh(graph, f"{name}_w")
    weight = inputs[1:4] if inputs[3] else inputs[1:3]
    new = [Node("DequantizeLinear", weight, [w], {"axis": axis}, fresh(graph, f"{name}_dq"))]
    args = [inputs[0], w] + ([inputs[4]] if base != "MatMul" and inputs[4] else [])
    steps: list[tuple[str, list, list[float]]] = [(a, [], p) for a, p in stages if a]
    steps += [(op_type, [value], []) for op_type, value in (("Mul", inputs[5]), ("Add", inputs[6])) if value]
    steps += [(post[0], [], post[1])] if post[0] else []
    t = graph.type_of(node.outputs[0])
    src = fresh(graph, f"{name}_y") if steps else node.outputs[0]
    new.append(Node(base, args, [src], attrs, node.name or fresh(graph, base.lower())))
    for k, (op_type, extra, params) in enumerate(steps):
        dst = node.outputs[0] if k == len(steps) - 1 else fresh(graph, f"{name}_s{k}")
        if t is not None:
            graph.types[src] = t  # every stage keeps the output's type
        if extra:
            new.append(Node(op_type, [src, *extra], [dst], {}, fresh(graph, f"{name}_{op_type.lower()}")))
        else:
            new.extend(_stage(graph, op_type, params, src, dst, fresh(graph, f"{name}_act{k}")))
        src = dst
    graph.replace([node], new)


def _split_rounding(graph: Graph, node: Node) -> None:
    """A float fused op whose activation is the rounding: the op without it, then a QuantizeDequantize node."""
    attrs = dict(node.attrs)
    scale, low, high = attrs.pop("activation_params")
    attrs.pop("activation")
    mid = fresh(graph, f"{node.name or node.op_type}_pre")
    if graph.type_of(node.outputs[0]) is not None:
        graph.types[mid] = graph.type_of(node.outputs[0])  # type: ignore[assignment]
    graph.replace([node], [Node(node.op_type, node.inputs, [mid], attrs, node.name, node.domain),
                           Node(QDQ, [mid], node.outputs, {"scale": scale, "low": low, "high": high},
                                fresh(graph, "qdq"), MINFER_DOMAIN)])


def lower_quantized(graph: Graph) -> bool:
    """For ``--portable``: every node the QDQ passes made, as the standard ops it stands for (exact).

    Runs before the fused ops' expansion (`portable.expand_fused`), which then sees them without the rounding.
    """
    changed = False
    for node in list(graph.nodes):
        if node.domain != MINFER_DOMAIN:
            continue
        if node.op_type in FLOAT_FUSED and node.attrs.get("activation") == QDQ:
            _split_rounding(graph, node)
        elif node.op_type in DEQUANT.values():
            _lower_dequant(graph, node)
        else:
            continue
        changed = True
    for node in list(graph.nodes):
        if node.domain == MINFER_DOMAIN and node.op_type == QDQ:
            a = node.attrs
            graph.replace([node], _qdq_nodes(graph, node.inputs[0], node.outputs[0], a["scale"], a["low"], a["high"],
                                             node.name or "qdq"))
            changed = True
    return changed
