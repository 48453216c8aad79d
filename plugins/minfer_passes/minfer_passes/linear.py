"""``matmul_bias_fusion``: a transformer's linear layer, ``MatMul`` + bias (+ residual) (+ activation), as one node.

Pattern (float32 or float64, every intermediate read once and no graph output):

    Y = MatMul(A, W)             W a 2-D constant, A of rank >= 2
    Y = Y + C                    C a constant that broadcasts into Y without growing it (a bias), either order
    Y = Y + Z                    optional: Z a tensor of exactly Y's shape (a residual), either order
    Y = act(Y)                   optional: ai.minfer::Gelu, or one of activation_fusion's activations

which is what exporters write for ``nn.Linear`` on a (batch, seq, features)
input, where ``matmul_add_to_gemm`` does not apply (Gemm takes rank 2).
Replacement: ``ai.minfer::FusedMatMulBias(A, W, C, [Z])`` with ``activation``
and ``activation_params`` as activation_fusion records them.

The kernel runs the registered MatMul kernel into the planned buffer and
adds C, adds Z and applies the activation on each part of the output as the
product hands it over (its ``epilogue``), while the part is in cache and on
the thread that computed it (GELU: on the whole output after the product,
see the kernel): the same operations in the same order as the nodes it
replaces, so exact but for the product's own summation order.
Two to four nodes and their passes over memory become one (the transformer
block's bias Adds, its residual Adds and its GELU).

``--portable`` lowers it back to MatMul, Add, [Add], [the activation].
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from minfer_core import Graph, KernelContext, Node, get_registry, kernel, op, parallel_for, prepare_node, spmd

from . import gelu
from ._util import (
    MINFER_DOMAIN, broadcasts_into, const, dims_of, dtype_of, fresh, has_kernel, is_op, other_input, same_shape,
)
from .activation import ACTIVATIONS as STANDARD_ACTIVATIONS
from .activation import _params, activation_node
from .ops import ACTIVATIONS, NEWEST, _infer_as

OP = "FusedMatMulBias"
DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

# ---- the pass ------------------------------------------------------------------------------------


def _next(graph: Graph, value: str) -> Node | None:
    """The sole reader of ``value`` when value is not a graph output."""
    return None if value in graph.outputs else graph.sole_consumer(value)


def _base(graph: Graph, mm: Node) -> tuple[Node, str] | None:
    """(the bias Add, C) when ``mm`` is a MatMul of a 2-D constant followed by the Add of a constant bias."""
    y = mm.outputs[0]
    dims, a_dims = dims_of(graph, y), dims_of(graph, mm.inputs[0])
    w = const(graph, mm.inputs[1])
    if (dims is None or a_dims is None or len(a_dims) < 2 or w is None or w.ndim != 2
            or dtype_of(graph, y) not in DTYPES):
        return None
    add = _next(graph, y)
    c_name = other_input(add, y) if is_op(add, "Add") else None  # type: ignore[arg-type]
    c = const(graph, c_name or "")
    if c is None or c.dtype != dtype_of(graph, y) or not broadcasts_into(c.shape, dims):
        return None
    return add, c_name  # type: ignore[return-value]


def _activation(graph: Graph, node: Node | None, src: str) -> tuple[str, list[float]] | None:
    """(activation name, params) when ``node`` applies a fusable activation to ``src``."""
    if node is None or not node.inputs or node.inputs[0] != src or len(node.outputs) != 1:
        return None
    if node.domain == MINFER_DOMAIN and node.op_type == gelu.OP and dtype_of(graph, src) == np.float32:
        return gelu.OP, []
    if is_op(node, *STANDARD_ACTIVATIONS):
        params = _params(graph, node)
        return None if params is None else (node.op_type, params)
    return None


def _match(graph: Graph, mm: Node) -> tuple[list[Node], list[str], dict[str, Any], str] | None:
    """(nodes replaced, the fused node's inputs, its attributes, its output) when ``mm`` starts the pattern,
    or when ``mm`` is a FusedMatMulBias without residual nor activation that a residual Add now follows
    (shape inference proved its shape after a first round)."""
    if mm.domain == MINFER_DOMAIN:
        if len(mm.inputs) > 3 or mm.attrs.get("activation"):
            return None
        nodes, inputs, y = [mm], list(mm.inputs), mm.outputs[0]
    else:
        found = _base(graph, mm)
        if found is None:
            return None
        add, c = found
        nodes, inputs, y = [mm, add], [*mm.inputs, c], add.outputs[0]
    residual = _next(graph, y)
    z = other_input(residual, y) if is_op(residual, "Add") else None  # type: ignore[arg-type]
    if z is not None and same_shape(graph, z, y) and same_shape(graph, y, residual.outputs[0]):  # type: ignore[union-attr]
        nodes.append(residual)  # type: ignore[arg-type]
        inputs.append(z)
        y = residual.outputs[0]  # type: ignore[union-attr]
    act = _next(graph, y)
    found_act = _activation(graph, act, y)
    attrs: dict[str, Any] = {}
    if found_act is not None:
        nodes.append(act)  # type: ignore[arg-type]
        attrs = {"activation": found_act[0], "activation_params": found_act[1]}
        y = act.outputs[0]  # type: ignore[union-attr]
    return (nodes, inputs, attrs, y) if len(nodes) > 1 else None


def matmul_bias_fusion(graph: Graph) -> bool:
    """Fuse MatMul by a constant + bias Add (+ residual Add) (+ activation) into ai.minfer::FusedMatMulBias."""
    if not has_kernel(graph, MINFER_DOMAIN, OP) or not has_kernel(graph, "", "MatMul"):
        return False
    changed = False
    for mm in list(graph.nodes):
        if mm not in graph.nodes or not (is_op(mm, "MatMul") or mm.domain == MINFER_DOMAIN and mm.op_type == OP):
            continue
        found = _match(graph, mm)
        if found is None:
            continue
        nodes, inputs, attrs, y = found
        graph.opsets.setdefault(MINFER_DOMAIN, 1)
        graph.replace(nodes, Node(OP, inputs, [y], attrs, mm.name, MINFER_DOMAIN))
        changed = True
    return changed


# ---- the kernel ----------------------------------------------------------------------------------


def _activation_fn(name: str) -> Callable[[np.ndarray, list[float]], None] | None:
    """The in-place activation an epilogue applies to each part (Gelu is applied to the whole: see the kernel)."""
    return ACTIVATIONS[name] if name and name != gelu.OP else None


def _base_matmul(ctx: Any) -> tuple[Any, Callable[..., Any], np.ndarray | None]:
    """The registered MatMul kernel for this node's A and W (as FusedMatMul finds it), and the W the fused
    kernel must pass itself (a copy, when the selected kernel does not pack W: the engine frees the original)."""
    consts = list(ctx.constants[:2]) + [None] * (2 - len(ctx.constants[:2]))
    inner_ctx = KernelContext(ctx.node_name, "MatMul", NEWEST, tuple(ctx.input_types[:2]), (None,), tuple(consts), 1)
    found = get_registry().kernel_candidates("", "MatMul", NEWEST, "numpy", inner_ctx, {})
    if not found:
        raise LookupError(f"{OP} needs a kernel for MatMul; none is installed")
    held = None
    if consts[1] is not None and not all(k.prepare and 1 in k.packed for k in found):
        consts[1] = held = np.array(consts[1], copy=True)
    inner_ctx = KernelContext(ctx.node_name, "MatMul", NEWEST, tuple(ctx.input_types[:2]), (None,), tuple(consts), 1)
    inner, fn = prepare_node(get_registry(), inner_ctx, {})  # type: ignore[misc]
    return inner, fn, held


@kernel(OP, domain=MINFER_DOMAIN, prepare=True, out=True, views=False, packed=(1,))
def fused_matmul_bias(ctx, *, activation="", activation_params=None):
    """ai.minfer::FusedMatMulBias-1: activation(A @ W + C + Z), C and Z added per finished part of the product."""
    inner, fn, held = _base_matmul(ctx)
    act = _activation_fn(activation)
    params = [float(v) for v in (activation_params or [])]
    takes_epilogue = inner.epilogue and inner.out
    # GELU takes ~14 numpy calls per block of a part: two threads making them contend for the GIL, which made
    # FFN1 of the transformer block slower split than whole, so it runs after the product on the whole output,
    # in ranges as `gelu.gelu32` splits them (long ones only). The epilogue keeps the two Adds (one call each).
    after = _gelu_after(_gelu_ranges(ctx)) if activation == gelu.OP else None

    # C broadcast to each output shape, kept across runs (np.broadcast_to costs a few microseconds, as much as
    # the bias Add on a 128x256 output); the value holds C itself, so its id stays its own
    broadcasts: dict[tuple[int, tuple[int, ...]], tuple[np.ndarray, np.ndarray]] = {}

    def full_c(c: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        found = broadcasts.get((id(c), shape))
        if found is None:
            if len(broadcasts) > 16:
                broadcasts.clear()
            found = broadcasts[(id(c), shape)] = (c, np.broadcast_to(c, shape))  # racing threads: the same view
        return found[1]

    def run(a, w, c, z=None, *, out=None):
        w = held if held is not None else w  # None when the base kernel packed W (packed=(1,))

        def finish(y: np.ndarray, region: tuple[slice, ...]) -> None:
            part = y[region]
            np.add(part, full_c(c, y.shape)[region], out=part)
            if z is not None:
                np.add(part, z[region], out=part)
            if act is not None:
                act(part, params)

        if takes_epilogue:
            y = fn(a, w, out=out, epilogue=finish)
        else:
            y = fn(a, w, out=out) if inner.out else fn(a, w)
            if out is not None and y is not out:
                np.copyto(out, y)
                y = out
            elif out is None and (not y.flags.writeable or not y.flags.c_contiguous or np.may_share_memory(y, a)):
                y = np.array(y, order="C")  # the epilogue writes into y (never an input's memory), GELU flat
            finish(y, (slice(None),) * y.ndim)
        return y if after is None else after(y)

    # the epilogue runs inside the base kernel's output parts, GELU in ranges that write only y: a process team
    # may share them when the base kernel may
    return spmd(run) if takes_epilogue and getattr(fn, "spmd", False) else run


def _gelu_ranges(ctx: Any) -> Callable[[np.ndarray, np.ndarray], Any]:
    """``fn(x, out)``, GELU of a 1-D float32 range: the registered ai.minfer::Gelu kernel when a plugin's writes in
    place and is not this plugin's own (minfer-ops-numba's one compiled pass), else `gelu.gelu_range`."""
    out_type = ctx.output_types[0] if ctx.output_types else None
    gelu_ctx = KernelContext(ctx.node_name, gelu.OP, 1, (out_type,), (out_type,), (None,), 1)
    kern = get_registry().select_kernel(MINFER_DOMAIN, gelu.OP, 1, "numpy", gelu_ctx, {}) if out_type else None
    if kern is None or kern.fn is gelu.gelu.fn or not kern.out or 0 not in kern.inplace:
        return gelu.gelu_range
    fn = kern.prepared(gelu_ctx, {})
    return lambda x, out: fn(x, out=out)


def _gelu_after(gelu_range: Callable[[np.ndarray, np.ndarray], Any]) -> Callable[[np.ndarray], np.ndarray]:
    """``after(y)``: GELU of the contiguous float32 ``y`` in place, in `gelu.SPLIT`-element ranges over the threads
    from two ranges up (as `gelu.gelu32`), else as one range: every write of y inside a range (the `spmd` contract)."""

    def after(y: np.ndarray) -> np.ndarray:
        flat, n, step = y.reshape(-1), y.size, gelu.SPLIT
        count = -(-n // step) if n >= 2 * step else 1
        size = step if count > 1 else n

        def part(lo: int, hi: int) -> None:
            gelu_range(flat[lo * size : min(n, hi * size)], flat[lo * size : min(n, hi * size)])

        parallel_for(count, part, parts=None if count > 1 else 1, outputs_only=True)
        return y

    return after


def _infer(a: Any, w: Any, c: Any = None, z: Any = None, **attrs: Any) -> list[Any]:
    """MatMul's output type: C and Z never change it (the pass checks they broadcast into it)."""
    return _infer_as("MatMul")(a, w)


KERNELS = [fused_matmul_bias]
OPS = [op(OP, domain=MINFER_DOMAIN, infer=_infer,
          doc="activation(MatMul(A, W) + C + Z): a linear layer with its bias, residual and activation, in one kernel")]


# ---- --portable ----------------------------------------------------------------------------------


def expand_matmul_bias(graph: Graph, node: Node) -> None:
    """FusedMatMulBias -> MatMul, Add C, [Add Z], [the activation]: the nodes the pass fused."""
    name = node.name or OP
    t = graph.type_of(node.outputs[0])
    act = node.attrs.get("activation", "")
    params = [float(p) for p in node.attrs.get("activation_params", [])]
    steps: list[tuple[str, list[str]]] = [("MatMul", list(node.inputs[:2])), ("Add", [node.inputs[2]])]
    if len(node.inputs) > 3 and node.inputs[3]:
        steps.append(("Add", [node.inputs[3]]))
    if act:
        steps.append((act, []))
    new: list[Node] = []
    src = ""
    for k, (op_type, extra) in enumerate(steps):
        dst = node.outputs[0] if k == len(steps) - 1 else fresh(graph, f"{name}_{op_type.lower()}")
        if t is not None and dst != node.outputs[0]:
            graph.types[dst] = t
        step_name = node.name if k == 0 and node.name else fresh(graph, f"{name}_{op_type.lower()}")
        if op_type == gelu.OP:
            new.append(Node(gelu.OP, [src], [dst], {}, step_name, MINFER_DOMAIN))
        elif k == len(steps) - 1 and act and op_type == act:
            new.append(activation_node(graph, act, params, src, dst, step_name))
        else:
            new.append(Node(op_type, extra if op_type == "MatMul" else [src, *extra], [dst], {}, step_name, ""))
        src = dst
    graph.replace([node], new)
    if act == gelu.OP:
        gelu.expand_gelu(graph, new[-1])


# ---- property-suite patterns ---------------------------------------------------------------------


def patterns() -> Any:
    """The pass's target strategy: MatMul + bias (+ residual) (+ activation) in random context.

    Ranks 2 to 4, biases of every broadcastable shape (and some that grow the output or are not
    constants), residuals of the output's shape or a broadcast one, a GELU or a standard activation;
    sometimes an intermediate is a graph output or read twice (nothing fuses there).
    """
    import math

    from hypothesis import strategies as st

    from minfer_core.testing import GraphBuilder
    from minfer_core.testing.strategies import expose, floats_array, has_kernels, loosen

    @st.composite
    def graphs(draw: Any) -> Any:
        b = GraphBuilder(opset=17)
        dtype = draw(st.sampled_from([np.float32, np.float32, np.float64]))
        lead = tuple(draw(st.integers(1, 3)) for _ in range(draw(st.integers(0, 2))))
        m, k, n = (draw(st.integers(1, 5)) for _ in range(3))
        x = b.input((*lead, m, k), dtype)
        loosen(draw, b, x)  # a symbolic or unknown leading dim: a bias of (m, n) or (2, m, n) must then stay an Add
        y = b.op("MatMul", x, b.const(draw(floats_array((k, n))).astype(dtype)))
        expose(draw, b, y)
        cshape = draw(st.sampled_from([(n,), (1, n), (1,), (m, n), (m, 1), (2, m, n)]))
        c = draw(floats_array(cshape)).astype(dtype)
        y = b.op("Add", *((y, b.const(c)) if draw(st.booleans()) else (b.const(c), y)))
        if draw(st.booleans()):
            expose(draw, b, y)
            z = b.input(draw(st.sampled_from([(*lead, m, n), (n,)])), dtype)
            y = b.op("Add", *((y, z) if draw(st.booleans()) else (z, y)))
        kind = draw(st.sampled_from(["none", "gelu", "erf", "relu", "tanh"]))
        if kind == "gelu":  # as gelu_fusion leaves it (float64 has no fusable Gelu: it stays a node)
            expose(draw, b, y)
            y = b.op(gelu.OP, y, domain=MINFER_DOMAIN)
        elif kind == "erf":
            expose(draw, b, y)
            s = b.op("Div", y, b.const(np.asarray(math.sqrt(2), dtype)))
            a = b.op("Add", b.op("Erf", s), b.const(np.asarray(1.0, dtype)))
            y = b.op("Mul", b.op("Mul", y, a), b.const(np.asarray(0.5, dtype)))
        elif kind != "none":
            expose(draw, b, y)
            y = b.op({"relu": "Relu", "tanh": "Tanh"}[kind], y)
        b.output(b.op("Neg", y) if has_kernels("Neg") else y)
        return b.build()

    return graphs()
