"""Helpers the pass families share: pattern matching guards, constants, running a kernel.

The guards encode the two lessons every fusion obeys: never fuse through a
value that is a graph output or that another node also reads, and never
create a node for which no kernel exists for its dtype.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from minfer_core import Graph, KernelContext, Node, TensorType, get_registry

FLOATS = (np.dtype(np.float16), np.dtype(np.float32), np.dtype(np.float64))
MINFER_DOMAIN = "ai.minfer"


def opset(graph: Graph, domain: str = "") -> int:
    return graph.opsets.get(domain, 1)


def const(graph: Graph, name: str) -> np.ndarray | None:
    """The value of ``name`` when it is an initializer, else None."""
    return graph.initializers.get(name) if name else None


def sole_consumer(graph: Graph, value: str) -> Node | None:
    """The one node reading ``value`` (once), if ``value`` is not a graph output; else None."""
    if value in graph.outputs:
        return None
    readers = graph.consumers(value)
    if len(readers) != 1 or list(readers[0].inputs).count(value) != 1:
        return None
    return readers[0]


def is_op(node: Node | None, *op_types: str) -> bool:
    return node is not None and node.domain == "" and node.op_type in op_types


def used(graph: Graph, value: str) -> bool:
    """Whether anything reads ``value`` (a node or the graph's outputs)."""
    return bool(value) and (value in graph.outputs or bool(graph.consumers(value)))


def dtype_of(graph: Graph, value: str) -> np.dtype | None:
    t = graph.type_of(value)
    return None if t is None else t.dtype


def shape_of(graph: Graph, value: str) -> tuple[int, ...] | None:
    """The static shape of ``value``, or None when any dim is unknown."""
    t = graph.type_of(value)
    return tuple(t.shape) if t is not None and t.is_static else None  # type: ignore[arg-type]


def has_kernel(graph: Graph, domain: str, op_type: str) -> bool:
    return get_registry().select_kernel(domain, op_type, opset(graph, domain)) is not None


def fresh(graph: Graph, base: str) -> str:
    return graph.unique_name(base.replace("/", "_"))


def add_const(graph: Graph, base: str, array: np.ndarray) -> str:
    return graph.add_initializer(fresh(graph, base), np.asarray(array))


def bypass(graph: Graph, node: Node, source: str) -> bool:
    """Remove ``node`` (single output) so its readers read ``source`` instead.

    When the node's output is a graph output the interface must keep its name:
    the producer of ``source`` is renamed instead, which is only possible if
    ``source`` is produced by a node, is no graph output and has no other reader.
    """
    out = node.outputs[0]
    if out not in graph.outputs:
        graph.remove_node(node)
        graph.replace_all_uses(out, source, graph_outputs=False)
        return True
    producer = graph.producer(source)
    if producer is None or source in graph.outputs or len(graph.consumers(source)) != 1:
        return False
    graph.remove_node(node)
    rename_output(graph, producer, source, out)
    return True


def rename_output(graph: Graph, node: Node, old: str, new: str) -> Node:
    """Make ``node`` output ``new`` where it output ``old`` (readers of ``old`` follow)."""
    index = graph.nodes.index(node)
    graph.remove_node(node)
    outputs = [new if o == old else o for o in node.outputs]
    clone = Node(node.op_type, node.inputs, outputs, dict(node.attrs), node.name, node.domain)
    graph.add_node(clone, index)
    graph.replace_all_uses(old, new, graph_outputs=False)
    if old in graph.types and new not in graph.types:
        graph.types[new] = graph.types[old]
    return clone


def replace(graph: Graph, old: list[Node], new: Node) -> Node:
    """Put ``new`` where the last of ``old`` was, and remove every node of ``old``."""
    index = min(graph.nodes.index(n) for n in old)
    for n in old:
        graph.remove_node(n)
    graph.add_node(new, index)
    return new


def run_node(graph: Graph, node: Node, inputs: list[np.ndarray | None]) -> list[np.ndarray]:
    """Compute ``node`` on constant ``inputs`` with the registered kernel (for folding)."""
    kern = get_registry().select_kernel(node.domain, node.op_type, opset(graph, node.domain))
    if kern is None:
        raise LookupError(f"no kernel for {node.op_type}")
    args = list(inputs)
    while args and args[-1] is None:
        args.pop()
    fn = prepare(kern, node.op_type, opset(graph, node.domain), dict(node.attrs), args, len(node.outputs), node.name)
    result = fn(*args)
    return list(result) if isinstance(result, (tuple, list)) else [result]


def prepare(kern: Any, op_type: str, version: int, attrs: dict[str, Any], consts: list[np.ndarray | None],
            num_outputs: int = 1, name: str = "", input_types: tuple[TensorType | None, ...] | None = None
            ) -> Callable[..., Any]:
    """The run-time callable of ``kern`` for one node, as the engine would build it."""
    if not kern.prepare:
        return functools.partial(kern.fn, **attrs) if attrs else kern.fn
    types = input_types or tuple(None if c is None else TensorType(c.dtype, c.shape) for c in consts)
    ctx = KernelContext(
        node_name=name,
        op_type=op_type,
        opset=version,
        input_types=types,
        output_types=(None,) * num_outputs,
        constants=tuple(consts),
        num_outputs=num_outputs,
    )
    return kern.fn(ctx, **attrs)


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
