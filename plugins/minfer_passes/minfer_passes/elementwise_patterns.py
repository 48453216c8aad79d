"""Target strategy of ``elementwise_fusion`` for the property suite (``Pass.patterns``).

Imported only by the suite: hypothesis is a test dependency.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import strategies as st

from minfer_core.testing import GraphBuilder
from minfer_core.testing.strategies import expose, has_kernels

_UNARY = ("Neg", "Abs", "Tanh", "Sigmoid", "Relu", "HardSwish", "LeakyRelu", "HardSigmoid", "Clip", "Exp", "Sqrt",
          "Log", "Reciprocal", "Erf")
_BINARY = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Pow", "Where")


def _draw_step(draw: Any, b: GraphBuilder, v: str, x: str, shape: tuple[int, ...], dtype: Any) -> str:
    """One random elementwise op on ``v``: its other operand x itself, a constant, or a broadcasting input."""
    c = lambda value: b.const(np.asarray(value, dtype))  # noqa: E731
    name = draw(st.sampled_from(_UNARY + _BINARY))
    if name == "Erf" and not has_kernels("Erf"):
        name = "Tanh"
    if name in ("Sqrt", "Log", "Reciprocal"):  # keep away from nan and division by zero
        return b.op(name, b.op("Add", b.op("Abs", v), c(0.5)))
    if name == "Exp":
        return b.op(name, b.op("Tanh", v))
    if name == "LeakyRelu":
        return b.op(name, v, alpha=draw(st.sampled_from([0.01, 0.2, 1.5])))
    if name == "HardSigmoid":
        return b.op(name, v, alpha=draw(st.sampled_from([0.2, 0.5])), beta=draw(st.sampled_from([0.5, 0.3])))
    if name == "Clip":  # bounds constant, omitted, or (not fusable) a graph input
        bounds = [c(-0.5), c(draw(st.sampled_from([0.5, 6.0])))][: draw(st.integers(0, 2))]
        if bounds and draw(st.integers(0, 4)) == 0:
            bounds[0] = b.input((), dtype)
        return b.op(name, v, *bounds)
    if name == "Pow":
        e = draw(st.sampled_from([2.0, 3.0, 0.5, 2]))
        base = b.op("Abs", v) if e == 0.5 else v
        return b.op(name, base, b.const(np.asarray(e, np.int64 if isinstance(e, int) else dtype)))
    if name not in _BINARY:
        return b.op(name, v)
    kind = draw(st.sampled_from(["x", "scalar", "bias", "input", "wider"]))
    if kind == "x":
        other = x
    elif kind == "scalar":
        other = c(draw(st.sampled_from([0.5, 1.5, -2.0])) * np.ones(draw(st.sampled_from([(), (1,)]))))
    elif kind == "bias":
        other = c(np.linspace(0.5, 1.5, shape[-1] if shape else 1))
    else:  # a full-size or broadcasting input; "wider" grows the shape: the node before it cannot join
        other = b.input((2, *shape) if kind == "wider" else tuple(d if draw(st.booleans()) else 1 for d in shape), dtype)
    if name == "Div":  # by |other| + 0.5 only: a quotient by a value near 0 would magnify any rounding
        return b.op(name, v, b.op("Add", b.op("Abs", other), c(0.5)))
    if name == "Where":
        return b.op(name, b.input(shape, np.bool_), v, other)
    return b.op(name, *((v, other) if draw(st.booleans()) else (other, v)))


def patterns() -> Any:
    """The pass's target strategy: random chains of 2-6 elementwise ops on an input, in random context.

    Intermediates are sometimes graph outputs or read twice (the group must end
    there), operands broadcast or grow the shape, a Clip bound is sometimes an
    input, and the tensor is sometimes float16 (nothing fuses).
    """

    @st.composite
    def graphs(draw: Any) -> Any:
        b = GraphBuilder(opset=draw(st.sampled_from([13, 17])))
        dtype = draw(st.sampled_from([np.float32, np.float32, np.float32, np.float64, np.float16]))
        shape = tuple(draw(st.integers(1, 5)) for _ in range(draw(st.integers(0, 4))))
        x = v = b.input(shape, dtype)
        for _ in range(draw(st.integers(2, 6))):
            v = _draw_step(draw, b, v, x, shape, dtype)
            expose(draw, b, v)
        b.output(v)
        return b.build()

    return graphs()
