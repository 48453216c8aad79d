"""The pass manager: selects passes by level or name, orders them, runs them.

(Interim version: selection and one sweep in registration order; the ordered,
fixed-point manager with validation and change records replaces it.)
"""

from __future__ import annotations

from typing import Iterable, Sequence, Union

from .graph import Graph
from .passes import LEVELS, Pass, PassResult
from .plugins import Registry

PassSelection = Union[str, Sequence[str], None]


def select_passes(registry: Registry, passes: PassSelection, disabled: Iterable[str] = ()) -> list[Pass]:
    """The passes ``passes`` names: a level ("basic", "extended", "all", "none") or a list of names."""
    disabled = set(disabled)
    if passes is None or passes == "none":
        return []
    if isinstance(passes, str):
        rank = LEVELS.index(passes)
        chosen = [p for p in registry.passes if LEVELS.index(p.level) <= rank]
    else:
        by_name = {p.name: p for p in registry.passes}
        chosen = [by_name[n] for n in passes]
    return [p for p in chosen if p.name not in disabled]


def optimize(graph: Graph, registry: Registry, passes: PassSelection = "all", disabled: Iterable[str] = ()) -> list[PassResult]:
    """Run the selected passes over ``graph`` in place."""
    results = []
    for p in select_passes(registry, passes, disabled):
        before = len(graph.nodes)
        changed = bool(p.fn(graph))
        results.append(PassResult(p.name, changed, before, len(graph.nodes)))
    return results
