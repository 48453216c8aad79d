"""One kernel-preparation path: the engine, constant folding and the testing kit all go through Kernel.prepared."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import minfer_core
from minfer_core import Kernel, KernelContext, KernelError, get_registry, kernel
from minfer_core.testing.ops import call_kernel
from modelkit import make_model, tensor


@pytest.fixture
def prepared_calls(monkeypatch):
    """Every (op_type, node name) Kernel.prepared is called for during the test."""
    calls = []
    original = Kernel.prepared

    def spy(self, ctx, attrs):
        calls.append((self.op_type, ctx.node_name))
        return original(self, ctx, attrs)

    monkeypatch.setattr(Kernel, "prepared", spy)
    return calls


def test_the_engine_and_constant_folding_prepare_through_kernel_prepared(prepared_calls):
    """Build prepares every node, and folding a constant node prepares it, through the one path."""
    nodes = [helper.make_node("Neg", ["c"], ["nc"], name="folded"), helper.make_node("Add", ["x", "nc"], ["y"], name="kept")]
    c = helper.make_tensor("c", 1, [3], [1.0, 2.0, 3.0])
    model = make_model(nodes, [tensor("x", [3])], [tensor("y", [3])], initializers=[c])
    sess = minfer_core.InferenceSession(model.SerializeToString(), passes="all")
    assert ("Neg", "folded") in prepared_calls  # constant folding computed it
    assert ("Add", "kept") in prepared_calls  # binding prepared it
    np.testing.assert_allclose(sess.run(None, {"x": np.zeros(3, np.float32)})[0], [-1, -2, -3])


def test_the_testing_kit_prepares_through_kernel_prepared(prepared_calls):
    """call_kernel prepares the kernel the engine would pick, the same way."""
    kernels = get_registry().kernels[("", "Relu")]
    out = call_kernel(kernels, "Relu", 14, np.array([-1.0, 2.0], np.float32))
    np.testing.assert_array_equal(out, [0, 2])
    assert prepared_calls and prepared_calls[-1][0] == "Relu"


def test_prepared_checks_attributes_the_same_way_everywhere():
    """An unknown or missing required attribute is a KernelError naming the node, whoever prepares."""

    @kernel("Scale", domain="test.prep")
    def scale(x, *, factor):
        """Scale-1: x * factor."""
        return x * factor

    ctx = KernelContext("n1", "Scale", 1, (None,), (None,), (None,), 1)
    assert scale.prepared(ctx, {"factor": 2.0})(np.ones(2))[0] == 2.0
    with pytest.raises(KernelError, match=r"node 'n1' \(Scale\) lacks required attribute\(s\) \['factor'\]"):
        scale.prepared(ctx, {})
    with pytest.raises(KernelError, match=r"does not accept"):
        scale.prepared(ctx, {"factor": 1.0, "bogus": 1})
