"""Build's warm-up: a model whose inputs are all static tensors is planned at build by a run on zeros."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

import minfer_core
from minfer_core import MinferError
from modelkit import make_model, tensor


def _static(shape=(2, 3)):
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])]
    return make_model(nodes, [tensor("x", list(shape))], [tensor("y", list(shape))])


def _reshaped_by_input():
    """y = Reshape(x, shape): the target shape is a feed, which zeros cannot be."""
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["y"])]
    return make_model(nodes, [tensor("x", [2, 3]), tensor("shape", [2], TensorProto.INT64)], [tensor("y", None)])


def _looping():
    """A Loop whose trip count is a feed: on zeros it would run 0 times, but a while-loop on zeros may never end."""
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Add", ["v_in", "one"], ["v_out"])],
        "body", [tensor("i", [], TensorProto.INT64), tensor("cond_in", [], TensorProto.BOOL), tensor("v_in", [1])],
        [tensor("cond_out", [], TensorProto.BOOL), tensor("v_out", [1])],
        [helper.make_tensor("one", TensorProto.FLOAT, [1], [1.0])])
    nodes = [helper.make_node("Loop", ["n", "cond", "v"], ["v_final"], body=body)]
    inputs = [tensor("n", [], TensorProto.INT64), tensor("cond", [], TensorProto.BOOL), tensor("v", [1])]
    return make_model(nodes, inputs, [tensor("v_final", [1])])


def test_a_static_model_is_planned_at_build():
    """With every input static, the memory plan exists right after build (no run needed to report it)."""
    engine = minfer_core.Engine(_static())
    assert engine.memory_report()["arena_bytes"] >= 0
    with pytest.raises(MinferError, match="needs a plan"):
        minfer_core.Engine(_static(), warm_up=False).memory_report()


def test_the_first_run_after_warm_up_is_right():
    """The warm-up's zeros leave nothing behind: the first real run computes from its own feeds."""
    x = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)
    got = minfer_core.Engine(_static()).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, -np.maximum(x, 0))


def test_symbolic_inputs_are_planned_at_their_first_run():
    """A symbolic dim has no one signature to plan: the build leaves it to the first run."""
    with pytest.raises(MinferError, match="needs a plan"):
        minfer_core.Engine(_static(("N", 3))).memory_report()


def test_a_model_rejecting_zeros_still_builds_and_runs():
    """A model whose zeros are invalid (a Reshape target read from a feed) builds, and runs its real feeds."""
    engine = minfer_core.Engine(_reshaped_by_input())
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    got = engine.run(None, {"x": x, "shape": np.array([3, 2], np.int64)})[0]
    np.testing.assert_array_equal(got, x.reshape(3, 2))


def test_a_model_with_subgraphs_is_not_warmed_up():
    """A Loop could run without end on zeros: models with subgraphs plan at their first run."""
    engine = minfer_core.Engine(_looping())
    with pytest.raises(MinferError, match="needs a plan"):
        engine.memory_report()
    got = engine.run(None, {"n": np.array(3, np.int64), "cond": np.array(True), "v": np.zeros(1, np.float32)})[0]
    np.testing.assert_array_equal(got, [3.0])


def test_a_profiled_session_records_only_its_own_runs(tmp_path):
    """The warm-up run is not a run the user asked for: a profiling session's trace holds only theirs."""
    opts = minfer_core.SessionOptions()
    opts.enable_profiling = True
    opts.profile_file_prefix = str(tmp_path / "trace")
    sess = minfer_core.InferenceSession(_static(), opts)
    sess.run(None, {"x": np.ones((2, 3), np.float32)})
    import json

    events = json.loads(open(sess.end_profiling()).read())
    events = events["traceEvents"] if isinstance(events, dict) else events
    assert sum(e.get("name") == "model_run" for e in events) == 1
    # each node once: the build's warm-up run recorded none (model_run is the session's; nodes are the executor's)
    assert sum(e.get("cat") == "Node" for e in events) == len(sess.graph.nodes) > 0
