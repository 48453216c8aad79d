"""Hypothesis strategies for graphs with control flow: If and Loop nodes whose bodies read outer values.

- `BodyBuilder`: a `GraphBuilder` for a subgraph (names of its own, reads of
  the enclosing graph's values allowed, output types declared).
- `if_motif`, `loop_motif`: motifs for `strategies.graphs` (a value of the
  input's shape computed through an If or a Loop).
- `constant_if_graphs`: If nodes whose condition is a constant (or, for
  contrast, computed from an input), the target of a constant-If pass.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from hypothesis import strategies as st

from ..graph import Graph
from ..tensor import TensorType
from .builder import GraphBuilder

UNARY = ("Relu", "Neg", "Abs", "Sigmoid", "Tanh")


class BodyBuilder(GraphBuilder):
    """Build a subgraph: value names carry ``prefix`` (so none shadows an outer one) and nodes may read
    values of the enclosing graph; `body` declares the outputs' types and returns the Graph."""

    def __init__(self, opset: int, prefix: str) -> None:
        super().__init__(opset, name=prefix)
        self.prefix = prefix

    def _name(self, base: str) -> str:
        return f"{self.prefix}_{super()._name(base)}"

    def typed_input(self, t: TensorType) -> str:
        """A body input of type ``t`` (a Loop's iteration number, condition, carried values)."""
        name = self._name("in")
        self.graph.inputs.append(name)
        self.graph.types[name] = t
        return name

    def body(self, outputs: Sequence[str], types: Sequence[TensorType]) -> Graph:
        """The subgraph returning ``outputs``, declared with ``types``."""
        self.graph.outputs = list(outputs)
        for name, t in zip(outputs, types):
            self.graph.types.setdefault(name, t)
        return self.graph


def _unary_chain(draw: Any, b: GraphBuilder, x: str, dtype: Any, ops: Sequence[str]) -> str:
    """One to two drawn unary ops, sometimes an Add of a scalar constant of the body's own."""
    y = x
    for _ in range(draw(st.integers(1, 2))):
        y = b.op(draw(st.sampled_from(list(ops))), y)
    if draw(st.booleans()):
        y = b.op("Add", y, b.const(np.asarray(draw(st.floats(-1, 1, width=32)), dtype)))
    return y


def _ops(opset: int) -> list[str]:
    from .strategies import has_kernels

    return [op for op in UNARY if has_kernels(op, opset=opset)]


def _branch(draw: Any, b: GraphBuilder, x: str, shape: tuple[int, ...], dtype: Any, tag: str,
            outputs: int = 1) -> Graph:
    """A branch of an If reading outer ``x``: its results (sometimes one value twice, or ``x`` itself)."""
    body = BodyBuilder(b.graph.opsets.get("", 17), f"{b._name(tag)}")
    y = _unary_chain(draw, body, x, dtype, _ops(body.graph.opsets[""]) or ["Identity"])
    results = [y] + [draw(st.sampled_from([y, x, _unary_chain(draw, body, y, dtype, ["Neg"])])) for _ in range(outputs - 1)]
    return body.body(results, [TensorType(dtype, shape)] * outputs)


def if_node(draw: Any, b: GraphBuilder, x: str, shape: tuple[int, ...], dtype: Any, cond: str,
            outputs: int = 1) -> Any:
    """An If on ``cond`` whose branches compute from outer ``x``; its output name (a tuple for several)."""
    then_g = _branch(draw, b, x, shape, dtype, "then", outputs)
    else_g = _branch(draw, b, x, shape, dtype, "else", outputs)
    return b.op("If", cond, outputs=outputs, then_branch=then_g, else_branch=else_g)


def computed_condition(b: GraphBuilder, x: str, dtype: Any) -> str:
    """A bool scalar computed from ``x`` (its mean > 0): a condition no pass can know."""
    mean = b.op("ReduceMean", x, keepdims=0)
    return b.op("Greater", mean, b.const(np.asarray(0, dtype)))


def if_motif(draw: Any, b: GraphBuilder, x: str, shape: tuple[int, ...], dtype: Any) -> str:
    """A motif for `strategies.graphs`: an If (constant or computed condition) over ``x``."""
    if draw(st.booleans()):
        cond = b.const(np.asarray(draw(st.booleans())))
    else:
        cond = computed_condition(b, x, dtype)
    return if_node(draw, b, x, shape, dtype, cond)


def loop_motif(draw: Any, b: GraphBuilder, x: str, shape: tuple[int, ...], dtype: Any) -> str:
    """A motif for `strategies.graphs`: a Loop of 0-3 trips carrying ``x`` through drawn ops that read
    an outer value too; its per-iteration values (a scan output) are sometimes a graph output."""
    opset = b.graph.opsets.get("", 17)
    body = BodyBuilder(opset, b._name("body"))
    body.typed_input(TensorType(np.int64, ()))
    cond_in = body.typed_input(TensorType(np.bool_, ()))
    v = body.typed_input(TensorType(dtype, shape))
    y = _unary_chain(draw, body, body.op("Add", v, x) if draw(st.booleans()) else v, dtype, _ops(opset) or ["Identity"])
    cond_out = body.op("Identity", cond_in)
    graph = body.body([cond_out, y, y], [TensorType(np.bool_, ()), TensorType(dtype, shape), TensorType(dtype, shape)])
    trips = b.const(np.asarray(draw(st.integers(0, 3)), np.int64))
    final, scanned = b.op("Loop", trips, "", x, outputs=2, body=graph)
    if draw(st.integers(0, 3)) == 0:
        b.output(scanned)
    return final


@st.composite
def constant_if_graphs(draw: Any) -> Graph:
    """If nodes whose condition is a constant (the pass inlines them), in random context.

    Sometimes the condition is a Constant node (folding makes it an
    initializer first) or computed from the input (nothing to inline); a
    branch may return an outer value or one value twice; the If output may
    be a graph output or read twice.
    """
    from .strategies import expose, shapes

    b = GraphBuilder(opset=draw(st.sampled_from([13, 17])))
    dtype = draw(st.sampled_from([np.float32, np.float64]))
    shape = draw(shapes(1, 3))
    x = b.input(shape, dtype)
    how = draw(st.sampled_from(["initializer", "initializer", "Constant", "computed"]))
    if how == "computed":
        cond = computed_condition(b, x, dtype)
    else:
        value = np.asarray(draw(st.booleans()))
        cond = b.const(value) if how == "initializer" else b.op("Constant", value=value)
    outputs = draw(st.integers(1, 2))
    res = if_node(draw, b, x, shape, dtype, cond, outputs)
    first = res if outputs == 1 else res[0]
    expose(draw, b, first)
    b.output(b.op("Neg", first))
    if outputs == 2:
        b.output(res[1])
    return b.build()
