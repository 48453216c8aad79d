"""The pass property suite as pytest tests, for every installed pass (third-party included).

Collected by ``pytest --minfer-passes`` (all installed passes) or
``pytest --minfer-passes=PLUGIN[,PLUGIN]`` (only those plugins' passes); a
project may also import these tests into a test module of its own. Each
pass is checked on its target strategy (keeps outputs within its tolerance,
stays valid, is idempotent, really fires) and on random graphs; the whole
``all`` pipeline is checked on random graphs and every pass's patterns.
"""

from __future__ import annotations

import re
from typing import Any

import pytest

from minfer_core.pipeline import select_passes
from minfer_core.plugins import get_registry
from minfer_core.testing.suite import target_strategy, verify_on_random_graphs, verify_pass, verify_pipeline


def select(wanted: str | None) -> tuple[list[Any], list[str]]:
    """The installed passes ``--minfer-passes=WANTED`` selects, and the names in it that match nothing.

    ``WANTED`` is ``all`` (or empty) or comma-separated plugin (distribution)
    names and pass names.
    """
    passes = list(get_registry().passes)
    if not wanted or wanted == "all":
        return passes, []
    names = [w.strip() for w in wanted.split(",") if w.strip()]
    dists = {_dist(n) for n in names}
    chosen = [p for p in passes if _dist(p.plugin) in dists or p.name in names]
    known = {_dist(p.plugin) for p in passes} | {p.name for p in passes}
    return chosen, [n for n in names if _dist(n) not in known and n not in known]


def _dist(name: str | None) -> str:
    """A distribution name as pip compares them: ``My_Plugin`` and ``my-plugin`` are one."""
    return re.sub(r"[-_.]+", "-", name or "").lower()


def _selected(config: Any) -> list[Any]:
    wanted = config.getoption("minfer_passes", None) if config is not None else None
    return select(wanted)[0]


def pytest_generate_tests(metafunc: Any) -> None:
    if "minfer_pass" in metafunc.fixturenames:
        passes = _selected(metafunc.config)
        metafunc.parametrize("minfer_pass", passes, ids=[p.name for p in passes])


def test_pass_fires_and_keeps_outputs(minfer_pass: Any) -> None:
    """On its target strategy a pass keeps outputs within its tolerance, stays valid, is idempotent and fires."""
    verify_pass(minfer_pass, get_registry().passes)


def test_pass_keeps_outputs_on_random_graphs(minfer_pass: Any) -> None:
    """On random graphs a pass keeps outputs within its tolerance, stays valid and is idempotent."""
    verify_on_random_graphs(minfer_pass, get_registry().passes)


def test_all_pipeline_keeps_outputs() -> None:
    """The whole ``all`` pipeline keeps outputs on random graphs and on every pass's target strategy."""
    from minfer_core.testing.strategies import graphs

    registry = get_registry()
    targets = [target_strategy(p) for p in registry.passes if p.patterns is not None and p.role == "optimize"]
    sources = [graphs(), *targets]
    verify_pipeline(select_passes(registry, "all"), sources)


def test_every_pass_is_covered() -> None:
    """Every installed pass declares a target strategy that resolves, so the suite can exercise it."""
    missing = [f"{p.name} ({p.plugin})" for p in get_registry().passes if p.patterns is None]
    assert not missing, f"passes without a target strategy (Pass.patterns): {missing}"
    for p in get_registry().passes:
        target_strategy(p)  # raises, naming the pass, when its import string does not resolve
