"""The pass manager: selects passes by level or name, orders them, runs them to a fixed point.

Ordering comes only from the passes' declarations (``after``, ``before``,
``requires``), never from plugin load order: a stable topological sort that
breaks ties by level then name, so the same set of passes always runs in the
same order. A cycle or a requirement that no installed pass satisfies is a
`PassError` naming the passes involved.

Each round runs every pass once in that order; rounds repeat until none
changes the graph or ``max_rounds`` is reached. After every pass that changed
something the graph is validated, and its interface (input and output names)
must be unchanged: a pass that breaks either is named in the error.
"""

from __future__ import annotations

import heapq
import time
import warnings
from typing import Iterable, Sequence, Union

from .errors import InvalidGraphError, PassError, PassWarning
from .graph import Graph
from .passes import LEVELS, Pass, PassResult
from .plugins import Registry, strict_plugins

PassSelection = Union[str, Sequence[str], None]
MAX_ROUNDS = 8


def select_passes(registry: Registry, passes: PassSelection, disabled: Iterable[str] = ()) -> list[Pass]:
    """The passes ``passes`` names, ordered: a level ("basic", "extended", "all", "none") or a list of names.

    Required passes that are installed are pulled in; disabling a pass that a
    selected pass requires, or requiring one nobody installed, is a PassError.
    """
    disabled = set(disabled)
    installed = {p.name: p for p in registry.passes}
    _check_names(disabled, installed, "disabled_passes")
    chosen = _chosen(registry, passes, installed)
    chosen = [p for p in chosen if p.name not in disabled]
    selected = _with_requirements(chosen, installed, disabled)
    _check_ordering_names(selected, installed)
    return order_passes(selected)


def _check_ordering_names(passes: Sequence[Pass], installed: dict[str, Pass]) -> None:
    """A name in ``after``/``before`` that no installed pass has is a misspelling, not an optional hint."""
    for p in passes:
        unknown = sorted({n for n in (*p.after, *p.before) if n not in installed})
        if unknown:
            raise PassError(
                f"pass {p.name!r} (from {p.plugin}) orders itself against unknown pass(es) {unknown} in after/before; "
                f"installed passes are {sorted(installed)}")


def _chosen(registry: Registry, passes: PassSelection, installed: dict[str, Pass]) -> list[Pass]:
    if passes is None or passes == "none":
        return []
    if isinstance(passes, str):
        if passes not in LEVELS:
            raise PassError(f"unknown pass level {passes!r}; choose one of {', '.join(LEVELS + ('none',))} or a list of names")
        rank = LEVELS.index(passes)
        return [p for p in registry.passes if p.role == "optimize" and LEVELS.index(p.level) <= rank]
    _check_names(set(passes), installed, "passes")
    return [installed[n] for n in dict.fromkeys(passes)]


def _check_names(names: set[str], installed: dict[str, Pass], what: str) -> None:
    unknown = sorted(names - set(installed))
    if unknown:
        raise PassError(f"{what} names unknown pass(es) {unknown}; installed passes are {sorted(installed)}")


def _with_requirements(chosen: list[Pass], installed: dict[str, Pass], disabled: set[str]) -> list[Pass]:
    result = {p.name: p for p in chosen}
    todo = list(chosen)
    while todo:
        p = todo.pop()
        for req in p.requires:
            if req in result:
                continue
            if req in disabled:
                raise PassError(f"pass {p.name!r} requires {req!r}, which is disabled; disable {p.name!r} too or enable {req!r}")
            if req not in installed:
                raise PassError(
                    f"pass {p.name!r} (from {p.plugin}) requires pass {req!r}, which no installed plugin provides")
            result[req] = installed[req]
            todo.append(installed[req])
    return list(result.values())


def order_passes(passes: Sequence[Pass]) -> list[Pass]:
    """``passes`` sorted so every ``after``/``requires`` runs earlier and every ``before`` later.

    Ties break by level, then name. Raises PassError naming a cycle.
    """
    by_name = {p.name: p for p in passes}
    edges: dict[str, set[str]] = {n: set() for n in by_name}
    for p in passes:
        for dep in (*p.after, *p.requires):
            if dep in by_name and dep != p.name:
                edges[dep].add(p.name)
        for succ in p.before:
            if succ in by_name and succ != p.name:
                edges[p.name].add(succ)
    indegree = {n: 0 for n in by_name}
    for succs in edges.values():
        for s in succs:
            indegree[s] += 1
    key = {n: (LEVELS.index(p.level), n) for n, p in by_name.items()}
    ready = [key[n] for n, d in indegree.items() if d == 0]
    heapq.heapify(ready)
    order: list[Pass] = []
    while ready:
        _, name = heapq.heappop(ready)
        order.append(by_name[name])
        for s in edges[name]:
            indegree[s] -= 1
            if indegree[s] == 0:
                heapq.heappush(ready, key[s])
    if len(order) != len(by_name):
        raise PassError(f"pass ordering has a cycle: {' -> '.join(_find_cycle(edges, indegree))}")
    return order


def _find_cycle(edges: dict[str, set[str]], indegree: dict[str, int]) -> list[str]:
    """One cycle among the passes the sort could not place, for the error message."""
    stuck = {n for n, d in indegree.items() if d > 0}
    start = min(stuck)
    path, seen = [start], {start: 0}
    while True:
        nxt = min(s for s in edges[path[-1]] if s in stuck)
        if nxt in seen:
            return path[seen[nxt] :] + [nxt]
        seen[nxt] = len(path)
        path.append(nxt)


def optimize(
    graph: Graph,
    registry: Registry,
    passes: PassSelection = "all",
    disabled: Iterable[str] = (),
    *,
    max_rounds: int = MAX_ROUNDS,
    validate: bool = True,
) -> list[PassResult]:
    """Run the selected passes over ``graph`` in place, to a fixed point; returns what changed.

    Only applications that changed the graph are recorded, plus nothing else:
    an empty list means the graph was already optimal for these passes.
    """
    return run_passes(graph, select_passes(registry, passes, disabled), max_rounds=max_rounds, validate=validate)


def run_passes(
    graph: Graph, passes: Sequence[Pass], *, max_rounds: int = MAX_ROUNDS, validate: bool = True,
    rollback: bool | None = None,
) -> list[PassResult]:
    """Run already-ordered ``passes`` to a fixed point (at most ``max_rounds`` sweeps).

    A pass that raises, leaves an invalid graph or changes its interface is
    a PassError. With ``rollback`` (the default unless ``MINFER_STRICT_PLUGINS=1``)
    its changes are undone, a `PassWarning` names it, and the other passes go
    on without it: the model still runs, only less optimized.
    """
    rollback = not strict_plugins() if rollback is None else rollback
    results: list[PassResult] = []
    failed: set[str] = set()
    snapshot: Graph | None = None  # the graph before the current pass; kept while passes change nothing
    for round_ in range(1, max_rounds + 1):
        changed_any = False
        for p in passes:
            if p.name in failed:
                continue
            if rollback and snapshot is None:
                snapshot = graph.copy()
            try:
                result = apply_pass(graph, p, round_=round_, validate=validate)
            except PassError as exc:
                if not rollback or snapshot is None:
                    raise
                _restore(graph, snapshot)
                snapshot = None
                failed.add(p.name)
                warnings.warn(f"{exc}; its changes were rolled back and the build went on without it "
                              f"(MINFER_STRICT_PLUGINS=1 makes this an error)", PassWarning, stacklevel=2)
                continue
            if result.changed:
                results.append(result)
                changed_any = True
                snapshot = None
        if not changed_any:
            break
    return results


def _restore(graph: Graph, snapshot: Graph) -> None:
    """Make ``graph`` (the object the caller holds) the ``snapshot`` taken before a failed pass."""
    vars(graph).clear()
    vars(graph).update(vars(snapshot))


def apply_pass(graph: Graph, p: Pass, *, round_: int = 1, validate: bool = True) -> PassResult:
    """Apply one pass once, check the graph afterwards, and record what it did."""
    before = {id(n): n for n in graph.nodes}
    interface = (list(graph.inputs), list(graph.outputs))
    start = time.perf_counter()
    try:
        changed = bool(p.fn(graph))
    except PassError:
        raise
    except Exception as exc:
        raise PassError(f"pass {p.name!r} (from {p.plugin}) failed: {type(exc).__name__}: {exc}") from exc
    seconds = time.perf_counter() - start
    after = {id(n): n for n in graph.nodes}
    if changed and validate:
        _check(graph, p, interface)
    removed = tuple(_label(n) for i, n in before.items() if i not in after)
    added = tuple(_label(n) for i, n in after.items() if i not in before)
    return PassResult(p.name, changed, len(before), len(after), removed, added, round_, seconds)


def _check(graph: Graph, p: Pass, interface: tuple[list[str], list[str]]) -> None:
    try:
        graph.validate()
    except InvalidGraphError as exc:
        raise PassError(f"pass {p.name!r} (from {p.plugin}) left an invalid graph: {exc}") from exc
    if (list(graph.inputs), list(graph.outputs)) != interface:
        raise PassError(
            f"pass {p.name!r} (from {p.plugin}) changed the graph's interface: inputs/outputs were "
            f"{interface}, now {(graph.inputs, graph.outputs)}")


def _label(node: object) -> str:
    name = getattr(node, "name", "") or "?"
    return f"{name}:{getattr(node, 'op_type', '?')}"


def summarize(results: Sequence[PassResult]) -> dict[str, dict[str, int]]:
    """Per pass: how many applications changed the graph and the net node delta."""
    table: dict[str, dict[str, int]] = {}
    for r in results:
        row = table.setdefault(r.name, {"applications": 0, "removed": 0, "added": 0, "delta": 0})
        row["applications"] += 1
        row["removed"] += len(r.removed)
        row["added"] += len(r.added)
        row["delta"] += r.nodes_after - r.nodes_before
    return table
