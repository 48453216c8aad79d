"""The IR: Node and Graph, with validation and the rewrite API passes use.

Values are named by strings, as in ONNX. The graph keeps a producer map and a
consumer map; every rewrite goes through a Graph method so both stay true.
A node's inputs and outputs are tuples: change them with `set_input`, never
by mutating the node.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Iterable, Iterator

import attrs
import numpy as np

from .errors import InvalidGraphError
from .tensor import TensorType


def _names(values: Iterable[str]) -> tuple[str, ...]:
    return tuple(values)


@attrs.define(eq=False, repr=False)
class Node:
    """One operator application: ``outputs = domain::op_type(inputs; attrs)``.

    An empty string in ``inputs`` or ``outputs`` is an omitted optional value.
    """

    op_type: str
    inputs: tuple[str, ...] = attrs.field(converter=_names, default=())
    outputs: tuple[str, ...] = attrs.field(converter=_names, default=())
    attrs: dict[str, Any] = attrs.field(factory=dict)
    name: str = ""
    domain: str = ""

    def __repr__(self) -> str:
        dom = f"{self.domain}::" if self.domain else ""
        return f"Node({self.name or '?'}: {dom}{self.op_type}{list(self.inputs)} -> {list(self.outputs)})"

    @property
    def label(self) -> str:
        """How error messages name this node."""
        dom = f"{self.domain}::" if self.domain else ""
        return f"node {self.name or '<unnamed>'!r} ({dom}{self.op_type})"


class Graph:
    """A computation graph: inputs, outputs, initializers, nodes and value types.

    ``types`` maps value names to `TensorType` (from the model's declarations and
    from shape inference). ``opsets`` maps domains to opset versions; subgraphs
    share their parent's. ``meta`` keeps model-level fields the exporter needs.
    """

    def __init__(
        self,
        nodes: Iterable[Node] = (),
        inputs: Iterable[str] = (),
        outputs: Iterable[str] = (),
        initializers: dict[str, np.ndarray] | None = None,
        types: dict[str, TensorType] | None = None,
        opsets: dict[str, int] | None = None,
        name: str = "graph",
    ) -> None:
        self.name = name
        self.inputs: list[str] = list(inputs)
        self.outputs: list[str] = list(outputs)
        self.initializers: dict[str, np.ndarray] = dict(initializers or {})
        self.types: dict[str, TensorType] = dict(types or {})
        self.opsets: dict[str, int] = dict(opsets or {"": 21})
        self.meta: dict[str, Any] = {}
        self.nodes: list[Node] = []
        self._producer: dict[str, Node] = {}
        self._consumers: dict[str, list[Node]] = {}
        self._names = itertools.count()
        for node in nodes:
            self.add_node(node)

    # ---- queries -------------------------------------------------------

    def producer(self, value: str) -> Node | None:
        """The node that outputs ``value``, or None for inputs, initializers and unknowns."""
        return self._producer.get(value)

    def consumers(self, value: str) -> list[Node]:
        """The nodes that read ``value`` (a node appears once per input slot that reads it)."""
        return list(self._consumers.get(value, ()))

    def is_constant(self, value: str) -> bool:
        return value in self.initializers

    def values(self) -> set[str]:
        """Every value name: inputs, initializers and node outputs."""
        names = set(self.inputs) | set(self.initializers) | set(self._producer)
        names.discard("")
        return names

    def type_of(self, value: str) -> TensorType | None:
        if value in self.initializers:
            arr = self.initializers[value]
            return TensorType(arr.dtype, arr.shape)
        return self.types.get(value)

    def unique_name(self, base: str) -> str:
        """A value or node name not used in this graph, derived from ``base``."""
        taken = self.values() | {n.name for n in self.nodes}
        while True:
            name = f"{base}__{next(self._names)}"
            if name not in taken:
                return name

    def op_types(self) -> set[tuple[str, str]]:
        """(domain, op_type) of every node, subgraphs included."""
        found = {(n.domain, n.op_type) for n in self.nodes}
        for sub in self.subgraphs():
            found |= sub.op_types()
        return found

    def subgraphs(self) -> Iterator[Graph]:
        for node in self.nodes:
            for value in node.attrs.values():
                if isinstance(value, Graph):
                    yield value
                elif isinstance(value, list):
                    yield from (v for v in value if isinstance(v, Graph))

    # ---- rewrites ------------------------------------------------------

    def add_node(self, node: Node, index: int | None = None) -> Node:
        """Insert ``node`` (at ``index`` in the node list, else at the end)."""
        for out in node.outputs:
            if out and out in self._producer:
                other = self._producer[out]
                raise InvalidGraphError(
                    f"{node.label} outputs {out!r}, which {other.label} already produces; "
                    "every value must have exactly one producer"
                )
        self.nodes.insert(len(self.nodes) if index is None else index, node)
        for out in node.outputs:
            if out:
                self._producer[out] = node
        for name in node.inputs + implicit_inputs(node):
            if name:
                self._consumers.setdefault(name, []).append(node)
        return node

    def insert_before(self, anchor: Node, node: Node) -> Node:
        """Insert ``node`` just before ``anchor`` in the node list."""
        return self.add_node(node, self.nodes.index(anchor))

    def remove_node(self, node: Node) -> None:
        """Remove ``node``; values it produced become dangling if still used."""
        self.nodes.remove(node)
        for out in node.outputs:
            if out and self._producer.get(out) is node:
                del self._producer[out]
        for name in node.inputs + implicit_inputs(node):
            if name:
                self._consumers[name].remove(node)

    def set_input(self, node: Node, index: int, value: str) -> None:
        """Make input slot ``index`` of ``node`` read ``value``."""
        old = node.inputs[index]
        if old:
            self._consumers[old].remove(node)
        node.inputs = node.inputs[:index] + (value,) + node.inputs[index + 1 :]
        if value:
            self._consumers.setdefault(value, []).append(node)

    def replace_all_uses(self, old: str, new: str, *, graph_outputs: bool = True) -> int:
        """Make every reader of ``old`` read ``new``; returns how many slots changed.

        With ``graph_outputs`` a graph output named ``old`` is renamed to ``new``
        too; passes that must not change the graph's interface pass False.
        """
        changed = 0
        for node in self.consumers(old):
            for i, name in enumerate(node.inputs):
                if name == old:
                    self.set_input(node, i, new)
                    changed += 1
            if old in implicit_inputs(node):
                # a subgraph reads ``old`` from this scope: rename it there and move the use
                self._consumers[old].remove(node)
                for sub in _node_subgraphs(node):
                    _rename_free(sub, old, new)
                self._consumers.setdefault(new, []).append(node)
                changed += 1
        if graph_outputs:
            for i, name in enumerate(self.outputs):
                if name == old:
                    self.outputs[i] = new
                    changed += 1
        return changed

    def add_initializer(self, name: str, array: np.ndarray) -> str:
        """Add (or replace) a constant value."""
        self.initializers[name] = np.asarray(array)
        return name

    def remove_initializer(self, name: str) -> None:
        del self.initializers[name]

    # ---- order and validity -------------------------------------------

    def topological_order(self) -> list[Node]:
        """Nodes in an order where producers precede consumers, stable w.r.t. the list order.

        Raises InvalidGraphError naming the nodes on a cycle.
        """
        position = {id(n): i for i, n in enumerate(self.nodes)}
        pending: dict[int, int] = {}
        for node in self.nodes:
            reads = node.inputs + implicit_inputs(node) if node.attrs else node.inputs
            deps = {id(p) for p in map(self._producer.get, reads) if p is not None}
            pending[id(node)] = len(deps)
        ready = [(position[id(n)], n) for n in self.nodes if pending[id(n)] == 0]
        heapq.heapify(ready)
        order: list[Node] = []
        while ready:
            _, node = heapq.heappop(ready)
            order.append(node)
            seen: set[int] = set()
            for out in node.outputs:
                for consumer in self._consumers.get(out, ()) if out else ():
                    if id(consumer) in seen:
                        continue
                    seen.add(id(consumer))
                    pending[id(consumer)] -= 1
                    if pending[id(consumer)] == 0:
                        heapq.heappush(ready, (position[id(consumer)], consumer))
        if len(order) != len(self.nodes):
            stuck = [n.label for n in self.nodes if pending[id(n)] > 0]
            raise InvalidGraphError(f"graph {self.name!r} has a cycle through: {', '.join(stuck[:8])}")
        return order

    def sort(self) -> None:
        """Reorder the node list topologically."""
        self.nodes = self.topological_order()

    def validate(self, outer_scope: Iterable[str] = ()) -> None:
        """Raise InvalidGraphError if the graph breaks an IR rule; the message names the node."""
        known = set(self.inputs) | set(self.initializers) | set(outer_scope)
        dup_inputs = {n for n in self.inputs if self.inputs.count(n) > 1}
        if dup_inputs:
            raise InvalidGraphError(f"graph {self.name!r} declares input(s) {sorted(dup_inputs)} more than once")
        for node in self.nodes:
            for out in node.outputs:
                if out in known:
                    raise InvalidGraphError(f"{node.label} outputs {out!r}, which is already a graph input or initializer")
        produced = set(self._producer)
        for node in self.nodes:
            outs = [o for o in node.outputs if o]
            if len(outs) != len(set(outs)):
                raise InvalidGraphError(f"{node.label} lists the same output name twice: {outs}")
            for name in node.inputs:
                if name and name not in known and name not in produced:
                    raise InvalidGraphError(
                        f"{node.label} reads {name!r}, which no node produces and is neither "
                        "a graph input nor an initializer (a dangling value)"
                    )
        for name in self.outputs:
            if name not in known and name not in produced:
                raise InvalidGraphError(f"graph output {name!r} of {self.name!r} is never produced")
        self.topological_order()
        scope = known | produced
        for sub in self.subgraphs():
            sub.validate(scope)

    def copy(self) -> Graph:
        """A deep copy of the structure; constant arrays are shared, not copied."""
        nodes = [
            Node(n.op_type, n.inputs, n.outputs, {k: _copy_attr(v) for k, v in n.attrs.items()}, n.name, n.domain)
            for n in self.nodes
        ]
        g = Graph(nodes, self.inputs, self.outputs, self.initializers, self.types, self.opsets, self.name)
        g.meta = dict(self.meta)
        return g

    def __repr__(self) -> str:
        return f"Graph({self.name!r}: {len(self.nodes)} nodes, {len(self.inputs)} inputs, {len(self.outputs)} outputs)"


def _copy_attr(value: Any) -> Any:
    if isinstance(value, Graph):
        return value.copy()
    if isinstance(value, list):
        return [_copy_attr(v) for v in value]
    return value


def free_values(graph: Graph) -> set[str]:
    """Names ``graph``'s nodes (and nested subgraphs) read from an enclosing scope."""
    defined = set(graph.inputs) | set(graph.initializers)
    for node in graph.nodes:
        defined.update(o for o in node.outputs if o)
    read: set[str] = set()
    for node in graph.nodes:
        read.update(n for n in node.inputs if n)
        for sub in _node_subgraphs(node):
            read |= free_values(sub)
    return read - defined


def implicit_inputs(node: Node) -> tuple[str, ...]:
    """Outer-scope values a node's subgraph attributes read (uses that are not in ``node.inputs``)."""
    names: set[str] = set()
    for sub in _node_subgraphs(node):
        names |= free_values(sub)
    return tuple(sorted(names - set(node.inputs)))


def _node_subgraphs(node: Node) -> Iterator[Graph]:
    for value in node.attrs.values():
        if isinstance(value, Graph):
            yield value
        elif isinstance(value, list):
            yield from (v for v in value if isinstance(v, Graph))


def _rename_free(graph: Graph, old: str, new: str) -> None:
    """Rename reads of the outer value ``old`` to ``new`` inside ``graph`` (unless shadowed)."""
    if old in graph.inputs or old in graph.initializers or graph.producer(old) is not None:
        return
    for node in graph.consumers(old):
        for i, name in enumerate(node.inputs):
            if name == old:
                graph.set_input(node, i, new)
    for node in graph.nodes:
        for sub in _node_subgraphs(node):
            _rename_free(sub, old, new)
    for i, name in enumerate(graph.outputs):
        if name == old:
            graph.outputs[i] = new
