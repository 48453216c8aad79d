"""minfer-passes' constant_if_inlining: an If with a constant condition becomes the nodes of its taken branch."""

from __future__ import annotations

import numpy as np
import pytest

from minfer_core import Graph, Node, TensorType
from minfer_core.testing import GraphBuilder
from minfer_passes.control_flow import constant_if_inlining
from modelkit import outputs_around

F32 = np.dtype(np.float32)


def branch(nodes, outputs, initializers=None, name="branch"):
    """A branch graph (no inputs) whose outputs are float32[3]."""
    return Graph(nodes, [], outputs, initializers or {}, {o: TensorType(F32, (3,)) for o in outputs}, name=name)


def if_graph(cond, then_g, else_g, outputs=1):
    """x -> a = Abs(x) -> If(cond) -> Neg of the first output; returns (builder, the If's output names)."""
    b = GraphBuilder()
    x = b.input((3,))
    b.graph.add_node(Node("Abs", [x], ["a"], name="abs"))
    c = b.const(np.asarray(cond)) if isinstance(cond, bool) else cond(b)
    outs = [f"y{i}" for i in range(outputs)]
    b.graph.add_node(Node("If", [c], outs, {"then_branch": then_g, "else_branch": else_g}, "if"))
    b.output(b.op("Neg", outs[0]), *outs[1:])
    return b, outs


@pytest.mark.parametrize("cond", [True, False])
def test_takes_the_branch_the_constant_picks(cond):
    """The If is gone, the taken branch's ops are in its place, and the outputs are those of the If."""
    then_g = branch([Node("Relu", ["a"], ["t"])], ["t"])
    else_g = branch([Node("Sigmoid", ["a"], ["e"])], ["e"])
    b, _ = if_graph(cond, then_g, else_g)
    changed, want, got = outputs_around(b.graph, constant_if_inlining)
    ops = [n.op_type for n in b.graph.nodes]
    assert changed and "If" not in ops and ("Relu" if cond else "Sigmoid") in ops
    np.testing.assert_array_equal(got[0], want[0])


def test_leaves_a_computed_condition_alone():
    """An If whose condition is computed at run time is kept."""
    then_g = branch([Node("Relu", ["a"], ["t"])], ["t"])
    else_g = branch([Node("Neg", ["a"], ["e"])], ["e"])
    b, _ = if_graph(lambda b: b.op("Greater", b.op("ReduceSum", "a", keepdims=0), b.const(np.float32(0))), then_g, else_g)
    assert not constant_if_inlining(b.graph)
    assert "If" in [n.op_type for n in b.graph.nodes]


def test_branch_values_are_renamed_apart_from_outer_ones():
    """A branch constant named like an outer one, and branch values a nested If reads, are renamed consistently."""
    inner = branch([Node("Neg", ["m"], ["n"])], ["n"], name="inner")
    then_g = branch([Node("Mul", ["a", "c"], ["m"]), Node("If", ["k"], ["abs_out"], {"then_branch": inner,
                     "else_branch": inner.copy()}), Node("Add", ["abs_out", "m"], ["t"])], ["t"],
                    {"c": np.float32(3.0), "k": np.asarray(True)})
    else_g = branch([Node("Neg", ["a"], ["e"])], ["e"])
    b, _ = if_graph(True, then_g, else_g)
    b.graph.add_initializer("c", np.float32(-7.0))  # an outer value of the same name as the branch's constant
    b.output(b.op("Add", "a", "c"))
    changed, want, got = outputs_around(b.graph, constant_if_inlining)
    assert changed
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)
    assert b.graph.initializers["c"] == np.float32(-7.0)


def test_outputs_keep_their_names_and_copies_cover_outer_and_repeated_values():
    """A branch returning one value twice, an outer value or a constant gives each If output its own value."""
    then_g = branch([Node("Relu", ["a"], ["t"])], ["t", "t", "a", "k"], {"k": np.ones(3, np.float32)})
    else_g = branch([Node("Neg", ["a"], ["e"])], ["e", "e", "e", "e"])
    b, outs = if_graph(True, then_g, else_g, outputs=4)
    changed, want, got = outputs_around(b.graph, constant_if_inlining)
    assert changed and b.graph.outputs[1:] == outs[1:]
    assert sum(n.op_type == "Identity" for n in b.graph.nodes) == 3
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_an_if_output_that_is_a_graph_output_keeps_the_interface():
    """When the If's output is itself a graph output, the inlined producer outputs that very name."""
    then_g = branch([Node("Relu", ["a"], ["t"])], ["t"])
    b, outs = if_graph(False, then_g, branch([Node("Tanh", ["a"], ["e"])], ["e"]))
    b.output(outs[0])
    changed, want, got = outputs_around(b.graph, constant_if_inlining)
    assert changed and outs[0] in b.graph.outputs and b.graph.producer(outs[0]).op_type == "Tanh"
    np.testing.assert_array_equal(got[-1], want[-1])


def test_applying_twice_equals_once():
    """After inlining nothing is left to inline."""
    b, _ = if_graph(True, branch([Node("Relu", ["a"], ["t"])], ["t"]), branch([Node("Neg", ["a"], ["e"])], ["e"]))
    assert constant_if_inlining(b.graph)
    assert not constant_if_inlining(b.graph)
