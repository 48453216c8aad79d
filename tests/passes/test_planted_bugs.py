"""The property suite can fail: planted bugs in passes are caught, and vacuous passes are refused."""

from __future__ import annotations

import attrs
import numpy as np
import pytest

from minfer_core import Graph, Node, Pass
from minfer_core.plugins import get_registry
from minfer_core.testing import PassCheckFailure, verify_pass
from minfer_passes import fusion


def _real(name: str) -> Pass:
    return next(p for p in get_registry().passes if p.name == name)


def _off_by_one_conv_bn(graph: Graph) -> bool:
    """conv_bn_fusion with a planted off-by-one: each output channel gets its neighbour's folded weights."""
    rebuild = fusion._rebuild_conv

    def shifted(graph, conv, last, w, b, dtype):
        rebuild(graph, conv, last, np.concatenate([w[1:], w[:1]]), b, dtype)

    fusion._rebuild_conv = shifted
    try:
        return fusion.conv_bn_fusion(graph)
    finally:
        fusion._rebuild_conv = rebuild


def test_planted_off_by_one_in_a_fusion_is_caught():
    """A Conv+BN fusion that folds channel i+1's scale into channel i fails the suite on its own strategy."""
    broken = attrs.evolve(_real("conv_bn_fusion"), name="broken_conv_bn", fn=_off_by_one_conv_bn)
    with pytest.raises(PassCheckFailure, match="broken_conv_bn.*changed the outputs"):
        verify_pass(broken, get_registry().passes)


def test_the_unbroken_fusion_passes():
    """The same check on the real conv_bn_fusion passes and sees it fire."""
    assert verify_pass(_real("conv_bn_fusion"), get_registry().passes) > 0


def test_a_pass_that_never_fires_fails():
    """A pass that changes nothing on its target strategy fails: no vacuous passing."""
    idle = attrs.evolve(_real("conv_bn_fusion"), name="idle", fn=lambda g: False)
    with pytest.raises(PassCheckFailure, match="never changed"):
        verify_pass(idle, get_registry().passes)


def test_a_pass_without_a_target_strategy_fails():
    """A pass that declares no target strategy cannot be verified and fails."""
    with pytest.raises(PassCheckFailure, match="no target strategy"):
        verify_pass(Pass("blind", lambda g: False), [])


def test_a_non_idempotent_pass_fails():
    """A pass whose second application changes the graph again fails."""
    def grow(graph: Graph) -> bool:
        out = graph.outputs[0]
        node = graph.producer(out)
        mid = graph.unique_name("mid")
        graph.remove_node(node)
        graph.add_node(Node(node.op_type, node.inputs, [mid], dict(node.attrs), node.name, node.domain))
        graph.add_node(Node("Identity", [mid], [out], {}, graph.unique_name("id")))
        return True

    growing = attrs.evolve(_real("dead_code_elimination"), name="grow", fn=grow)
    with pytest.raises(PassCheckFailure, match="not idempotent"):
        verify_pass(growing, get_registry().passes)


def test_fusing_through_an_extra_consumer_is_caught():
    """An activation fusion that ignores the intermediate's other readers leaves a dangling value and fails."""
    from minfer_passes import activation

    def careless(graph: Graph) -> bool:
        original = Graph.sole_consumer
        Graph.sole_consumer = lambda g, v: (g.consumers(v) or [None])[0]  # type: ignore[method-assign]
        try:
            return activation.activation_fusion(graph)
        finally:
            Graph.sole_consumer = original  # type: ignore[method-assign]

    broken = attrs.evolve(_real("activation_fusion"), name="careless_fusion", fn=careless)
    with pytest.raises(PassCheckFailure, match="careless_fusion"):
        verify_pass(broken, get_registry().passes)
