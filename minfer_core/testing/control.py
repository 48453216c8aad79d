"""Hypothesis strategies for graphs with control flow: If and Loop nodes whose bodies read outer values.

- `BodyBuilder`: a `GraphBuilder` for a subgraph (names of its own, reads of
  the enclosing graph's values allowed, output types declared).
- `if_motif`, `loop_motif`, `scan_motif`: motifs for `strategies.graphs` (a
  value of the input's shape computed through an If, a Loop or a Scan).
- `if_node`, `computed_condition`: pieces for a pass's target strategy
  (minfer-passes' constant-If pass builds its own from them).

This module does not import `strategies` (which imports it for its motifs).
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
    from ..plugins import get_registry

    reg = get_registry()
    return [op for op in UNARY if reg.select_kernel("", op, opset) is not None]


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


def scan_motif(draw: Any, b: GraphBuilder, x: str, shape: tuple[int, ...], dtype: Any) -> str:
    """A motif for `strategies.graphs`: a Scan over axis 0 of ``x`` (forwards or backwards) with a running
    sum as its state; each step's output, stacked back, is the result (``x``'s shape)."""
    opset = b.graph.opsets.get("", 17)
    body = BodyBuilder(opset, b._name("cell"))
    step_type = TensorType(dtype, shape[1:])
    acc, x_t = body.typed_input(step_type), body.typed_input(step_type)
    acc_next = body.op("Add", acc, x_t)
    y = _unary_chain(draw, body, body.op("Mul", acc_next, x_t) if draw(st.booleans()) else x_t, dtype,
                     _ops(opset) or ["Identity"])
    graph = body.body([acc_next, y], [step_type, step_type])
    zeros = b.const(np.zeros(shape[1:], dtype))
    direction = draw(st.integers(0, 1))
    total, ys = b.op("Scan", zeros, x, outputs=2, body=graph, num_scan_inputs=1,
                     scan_input_directions=[direction], scan_output_directions=[direction])
    if draw(st.integers(0, 3)) == 0:
        b.output(total)
    return ys
