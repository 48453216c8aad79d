"""GraphBuilder: a terse way for tests and strategies to write small graphs, and random feeds."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..graph import Graph, Node
from ..tensor import TensorType


class GraphBuilder:
    """Build a `Graph` one op at a time: ``y = b.op("Relu", b.input((2, 3)))``.

    Value and node names are generated. Graph inputs carry their declared
    type; intermediate values are left unannotated, as an importer would
    leave a model without value_info.
    """

    def __init__(self, opset: int = 17, name: str = "g") -> None:
        self.graph = Graph(opsets={"": opset}, name=name)
        self._n = 0

    def _name(self, base: str) -> str:
        self._n += 1
        return f"{base}{self._n}"

    def input(self, shape: Sequence[int], dtype: Any = np.float32) -> str:
        """A new graph input of a static shape."""
        name = self._name("x")
        self.graph.inputs.append(name)
        self.graph.types[name] = TensorType(np.dtype(dtype), tuple(shape))
        return name

    def const(self, array: Any, dtype: Any = None) -> str:
        """A new initializer."""
        return self.graph.add_initializer(self._name("c"), np.asarray(array, dtype=dtype))

    def op(self, op_type: str, *inputs: str, outputs: int = 1, domain: str = "", **attrs: Any) -> Any:
        """Add a node; returns its output name (a tuple of names when ``outputs`` > 1)."""
        outs = [self._name("v") for _ in range(outputs)]
        self.graph.add_node(Node(op_type, list(inputs), outs, attrs, self._name("n"), domain))
        if domain and domain not in self.graph.opsets:
            self.graph.opsets[domain] = 1
        return outs[0] if outputs == 1 else tuple(outs)

    def output(self, *names: str) -> None:
        """Declare graph outputs (a value already an output is not repeated)."""
        for name in names:
            if name not in self.graph.outputs:
                self.graph.outputs.append(name)

    def build(self) -> Graph:
        """The graph, validated; an output-less graph exposes its last node's outputs."""
        if not self.graph.outputs and self.graph.nodes:
            self.output(*[o for o in self.graph.nodes[-1].outputs if o])
        self.graph.validate()
        return self.graph


def random_feeds(graph: Graph, seed: int = 0, dims: Mapping[str, int] | None = None) -> dict[str, np.ndarray]:
    """Deterministic random values for every graph input, from its declared type (minfer's one feed helper).

    An input declared with symbolic or unknown dims is fed the shape
    ``graph.meta["feed_shapes"]`` gives it (see `strategies.loosen`); else,
    when ``dims`` is given (the CLI's ``--dim NAME=SIZE``), each symbolic dim
    takes its size from ``dims`` and every other non-static dim is 1.
    """
    rng = np.random.default_rng(seed)
    feeds = {}
    sizes = graph.meta.get("feed_shapes", {})
    for name in graph.inputs:
        t = graph.types.get(name)
        shape = sizes.get(name, None if t is None else t.shape)
        if dims is not None and shape is not None and name not in sizes:
            shape = tuple(d if isinstance(d, int) else dims.get(str(d), 1) for d in shape)
        if t is None or shape is None or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"input {name!r} needs a static declared type (or graph.meta['feed_shapes']) to draw a feed for it")
        feeds[name] = random_array(rng, shape, t.dtype)
    return feeds


def random_array(rng: np.random.Generator, shape: Sequence[int], dtype: Any) -> np.ndarray:
    """Values of moderate magnitude in ``dtype``: normal floats, small ints, random bools."""
    dtype = np.dtype(dtype)
    if dtype.kind == "f":
        return rng.standard_normal(tuple(shape)).astype(dtype)
    if dtype.kind == "b":
        return rng.random(tuple(shape)) < 0.5
    return rng.integers(-5 if dtype.kind == "i" else 0, 6, size=tuple(shape)).astype(dtype)
