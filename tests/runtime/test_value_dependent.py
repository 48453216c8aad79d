"""Kernels whose aliasing or output shape depends on input values never make a plan return wrong results."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import minfer_core
from modelkit import make_model, ort_run, tensor

SCALE_UP = np.array([1, 1, 2, 2], np.float32)
SCALE_ONE = np.array([1, 1, 1, 1], np.float32)


def _resize_model(extra_consumer: bool):
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Resize", ["r", "", "scales"], ["y"], mode="nearest")]
    outputs = [tensor("y", None)]
    if extra_consumer:
        # the Resize output read by an op that may write in place: a view of r must not be written through
        nodes.append(helper.make_node("Neg", ["y"], ["z"]))
        outputs = [tensor("z", None)]
    return make_model(nodes, [tensor("x", [1, 1, 4, 4]), tensor("scales", [4])], outputs, opset=18)


@pytest.mark.parametrize("extra_consumer", [False, True])
@pytest.mark.parametrize("passes", ["none", "all"])
def test_runtime_scale_of_one_after_a_real_resize_returns_owned_correct_arrays(extra_consumer, passes):
    """A Resize that returns its input for a runtime scale of 1, after a run that really resized, is still right."""
    model = _resize_model(extra_consumer)
    sess = minfer_core.InferenceSession(model.SerializeToString(), passes=passes)
    rng = np.random.default_rng(0)
    runs = [(rng.standard_normal((1, 1, 4, 4), dtype=np.float32), s) for s in (SCALE_UP, SCALE_ONE, SCALE_ONE, SCALE_UP, SCALE_ONE)]
    returned, copies = [], []
    for x, scales in runs:
        got = sess.run(None, {"x": x, "scales": scales})[0]
        want = ort_run(model, {"x": x, "scales": scales})[0]
        np.testing.assert_allclose(got, want, rtol=1e-6, atol=0)
        returned.append(got)
        copies.append(got.copy())
    for got, kept in zip(returned, copies):
        np.testing.assert_array_equal(got, kept)  # no later run wrote into an earlier run's output


def test_a_kernel_that_starts_returning_views_is_copied_not_trusted(minfer_plugin):
    """An undeclared kernel seen returning fresh arrays on the first run may return a view later: the output is copied."""

    @minfer_core.kernel("MaybeView", domain="test.values")
    def maybe_view(x, flag):
        """MaybeView-1: x itself when flag is set, else a fresh copy."""
        return x if flag[0] else x.copy()

    class Plugin:
        @minfer_core.hookimpl
        def register_ops(self, register):
            register(minfer_core.op("MaybeView", domain="test.values"))

        @minfer_core.hookimpl
        def register_kernels(self, register):
            register(maybe_view)

    minfer_plugin(Plugin())
    nodes = [
        helper.make_node("Relu", ["x"], ["r"]),
        helper.make_node("MaybeView", ["r", "flag"], ["y"], domain="test.values"),
    ]
    model = make_model(nodes, [tensor("x", [8]), tensor("flag", [1], TensorProto.BOOL)], [tensor("y", [8])],
                       extra_opsets=[helper.make_opsetid("test.values", 1)])
    sess = minfer_core.InferenceSession(model.SerializeToString(), passes="none")
    x = np.arange(8, dtype=np.float32)
    sess.run(None, {"x": x, "flag": np.array([False])})
    first = sess.run(None, {"x": x, "flag": np.array([True])})[0]
    kept = first.copy()
    sess.run(None, {"x": x + 100, "flag": np.array([True])})
    np.testing.assert_array_equal(first, kept)
