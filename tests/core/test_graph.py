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


# ---- the public rewrite API ---------------------------------------------------------------


def mm_add() -> Graph:
    """y = Add(MatMul(x, w), b), then z = Neg(y) read by the graph output."""
    nodes = [Node("MatMul", ["x", "w"], ["m"], name="mm"), Node("Add", ["m", "b"], ["y"], name="add"),
             Node("Neg", ["y"], ["z"], name="neg")]
    inits = {"w": np.ones((2, 2), np.float32), "b": np.ones(2, np.float32)}
    return Graph(nodes, inputs=["x"], outputs=["z"], initializers=inits)


def names(nodes) -> list[str]:
    return [n.name for n in nodes]


def test_sole_consumer_needs_one_reader_in_one_slot_and_no_graph_output():
    """sole_consumer is the one reader of a value read once, never a value the graph outputs."""
    g = mm_add()
    assert g.sole_consumer("m").name == "add" and g.sole_consumer("x").name == "mm"
    g.add_node(Node("Mul", ["y", "y"], ["sq"], name="sq"))
    assert g.sole_consumer("y") is None  # two readers
    assert g.sole_consumer("sq") is None  # no reader
    g2 = mm_add()
    g2.add_node(Node("Mul", ["z", "z"], ["zz"]))
    assert g2.sole_consumer("z") is None  # one reader, two slots, and a graph output


def test_is_used_counts_node_readers_and_graph_outputs():
    """is_used: a node reads the value or the graph outputs it; the empty name is never used."""
    g = mm_add()
    g.add_node(Node("Relu", ["x"], ["dead"]))
    assert g.is_used("m") and g.is_used("z") and not g.is_used("dead") and not g.is_used("")


def test_replace_puts_the_new_node_where_the_last_old_node_was():
    """replace removes the old nodes, keeps the maps true and places the new node after what they read."""
    g = mm_add()
    g.insert_before(g.producer("y"), Node("Relu", ["x"], ["late"], name="late"))
    gemm = g.replace([g.producer("m"), g.producer("y")], Node("Gemm", ["x", "w", "b"], ["y"], name="gemm"))
    assert names(g.nodes) == ["late", "gemm", "neg"]
    assert g.producer("y") is gemm and g.producer("m") is None and g.consumers("m") == []
    assert names(g.consumers("x")) == ["late", "gemm"] and g.sole_consumer("y").name == "neg"
    g.validate()


def test_replace_with_several_nodes_keeps_their_order():
    """replace with a list inserts the new nodes in the given order at the old node's place."""
    g = mm_add()
    new = [Node("MatMul", ["x", "w"], ["m2"], name="a"), Node("Add", ["m2", "b"], ["y"], name="b")]
    g.replace([g.producer("y"), g.producer("m")], [Node("Identity", ["x"], ["m"], name="i"), *new])
    assert names(g.nodes) == ["i", "a", "b", "neg"]
    g.validate()


def test_bypass_rewires_readers_or_renames_the_producer_of_a_graph_output():
    """bypass: readers read the input; for a graph output the input's producer takes the output's name."""
    g = mm_add()
    g.insert_before(g.producer("y"), Node("Identity", ["m"], ["i"], name="id"))
    g.set_input(g.producer("y"), 0, "i")
    assert g.bypass(g.producer("i"))
    assert g.producer("y").inputs == ("m", "b") and "id" not in names(g.nodes)
    g.validate()
    g.add_node(Node("Identity", ["z"], ["out"], name="id2"))
    g.outputs[:] = ["out"]
    assert g.bypass(g.producer("out"))
    assert g.outputs == ["out"] and g.producer("out").name == "neg" and g.producer("z") is None
    g.validate()


def test_bypass_refuses_when_the_source_is_also_read_elsewhere():
    """A graph output cannot be bypassed onto a value something else reads: nothing changes."""
    g = mm_add()
    g.add_node(Node("Identity", ["y"], ["out"], name="id"))
    g.outputs[:] = ["z", "out"]
    assert not g.bypass(g.producer("out"))
    assert "id" in names(g.nodes)
    g.validate()


def test_rename_output_moves_readers_and_type():
    """rename_output renames a node's output; readers and the type annotation follow."""
    from minfer_core import TensorType

    g = mm_add()
    g.types["m"] = TensorType(np.float32, (1, 2))
    mm = g.producer("m")
    assert g.rename_output(mm, "m", "m2") is mm
    assert mm.outputs == ("m2",) and g.producer("m2") is mm and g.producer("m") is None
    assert g.producer("y").inputs[0] == "m2" and g.types["m2"].shape == (1, 2)
    g.validate()
    with pytest.raises(InvalidGraphError, match="'y'"):
        g.rename_output(mm, "m2", "y")


def test_insert_remove_and_membership_keep_the_order():
    """insert_before places nodes (None: at the end); remove_node drops one; `in` and index follow."""
    g = mm_add()
    add = g.producer("y")
    r1 = g.insert_before(add, Node("Relu", ["m"], ["r1"], name="r1"))
    r2 = g.insert_before(g.producer("z"), Node("Relu", ["m"], ["r2"], name="r2"))
    g.insert_before(None, Node("Relu", ["m"], ["r3"], name="r3"))
    assert names(g.nodes) == ["mm", "r1", "add", "r2", "neg", "r3"] and g.nodes.index(r2) == 3
    g.remove_node(g.producer("r3"))
    g.remove_node(r1)
    assert r1 not in g.nodes and r2 in g.nodes and len(g.nodes) == 4 and g.consumers("m") == [add, r2]
    with pytest.raises(InvalidGraphError, match="not a node"):
        g.remove_node(r1)
    with pytest.raises(InvalidGraphError, match="already in graph"):
        g.add_node(r2)
    g.validate()


def test_many_inserts_at_one_place_keep_their_order():
    """Inserting again and again before one node keeps insertion order (labels are renumbered when needed)."""
    g = mm_add()
    add = g.producer("y")
    made = [g.insert_before(add, Node("Relu", ["x"], [f"r{i}"], name=f"r{i}")) for i in range(40)]
    assert list(g.nodes)[1:41] == made
    g.validate()


def test_nodes_is_a_read_only_view_safe_to_iterate_while_rewriting():
    """graph.nodes cannot be mutated directly, and a loop over it sees a snapshot while the graph changes."""
    g = mm_add()
    with pytest.raises(AttributeError):
        g.nodes.append(Node("Relu", ["x"], ["q"]))  # type: ignore[attr-defined]
    for node in g.nodes:
        if node.op_type == "MatMul":
            g.replace([node, g.producer("y")], Node("Gemm", ["x", "w", "b"], ["y"], name="gemm"))
    assert list(g.nodes) == [g.producer("y"), g.producer("z")] and names(g.nodes) == ["gemm", "neg"]
    g.validate()


def test_rewrites_do_not_rebuild_the_node_list(monkeypatch):
    """Removing, inserting and replacing nodes never rebuilds the list, also for a value read by many nodes."""
    from minfer_core.nodeorder import NodeOrder

    g = Graph([Node("Relu", ["x"], [f"r{i}"], name=f"r{i}") for i in range(1000)], inputs=["x"], outputs=["r999"])
    nodes = list(g.nodes)
    rebuilds = []
    build = NodeOrder.as_list
    monkeypatch.setattr(NodeOrder, "as_list", lambda self: rebuilds.append(self._list is None) or build(self))
    for i, node in enumerate(nodes[:-1]):
        if i % 2:
            g.remove_node(node)
        else:
            g.replace([node], Node("Neg", ["x"], node.outputs, name=f"n{i}"))
        assert node not in g.nodes and g.sole_consumer(node.outputs[0]) is None
    assert not any(rebuilds)
    assert len(g.consumers("x")) == 501  # 500 Negs and the last Relu
    g.validate()


def test_topological_order_sees_every_rewrite():
    """The cached order is dropped by any rewrite, an input-less node's insertion included."""
    g = mm_add()
    assert names(g.topological_order()) == ["mm", "add", "neg"]
    const = g.insert_before(g.producer("m"), Node("Constant", [], ["k"], {"value": np.float32(1)}, name="k"))
    assert names(g.topological_order()) == ["k", "mm", "add", "neg"]
    g.set_input(g.producer("y"), 1, "k")
    g.remove_node(g.producer("m"))
    g.add_node(Node("MatMul", ["x", "w"], ["m"], name="late"))  # after its reader in the list: the order moves it
    assert names(g.topological_order()) == [const.name, "late", "add", "neg"]
