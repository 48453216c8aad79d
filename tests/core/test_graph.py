"""The IR: validation errors name the node; the rewrite API keeps producer/consumer maps true."""

from __future__ import annotations

import numpy as np
import pytest

from minfer_core import Graph, InvalidGraphError, Node


def chain() -> Graph:
    return Graph(
        [Node("Relu", ["x"], ["a"], name="r1"), Node("Neg", ["a"], ["b"], name="n1"), Node("Abs", ["b"], ["y"], name="a1")],
        inputs=["x"],
        outputs=["y"],
    )


def test_valid_graph_passes_validation():
    """A well-formed chain validates and sorts in order."""
    g = chain()
    g.validate()
    assert [n.name for n in g.topological_order()] == ["r1", "n1", "a1"]


def test_cycle_is_reported_with_node_names():
    """A cycle is an InvalidGraphError naming the nodes on it."""
    g = Graph([Node("Add", ["x", "c"], ["b"], name="p"), Node("Neg", ["b"], ["c"], name="q")], inputs=["x"], outputs=["b"])
    with pytest.raises(InvalidGraphError, match=r"cycle.*'p'.*'q'"):
        g.validate()


def test_dangling_value_is_reported():
    """Reading a value nobody produces names the node and the value."""
    g = Graph([Node("Relu", ["ghost"], ["y"], name="r")], inputs=["x"], outputs=["y"])
    with pytest.raises(InvalidGraphError, match=r"'r'.*'ghost'.*dangling"):
        g.validate()


def test_duplicate_output_name_is_rejected_on_insert():
    """Two producers of one value is an error naming both nodes."""
    g = chain()
    with pytest.raises(InvalidGraphError, match=r"'dup'.*'a'.*'r1'"):
        g.add_node(Node("Neg", ["x"], ["a"], name="dup"))


def test_output_shadowing_an_input_is_rejected():
    """A node may not redefine a graph input."""
    g = Graph([Node("Relu", ["z"], ["x"], name="r")], inputs=["x", "z"], outputs=["x"])
    with pytest.raises(InvalidGraphError, match="already a graph input"):
        g.validate()


def test_missing_graph_output_is_reported():
    """A graph output nobody produces is invalid."""
    g = Graph([Node("Relu", ["x"], ["a"])], inputs=["x"], outputs=["nope"])
    with pytest.raises(InvalidGraphError, match="'nope'"):
        g.validate()


def test_replace_all_uses_updates_consumers_and_outputs():
    """replace_all_uses rewires every reader and, by default, graph outputs."""
    g = chain()
    relu = g.producer("a")
    assert g.replace_all_uses("a", "x") == 1
    assert g.consumers("a") == []
    assert [n.name for n in g.consumers("x")] == ["r1", "n1"]
    g.remove_node(relu)
    g.validate()
    assert g.producer("a") is None


def test_replace_all_uses_can_keep_graph_outputs():
    """With graph_outputs=False the graph's interface does not change."""
    g = chain()
    g.add_node(Node("Identity", ["b"], ["b2"]))
    g.replace_all_uses("y", "b2", graph_outputs=False)
    assert g.outputs == ["y"]


def test_insert_before_and_set_input_keep_maps_consistent():
    """Inserting a node and rewiring an input keep producer/consumer maps exact."""
    g = chain()
    neg = g.producer("b")
    new = g.insert_before(neg, Node("Sigmoid", ["a"], ["s"], name="sig"))
    g.set_input(neg, 0, "s")
    assert g.producer("s") is new
    assert [n.name for n in g.consumers("a")] == ["sig"]
    assert g.nodes.index(new) < g.nodes.index(neg)
    g.validate()


def test_add_initializer_makes_a_constant_usable():
    """An added initializer is a known value with its type."""
    g = chain()
    g.add_initializer("w", np.ones((2, 3), np.float32))
    g.add_node(Node("Add", ["y", "w"], ["z"]))
    g.outputs.append("z")
    g.validate()
    assert g.is_constant("w") and g.type_of("w").shape == (2, 3)


def test_unique_name_avoids_existing_values():
    """unique_name never returns a name already used."""
    g = chain()
    names = {g.unique_name("a") for _ in range(5)}
    assert len(names) == 5 and not names & g.values()


def test_copy_is_independent():
    """Rewriting a copy leaves the original untouched."""
    g = chain()
    h = g.copy()
    h.remove_node(h.producer("y"))
    assert len(g.nodes) == 3 and g.producer("y") is not None


def if_graph() -> Graph:
    then = Graph([Node("Neg", ["a"], ["t"])], outputs=["t"], name="then")
    other = Graph([Node("Abs", ["a"], ["e"])], outputs=["e"], name="else")
    return Graph(
        [Node("If", ["c"], ["y"], {"then_branch": then, "else_branch": other}, name="if"), Node("Relu", ["x"], ["a"], name="r")],
        inputs=["x", "c"],
        outputs=["y"],
    )


def test_subgraph_reads_of_outer_values_count_as_uses():
    """A value read only inside a subgraph has the subgraph's node as consumer and is ordered before it."""
    g = if_graph()
    assert [n.name for n in g.consumers("a")] == ["if"]
    assert [n.name for n in g.topological_order()] == ["r", "if"]
    g.validate()


def test_replace_all_uses_renames_inside_subgraphs():
    """Replacing an outer value rewires the subgraphs that read it."""
    g = if_graph()
    g.replace_all_uses("a", "x")
    then = g.producer("y").attrs["then_branch"]
    assert then.nodes[0].inputs == ("x",)
    assert g.consumers("a") == [] and "if" in [n.name for n in g.consumers("x")]
    g.remove_node(g.producer("a"))
    g.validate()
