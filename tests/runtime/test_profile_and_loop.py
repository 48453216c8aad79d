"""Profiling (Chrome trace), run observers, thread control and the run loop's error reporting."""

from __future__ import annotations

import json

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelkit import make_model, tensor
from minfer_core import InferenceSession, KernelError, hookimpl
from minfer_parallel.blas import get_blas_threads, set_blas_threads


def two_node_model():
    # run with passes="basic": elementwise_fusion ("extended") would make Relu + Neg one node
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"), helper.make_node("Neg", ["h"], ["y"], name="neg")]
    return make_model(nodes, [tensor("x", ["N", 3])], [tensor("y", ["N", 3])])


def test_profile_writes_one_chrome_trace_event_per_node_and_run(tmp_path):
    """profile() writes Chrome "X" events per node per run, with op type and output shapes, plus run events."""
    sess = InferenceSession(two_node_model(), passes="basic")
    path = tmp_path / "trace.json"
    sess.profile({"x": np.ones((2, 3), np.float32)}, str(path), repeat=2)
    doc = json.loads(path.read_text())
    nodes = [e for e in doc["traceEvents"] if e["cat"] == "Node"]
    assert [e["name"] for e in nodes] == ["relu", "neg", "relu", "neg"]
    assert all(e["ph"] == "X" and e["dur"] >= 0 for e in doc["traceEvents"])
    assert nodes[0]["args"]["op_name"] == "Relu" and nodes[0]["args"]["output_type_shape"] == [{"float32": [2, 3]}]
    assert sum(e["name"] == "model_run" for e in doc["traceEvents"]) == 2


class Recorder:
    """An observer plugin: records every node it sees start and end."""

    def __init__(self):
        self.seen = []

    @hookimpl
    def register_observers(self, register):
        register(self)

    def on_node_start(self, node):
        self.seen.append(("start", node.name))

    def on_node_end(self, node, outputs):
        self.seen.append(("end", node.name, outputs[0].shape))


def test_registered_observers_see_every_node(minfer_plugin):
    """Observers from the register_observers hook are called around each node, in every kind of run."""
    rec = Recorder()
    minfer_plugin(rec)
    sess = InferenceSession(two_node_model(), passes="basic")
    for _ in range(2):  # the discovery run and a planned run
        sess.run(None, {"x": np.ones((4, 3), np.float32)})
    assert rec.seen == [("start", "relu"), ("end", "relu", (4, 3)), ("start", "neg"), ("end", "neg", (4, 3))] * 2


def test_kernel_failures_name_the_node_and_shapes():
    """A kernel that raises during a run surfaces as KernelError naming the node and input shapes."""
    nodes = [helper.make_node("MatMul", ["a", "b"], ["y"], name="mm")]
    model = make_model(nodes, [tensor("a", ["N", "K"]), tensor("b", ["J", 2])], [tensor("y", ["N", 2])])
    sess = InferenceSession(model)
    with pytest.raises(KernelError, match=r"node 'mm' \(MatMul\) failed on input shapes \[\(2, 3\), \(4, 2\)\]"):
        sess.run(None, {"a": np.ones((2, 3), np.float32), "b": np.ones((4, 2), np.float32)})


def test_a_failure_in_a_planned_run_names_its_node():
    """In the runs after a shape's first (the generated run loop over the bound plan) a failing step is still
    named: the middle one of three, with its input shapes, not its neighbours."""
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"),
             helper.make_node("Gather", ["h", "i"], ["g"], name="gather", axis=0),
             helper.make_node("Neg", ["g"], ["y"], name="neg")]
    model = make_model(nodes, [tensor("x", [4, 3]), tensor("i", [2], TensorProto.INT64)], [tensor("y", [2, 3])])
    sess = InferenceSession(model, passes="basic")
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    for _ in range(2):
        np.testing.assert_array_equal(sess.run(None, {"x": x, "i": np.array([3, 0])})[0], -x[[3, 0]])
    with pytest.raises(KernelError, match=r"node 'gather' \(Gather\) failed on input shapes \[\(4, 3\), \(2,\)\]"):
        sess.run(None, {"x": x, "i": np.array([7, 0])})


def test_a_dropped_session_frees_its_arena_without_the_garbage_collector():
    """The generated run loop holds the bound steps (and through their out= buffers the arena) but no reference
    cycle: a session let go frees its memory at once, not at the next collection."""
    import gc
    import weakref

    w = numpy_helper.from_array(np.eye(64, dtype=np.float32), "w")
    nodes = [helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
             helper.make_node("MatMul", ["r", "w"], ["y"])]
    model = make_model(nodes, [tensor("x", [64, 64])], [tensor("y", [64, 64])], [w])
    sess = InferenceSession(model, passes="none", threads=None)
    for _ in range(3):
        sess.run(None, {"x": np.ones((64, 64), np.float32)})
    arena = weakref.ref(sess.executor.plans.arena)
    assert arena() is not None and arena().nbytes > 0
    gc.disable()
    try:
        del sess
        assert arena() is None
    finally:
        gc.enable()


def test_threads_apply_during_runs_only():
    """threads= sets numpy's BLAS thread count while the engine runs and restores the caller's after."""
    before = get_blas_threads()
    if before is None:
        pytest.skip("numpy's BLAS is not an OpenBLAS minfer can control")
    seen = []

    class Probe:
        @hookimpl
        def register_observers(self, register):
            register(self)

        def on_node_start(self, node):
            seen.append(get_blas_threads())

        def on_node_end(self, node, outputs):
            pass

    from minfer_core.plugins import use_plugins

    set_blas_threads(2)
    try:
        with use_plugins(Probe()):
            InferenceSession(two_node_model(), threads=1, passes="basic").run(None, {"x": np.ones((1, 3), np.float32)})
        assert seen == [1, 1] and get_blas_threads() == 2
    finally:
        set_blas_threads(before)


def test_auto_threads_drop_to_one_while_other_processes_are_busy(monkeypatch):
    """AutoThreads uses every core on an idle machine and one while other processes keep a core busy."""
    from minfer_parallel.autothreads import AutoThreads

    clock = iter(float(t) for t in range(100))
    samples = iter([(0, 0), (1.0, 1.0), (2.0, 2.0), (3.9, 2.9), (5.8, 3.8), (7.7, 4.7), (8.7, 5.7), (9.7, 6.7)])
    auto = AutoThreads(2, clock=lambda: next(clock), sample=lambda: next(samples))
    idle = [auto.choose() for _ in range(3)]  # only this process was busy
    busy = [auto.choose() for _ in range(3)]  # others kept ~0.9 of a core busy
    calm = [auto.choose() for _ in range(2)]
    assert idle == [2, 2, 2] and busy[-1] == 1 and calm[-1] == 2
