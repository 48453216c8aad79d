"""The pass manager: selection, ordering from declarations, fixed point, validation, records."""

from __future__ import annotations

import numpy as np
import pytest

from minfer_core import Graph, InferenceSession, Node, Pass, PassError, hookimpl, use_plugins
from minfer_core.pipeline import apply_pass, optimize, order_passes, run_passes, select_passes
from minfer_core.plugins import get_registry
from minfer_core.testing import GraphBuilder


def _noop(graph: Graph) -> bool:
    return False


def _names(passes) -> list[str]:
    return [p.name for p in passes]


class _Plugin:
    def __init__(self, *passes: Pass) -> None:
        self.passes = passes

    @hookimpl
    def register_passes(self, register):
        register(*self.passes)


def test_order_follows_after_before_requires():
    """Passes run after what they name in after/requires and before what they name in before."""
    a = Pass("a", _noop, after=("c",))
    b = Pass("b", _noop, before=("a",))
    c = Pass("c", _noop, requires=("d",))
    d = Pass("d", _noop)
    order = _names(order_passes([a, b, c, d]))
    assert order.index("c") < order.index("a") and order.index("b") < order.index("a")
    assert order.index("d") < order.index("c")


def test_order_ignores_absent_soft_constraints():
    """after/before naming a pass that is not selected do not constrain anything."""
    assert _names(order_passes([Pass("x", _noop, after=("nowhere",)), Pass("w", _noop)])) == ["w", "x"]


def test_cycle_is_an_error_naming_it():
    """A cycle in the declared ordering is a PassError that names the passes on it."""
    with pytest.raises(PassError, match="cycle: .*a.*b"):
        order_passes([Pass("a", _noop, after=("b",)), Pass("b", _noop, after=("a",)), Pass("c", _noop)])


def test_missing_requirement_is_an_error():
    """Requiring a pass that no plugin installed is a PassError naming both."""
    with use_plugins(_Plugin(Pass("needy", _noop, requires=("ghost",)))):
        with pytest.raises(PassError, match="needy.*requires pass 'ghost'"):
            select_passes(get_registry(), ["needy"])


def test_requirements_are_pulled_in_and_disabling_them_is_an_error():
    """A selected pass brings what it requires; disabling a required pass is an error."""
    with use_plugins(_Plugin(Pass("needs_dce", _noop, requires=("dead_code_elimination",)))):
        assert _names(select_passes(get_registry(), ["needs_dce"])) == ["dead_code_elimination", "needs_dce"]
        with pytest.raises(PassError, match="disabled"):
            select_passes(get_registry(), ["needs_dce"], ["dead_code_elimination"])


def test_levels_none_and_unknown_names():
    """'none' selects nothing, levels nest, unknown levels or pass names are errors."""
    reg = get_registry()
    assert select_passes(reg, "none") == []
    assert set(_names(select_passes(reg, "basic"))) < set(_names(select_passes(reg, "all")))
    assert "expand_fused" not in _names(select_passes(reg, "all"))  # portable passes run only on request
    with pytest.raises(PassError, match="unknown pass level"):
        select_passes(reg, "turbo")
    with pytest.raises(PassError, match="unknown pass"):
        select_passes(reg, ["no_such_pass"])


def test_fixed_point_is_bounded():
    """A pass that always claims a change stops after max_rounds sweeps."""
    calls = []
    p = Pass("restless", lambda g: calls.append(1) or True)
    results = run_passes(_graph(), [p], max_rounds=3)
    assert len(calls) == 3 and [r.round for r in results] == [1, 2, 3]


def test_a_pass_that_breaks_the_graph_is_named():
    """After a changing pass the graph is validated; a dangling value names the pass."""
    def breaker(graph: Graph) -> bool:
        graph.remove_node(graph.nodes[0])
        return True

    with pytest.raises(PassError, match="'breaker'.*invalid graph"):
        apply_pass(_graph(), Pass("breaker", breaker))


def test_a_pass_that_renames_an_output_is_named():
    """Passes must keep the graph's interface: renaming an output is a PassError."""
    def renamer(graph: Graph) -> bool:
        graph.replace_all_uses(graph.outputs[0], graph.inputs[0])
        graph.outputs[0] = graph.inputs[0]
        return True

    with pytest.raises(PassError, match="interface"):
        apply_pass(_graph(), Pass("renamer", renamer))


def test_records_name_removed_and_added_nodes():
    """A record counts nodes before/after and names the nodes that left and entered."""
    g = _graph()
    [p] = [q for q in get_registry().passes if q.name == "identity_elimination"]
    result = apply_pass(g, p)
    assert result.changed and result.nodes_before == 3 and result.nodes_after == 2
    assert any(r.endswith(":Identity") for r in result.removed) and result.added == ()


def test_session_selects_passes():
    """InferenceSession(passes=..., disabled_passes=...) picks the pipeline; outputs agree."""
    g = _graph()
    x = np.arange(6, dtype=np.float32).reshape(2, 3) - 2
    full = InferenceSession(g)
    assert [n.op_type for n in full.graph.nodes].count("Identity") == 0
    assert [n.op_type for n in InferenceSession(g, passes="none").graph.nodes].count("Identity") == 1
    kept = InferenceSession(g, disabled_passes=["identity_elimination"])
    assert [n.op_type for n in kept.graph.nodes].count("Identity") == 1
    only = InferenceSession(g, passes=["identity_elimination"])
    assert len(only.graph.nodes) == 2
    for s in (full, kept, only):
        np.testing.assert_array_equal(s.run(None, {g.inputs[0]: x})[0], np.abs(np.maximum(x, 0)))


def test_third_party_pass_joins_the_pipeline():
    """A pass registered by another plugin through the same hook runs in the level pipelines."""
    seen = []
    with use_plugins(_Plugin(Pass("spy", lambda g: seen.append(len(g.nodes)) or False, level="extended"))):
        results = optimize(_graph(), get_registry(), "all")
        assert seen and "spy" in _names(select_passes(get_registry(), "extended"))
    assert all(r.changed for r in results)


def _graph() -> Graph:
    b = GraphBuilder()
    x = b.input((2, 3))
    b.output(b.op("Abs", b.op("Identity", b.op("Relu", x))))
    return b.build()
