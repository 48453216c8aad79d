"""``lookup_fusion``: elementwise ops on a value of at most 257 possible values, as one table lookup.

A quantized model spells a float activation between two integer layers as a
chain of elementwise ops on a value that can take only a few values: a
transformer's GELU in a QOperator model is ``DequantizeLinear -> Div -> Erf
-> QuantizeLinear -> QLinearAdd -> QLinearMul(x, .) -> QLinearMul`` from one
uint8 tensor to another (256 values in, 256 out); in a QDQ model it is the
same chain, with a rounding after each op, from a float value on a rounding's
grid (``k * scale`` for integers ``k`` in ``[low, high]``). Such a chain is a
function of one 8-bit value: ``ai.minfer::Lookup`` computes it as ``T[index]``,
one pass over the data instead of ~40 (the QDQ transformer block's GELU
took 0.67 ms of 2.6; its lookup ~0.1).

Pattern: a seed value V, either 8-bit integer or the float32 output of a
rounding (a QuantizeDequantize, or a node whose epilogue ends in one: see
`qdq._grid_of`), of static shape; the region grown from V: nodes of
`ELEMENTWISE` whose every input is V, a region node's output or a constant
of one element (so every output has V's shape and each element depends only
on V's element at that position); exactly one region value is read outside
the region (or is a graph output): the exit, which the Lookup then
produces. Replacement: ``ai.minfer::Lookup(V, T; scale, low, high)`` with
T the region's outputs on every value V can take, computed at build by the
same registered kernels on a V-shaped array holding those values (each
element computed as the region computes it at run).

Exact (table of the same kernels' results), with one caveat that no test
sees: V = -0.0 (a rounding of a small negative value) looks up the entry
computed from +0.0; only ops that tell the zeros apart (1/x, atan2) could
differ. NaN in a float V has its own entry (the region's result on NaN).

``Lookup(X, T; scale, low, high)``: for 8-bit X, ``T[X - low]`` (``low`` the
type's minimum, T of 256 entries); for float X,
``T[clip(rint(X / scale), low, high) - low]``, NaN to ``T[high - low + 1]``.
``--portable`` lowers it to Cast/Sub (or Div, Round, Clip, Sub, IsNaN,
Where, Cast) and ``Gather(T, index)``.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import Graph, Node, TensorType, kernel, op

from ._util import MINFER_DOMAIN, add_const, const, fresh, has_kernel, opset, run_node, shape_of

OP = "Lookup"
INT8 = (np.dtype(np.int8), np.dtype(np.uint8))
# ops whose output element depends only on their inputs' elements at the same position (constants being scalars)
ELEMENTWISE = {
    "": {"Abs", "Add", "Cast", "Ceil", "Celu", "Clip", "Cos", "DequantizeLinear", "Div", "Elu", "Erf", "Exp", "Floor",
         "Gelu", "HardSigmoid", "HardSwish", "Identity", "LeakyRelu", "Log", "Max", "Min", "Mish", "Mul", "Neg",
         "Pow", "QuantizeLinear", "Reciprocal", "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Softplus",
         "Softsign", "Sqrt", "Sub", "Tanh", "ThresholdedRelu"},
    "com.microsoft": {"QLinearAdd", "QLinearMul", "QLinearSigmoid", "QLinearLeakyRelu"},
    MINFER_DOMAIN: {"BinaryScalar", "FusedElementwise", "Gelu", "QuantizeDequantize", "WeightedSum"},
}
# a region of only these is as cheap as the lookup: left alone
CHEAP = {"Identity", "Cast", "DequantizeLinear", "QuantizeDequantize"}


# ---- the pass ------------------------------------------------------------------------------------


def _grid(graph: Graph, value: str) -> tuple[float, float, float] | None:
    """(scale, low, high) of the rounding that produces float32 ``value``, or None."""
    from .qdq import _grid_of  # the QDQ passes' own reading of a rounding's grid

    node = graph.producer(value)
    if node is None or len(node.outputs) != 1 or graph.type_of(value) is None:
        return None
    if graph.type_of(value).dtype != np.float32:
        return None
    grid = _grid_of(node)  # a rounding's with * M, + A: none, unless a second rounding ends it (that one's grid)
    if grid is None or not grid[2] - grid[1] <= 255 or grid[0] <= 0:
        return None
    return grid


def _levels(graph: Graph, value: str) -> tuple[np.ndarray, dict[str, float]] | None:
    """Every value ``value`` can take (NaN last for a float) and the Lookup's attributes, or None (not a seed)."""
    t, shape = graph.type_of(value), shape_of(graph, value)
    if t is None or getattr(t, "dtype", None) is None or shape is None or 0 in shape:
        return None
    if t.dtype in INT8:
        info = np.iinfo(t.dtype)
        return np.arange(info.min, info.max + 1).astype(t.dtype), {"scale": 0.0, "low": float(info.min),
                                                                   "high": float(info.max)}
    grid = _grid(graph, value)
    if grid is None or opset(graph) < 11:  # the portable form needs Round and Clip's inputs
        return None
    scale, low, high = grid
    ks = np.arange(low, high + 1, dtype=np.float32)
    levels = np.append(ks * np.float32(scale), np.float32(np.nan)).astype(np.float32)  # as the rounding computes it
    return levels, {"scale": float(scale), "low": float(low), "high": float(high)}


def _member(graph: Graph, node: Node, values: set[str]) -> bool:
    """Whether ``node`` is elementwise on region ``values`` and one-element constants only."""
    if node.op_type not in ELEMENTWISE.get(node.domain, ()) or len(node.outputs) != 1 or not node.outputs[0]:
        return False
    if not any(name in values for name in node.inputs):
        return False
    for name in node.inputs:
        if name and name not in values:
            c = const(graph, name)
            if c is None or c.size != 1:
                return False
    return has_kernel(graph, node.domain, node.op_type)


def _region(graph: Graph, seed: str) -> tuple[list[Node], str] | None:
    """(the region's nodes in order, its exit) grown from ``seed`` (every node of its shape), or None when it has
    not exactly one exit."""
    values, nodes, shape = {seed}, [], shape_of(graph, seed)
    grown = True
    while grown:
        grown = False
        for value in list(values):
            for node in graph.consumers(value):
                if node in nodes or not _member(graph, node, values):
                    continue
                if shape_of(graph, node.outputs[0]) != shape:
                    continue  # a one-element constant of higher rank would grow the shape
                nodes.append(node)
                values.add(node.outputs[0])
                grown = True
    return _ordered(graph, nodes)


def _ordered(graph: Graph, nodes: list[Node]) -> tuple[list[Node], str] | None:
    """``nodes`` in graph order and their one exit (the one value read outside them), or None."""
    inside = set(nodes)
    exits = [n.outputs[0] for n in nodes if n.outputs[0] in graph.outputs
             or any(c not in inside for c in graph.consumers(n.outputs[0]))]
    if len(exits) != 1 or all(n.op_type in CHEAP for n in nodes):
        return None
    order = {id(n): i for i, n in enumerate(graph.topological_order())}
    return sorted(nodes, key=lambda n: order[id(n)]), exits[0]


def _evaluate(graph: Graph, nodes: list[Node], exit_: str, env: dict[str, np.ndarray]) -> np.ndarray | None:
    """The exit's value from ``env`` (the seeds' values), by the nodes' registered kernels; None when one fails."""
    try:
        with np.errstate(all="ignore"):
            for node in nodes:
                args = [env[n] if n in env else (const(graph, n) if n else None) for n in node.inputs]
                env[node.outputs[0]] = np.asarray(run_node(graph, node, args)[0])
    except Exception:
        return None  # a kernel that cannot run here: the region stays as it is, to report at run time
    return env[exit_]


def _table(graph: Graph, seed: str, nodes: list[Node], exit_: str, levels: np.ndarray) -> np.ndarray | None:
    """The exit's value for each of ``levels``, by the nodes' kernels on seed-shaped arrays holding them."""
    shape = shape_of(graph, seed)
    size = int(np.prod(shape, dtype=np.int64))
    parts = []
    for start in range(0, len(levels), max(size, 1)):
        chunk = levels[start : start + size]
        out = _evaluate(graph, nodes, exit_, {seed: np.resize(chunk, shape).astype(levels.dtype)})  # chunk in front
        if out is None or out.shape != tuple(shape):
            return None
        parts.append(out.reshape(-1)[: len(chunk)].copy())
    return np.concatenate(parts)


def _fuse(graph: Graph, seed: str) -> bool:
    """The region grown from ``seed`` as one Lookup of it (or of the rounding that makes it: `_own_rounding`)."""
    found = _levels(graph, seed)
    region = _region(graph, seed) if found is not None else None
    if found is None or region is None or not has_kernel(graph, MINFER_DOMAIN, OP):
        return False
    levels, attrs = found
    nodes, exit_ = region
    table = _table(graph, seed, nodes, exit_, levels)
    if table is None or table.dtype != graph.type_of(exit_).dtype:
        return False
    t = add_const(graph, f"{exit_}_table", table)
    graph.opsets.setdefault(MINFER_DOMAIN, 1)
    rounding = _own_rounding(graph, seed, nodes)
    if rounding is not None:  # the lookup rounds its input as that node does: it reads the node's input instead
        nodes, seed = [rounding, *nodes], rounding.inputs[0]
    graph.replace(nodes, Node(OP, [seed, t], [exit_], attrs, fresh(graph, f"{exit_}_lookup"), MINFER_DOMAIN))
    return True


def _own_rounding(graph: Graph, seed: str, nodes: list[Node]) -> Node | None:
    """The plain QuantizeDequantize producing float ``seed`` when only the region reads seed, else None.

    Lookup's index of a float X is clip(rint(X / scale), low, high) - low: that rounding's integer, so the lookup of
    the rounding's input is the lookup of its output (NaN and infinities too: rint keeps NaN, clip takes inf to
    a bound), and the rounding node goes.
    """
    from .qdq import _plain

    node = graph.producer(seed)
    if not _plain(node) or seed in graph.outputs:  # (with * M, + A or a second rounding, not its first grid)
        return None
    if _grid(graph, seed) is None or any(c not in nodes for c in graph.consumers(seed)):
        return None
    return node


def lookup_fusion(graph: Graph) -> bool:
    """Replace each chain of elementwise ops on an 8-bit value (or a rounding's float grid) by one table lookup."""
    changed = False
    for name in [*graph.inputs, *[o for n in graph.topological_order() for o in n.outputs if o]]:
        if name in graph.types and _fuse(graph, name):
            changed = True
    return changed


# ---- the op and its kernel ----------------------------------------------------------------------


def index_of(x: np.ndarray, scale: float, low: float, high: float) -> np.ndarray:
    """The table index of each element of ``x`` (see the module docstring)."""
    if x.dtype.kind in "iu":
        idx = x.astype(np.intp)
        return idx if low == 0 else np.subtract(idx, int(low), out=idx)
    q = np.divide(x, x.dtype.type(scale))
    np.rint(q, out=q)
    np.clip(q, low, high, out=q)
    q -= x.dtype.type(low)
    q[np.isnan(q)] = high - low + 1
    return q.astype(np.intp)


@kernel(OP, domain=MINFER_DOMAIN, out=True, views=False)
def lookup(x, table, *, scale=0.0, low=0.0, high=0.0, out=None):
    """ai.minfer::Lookup-1: T[X - low] for 8-bit X; T[clip(rint(X / scale), low, high) - low] for a float X."""
    return np.take(table, index_of(x, scale, low, high), out=out)


def _infer(x: TensorType | None, table: TensorType | None = None, **attrs: Any) -> list[TensorType | None]:
    """X's shape, T's dtype."""
    if x is None or table is None:
        return [None]
    return [TensorType(table.dtype, x.shape)]


KERNELS = [lookup]
OPS = [op(OP, domain=MINFER_DOMAIN, infer=_infer,
          doc="T[index of X]: a function of an 8-bit value (or of a value on a rounding's grid) as a table")]


# ---- --portable ----------------------------------------------------------------------------------


def _step(graph: Graph, new: list[Node], op_type: str, inputs: list[str], name: str, **attrs: Any) -> str:
    """Append ``op_type(inputs)`` to ``new``; returns its output."""
    out = fresh(graph, f"{name}_{op_type.lower()}")
    new.append(Node(op_type, inputs, [out], attrs, fresh(graph, f"{name}_{op_type.lower()}_node")))
    return out


def _int_index(graph: Graph, new: list[Node], x: str, low: float, name: str) -> str:
    """Cast(x, int32) [- low]: an 8-bit value's offset in the table."""
    idx = _step(graph, new, "Cast", [x], name, to=6)
    return _step(graph, new, "Sub", [idx, add_const(graph, f"{name}_low", np.int32(low))], name) if low else idx


def _grid_index(graph: Graph, new: list[Node], x: str, scale: float, low: float, high: float, name: str) -> str:
    """Cast(Where(IsNaN(q), high - low + 1, q), int64) with q = Clip(Round(x / scale), low, high) - low."""
    f32 = np.float32
    q = _step(graph, new, "Div", [x, add_const(graph, f"{name}_scale", f32(scale))], name)
    q = _step(graph, new, "Round", [q], name)
    bounds = [add_const(graph, f"{name}_lo", f32(low)), add_const(graph, f"{name}_hi", f32(high))]
    q = _step(graph, new, "Clip", [q, *bounds], name)
    q = _step(graph, new, "Sub", [q, add_const(graph, f"{name}_low", f32(low))], name)
    nan = _step(graph, new, "IsNaN", [q], name)
    q = _step(graph, new, "Where", [nan, add_const(graph, f"{name}_nan_index", f32(high - low + 1)), q], name)
    return _step(graph, new, "Cast", [q], name, to=7)


def expand_lookup(graph: Graph, node: Node) -> None:
    """Lookup -> the index in standard ops (`_int_index`, `_grid_index`) -> Gather."""
    x, table = node.inputs[0], node.inputs[1]
    a, name = node.attrs, node.name or OP
    scale, low, high = float(a.get("scale", 0.0)), float(a.get("low", 0.0)), float(a.get("high", 0.0))
    new: list[Node] = []
    if scale:
        idx = _grid_index(graph, new, x, scale, low, high, name)
    else:
        idx = _int_index(graph, new, x, low, name)
    new.append(Node("Gather", [table, idx], list(node.outputs), {"axis": 0}, node.name or fresh(graph, "gather")))
    graph.replace([node], new)


# ---- property-suite patterns ---------------------------------------------------------------------


def patterns() -> Any:
    """The pass's target strategy: elementwise chains on an 8-bit tensor or on a rounding's float grid.

    An 8-bit input through DequantizeLinear, Erf/Tanh/Mul/Add by scalars and QuantizeLinear (or a float
    input rounded by a QuantizeDequantize, then such ops and another rounding), in random context: an
    intermediate sometimes also read elsewhere or a graph output (then the region has two exits: no fusion).
    """
    from hypothesis import strategies as st

    from minfer_core.testing import GraphBuilder
    from minfer_core.testing.strategies import expose

    @st.composite
    def graphs(draw: Any) -> Any:
        b = GraphBuilder(opset=13)
        shape = tuple(draw(st.lists(st.integers(1, 5), min_size=1, max_size=3)))
        dtype = draw(st.sampled_from([np.uint8, np.int8]))
        scale = b.const(np.float32(draw(st.sampled_from([0.02, 0.05, 0.1]))))
        zp = b.const(np.asarray(draw(st.integers(-10, 10)) + (128 if dtype == np.uint8 else 0), dtype))
        if draw(st.booleans()):
            y = b.op("DequantizeLinear", b.input(shape, dtype), scale, zp)
        else:
            low, high = (0.0, 255.0) if dtype == np.uint8 else (-128.0, 127.0)
            y = b.op("QuantizeDequantize", b.input(shape), domain=MINFER_DOMAIN, scale=0.05, low=low, high=high)
        x = y
        for _ in range(draw(st.integers(1, 3))):
            kind = draw(st.sampled_from(["Erf", "Tanh", "Mul", "Add", "square"]))
            if kind in ("Erf", "Tanh"):
                y = b.op(kind, y)
            elif kind == "square":
                y = b.op("Mul", x, y)  # reads the start of the chain again, as GELU's x * (1 + erf)
            else:
                y = b.op(kind, y, b.const(np.float32(draw(st.sampled_from([0.5, 1.0, -2.0])))))
            expose(draw, b, y)
        if draw(st.booleans()):
            y = b.op("QuantizeLinear", y, scale, zp)
        b.output(y)
        return b.build()

    return graphs()
