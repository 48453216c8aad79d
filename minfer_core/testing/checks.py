"""Checks that a pass keeps a graph's numbers: the oracle is the same engine without the pass.

Tolerance per dtype: integer and bool outputs must be identical; float
outputs must satisfy ``|got - want| <= rtol*|want| + atol*max(1, max|want|)``
elementwise (atol scales with the output's magnitude so a large activation
does not fail on rounding that is tiny relative to it), with the pass's
declared ``rtol``/``atol`` for float32 and float64 and at least
`FLOAT16_FLOOR` for float16. NaN must match NaN.
"""

from __future__ import annotations

from typing import Iterable, Sequence

import attrs
import numpy as np

from ..errors import MinferError
from ..graph import Graph
from ..passes import Pass, PassResult
from .builder import random_feeds

FLOAT16_FLOOR = (1e-2, 1e-3)


class PassCheckFailure(AssertionError):
    """A pass broke a rule of the property suite; the message names the pass and the rule."""


class UnusableExample(Exception):
    """The graph does not run even without the pass: no evidence about the pass either way.

    The hypothesis properties reject such examples (kernel failures are the
    kernels' own tests' business); direct callers see the engine's error.
    """


@attrs.frozen
class PassOutcome:
    """What `check_pass` observed: whether the pass fired, and its record."""

    changed: bool
    result: PassResult


def run_graph(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Outputs of ``graph`` on ``feeds`` with no pass applied."""
    from ..engine import Engine

    with np.errstate(all="ignore"):
        return [np.asarray(o) for o in Engine(graph, passes="none").run(None, feeds)]


def tolerance(rtol: float, atol: float, dtype: np.dtype) -> tuple[float, float]:
    """The (rtol, atol) a check applies to outputs of ``dtype``."""
    dtype = np.dtype(dtype)
    if dtype.kind != "f" and dtype.kind != "c":
        return 0.0, 0.0
    if dtype.itemsize <= 2:
        return max(rtol, FLOAT16_FLOOR[0]), max(atol, FLOAT16_FLOOR[1])
    return rtol, atol


def outputs_mismatch(want: Sequence[np.ndarray], got: Sequence[np.ndarray], rtol: float, atol: float,
                     names: Sequence[str] = ()) -> str | None:
    """Why ``got`` differs from ``want`` beyond tolerance, or None when they agree."""
    names = list(names) or [f"output {i}" for i in range(len(want))]
    if len(want) != len(got):
        return f"{len(got)} outputs instead of {len(want)}"
    for name, w, g in zip(names, want, got):
        w, g = np.asarray(w), np.asarray(g)
        if w.shape != g.shape or w.dtype != g.dtype:
            return f"{name}: {g.dtype}{list(g.shape)} instead of {w.dtype}{list(w.shape)}"
        r, a = tolerance(rtol, atol, w.dtype)
        if r == 0 and a == 0:
            if not np.array_equal(w, g, equal_nan=w.dtype.kind == "f"):
                return f"{name}: values differ (exact dtype {w.dtype})"
            continue
        w64, g64 = w.astype(np.float64), g.astype(np.float64)
        finite = np.isfinite(w64)
        scale = max(1.0, float(np.abs(w64[finite]).max())) if finite.any() else 1.0
        with np.errstate(invalid="ignore"):
            err = np.abs(g64 - w64)
        bad = ~((err <= r * np.abs(w64) + a * scale) | (np.isnan(w64) & np.isnan(g64)) | (w64 == g64))
        if bad.any():
            i = np.unravel_index(int(np.argmax(np.where(bad, err, -1))), w.shape)
            return (f"{name}: {int(bad.sum())}/{w.size} values beyond rtol={r:g} atol={a:g} "
                    f"(worst at {tuple(int(k) for k in i)}: want {w64[i]!r}, got {g64[i]!r})")
    return None


def signature(graph: Graph) -> tuple:
    """A structural fingerprint: nodes (op, inputs, outputs, attribute names), initializer names, interface."""
    nodes = tuple((n.domain, n.op_type, n.inputs, n.outputs, tuple(sorted(n.attrs))) for n in graph.nodes)
    return nodes, tuple(sorted(graph.initializers)), tuple(graph.inputs), tuple(graph.outputs)


def prepare_for(p: Pass, graph: Graph, passes: Iterable[Pass]) -> Graph:
    """A copy of ``graph`` with the passes ``p`` requires already applied (its baseline)."""
    from ..pipeline import apply_pass, order_passes

    installed = {q.name: q for q in passes}
    needed: dict[str, Pass] = {}
    todo = list(p.requires)
    while todo:
        name = todo.pop()
        if name not in needed and name in installed:
            needed[name] = installed[name]
            todo.extend(installed[name].requires)
    g = graph.copy()
    for q in order_passes(list(needed.values())):
        apply_pass(g, q)
    return g


def check_pass(p: Pass, graph: Graph, *, feeds: dict[str, np.ndarray] | None = None,
               installed: Iterable[Pass] = ()) -> PassOutcome:
    """Apply ``p`` to ``graph`` and assert the suite's rules; returns whether it fired.

    Rules: the graph stays valid (checked by the pass manager), outputs equal
    the outputs without the pass within its tolerance, and a second
    application changes nothing (structure and outputs).
    """
    from ..pipeline import apply_pass

    base = prepare_for(p, graph, installed)
    feeds = feeds if feeds is not None else random_feeds(base)
    want = _baseline(base, feeds)
    once = base.copy()
    result = _apply(apply_pass, once, p)
    _compare(p, "applying it", want, _run(p, once, feeds), once.outputs)
    twice = once.copy()
    again = _apply(apply_pass, twice, p)
    if signature(twice) != signature(once):
        raise PassCheckFailure(
            f"pass {p.name!r} is not idempotent: a second application changed the graph again "
            f"({again.nodes_before} -> {again.nodes_after} nodes, removed {list(again.removed)}, added {list(again.added)})"
        )
    if again.changed:
        _compare(p, "applying it twice", want, _run(p, twice, feeds), twice.outputs)
    return PassOutcome(result.changed, result)


def _baseline(graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    try:
        return run_graph(graph, feeds)
    except MinferError as exc:
        raise UnusableExample(f"the graph fails without the pass: {exc}") from exc


def _apply(apply_pass, graph: Graph, p: Pass) -> PassResult:  # type: ignore[no-untyped-def]
    try:
        return apply_pass(graph, p)
    except MinferError as exc:
        raise PassCheckFailure(str(exc)) from exc


def _run(p: Pass, graph: Graph, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    try:
        return run_graph(graph, feeds)
    except MinferError as exc:
        raise PassCheckFailure(f"after pass {p.name!r} the graph no longer runs: {exc}") from exc


def _compare(p: Pass, what: str, want: list[np.ndarray], got: list[np.ndarray], names: Sequence[str]) -> None:
    why = outputs_mismatch(want, got, p.rtol, p.atol, names)
    if why:
        raise PassCheckFailure(f"pass {p.name!r} changed the outputs when {what}: {why}")


def check_pipeline(graph: Graph, passes: Sequence[Pass], *, feeds: dict[str, np.ndarray] | None = None) -> list[PassResult]:
    """Run ``passes`` (ordered) to a fixed point and assert outputs hold within their summed tolerances."""
    from ..pipeline import run_passes

    feeds = feeds if feeds is not None else random_feeds(graph)
    want = _baseline(graph, feeds)
    g = graph.copy()
    try:
        results = run_passes(g, passes)
    except MinferError as exc:
        raise PassCheckFailure(str(exc)) from exc
    fired = {r.name for r in results}
    rtol = sum(q.rtol for q in passes if q.name in fired) or 1e-6
    atol = sum(q.atol for q in passes if q.name in fired) or 1e-7
    try:
        got = run_graph(g, feeds)
    except MinferError as exc:
        raise PassCheckFailure(f"after the pipeline ({sorted(fired)}) the graph no longer runs: {exc}") from exc
    why = outputs_mismatch(want, got, rtol, atol, g.outputs)
    if why:
        raise PassCheckFailure(f"the pipeline (passes that fired: {sorted(fired)}) changed the outputs: {why}")
    return results
