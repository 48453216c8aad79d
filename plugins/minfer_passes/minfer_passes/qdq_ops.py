"""The ops ``qdq_fusion`` creates (domain ``ai.minfer``) and their kernels; the passes are in `qdq`.

- ``QuantizeDequantize(X, [M], [A]; scale, low, high, post_scale, post_low, post_high)``: ``R(X)``, with
  ``R(v) = clip(rint(v / scale), low, high) * scale`` a per-tensor QuantizeLinear -> DequantizeLinear pair in one
  step (``low``/``high``: the integer range less the zero point); then ``* M`` and ``+ A`` (broadcasting into X)
  and, when ``post_scale`` is not 0, a second rounding on the ``post_*`` grid. The passes create only the plain
  form; the Dequant* kernels run their epilogue ``rounding, * M, + A, rounding`` through the registered kernel of
  this op, so a plugin's one-pass kernel of it (minfer-ops-numba's) replaces ten numpy passes over each tile.
- ``DequantConv(X, Wq, scale, zero_point, [B], [M], [A], [Z])`` (and ``DequantGemm``, ``DequantMatMul``, whose
  B input is Gemm's C, MatMul having none): the base op (its attributes) on ``DequantizeLinear(Wq, scale,
  zero_point; axis)``, then ``activation``/``activation_params`` (as on FusedConv), then ``* M`` and ``+ A``
  (constants broadcasting to the output: a ChannelAffine's S and B laid out per channel, or an Add/Mul
  bias), then ``post_activation``/``post_activation_params``, then ``+ Z`` (a residual of the output's shape,
  computed) and the rounding ``residual_params`` ([scale, low, high], given with Z). The kernel holds the 8-bit weight (declared
  ``packed``: the engine frees the originals), dequantizes it into this thread's scratch on each run, exactly
  as DequantizeLinear rounds, runs the registered kernel of the base op on it (a faster Conv from any plugin
  speeds this up too) and applies the rest in that kernel's epilogue, tile by tile while each is in cache.
  A depthwise conv's weight (9 floats a channel: a few KB) is instead dequantized once, at build, the same way,
  and held as float32 like a float model's, so that the base op packs it and picks its kernel as for a
  constant (minfer-ops-numba's depthwise conv needs constant weights).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from minfer_core import (Graph, KernelContext, KernelError, Node, TensorType, get_registry, kernel, op, parallel_for,
                         prepare_node, scratch, spmd)

from . import ops
from .ops import _infer_as as infer_as
from ._util import MINFER_DOMAIN, add_const, fresh
from .activation import activation_node

QDQ = "QuantizeDequantize"
DEQUANT = {"Conv": "DequantConv", "Gemm": "DequantGemm", "MatMul": "DequantMatMul"}
# weights of at least this many elements are dequantized by the intra-op threads, rows split between them (~100 us
# of conversion: the hand-over costs ~50 us)
SPLIT_WEIGHTS = 1 << 18


def _round(x: np.ndarray, scale: float, low: float, high: float, out: np.ndarray | None) -> np.ndarray:
    s = x.dtype.type(scale)
    # QuantizeLinear divides (a multiply by 1/scale rounds some values apart); into an array even for a 0-d x
    y = np.divide(x, s, out=np.empty_like(x) if out is None else out)
    np.rint(y, out=y)
    np.clip(y, low, high, out=y)
    return np.multiply(y, s, out=y)


@kernel(QDQ, domain=MINFER_DOMAIN, out=True, inplace=(0,), views=False)
def quantize_dequantize(x, m=None, a=None, *, scale, low, high, post_scale=0.0, post_low=0.0, post_high=0.0, out=None):
    """ai.minfer::QuantizeDequantize-1: clip(rint(x / scale), low, high) * scale [* m] [+ a] [rounded again]."""
    y = _round(x, scale, low, high, out)
    if m is not None:
        np.multiply(y, m, out=y)
    if a is not None:
        np.add(y, a, out=y)
    return _round(y, post_scale, post_low, post_high, y) if post_scale else y


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


def _rounding(out_type: TensorType | None, params: list[float], mul: np.ndarray | None, add: np.ndarray | None,
              post_params: list[float] | None) -> Callable[[np.ndarray, tuple], None]:
    """The epilogue ``rounding, * mul, + add[, rounding]`` as the registered QuantizeDequantize kernel's one call
    per tile (the highest priority that applies to these operands; the numpy kernel at worst)."""
    scale, low, high = params
    post = list(post_params) if post_params else [0.0, 0.0, 0.0]
    attrs = {"scale": scale, "low": low, "high": high, "post_scale": post[0], "post_low": post[1], "post_high": post[2]}
    types = tuple(None if c is None else TensorType(c.dtype, c.shape) for c in (mul, add))
    ctx = KernelContext("", QDQ, 1, (out_type, *types), (out_type,), (None, None, None), 1)
    found = get_registry().select_kernel(MINFER_DOMAIN, QDQ, 1, "numpy", ctx, attrs)
    fn = (found or quantize_dequantize).prepared(ctx, attrs)

    def finish(y: np.ndarray, region: tuple) -> None:
        part = y[region]
        fn(part, None if mul is None else _part_of(mul, y.ndim, region),
           None if add is None else _part_of(add, y.ndim, region), out=part)

    # described, so that a compiled kernel may apply it itself: the rounding alone as an activation (``spec``), and
    # the whole chain (``rounding``: its grid, M, A, the second grid or None)
    if mul is None and add is None and not post_params:
        finish.spec = (QDQ, (scale, low, high), None)  # type: ignore[attr-defined]
    finish.rounding = ((scale, low, high), mul, add, tuple(post) if post_params else None)  # type: ignore[attr-defined]
    return finish


def _epilogue(out_type: TensorType | None, act: str, params: list[float], mul: np.ndarray | None,
              add: np.ndarray | None, post: str, post_params: list[float]) -> Callable[[np.ndarray, tuple], None] | None:
    """The Dequant* epilogue: one rounding kernel call when it starts with the rounding and ends with one or none
    (what qdq_epilogue_fusion makes of a quantized model), else the numpy stages one after another."""
    if act == QDQ and post in ("", QDQ) and len(params) == 3:
        return _rounding(out_type, params, mul, add, post_params if post else None)
    return _chain(ops.ACTIVATIONS[act] if act else None, params, mul, add, ops.ACTIVATIONS[post] if post else None,
                  post_params)


def _residual(finish: Callable[[np.ndarray, tuple], None] | None, out_type: TensorType | None,
              params: list[float]) -> Callable[[np.ndarray], Callable[[np.ndarray, tuple], None]]:
    """``fn(z)``: the epilogue of one run with residual ``z``: ``finish``, then + z and the rounding, per tile."""
    rounding = _rounding(out_type, [float(v) for v in params], None, None, None)

    def with_z(z: np.ndarray) -> Callable[[np.ndarray, tuple], None]:
        def epilogue(y: np.ndarray, region: tuple) -> None:
            if finish is not None:
                finish(y, region)
            part = y[region]
            np.add(part, z[region], out=part)
            rounding(y, region)

        return epilogue

    return with_z


def _registered_dequantize(wq: np.ndarray, ws: np.ndarray, wz: np.ndarray | None, axis: int,
                           name: str) -> Callable[..., np.ndarray] | None:
    """``fn(wq, ws, wz, out=)``: the registered DequantizeLinear kernel for this weight when it writes into ``out``
    (a plugin's compiled one pass, minfer-ops-numba's), else None: the numpy steps below are as fast as the numpy
    kernel's. Either computes DequantizeLinear's float32 ``(w - zp) * scale``: the same bits."""
    types = (TensorType(wq.dtype, wq.shape), TensorType(ws.dtype, ws.shape),
             None if wz is None else TensorType(wz.dtype, wz.shape))
    ctx = KernelContext(name, "DequantizeLinear", ops.NEWEST, types, (TensorType(np.dtype(np.float32), wq.shape),),
                        (None, ws, wz), 1)
    found = get_registry().select_kernel("", "DequantizeLinear", ops.NEWEST, "numpy", ctx, {"axis": axis})
    if found is None or not found.out:
        return None
    return found.prepared(ctx, {"axis": axis})


def _dequantizer(wq: np.ndarray, ws: np.ndarray, wz: np.ndarray | None, axis: int, name: str) -> Callable[[], np.ndarray]:
    """``fn()``: DequantizeLinear(wq, ws, wz) in this thread's scratch, as DequantizeLinear rounds it (float32)."""
    scale, zero = _layout(ws, wz, wq.ndim, axis % wq.ndim)

    rows = wq.shape[0]

    def row_of(v: np.ndarray | None, lo: int, hi: int) -> np.ndarray | None:
        """Rows lo:hi of a scale or zero point that varies along axis 0, else all of it (it broadcasts)."""
        return v[lo:hi] if v is not None and v.shape[0] > 1 else v

    compiled = _registered_dequantize(wq, ws, wz, axis % wq.ndim, name)
    lengthwise = ws.size > 1 and axis % wq.ndim == 0  # a scale (and zero point) per row: sliced with the rows

    def cut(v: np.ndarray | None, lo: int, hi: int) -> np.ndarray | None:
        # all rows: the array itself, which a kernel may know as the node's constant (minfer-ops-numba's keeps its layout)
        return v[lo:hi] if lengthwise and v is not None and v.size > 1 and (lo, hi) != (0, rows) else v

    def part(wf: np.ndarray, lo: int, hi: int) -> None:
        if compiled is not None:
            compiled(wq[lo:hi], cut(ws, lo, hi), cut(wz, lo, hi), out=wf[lo:hi])
            return
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


def _holds_float(base: str, wq: np.ndarray, attrs: dict) -> bool:
    """Whether the weight is dequantized once, at build, and held as float32: a depthwise conv's (a few KB, and the
    base op's kernels for constant weights are the fast ones there: taps packed once, numba's loops)."""
    return base == "Conv" and wq.ndim > 2 and wq.shape[1] == 1 and int(attrs.get("group", 1)) == wq.shape[0] > 1


def _base_kernel(ctx: Any, base: str, w_shape: tuple[int, ...], weight: np.ndarray | None, bias: np.ndarray | None,
                 attrs: dict) -> tuple[Any, Any, list[np.ndarray | None]]:
    """The base op's kernel as the core picks it for a node with these constants (``weight``: the float weight when
    held, else None: a per-run one), its record, and the constants it does not pack (passed from here each run)."""
    types = tuple(ctx.input_types) + (None,) * 5
    consts = (None, weight, bias)[: ops.ARITY[base]]
    inner_ctx = KernelContext(ctx.node_name, base, ops.NEWEST, (types[0], TensorType(np.float32, w_shape), types[4])[
        : ops.ARITY[base]], tuple(ctx.output_types), consts, 1)
    found = prepare_node(get_registry(), inner_ctx, attrs)
    if found is None:
        raise KernelError(f"{ctx.node_name}: ai.minfer::{DEQUANT[base]} needs a kernel for {base}; none is installed")
    inner, fn = found
    return inner, fn, [None if v is None or (inner.prepare and i in inner.packed) else v for i, v in enumerate(consts)]


def _dequant(base: str) -> Callable[..., Any]:
    """The factory of Dequant{base}: dequantize the int8 weight into scratch, run {base}'s kernel, then the epilogue."""

    def factory(ctx: Any, *, axis: int = 1, activation: str = "", activation_params: list[float] | None = None,
                post_activation: str = "", post_activation_params: list[float] | None = None,
                residual_params: list[float] | None = None, **attrs: Any) -> Any:
        c = tuple(ctx.constants) + (None,) * 8
        zp_computed = len(ctx.input_types) > 3 and ctx.input_types[3] is not None and c[3] is None
        if c[1] is None or c[2] is None or zp_computed:
            raise KernelError(f"{ctx.node_name}: ai.minfer::{DEQUANT[base]} needs its weight, scale and zero point as "
                              f"initializers (the qdq_fusion pass only creates it so); got a computed one")
        dequantized = _dequantizer(c[1], c[2], c[3], axis, f"minfer_passes-dequant-{base}")
        weight = dequantized().copy() if _holds_float(base, c[1], attrs) else None
        inner, fn, held = _base_kernel(ctx, base, c[1].shape, weight, c[4], attrs)
        # the weight each run: dequantized now, or the one held at build (None when the base kernel packed it)
        weight_now = dequantized if weight is None else (lambda: held[1])
        out_type = ctx.output_types[0] if ctx.output_types else None
        finish = _epilogue(out_type, activation, [float(v) for v in activation_params or []], c[5], c[6],
                           post_activation, [float(v) for v in post_activation_params or []])
        residual = None if residual_params is None else _residual(finish, out_type, residual_params)
        del ctx, c, weight, dequantized

        def run(x, w=None, s=None, zp=None, b=None, m=None, a=None, z=None, *, out=None):
            wf = weight_now()
            args = (x, wf) if len(held) == 2 else (x, wf, b if held[2] is None else held[2])
            epilogue = finish if residual is None or z is None else residual(z)
            if inner.epilogue and inner.out:
                return fn(*args, out=out, epilogue=epilogue)
            y = fn(*args, out=out) if inner.out else fn(*args)
            if out is not None and y is not out:
                np.copyto(out, y)
                y = out
            if epilogue is not None:
                epilogue(y, (slice(None),) * y.ndim)  # the base kernel declared out=, views=False: y is its own
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
              post_activation: str = "", post_activation_params: Any = None, residual_params: Any = None,
              **attrs: Any) -> list[TensorType | None]:
        """The base op's inference on X and the dequantized weight's type (the epilogue keeps the output's)."""
        w = None if wq is None or x is None else TensorType(x.dtype, wq.shape)
        bias = rest[2:3] if base != "MatMul" else ()
        return float_infer(x, w, *bias, **attrs)

    return infer


OPS = [
    op(QDQ, domain=MINFER_DOMAIN, doc="QuantizeLinear then DequantizeLinear (per tensor) as one rounding step; "
       "optionally then * M, + A and a second rounding (the Dequant* epilogue)"),
    *[op(name, domain=MINFER_DOMAIN, infer=_infer_dequant(base), doc=f"{base} of an int8 weight, dequantized per run")
      for base, name in DEQUANT.items()],
]


# ---- --portable: back to standard ops --------------------------------------------------------------------------

FLOAT_FUSED = ("FusedConv", "FusedGemm", "FusedMatMul", "ChannelAffine")


def qdq_nodes(graph: Graph, x: str, out: str, scale: float, low: float, high: float, name: str) -> list[Node]:
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
        return qdq_nodes(graph, src, out, *params, name=name)
    return [activation_node(graph, act, params, src, out, name)]


def _lower_dequant(graph: Graph, node: Node) -> None:
    """Dequant{Conv,Gemm,MatMul} -> DequantizeLinear(W) -> the base op -> activation -> Mul/Add -> post activation."""
    attrs = dict(node.attrs)
    axis = attrs.pop("axis", 1)
    stages = [(attrs.pop("activation", ""), list(attrs.pop("activation_params", [])))]
    post = (attrs.pop("post_activation", ""), list(attrs.pop("post_activation_params", [])))
    residual = list(attrs.pop("residual_params", []))
    base = next(b for b, name in DEQUANT.items() if name == node.op_type)
    inputs = (list(node.inputs) + [""] * 8)[:8]
    name = node.name or node.op_type
    w = fresh(graph, f"{name}_w")
    weight = inputs[1:4] if inputs[3] else inputs[1:3]
    new = [Node("DequantizeLinear", weight, [w], {"axis": axis}, fresh(graph, f"{name}_dq"))]
    args = [inputs[0], w] + ([inputs[4]] if base != "MatMul" and inputs[4] else [])
    steps: list[tuple[str, list, list[float]]] = [(a, [], p) for a, p in stages if a]
    steps += [(op_type, [value], []) for op_type, value in (("Mul", inputs[5]), ("Add", inputs[6])) if value]
    steps += [(post[0], [], post[1])] if post[0] else []
    steps += [("Add", [inputs[7]], []), (QDQ, [], residual)] if inputs[7] else []
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
            graph.replace([node], _lower_rounding(graph, node))
            changed = True
    return changed


def _lower_rounding(graph: Graph, node: Node) -> list[Node]:
    """QuantizeDequantize(X, [M], [A]; [post_*]) -> Q/DQ [-> Mul M] [-> Add A] [-> Q/DQ on the post grid]."""
    a, name = node.attrs, node.name or "qdq"
    steps = [(op_type, v) for op_type, v in zip(("Mul", "Add"), (list(node.inputs) + ["", ""])[1:3]) if v]
    grids = [(a["scale"], a["low"], a["high"])] + ([(a["post_scale"], a["post_low"], a["post_high"])]
                                                   if a.get("post_scale") else [])
    last = len(steps) + len(grids) - 1
    t = graph.type_of(node.outputs[0])
    src, nodes = node.inputs[0], []
    for k, step in enumerate([grids[0], *steps, *grids[1:]]):
        dst = node.outputs[0] if k == last else fresh(graph, f"{name}_s{k}")
        if t is not None:
            graph.types[dst] = t
        if isinstance(step[1], str):
            nodes.append(Node(step[0], [src, step[1]], [dst], {}, fresh(graph, f"{name}_{step[0].lower()}")))
        else:
            nodes.extend(qdq_nodes(graph, src, dst, *step, name=fresh(graph, f"{name}_r{k}")))
        src = dst
    return nodes
