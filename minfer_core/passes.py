"""Pass records. The pass manager that orders and runs them lives in `minfer_core.pipeline`."""

from __future__ import annotations

import re
from typing import Any, Callable

import attrs

from .errors import PassError
from .graph import Graph

LEVELS = ("basic", "extended", "all")
"""Pipeline levels, cheapest first; a level includes every level before it ("none" selects nothing)."""

ROLES = ("optimize", "portable")
"""``optimize`` passes run in the level pipelines; ``portable`` passes lower minfer-only nodes
back to standard ONNX ops (``minfer optimize --portable``) and never run in a level."""


PATTERNS_IMPORT_STRING = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


def check_patterns(p: Pass, _attribute: Any, value: Any) -> None:
    """Refuse a ``Pass.patterns`` that is neither None, a callable nor an import string ``"module:name"``."""
    if value is None or callable(value):
        return
    if isinstance(value, str) and PATTERNS_IMPORT_STRING.fullmatch(value):
        return
    raise PassError(
        f"pass {p.name!r}: patterns={value!r} is neither an import string 'package.module:name' naming a "
        "zero-argument callable that returns a hypothesis strategy of graphs, nor such a callable; "
        "write e.g. patterns='my_plugin.strategies:my_pass_targets'")


@attrs.frozen
class Pass:
    """A named graph rewrite: ``fn(graph) -> bool`` (whether it changed the graph).

    ``level`` places it in the basic / extended / all pipelines; ``after`` and
    ``before`` order it against other passes by name (ignored when the other
    pass is not selected); ``requires`` names passes that must run before it
    (the pass manager pulls them in, or fails when they are not installed).
    ``rtol``/``atol`` state how far it may move float outputs (the property
    suite enforces it; integer outputs must stay exact).

    ``patterns`` names the pass's target strategy: a zero-argument callable
    returning a hypothesis strategy of `Graph` objects that contain the pass's
    target pattern in random context, either given as an import string
    ``"package.module:name"`` (preferred: nothing is imported until the
    property suite resolves it, so a plugin never needs hypothesis to load) or
    as the callable itself. The property suite (`minfer_core.testing`) draws
    from it to check that the pass fires where it must, keeps outputs, and is
    idempotent. Only the form is checked here (see `check_patterns`).
    ``role`` is ``"optimize"`` or ``"portable"`` (see `ROLES`).
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
    patterns: str | Callable[[], Any] | None = attrs.field(default=None, eq=False, validator=check_patterns)
    role: str = attrs.field(default="optimize", validator=attrs.validators.in_(ROLES))
    plugin: str | None = attrs.field(default=None, eq=False)

    def __call__(self, graph: Graph) -> bool:
        return bool(self.fn(graph))

    @property
    def summary(self) -> str:
        """The first line of the pass's documentation."""
        text = self.doc or getattr(self.fn, "__doc__", None) or ""
        return text.strip().splitlines()[0] if text.strip() else ""


@attrs.frozen
class PassResult:
    """What one application of a pass did to a graph.

    ``removed`` and ``added`` name the nodes (by name, else by op type) that
    left or entered the graph; a fusion shows as its parts removed and the
    fused node added. ``round`` is the fixed-point iteration it ran in (from 1).
    """

    name: str
    changed: bool
    nodes_before: int
    nodes_after: int
    removed: tuple[str, ...] = ()
    added: tuple[str, ...] = ()
    round: int = 1
    seconds: float = 0.0

    def describe(self) -> str:
        """One line for a report: ``name: 120 -> 98 nodes (-22), fused/removed ...``."""
        delta = self.nodes_after - self.nodes_before
        line = f"{self.name} (round {self.round}): {self.nodes_before} -> {self.nodes_after} nodes ({delta:+d})"
        if self.removed or self.added:
            line += f", removed {len(self.removed)}, added {len(self.added)}"
        return line
