"""The IR: Node and Graph, with validation and the rewrite API passes use.

Values are named by strings, as in ONNX. The graph keeps a producer map and a
consumer map; every rewrite goes through a Graph method so both stay true, at
O(1) amortized cost whatever the graph's size (a pass visiting each node once
is linear). ``Graph.nodes`` is a read-only sequence view: edit through the
methods. A pass, on ``y = Relu(MatMul(x, w))``::

    act = graph.sole_consumer("m")         # m's only reader (and no graph output), or None
    if act is not None and act.op_type == "Relu":
        mm = graph.producer("m")
        graph.replace([mm, act], Node("FusedMatMul", mm.inputs, act.outputs, {"activation": "Relu"}))

The methods' examples below assume ``m = MatMul(x, w); y = Add(m, b)``, with
initializers ``w`` and ``b`` and graph output ``y``.
"""

from __future__ import annotations

import heapq
import itertools
from typing import Any, Iterable, Iterator, Sequence

import attrs
import numpy as np

from .errors import InvalidGraphError
from .nodeorder import NodeList, NodeOrder
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
        self._order = NodeOrder()
        self._producer: dict[str, Node] = {}
        self._consumers: dict[str, dict[Node, int]] = {}  # value -> {reader: slots}: O(1) removal of a reader
        self._node_names: dict[str, int] = {}
        self._names = itertools.count()
        self._topo: list[Node] | None = None  # topological_order until the next rewrite
        self._nested = 0  # nodes holding subgraphs: edits inside those are not seen here, so no caching
        for node in nodes:
            self.add_node(node)

    @property
    def nodes(self) -> NodeList:
        """The nodes in list order, read-only (`NodeList`): ``[n.op_type for n in graph.nodes] == ["MatMul", "Add"]``."""
        return NodeList(self._order)

    @nodes.setter
    def nodes(self, nodes: Iterable[Node]) -> None:
        for node in list(self._order.as_list()):
            self.remove_node(node)
        for node in list(nodes):
            self.add_node(node)

    # ---- queries -------------------------------------------------------

    def producer(self, value: str) -> Node | None:
        """The node outputting ``value`` (``graph.producer("m").op_type == "MatMul"``); None for inputs, initializers."""
        return self._producer.get(value)

    def consumers(self, value: str) -> list[Node]:
        """The nodes reading ``value``, once per slot (a subgraph's read: once): ``graph.consumers("m") == [add]``."""
        return [n for n, k in self._consumers.get(value, {}).items() for _ in range(k)]

    def sole_consumer(self, value: str) -> Node | None:
        """The one node reading ``value``, in one slot, when ``value`` is no graph output, else None: what a fusion needs.

        ``graph.sole_consumer("m")`` is the Add; ``graph.sole_consumer("y")`` is None (a graph output).
        """
        readers = self._consumers.get(value)
        if not readers or len(readers) != 1 or value in self.outputs:
            return None
        node, slots = next(iter(readers.items()))
        return node if slots == 1 else None

    def is_used(self, value: str) -> bool:
        """Whether a node (or its subgraph) or the graph's outputs read ``value``: ``graph.is_used("m") is True``."""
        return bool(value) and (bool(self._consumers.get(value)) or value in self.outputs)

    def is_constant(self, value: str) -> bool:
        """Whether ``value`` is an initializer: ``graph.is_constant("w") is True``."""
        return value in self.initializers

    def values(self) -> set[str]:
        """Every value name: inputs, initializers and node outputs."""
        names = set(self.inputs) | set(self.initializers) | set(self._producer)
        names.discard("")
        return names

    def type_of(self, value: str) -> TensorType | None:
        """An initializer's type, else the annotation in ``types``, else None: ``str(graph.type_of("w")) == "float32[8x4]"``."""
        if value in self.initializers:
            arr = self.initializers[value]
            return TensorType(arr.dtype, arr.shape)
        return self.types.get(value)

    def unique_name(self, base: str) -> str:
        """A value or node name not used in this graph, derived from ``base``: ``graph.unique_name("w") == "w__0"``."""
        while True:
            name = f"{base}__{next(self._names)}"
            if not (name in self._producer or name in self.initializers or name in self._node_names
                    or name in self.inputs or name in self.outputs):
                return name

    def op_types(self) -> set[tuple[str, str]]:
        """(domain, op_type) of every node, subgraphs included."""
        found = {(n.domain, n.op_type) for n in self.nodes}
        for sub in self.subgraphs():
            found |= sub.op_types()
        return found

    def holds_subgraphs(self, node: Node) -> bool:
        """Whether ``node`` has a subgraph attribute (If, Loop, Scan)."""
        return bool(_holds_graph(node))

    def subgraphs(self) -> Iterator[Graph]:
        """The graphs in the nodes' attributes (If branches, Loop and Scan bodies), one level deep."""
        for node in self.nodes:
            yield from _node_subgraphs(node)

    # ---- rewrites ------------------------------------------------------

    def add_node(self, node: Node, index: int | None = None) -> Node:
        """Append ``node`` (or put it at list position ``index``, O(n): prefer `insert_before`); returns it.

        ``graph.add_node(Node("Neg", ["y"], ["z"]))``; a second producer of a value is an InvalidGraphError.
        """
        anchor = self._order.as_list()[index] if index is not None and index < len(self._order.label) else None
        return self.insert_before(anchor, node)

    def insert_before(self, anchor: Node | None, node: Node) -> Node:
        """Insert ``node`` just before ``anchor`` (at the end for None): ``graph.insert_before(add, Node("Relu", ["m"], ["r"]))``."""
        if anchor is not None:
            self._check_member(anchor)
        if node in self._order.label:
            raise InvalidGraphError(f"{node.label} is already in graph {self.name!r}; insert a new Node instead")
        for out in node.outputs:
            if out and out in self._producer:
                raise InvalidGraphError(f"{node.label} outputs {out!r}, which {self._producer[out].label} already "
                                        "produces; every value must have exactly one producer")
        self._producer.update((out, node) for out in node.outputs if out)
        for name in node.inputs + implicit_inputs(node) if node.attrs else node.inputs:
            if name:
                self._read(name, node)
        self._node_names[node.name] = self._node_names.get(node.name, 0) + 1
        self._nested += _holds_graph(node)
        self._order.insert(node, anchor)
        self._topo = None
        return node

    def remove_node(self, node: Node) -> None:
        """Remove ``node``; values it produced become dangling if still used: ``graph.remove_node(graph.producer("z"))``."""
        self._check_member(node)
        self._order.remove(node)
        self._topo = None
        self._nested -= _holds_graph(node)
        for out in node.outputs:
            if out and self._producer.get(out) is node:
                del self._producer[out]
        for name in node.inputs + implicit_inputs(node) if node.attrs else node.inputs:
            if name:
                self._unread(name, node)
        self._node_names[node.name] -= 1
        if not self._node_names[node.name]:
            del self._node_names[node.name]

    def replace(self, old: Sequence[Node], new: Node | Sequence[Node]) -> Any:
        """Remove the nodes ``old``; put ``new`` (a node, or several in order) where the last of them stood; return it.

        That place follows everything the old nodes read. ``graph.replace([mm, add], Node("Gemm", ["x", "w", "b"], ["y"]))``
        """
        old = list(dict.fromkeys(old))
        for n in old:
            self._check_member(n)
        anchor = self._order.next[max(old, key=self._order.label.__getitem__)]
        for n in old:
            self.remove_node(n)
        for n in [new] if isinstance(new, Node) else new:
            self.insert_before(anchor, n)
        return new

    def set_input(self, node: Node, index: int, value: str) -> None:
        """Make input slot ``index`` of ``node`` read ``value``: ``graph.set_input(add, 1, "b2")``."""
        if node.inputs[index]:
            self._unread(node.inputs[index], node)
        node.inputs = node.inputs[:index] + (value,) + node.inputs[index + 1 :]
        if value:
            self._read(value, node)

    def replace_all_uses(self, old: str, new: str, *, graph_outputs: bool = True) -> int:
        """Make every reader of ``old`` read ``new``; returns how many slots changed.

        With ``graph_outputs`` a graph output named ``old`` is renamed to ``new``
        too; passes that must not change the graph's interface pass False:
        ``graph.replace_all_uses("m", "m2", graph_outputs=False) == 1``.
        """
        changed = 0
        for node in list(self._consumers.get(old, {})):
            for i, name in enumerate(node.inputs):
                if name == old:
                    self.set_input(node, i, new)
                    changed += 1
            if old in implicit_inputs(node):
                # a subgraph reads ``old`` from this scope: rename it there and move the use
                self._unread(old, node)
                for sub in _node_subgraphs(node):
                    _rename_free(sub, old, new)
                self._read(new, node)
                changed += 1
        if graph_outputs:
            for i, name in enumerate(self.outputs):
                if name == old:
                    self.outputs[i] = new
                    changed += 1
        return changed

    def bypass(self, node: Node, source: str | None = None) -> bool:
        """Remove single-output ``node``; its readers read ``source`` (default: its first input): ``graph.bypass(identity)``.

        When the node's output is a graph output the interface keeps its name:
        the producer of ``source`` is renamed to output it instead, possible only
        when ``source`` has a producer, is no graph output and has no other
        reader. Returns False, changing nothing, when it is not possible.
        """
        source = node.inputs[0] if source is None else source
        out = node.outputs[0]
        if out not in self.outputs:
            self.remove_node(node)
            self.replace_all_uses(out, source, graph_outputs=False)
            return True
        producer = self.producer(source)
        if producer is None or source in self.outputs or len(self.consumers(source)) != 1:
            return False
        self.remove_node(node)
        self.rename_output(producer, source, out)
        return True

    def rename_output(self, node: Node, old: str, new: str) -> Node:
        """Make ``node`` output ``new`` where it output ``old``; readers and the type follow; graph outputs do not.

        ``graph.rename_output(graph.producer("m"), "m", "mm")``; ``new`` must have no other producer.
        """
        self._check_member(node)
        if self._producer.get(new, node) is not node:
            raise InvalidGraphError(f"cannot rename {old!r} of {node.label} to {new!r}: {self._producer[new].label} produces it")
        node.outputs = tuple(new if o == old else o for o in node.outputs)
        self._topo = None
        if self._producer.get(old) is node:
            del self._producer[old]
        self._producer[new] = node
        self.replace_all_uses(old, new, graph_outputs=False)
        if old in self.types and new not in self.types:
            self.types[new] = self.types[old]
        return node

    def add_initializer(self, name: str, array: np.ndarray) -> str:
        """Add (or replace) a constant value; returns its name: ``graph.add_initializer(graph.unique_name("w"), w)``."""
        self.initializers[name] = np.asarray(array)
        return name

    def remove_initializer(self, name: str) -> None:
        """Drop a constant value; readers left would dangle (`validate` says so): ``graph.remove_initializer("w")``."""
        del self.initializers[name]

    def _read(self, value: str, node: Node) -> None:
        self._topo = None
        readers = self._consumers.setdefault(value, {})
        readers[node] = readers.get(node, 0) + 1

    def _unread(self, value: str, node: Node) -> None:
        self._topo = None
        readers = self._consumers[value]
        readers[node] -= 1
        if not readers[node]:
            del readers[node]
            if not readers:
                del self._consumers[value]

    def _check_member(self, node: Node) -> None:
        if node not in self._order.label:
            raise InvalidGraphError(f"{node.label} is not a node of graph {self.name!r} (removed already?)")

    # ---- order and validity -------------------------------------------

    def topological_order(self) -> list[Node]:
        """Nodes in an order where producers precede consumers, stable w.r.t. the list order.

        Raises InvalidGraphError naming the nodes on a cycle. O(n) when the list
        is in order already (rewrites through this API keep it so), then free
        until the next rewrite.
        """
        if self._topo is None or self._nested:
            nodes = self._order.as_list()
            self._topo = list(nodes) if self._in_order(nodes) else self._kahn(nodes)
        return list(self._topo)

    def _in_order(self, nodes: list[Node]) -> bool:
        seen: set[Node] = set()
        for node in nodes:
            for name in node.inputs + implicit_inputs(node) if node.attrs else node.inputs:
                if self._producer.get(name, node) not in seen and name in self._producer:
                    return False
            seen.add(node)
        return True

    def _kahn(self, nodes: list[Node]) -> list[Node]:
        position = {id(n): i for i, n in enumerate(nodes)}
        pending: dict[int, int] = {}
        for node in nodes:
            reads = node.inputs + implicit_inputs(node) if node.attrs else node.inputs
            pending[id(node)] = len({id(p) for p in map(self._producer.get, reads) if p is not None})
        ready = [(position[id(n)], n) for n in nodes if pending[id(n)] == 0]
        heapq.heapify(ready)
        order: list[Node] = []
        while ready:
            _, node = heapq.heappop(ready)
            order.append(node)
            for consumer in {id(c): c for out in node.outputs if out for c in self._consumers.get(out, ())}.values():
                pending[id(consumer)] -= 1
                if pending[id(consumer)] == 0:
                    heapq.heappush(ready, (position[id(consumer)], consumer))
        if len(order) != len(nodes):
            stuck = [n.label for n in nodes if pending[id(n)] > 0]
            raise InvalidGraphError(f"graph {self.name!r} has a cycle through: {', '.join(stuck[:8])}")
        return order

    def sort(self) -> None:
        """Reorder the node list topologically."""
        self.nodes = self.topological_order()

    def validate(self, outer_scope: Iterable[str] = ()) -> None:
        """Raise InvalidGraphError if the graph breaks an IR rule (``graph.validate()`` after a rewrite); names the node."""
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
                        "a graph input nor an initializer (a dangling value)")
        for name in self.outputs:
            if name not in known and name not in produced:
                raise InvalidGraphError(f"graph output {name!r} of {self.name!r} is never produced")
        self.topological_order()
        scope = known | produced
        for sub in self.subgraphs():
            sub.validate(scope)

    def copy(self) -> Graph:
        """A deep copy of the structure, constant arrays shared: ``trial = graph.copy()`` leaves ``graph`` alone."""
        twin = {n: Node(n.op_type, n.inputs, n.outputs, {k: _copy_attr(v) for k, v in n.attrs.items()}, n.name, n.domain)
                for n in self._order.as_list()}
        g = Graph((), self.inputs, self.outputs, self.initializers, self.types, self.opsets, self.name)
        g.meta = dict(self.meta)
        # this graph's maps are true: map them onto the twins rather than derive them again node by node
        g._producer = {value: twin[n] for value, n in self._producer.items()}
        g._consumers = {value: {twin[n]: k for n, k in readers.items()} for value, readers in self._consumers.items()}
        g._node_names, g._nested = dict(self._node_names), self._nested
        for node in twin.values():
            g._order.insert(node)
        return g

    def __repr__(self) -> str:
        return f"Graph({self.name!r}: {len(self.nodes)} nodes, {len(self.inputs)} inputs, {len(self.outputs)} outputs)"


def _copy_attr(value: Any) -> Any:
    if isinstance(value, Graph):
        return value.copy()
    return [_copy_attr(v) for v in value] if isinstance(value, list) else value


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
    """Outer-scope values a node's subgraph attributes read (a body may read one of the node's own inputs too)."""
    names: set[str] = set()
    for sub in _node_subgraphs(node):
        names |= free_values(sub)
    return tuple(sorted(names))


def _holds_graph(node: Node) -> int:
    return int(bool(node.attrs) and next(_node_subgraphs(node), None) is not None)


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
