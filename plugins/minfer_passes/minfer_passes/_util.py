"""Helpers the pass families share: pattern matching guards, constants, running a kernel.

The guards encode the two lessons every fusion obeys: never fuse through a
value that is a graph output or that another node also reads (the core's
``Graph.sole_consumer``), and never create a node for which no kernel exists
for its dtype. Graph rewrites themselves are the core's ``Graph`` methods.
"""

from __future__ import annotations

import functools
from typing import Callable

import numpy as np

from minfer_core import Graph, KernelContext, Node, get_registry

FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
MINFER_DOMAIN = "ai.minfer"


def opset(graph: Graph, domain: str = "") -> int:
    """The opset the graph imports for ``domain`` (1 when it does not say)."""
    return graph.opsets.get(domain, 1)


def const(graph: Graph, name: str) -> np.ndarray | None:
    """The value of ``name`` when it is an initializer, else None."""
    return graph.initializers.get(name) if name else None


def is_op(node: Node | None, *op_types: str) -> bool:
    return node is not None and node.domain == "" and node.op_type in op_types


def other_input(node: Node, value: str) -> str | None:
    """The input of binary ``node`` that is not ``value`` (None when value is not exactly one of its inputs)."""
    if len(node.inputs) != 2 or list(node.inputs).count(value) != 1:
        return None
    return node.inputs[1] if node.inputs[0] == value else node.inputs[0]


def dtype_of(graph: Graph, value: str) -> np.dtype | None:
    return getattr(graph.type_of(value), "dtype", None)  # None too for a sequence or optional (no element dtype)


def dims_of(graph: Graph, value: str) -> tuple[int | None, ...] | None:
    """``value``'s shape with every dim that is not a known size as None; None when even the rank is unknown.

    Symbolic dims (``"N"``) and negative sizes (some exporters write -1 for
    "unknown" as a dim_value) are not sizes a pass may compute with.
    """
    t = graph.type_of(value)
    if t is None or t.shape is None:
        return None
    return tuple(d if isinstance(d, int) and d >= 0 else None for d in t.shape)


def shape_of(graph: Graph, value: str) -> tuple[int, ...] | None:
    """The static shape of ``value``, or None when any dim is not a known size (see `dims_of`)."""
    dims = dims_of(graph, value)
    return None if dims is None or None in dims else dims  # type: ignore[return-value]


def same_shape(graph: Graph, a: str, b: str) -> bool:
    """Whether ``a`` and ``b`` surely have one shape: equal dims, each a known size or the same symbolic name."""
    ta, tb = graph.type_of(a), graph.type_of(b)
    if ta is None or tb is None or ta.shape is None or ta.shape != tb.shape:
        return False
    return all(isinstance(d, str) or (isinstance(d, int) and d >= 0) for d in ta.shape)


def broadcasts_into(shape: tuple[int, ...], target: tuple[int | None, ...]) -> bool:
    """Whether ``shape`` broadcasts to ``target`` without growing it: each dim 1 or equal to a known target dim."""
    if len(shape) > len(target):
        return False
    return all(d == 1 or d == t for d, t in zip(reversed(shape), reversed(target)))


def has_kernel(graph: Graph, domain: str, op_type: str) -> bool:
    return get_registry().select_kernel(domain, op_type, opset(graph, domain)) is not None


def fresh(graph: Graph, base: str) -> str:
    return graph.unique_name(base.replace("/", "_"))


def add_const(graph: Graph, base: str, array: np.ndarray) -> str:
    return graph.add_initializer(fresh(graph, base), np.asarray(array))


def run_node(graph: Graph, node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """Compute ``node`` on constant ``inputs`` with the registered kernel (for folding)."""
    kern = get_registry().select_kernel(node.domain, node.op_type, opset(graph, node.domain))
    if kern is None:
        raise LookupError(f"no kernel for {node.op_type}")
    args = list(inputs)
    while args and args[-1] is None:
        args.pop()
    fn = kern.prepared(KernelContext.of(node, graph), node.attrs)  # as the engine prepares it
    result = fn(*args)
    return list(result) if isinstance(result, (tuple, list)) else [result]


def fixpoint(step: Callable[[Graph], bool], limit: int = 10_000) -> Callable[[Graph], bool]:
    """Repeat a one-rewrite ``step`` until it finds nothing, so one application is idempotent."""

    @functools.wraps(step)
    def run(graph: Graph) -> bool:
        changed = False
        for _ in range(limit):
            if not step(graph):
                break
            changed = True
        return changed

    return run


def per_channel(array: np.ndarray, channels: int, rank: int) -> np.ndarray | None:
    """``array`` as a [channels] vector if it broadcasts per channel (axis 1) against a rank-``rank`` tensor.

    Accepts scalars, [C,1,..,1] and [1,C,1,..,1]; None when the broadcast
    would touch another axis or grow the result's shape.
    """
    a = np.asarray(array)
    if a.ndim > rank:
        return None
    full = (1,) * (rank - a.ndim) + a.shape
    if any(d != 1 for i, d in enumerate(full) if i != 1) or full[1] not in (1, channels):
        return None
    return np.broadcast_to(a.reshape(-1) if a.size > 1 else a.reshape(()), (channels,)).copy()
