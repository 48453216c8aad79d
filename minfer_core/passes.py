"""Pass records. The pass manager that orders and runs them lives in `minfer_core.pipeline`."""

from __future__ import annotations

from typing import Callable

import attrs

from .graph import Graph

LEVELS = ("basic", "extended", "all")


@attrs.frozen
class Pass:
    """A named graph rewrite: ``fn(graph) -> bool`` (whether it changed the graph).

    ``level`` places it in the basic / extended / all pipelines; ``after`` and
    ``before`` order it against other passes by name; ``requires`` names passes
    that must be present. ``rtol``/``atol`` state how far it may move outputs
    (the property suite enforces it).
    """

    name: str
    fn: Callable[[Graph], bool]
    level: str = attrs.field(default="basic", validator=attrs.validators.in_(LEVELS))
    after: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    before: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    requires: tuple[str, ...] = attrs.field(default=(), converter=tuple)
    rtol: float = 1e-5
    atol: float = 1e-6
    doc: str = ""
    plugin: str | None = attrs.field(default=None, eq=False)


@attrs.frozen
class PassResult:
    """What one pass did to a graph."""

    name: str
    changed: bool
    nodes_before: int
    nodes_after: int
    removed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
