"""A graph's node order, edited in O(1): a rewrite never shifts or scans a list, so passes stay linear.

A doubly linked list with integer labels (gaps between neighbours, renumbered
when one runs out) orders the nodes; the plain list readers index into is
made once per change, when someone reads it.
"""

from __future__ import annotations

from typing import Any, Iterator, Sequence

GAP = 1 << 16  # label spacing: insertions at one place before the labels are renumbered


class NodeOrder:
    """Nodes (hashed by identity) in list order: insert, remove, membership and comparison in O(1) amortized."""

    def __init__(self) -> None:
        self.label: dict[Any, int] = {}
        self.prev: dict[Any, Any] = {}
        self.next: dict[Any, Any] = {}
        self.head: Any = None
        self.tail: Any = None
        self._list: list[Any] | None = None
        self._pos: dict[Any, int] | None = None

    def insert(self, node: Any, anchor: Any = None) -> None:
        """Put ``node`` just before ``anchor`` (a member), or at the end when ``anchor`` is None."""
        prev = self.tail if anchor is None else self.prev[anchor]
        if anchor is not None and prev is not None and self.label[anchor] - self.label[prev] < 2:
            for i, n in enumerate(self.as_list()):
                self.label[n] = i * GAP
        low = self.label[prev] if prev is not None else (self.label[anchor] if anchor is not None else 0) - 2 * GAP
        high = self.label[anchor] if anchor is not None else low + 2 * GAP
        self.label[node], self.prev[node], self.next[node] = (low + high) // 2, prev, anchor
        self._relink(prev, node, anchor)

    def remove(self, node: Any) -> None:
        prev, nxt = self.prev.pop(node), self.next.pop(node)
        del self.label[node]
        self._relink(prev, nxt, nxt)

    def _relink(self, prev: Any, node: Any, nxt: Any) -> None:
        """Link ``prev`` -> ``node`` -> ``nxt``; removal passes ``node`` = ``nxt`` (None: the head or tail side)."""
        if prev is None:
            self.head = node
        else:
            self.next[prev] = node
        if nxt is None:
            self.tail = prev if node is None else node
        else:
            self.prev[nxt] = prev if node is nxt else node
        self._list = self._pos = None

    def as_list(self) -> list[Any]:
        """The nodes in order (one list object until the next change: do not mutate it)."""
        if self._list is None:
            out, node = [], self.head
            while node is not None:
                out.append(node)
                node = self.next[node]
            self._list = out
        return self._list

    def index(self, node: Any) -> int:
        if self._pos is None:
            self._pos = {n: i for i, n in enumerate(self.as_list())}
        return self._pos[node]


class NodeList(Sequence[Any]):
    """What ``Graph.nodes`` returns: a read-only view in order; ``len``, ``in`` and ``index`` cost O(1).

    Iterating walks a snapshot, so a loop may rewrite the graph as it goes.
    Edit through the Graph's methods, which keep its producer and consumer maps true.
    """

    def __init__(self, order: NodeOrder) -> None:
        self._order = order

    def __len__(self) -> int:
        return len(self._order.label)

    def __contains__(self, node: object) -> bool:
        return node in self._order.label

    def __iter__(self) -> Iterator[Any]:
        return iter(self._order.as_list())

    def __getitem__(self, i: Any) -> Any:
        return self._order.as_list()[i]

    def index(self, node: Any, *_: Any) -> int:
        if node not in self:
            raise ValueError(f"{node!r} is not a node of this graph")
        return self._order.index(node)

    def __repr__(self) -> str:
        return f"NodeList({self._order.as_list()!r})"
