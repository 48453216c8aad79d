"""Process teams (procs.py): a forked worker computes a share of each shared step, and results never change.

Each test builds engines with ``parallel="processes"`` and compares them with
the threads engine (same conv methods: tuning off), checks that steps were
really shared with the worker (the team's counter), and that failures,
dead workers, new shapes and feeds that outputs alias are handled.
"""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import minfer_core
from minfer_core import hookimpl, kernel, op, parallel_for, spmd
from minfer_parallel import procs
from minfer_parallel.procs import Dispatch, RankPool

pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork") or len(os.sched_getaffinity(0)) < 2, reason="process teams need fork and two CPUs"
)

RUNS = 2 * Dispatch.TRIALS + 4  # discovery, the timed trials, then steady runs


@pytest.fixture(autouse=True)
def share_everything(monkeypatch):
    """Share every candidate step and keep the team for every shape (timing decides otherwise: on a busy
    host the threads' tiny runs here can win), and take the conv's first method and the depthwise conv's
    first layout (no tuners: two engines could time their way to different ones)."""
    from minfer_ops_conv import conv, depthwise

    monkeypatch.setattr(Dispatch, "GAIN", 1e9)
    monkeypatch.setattr(procs.ModeChoice, "GAIN", 1e9)
    monkeypatch.setattr(conv, "TUNE", False)
    monkeypatch.setattr(depthwise, "TUNE", False)
    # nor the core's timing among kernels: a node's choice (a Choice step) is never shared, and two engines could
    # choose differently
    monkeypatch.setenv("MINFER_TUNE", "0")
    # the threads engine's kernels would split on minfer-ops-numba's native teams, in other shares of their
    # GEMMs than the process team's ranges (the same values but for last bits: tests/plugins/test_team.py)
    monkeypatch.setenv("MINFER_NUMBA_TEAM", "0")
    try:
        from minfer_ops_numba import team
    except ImportError:
        return
    monkeypatch.setattr(team, "_state", {})


def _model(nodes, inputs, outputs, inits=(), opsets=(("", 17),)):
    graph = helper.make_graph(nodes, "g", inputs, outputs, list(inits))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(d, v) for d, v in opsets])
    model.ir_version = 10
    return model


def _conv_model(c, m, hw, kernel_shape, strides=(1, 1), pads=(0, 0, 0, 0), group=1, batch=1, seed=0):
    """x -> Abs -> Conv (+ bias) -> Concat(c, c): the conv reads and writes arena memory the worker shares."""
    rng = np.random.default_rng(seed)
    w = rng.standard_normal((m, c // group) + tuple(kernel_shape)).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    nodes = [
        helper.make_node("Abs", ["x"], ["a"]),
        helper.make_node("Conv", ["a", "w", "b"], ["c"], kernel_shape=list(kernel_shape), strides=list(strides),
                         pads=list(pads), group=group),
        helper.make_node("Concat", ["c", "c"], ["y"], axis=1),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, c, hw, hw])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return _model(nodes, [x], [y], [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])


def _runs(sess, feeds, n=RUNS):
    return [sess.run(None, feeds)[0] for _ in range(n)]


CONVS = {
    "winograd": dict(c=64, m=64, hw=14, kernel_shape=(3, 3), pads=(1, 1, 1, 1)),
    "im2col-strided": dict(c=32, m=48, hw=17, kernel_shape=(3, 3), strides=(2, 2), pads=(1, 0, 1, 0)),
    "pointwise": dict(c=96, m=128, hw=14, kernel_shape=(1, 1)),
    "pointwise-batch": dict(c=64, m=64, hw=7, kernel_shape=(1, 1), batch=3),
    "grouped": dict(c=64, m=64, hw=12, kernel_shape=(3, 3), pads=(1, 1, 1, 1), group=4),
    "depthwise": dict(c=48, m=48, hw=28, kernel_shape=(3, 3), pads=(1, 1, 1, 1), group=48),
    "depthwise-s2": dict(c=32, m=32, hw=15, kernel_shape=(3, 3), strides=(2, 2), group=32, batch=2),
}


@pytest.mark.parametrize("case", sorted(CONVS))
def test_conv_methods_give_the_threads_result(case):
    kw = CONVS[case]
    model = _conv_model(**kw)
    x = np.random.default_rng(1).standard_normal((kw.get("batch", 1), kw["c"], kw["hw"], kw["hw"])).astype(np.float32)
    threads = minfer_core.InferenceSession(model, threads=2)
    procs_ = minfer_core.InferenceSession(model, threads=2, parallel="processes")
    team = procs.team()
    before = team.shared_steps
    expected = threads.run(None, {"x": x})[0]
    for got in _runs(procs_, {"x": x}):
        np.testing.assert_array_equal(got, expected)  # the same tiles, the same GEMMs: bitwise equal
    # minfer-ops-conv's conv methods pay for sharing; a faster kernel of another plugin (minfer-ops-numba's
    # depthwise conv, tested without it by scripts/test.sh's second run) may not
    if all(s.kernel.plugin == "minfer-ops-conv" for s in procs_.program.specs if s.kernel.op_type == "Conv"):
        assert team.shared_steps > before, "the conv never ran with the worker"


def test_a_zoo_model_matches_threads_over_runs():
    from minfer_core.testing.zoo import model_path, randomized

    model = randomized(model_path("light_squeezenet"))  # shipped in the onnx wheel
    rng = np.random.default_rng(0)
    threads = minfer_core.InferenceSession(model, threads=2)
    procs_ = minfer_core.InferenceSession(model, threads=2, parallel="processes")
    name = threads.get_inputs()[0].name
    team = procs.team()
    before = team.shared_steps
    for k in range(RUNS):
        x = rng.standard_normal((1, 3, 224, 224)).astype(np.float32)
        np.testing.assert_array_equal(procs_.run(None, {name: x})[0], threads.run(None, {name: x})[0])
    assert team.shared_steps - before >= 10  # convs and pools of the steady runs


def test_new_shapes_refork_and_match_fresh_engines():
    model = _conv_model(c=32, m=32, hw=16, kernel_shape=(3, 3), pads=(1, 1, 1, 1))
    model.graph.input[0].type.tensor_type.shape.dim[2].dim_param = "h"
    model.graph.input[0].type.tensor_type.shape.dim[3].dim_param = "w"
    sess = minfer_core.InferenceSession(model, threads=2, parallel="processes")
    team = procs.team()
    rng = np.random.default_rng(3)
    for hw in (16, 24, 16, 9, 24, 16):
        x = rng.standard_normal((1, 32, hw, hw)).astype(np.float32)
        fresh = minfer_core.InferenceSession(model, threads=2)
        expected = fresh.run(None, {"x": x})[0]
        for got in _runs(sess, {"x": x}, 3):
            np.testing.assert_array_equal(got, expected)
    forks = team.forks
    for _ in range(RUNS):  # alternating known shapes: nothing new, no fork
        for hw in (16, 24):
            sess.run(None, {"x": rng.standard_normal((1, 32, hw, hw)).astype(np.float32)})
    assert team.forks == forks


def test_outputs_never_alias_the_staged_feed():
    # y1 is a view of the feed; the shared conv reads the feed, so the engine stages it in shared memory (7.4M
    # multiply-adds: minfer-ops-numba's conv cuts it in units a team shares, as numpy's does)
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 32, 3, 3)).astype(np.float32)
    nodes = [
        helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
        helper.make_node("ReduceSum", ["c"], ["y2"], keepdims=1),
        helper.make_node("Flatten", ["x"], ["y1"], axis=1),
    ]
    x_info = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 32, 20, 20])
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in ("y1", "y2")]
    sess = minfer_core.InferenceSession(_model(nodes, [x_info], outs, [numpy_helper.from_array(w, "w")]),
                                        threads=2, parallel="processes")
    team = procs.team()
    before = team.shared_steps
    kept = []
    for k in range(RUNS):
        x = np.full((1, 32, 20, 20), float(k), np.float32)
        y1, _ = sess.run(None, {"x": x})
        kept.append((k, y1))
    for k, y1 in kept:
        assert (y1 == k).all(), "a returned output changed when a later run staged its feed"
    assert team.shared_steps > before


class _Flaky:
    """test.procs::Double (2x, shared with the worker), whose worker side fails while the file FLAG exists
    (a file: the forked worker does not see the parent's later writes to memory)."""

    FLAG = ""
    PARENT = os.getpid()

    @hookimpl
    def register_ops(self, register):
        register(op("Double", domain="test.procs"), op("DoubleInPlace", domain="test.procs"))

    @hookimpl
    def register_kernels(self, register):
        register(_double, _double_in_place)


@kernel("Double", domain="test.procs", prepare=True, out=True, views=False)
def _double(ctx):
    def run(x, *, out=None):
        y = np.empty_like(x) if out is None else out
        flat_x, flat_y = x.reshape(-1), y.reshape(-1)

        def part(lo, hi):
            if os.getpid() != _Flaky.PARENT and _Flaky.FLAG and os.path.exists(_Flaky.FLAG):
                raise RuntimeError("worker-side failure")
            np.multiply(flat_x[lo:hi], 2, out=flat_y[lo:hi])

        parallel_for(flat_x.size, part, parts=2, outputs_only=True)
        return y

    return spmd(run)


@kernel("DoubleInPlace", domain="test.procs", prepare=True, out=True, inplace=(0,), views=False)
def _double_in_place(ctx):
    return _double.fn(ctx)


def _double_model(op_type="Double"):
    nodes = [
        helper.make_node("Abs", ["x"], ["a"]),
        helper.make_node(op_type, ["a"], ["d"], domain="test.procs"),
        helper.make_node("Concat", ["d", "d"], ["y"], axis=0),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [4, 1000])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    return _model(nodes, [x], [y], opsets=(("", 17), ("test.procs", 1)))


def _flaky_session(model):
    """A process-team session whose runs these tests count from the first: no warm-up run at build."""
    return minfer_core.InferenceSession(model, threads=2, parallel="processes", warm_up=False)


@pytest.mark.parametrize("team_gain", [1e9, 1e-9])
def test_a_failing_worker_share_is_recomputed_and_the_worker_replaced(minfer_plugin, tmp_path, monkeypatch, team_gain):
    # team_gain 1e-9: the threads win the team-or-threads trials; the failed run must not count as one of the
    # team's, else those trials end before the next team run and no worker is forked again (seen in CI)
    monkeypatch.setattr(procs.ModeChoice, "GAIN", team_gain)
    flag = tmp_path / "fail"
    monkeypatch.setattr(_Flaky, "FLAG", str(flag))
    minfer_plugin(_Flaky())
    sess = _flaky_session(_double_model())
    x = np.random.default_rng(0).standard_normal((4, 1000)).astype(np.float32)
    expected = np.concatenate([2 * np.abs(x)] * 2)
    for got in _runs(sess, {"x": x}):
        np.testing.assert_array_equal(got, expected)
    team = procs.team()
    forks = team.forks
    before = team.shared_steps
    flag.write_text("")  # the worker's next share raises
    try:
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], expected)
    finally:
        flag.unlink()
    assert team.shared_steps > before and team.pid == 0  # it was shared, failed, and the worker is gone
    for got in _runs(sess, {"x": x}, 3):
        np.testing.assert_array_equal(got, expected)
    assert team.forks > forks


def test_a_failing_worker_share_of_an_in_place_step_is_an_error(minfer_plugin, tmp_path, monkeypatch):
    flag = tmp_path / "fail"
    monkeypatch.setattr(_Flaky, "FLAG", str(flag))
    minfer_plugin(_Flaky())
    sess = _flaky_session(_double_model("DoubleInPlace"))
    x = np.random.default_rng(0).standard_normal((4, 1000)).astype(np.float32)
    for got in _runs(sess, {"x": x}):
        np.testing.assert_array_equal(got, np.concatenate([2 * np.abs(x)] * 2))
    flag.write_text("")
    try:
        with pytest.raises(minfer_core.KernelError, match="in-place"):  # never a silently doubled half
            sess.run(None, {"x": x})
    finally:
        flag.unlink()


def _state(pid):
    """The process's state letter in /proc (R running, S sleeping, Z dead and not yet reaped)."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()[0]


def _wait_for_state(pid, states, what):
    deadline = time.monotonic() + 10.0  # a deadline against hanging, not a measurement
    while _state(pid) not in states:
        assert time.monotonic() < deadline, what
        time.sleep(0.001)


def test_a_killed_worker_is_replaced(minfer_plugin):
    minfer_plugin(_Flaky())
    sess = _flaky_session(_double_model())
    x = np.ones((4, 1000), np.float32)
    _runs(sess, {"x": x})
    team = procs.team()
    os.kill(team.pid, signal.SIGKILL)
    _wait_for_state(team.pid, "Z", "the killed worker did not die")
    before = team.shared_steps
    for got in _runs(sess, {"x": x}, 4):
        assert (got == 2).all()
    assert team.shared_steps > before


def test_the_worker_sleeps_between_runs(minfer_plugin, monkeypatch):
    """After a run (and its short linger) the worker blocks in a read of its pipe instead of spinning."""
    monkeypatch.setattr(procs, "LINGER", 0.0)  # read by the worker, forked after this
    minfer_plugin(_Flaky())
    sess = _flaky_session(_double_model())
    _runs(sess, {"x": np.ones((4, 1000), np.float32)})
    pid = procs.team().pid
    _wait_for_state(pid, "S", "the worker never went to sleep after the run")
    with open(f"/proc/{pid}/wchan") as fh:
        wchan = fh.read()
    assert wchan in ("0", "") or "pipe" in wchan or "wait" in wchan, wchan  # asleep in read(), if the kernel says


class _Control:
    def __init__(self):
        self.barriers = 0

    def barrier(self, rank):
        self.barriers += 1


@pytest.mark.parametrize("n,parts", [(1, 1), (2, 2), (7, 3), (100, 8), (5, 9)])
def test_rank_shares_cover_the_ranges_once(n, parts):
    seen = []
    for rank in (0, 1):
        control = _Control()
        RankPool(control, rank, 2).run_outputs(n, lambda lo, hi, r=rank: seen.append((r, lo, hi)), parts)
        assert control.barriers == 1  # every share ends at the barrier, even an empty one
    covered = sorted(i for _, lo, hi in seen for i in range(lo, hi))
    assert covered == list(range(n))
    if n == 1:
        assert seen == [(0, 0, 1)]  # a lone range stays with the calling process


def test_dispatch_shares_the_steps_that_ran_faster_shared(monkeypatch):
    monkeypatch.setattr(Dispatch, "GAIN", 0.9)
    d = Dispatch([True, True, False])
    first = d.trial()
    assert first == [True, True, False]
    d.record(first, [9.0, 9.0, 9.0])  # a new worker's first run: not counted
    shared_times, alone_times = [0.5, 1.0, 1.0], [1.0, 1.0, 1.0]
    while (flags := d.trial()) is not None:
        d.record(flags, shared_times if flags[0] else alone_times)
    assert d.flags == [True, False, False]  # 0.5 < 0.9 * 1.0; 1.0 is not; never a non-candidate


def test_mode_choice_keeps_the_faster_way(monkeypatch):
    monkeypatch.setattr(procs.ModeChoice, "GAIN", 1.0)
    m = procs.ModeChoice()
    times = {True: 2.0, False: 1.5}
    while m.team is None:
        team = m.want_team()
        m.record(team, times[team])
    assert m.team is False and m.want_team() is False
    assert procs.ModeChoice(False).want_team() is False  # nothing shared: threads from the start


def test_auto_threads_count_the_worker_as_this_process(monkeypatch):
    """The worker spins during runs: "auto" counts its CPU time as this process's, not as another
    process's load (which would make the next run use 1 thread)."""
    from minfer_parallel.autothreads import cpu_sample

    monkeypatch.setattr(procs, "worker_cpu_seconds", lambda: 0.0)
    alone = cpu_sample()
    monkeypatch.setattr(procs, "worker_cpu_seconds", lambda: 1000.0)
    with_worker = cpu_sample()
    assert with_worker[1] - alone[1] >= 1000.0  # (plus whatever this process used between the two samples)
