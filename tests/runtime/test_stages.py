"""Inter-op stages: which steps may run side by side, how they run, and what the memory plan makes of them."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from onnx import TensorProto, helper

from modelkit import make_model, ort_run, tensor
from minfer_core import InferenceSession, KernelError, hookimpl, kernel, op
from minfer_core import Stage
from minfer_core.parallel import using_threads
from minfer_parallel import stages as stages_mod
from minfer_parallel.sharing import Team
from minfer_parallel.stages import Calibration, choose, producers, split

from . import outkernels as ok
from .outkernels import node


@pytest.fixture(autouse=True)
def threads_mode(monkeypatch):
    """Stages are the threads mode's (a process team's runs do not stage): whatever MINFER_PARALLEL says. And the
    kernels by priority, not timed per thread count: the bitwise comparisons with threads=1 below need the same
    kernel for a node at both counts (minfer-ops-numba's MatMul makes other BLAS calls than numpy's: last bits)."""
    monkeypatch.setenv("MINFER_PARALLEL", "threads")
    monkeypatch.setenv("MINFER_TUNE", "0")

N = 64


def _inception_deps() -> list[tuple[int, ...]]:
    """Steps: 0 stem; branches 1 | 2-3 | 4-5-6 | 7-8 (as an inception module orders them); 9 joins them."""
    return [(), (0,), (0,), (2,), (0,), (4,), (5,), (0,), (7,), (1, 3, 6, 8)]


def test_producers_follow_slots():
    """A step depends on the last earlier step that wrote a slot it reads; slot 0 (no value) links nothing."""
    ins = [(1,), (2,), (2, 0), (3, 4)]
    outs = [(2,), (3,), (4, 0), (5,)]
    assert producers(ins, outs) == [(), (0,), (0,), (1, 2)]


def test_split_finds_the_branches_of_a_module():
    """Steps 1..8 of an inception-like module fall into its four branches, each in order."""
    assert sorted(split(_inception_deps(), 1, 8)) == [(1,), (2, 3), (4, 5, 6), (7, 8)]
    assert split(_inception_deps(), 1, 9) == ((1, 2, 3, 4, 5, 6, 7, 8, 9),)  # the join ties them together


def test_choose_takes_a_module_of_comparable_branches():
    """Balanced branches between a fork and a join become one stage; the stem and the join stay sequential."""
    cost = [1e-3, 1e-3, 5e-4, 5e-4, 4e-4, 3e-4, 3e-4, 6e-4, 4e-4, 1e-5]
    (stage,) = choose(_inception_deps(), cost)
    assert (stage.first, stage.last) == (1, 8)
    assert sorted(stage.branches) == [(1,), (2, 3), (4, 5, 6), (7, 8)]


def test_choose_leaves_chains_and_lopsided_branches_alone():
    """No stage in a chain; none where one branch is nearly all the work (nothing to overlap)."""
    chain = [(), (0,), (1,), (2,)]
    assert choose(chain, [1e-3] * 4) == []
    lopsided = [(), (0,), (0,), (1, 2)]
    assert choose(lopsided, [1e-4, 2e-3, 2e-5, 1e-5]) == []


def test_choose_needs_a_saving_above_the_overhead():
    """Two 40 us branches do not pay for a 50 us hand-over; two 400 us ones do."""
    deps = [(), (0,), (0,), (1, 2)]
    assert choose(deps, [1e-5, 4e-5, 4e-5, 1e-5]) == []
    assert choose(deps, [1e-5, 4e-4, 4e-4, 1e-5]) == [Stage(1, 2, ((1,), (2,)))]


def test_calibration_keeps_only_stages_that_ran_faster():
    """After the timed runs, a trial stage stays only if its measured time beat its steps in sequence."""
    deps = [(), (0,), (0,), (1, 2), (3,), (3,), (4, 5)]
    cal = Calibration(deps, workers=2)
    times = [1e-4, 5e-4, 5e-4, 1e-4, 5e-4, 5e-4, 1e-4]
    assert cal.add_serial(times) is None
    trial = cal.add_serial(times)
    assert trial == [Stage(1, 2, ((1,), (2,))), Stage(4, 5, ((4,), (5,)))]
    walls = {1: 6e-4, 4: 1.1e-3}  # the first stage saved 400 us, the second lost 100 us
    assert cal.add_trial(walls) is None
    assert cal.add_trial(walls) == [Stage(1, 2, ((1,), (2,)))]


def test_team_shares_a_branch_ranges_with_an_idle_thread():
    """Once out of branches, a thread works on another branch's parallel_for ranges; all ranges run once."""
    done: list[tuple[int, str]] = []
    helped = threading.Event()

    def short() -> None:
        pass

    def long() -> None:
        publisher = threading.current_thread()

        def fn(lo: int, hi: int) -> None:
            for k in range(lo, hi):
                done.append((k, threading.current_thread().name))
            if threading.current_thread() is publisher:
                helped.wait(10)  # hold the publisher until the idle thread has taken a range (10 s: against a hang)
            else:
                helped.set()

        team.run(40, fn, 40)

    team = Team([long, short], threads=2)
    worker = threading.Thread(target=team.work)
    worker.start()
    team.work()
    worker.join()
    assert sorted(k for k, _ in done) == list(range(40))
    assert len({name for _, name in done}) == 2


def test_team_keeps_the_first_branch_error():
    """An exception in a branch ends up in ``error``; the other branches still end."""
    ran = []

    def bad() -> None:
        raise ValueError("boom")

    team = Team([bad, lambda: ran.append(1)], threads=1)
    team.work()
    assert isinstance(team.error, ValueError)


# ---- engine level ----------------------------------------------------------------------------------


def _branchy_model():
    """x -> four MatMul/Relu/Add branches of different lengths -> Concat -> y ([N, 4N])."""
    rng = np.random.default_rng(0)
    inits, nodes, tails = [], [], []
    for b, depth in enumerate((1, 2, 3, 2)):
        cur = "x"
        for d in range(depth):
            w = f"w{b}{d}"
            inits.append(helper.make_tensor(w, TensorProto.FLOAT, [N, N], (rng.standard_normal((N, N)) / 8).astype(np.float32).ravel().tolist()))
            nodes.append(helper.make_node("MatMul", [cur, w], [f"m{b}{d}"], name=f"mm{b}{d}"))
            nodes.append(helper.make_node("Relu", [f"m{b}{d}"], [f"r{b}{d}"], name=f"relu{b}{d}"))
            cur = f"r{b}{d}"
        nodes.append(helper.make_node("Add", [cur, "x"], [f"t{b}"], name=f"res{b}"))
        tails.append(f"t{b}")
    nodes.append(helper.make_node("Concat", tails, ["y"], axis=1, name="cat"))
    return make_model(nodes, [tensor("x", ["B", N])], [tensor("y", ["B", 4 * N])], inits)


def _x(rows: int, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((rows, N)).astype(np.float32)


def test_always_runs_the_branches_as_a_stage_with_the_sequential_outputs():
    """inter_op="always" finds the four branches; the outputs are bitwise those of threads=1 and match ORT."""
    model = _branchy_model()
    staged = InferenceSession(model, threads=2, inter_op="always")
    serial = InferenceSession(model, threads=1, inter_op="never")
    x = _x(8)
    want = serial.run(None, {"x": x})[0]
    for _ in range(3):
        np.testing.assert_array_equal(staged.run(None, {"x": x})[0], want)
    (stage,) = staged.executor.stages[staged.executor.plans.last][0]
    assert len(stage.branches) == 4  # one per branch (passes may have fused MatMul and Relu)
    assert staged.executor.staged[staged.executor.plans.last]  # it ran through the staged loop
    np.testing.assert_allclose(want, ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_alternating_shapes_keep_their_own_stages():
    """Each input shape gets its plan and stages; alternating shapes give the same outputs as threads=1."""
    model = _branchy_model()
    staged = InferenceSession(model, threads=2, inter_op="always")
    serial = InferenceSession(model, threads=1, inter_op="never")
    for i, rows in enumerate([3, 17, 3, 40, 17, 3]):
        x = _x(rows, seed=i)
        np.testing.assert_array_equal(staged.run(None, {"x": x})[0], serial.run(None, {"x": x})[0])
    assert len(staged.executor.staged) == 3


def test_auto_calibrates_then_settles(monkeypatch):
    """inter_op="auto" times two sequential and two staged runs, then keeps the stages that paid."""
    monkeypatch.setattr(stages_mod, "MIN_GAIN", -1.0)  # keep every trial stage, whatever this machine measures
    monkeypatch.setattr(stages_mod, "MIN_SHARE", -1e9)
    monkeypatch.setattr(stages_mod, "OVERHEAD", 0.0)
    model = _branchy_model()
    sess = InferenceSession(model, threads=2, inter_op="auto")
    serial = InferenceSession(model, threads=1, inter_op="never")
    x = _x(64)
    want = serial.run(None, {"x": x})[0]
    for run in range(6):
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)
        sig = sess.executor.plans.last
        assert (sig in sess.executor.pending) == (run < 4)
    assert sess.executor.staged[sig]


def test_one_thread_keeps_the_sequential_loop():
    """With threads=1 nothing is timed and no stage is planned."""
    sess = InferenceSession(_branchy_model(), threads=1)
    for _ in range(4):
        sess.run(None, {"x": _x(4)})
    assert not sess.executor.pending and not sess.executor.staged


class _FailPlugin:
    """A kernel that fails on a negative input, to check errors raised inside a branch."""

    @hookimpl
    def register_ops(self, register):
        register(op("FailIfNeg", domain="test.stages"))

    @hookimpl
    def register_kernels(self, register):
        register(_fail_if_neg)


@kernel("FailIfNeg", domain="test.stages")
def _fail_if_neg(x):
    """FailIfNeg: x, or an error when x has a negative element."""
    if (x < 0).any():
        raise ValueError("negative input")
    return x + 0


def test_a_failing_kernel_in_a_branch_names_its_node(minfer_plugin):
    """An exception inside a concurrent branch surfaces as KernelError naming the node and its input shapes."""
    minfer_plugin(_FailPlugin())
    nodes = [
        helper.make_node("Relu", ["x"], ["a"], name="left"),
        helper.make_node("Neg", ["a"], ["a2"], name="left2"),
        helper.make_node("Abs", ["x"], ["b"], name="right"),
        helper.make_node("FailIfNeg", ["x"], ["b2"], name="picky", domain="test.stages"),
        helper.make_node("Sum", ["a2", "b", "b2"], ["y"], name="join"),
    ]
    model = make_model(nodes, [tensor("x", [4, 4])], [tensor("y", [4, 4])],
                       extra_opsets=[helper.make_opsetid("test.stages", 1)])
    sess = InferenceSession(model, threads=2, inter_op="always")
    sess.run(None, {"x": np.ones((4, 4), np.float32)})
    assert sess.executor.staged[sess.executor.plans.last]
    with pytest.raises(KernelError, match=r"picky.*\(4, 4\).*negative input"):
        sess.run(None, {"x": -np.ones((4, 4), np.float32)})
    # the session still works afterwards
    np.testing.assert_array_equal(sess.run(None, {"x": np.ones((4, 4), np.float32)})[0], np.full((4, 4), 1.0, np.float32))


# ---- memory plan -----------------------------------------------------------------------------------


def _two_branch_out_model():
    """a = x + b; two branches each ReluOut(a) -> AddOut(., b) -> ReluOut; y = Twice(sum of both)."""
    b = helper.make_tensor("b", TensorProto.FLOAT, [N], np.full(N, 0.25, np.float32).tolist())
    nodes = [node("AddOut", ["x", "b"], ["a"], "stem")]
    for side in ("l", "r"):
        nodes += [
            node("ReluOut", ["a"], [f"{side}1"], f"{side}_relu1"),
            node("AddOut", [f"{side}1", "b"], [f"{side}2"], f"{side}_add"),
            node("ReluOut", [f"{side}2"], [f"{side}3"], f"{side}_relu2"),
        ]
    nodes += [node("AddOut", ["l3", "r3"], ["s"], "join"), node("Twice", ["s"], ["y"], "out")]
    return make_model(nodes, [tensor("x", [N, N])], [tensor("y", [N, N])], [b], extra_opsets=[ok.opset()])


def _writes_into(sess: InferenceSession, node_name: str, value: str) -> bool:
    """Whether the node's planned ``out=`` is the arena buffer of ``value``."""
    sig = sess.executor.plans.last
    step = sess.executor.plans.bound[sig][[n.name for n in sess.program.step_nodes].index(node_name)]
    out = getattr(step[0], "keywords", {}).get("out")
    if out is None:
        return False
    offset = out.__array_interface__["data"][0] - sess.executor.plans.arena.__array_interface__["data"][0]
    return offset == sess.executor.plans.plans[sig].buffers[sess.program.slots[value]][0]


def test_no_in_place_on_a_value_another_branch_reads(out_plugin):
    """The sequential plan lets the last reader of a shared value work in place; in a stage it must not."""
    model = _two_branch_out_model()
    x = np.random.default_rng(0).standard_normal((N, N)).astype(np.float32)
    seq = InferenceSession(model, threads=2, inter_op="never")
    staged = InferenceSession(model, threads=2, inter_op="always")
    want = seq.run(None, {"x": x})[0]
    for _ in range(3):
        np.testing.assert_array_equal(staged.run(None, {"x": x})[0], want)
    assert staged.executor.stages[staged.executor.plans.last][0]
    assert _writes_into(seq, "r_relu1", "a")
    assert not _writes_into(staged, "r_relu1", "a") and not _writes_into(staged, "l_relu1", "a")
    # within a branch, in place is still fine: AddOut and the second ReluOut write over the first ReluOut's buffer
    assert _writes_into(staged, "r_relu2", "r1") and _writes_into(staged, "l_add", "l1")


def test_stage_buffers_never_share_bytes(out_plugin):
    """Every arena buffer written or read in a stage has bytes of its own for the whole stage."""
    model = _two_branch_out_model()
    sess = InferenceSession(model, threads=2, inter_op="always")
    sess.run(None, {"x": np.ones((N, N), np.float32)})
    sig = sess.executor.plans.last
    (stage,) = sess.executor.stages[sig][0]
    touched = set()
    for i in range(stage.first, stage.last + 1):
        spec = sess.program.specs[i]
        touched |= {s for s in spec.ins + spec.outs if s}
    plan = sess.executor.plans.plans[sig]
    spans = [(off, off + np.dtype(dt).itemsize * int(np.prod(shape))) for s, (off, shape, dt) in plan.buffers.items()
             if s in touched]
    spans.sort()
    for (lo1, hi1), (lo2, hi2) in zip(spans, spans[1:]):
        assert hi1 <= lo2, "two buffers of one stage overlap"


@pytest.mark.parametrize("mode", ["never", "always"])
def test_arena_stays_near_the_live_set(mode):
    """With stages the plan stays within 1.15x of its live-set bound (which counts a stage as one moment)."""
    sess = InferenceSession(_branchy_model(), threads=2, inter_op=mode)
    sess.run(None, {"x": _x(32)})
    report = sess.memory_report()
    assert report["arena_bytes"] <= 1.15 * report["live_set_bytes"]


def test_kernels_in_a_stage_never_run_on_more_threads_than_the_session():
    """Inside a stage at most the session's two threads run kernels at once (and two do)."""
    active, peak = [0], [0]
    lock = threading.Lock()
    pair = threading.Barrier(2, timeout=10)  # staged runs: two probes meet here, so both are active at once
    staged = [False]

    def probe(x):
        with lock:
            active[0] += 1
            peak[0] = max(peak[0], active[0])
        if staged[0]:
            try:
                pair.wait()
            except threading.BrokenBarrierError:
                pass  # no second thread came: peak stays 1 and the assertion says so
        with lock:
            active[0] -= 1
        return x + 0

    class Probe:
        @hookimpl
        def register_ops(self, register):
            register(op("Probe", domain="test.stages"))

        @hookimpl
        def register_kernels(self, register):
            register(kernel("Probe", domain="test.stages")(probe))

    from minfer_core.plugins import use_plugins

    nodes = [helper.make_node("Probe", ["x"], [f"p{i}"], name=f"p{i}", domain="test.stages") for i in range(6)]
    nodes.append(helper.make_node("Sum", [f"p{i}" for i in range(6)], ["y"], name="sum"))
    model = make_model(nodes, [tensor("x", [4])], [tensor("y", [4])], extra_opsets=[helper.make_opsetid("test.stages", 1)])
    with use_plugins(Probe()):
        sess = InferenceSession(model, threads=2, inter_op="always")
        sess.run(None, {"x": np.ones(4, np.float32)})  # the discovery run: one step after another
        staged[0] = True
        for _ in range(2):
            sess.run(None, {"x": np.ones(4, np.float32)})
    assert peak[0] == 2


def test_parallel_for_inside_a_branch_reports_the_session_threads():
    """Kernels in a branch see the session's thread count, so they cut their work as in the sequential loop."""
    seen = []
    team = Team([lambda: seen.append(__import__("minfer_core").intra_op_threads())], threads=2)
    with using_threads(2):
        team.work()
    assert seen == [2]


def test_sessions_running_from_several_threads_stay_correct():
    """Staged runs from four Python threads at once (the pool busy, the arena taken) give the threads=1 outputs."""
    model = _branchy_model()
    staged = InferenceSession(model, threads=2, inter_op="always")
    serial = InferenceSession(model, threads=1, inter_op="never")
    xs = [_x(16, seed=s) for s in range(4)]
    want = [serial.run(None, {"x": x})[0] for x in xs]
    staged.run(None, {"x": xs[0]})
    failures: list[str] = []

    def worker(k: int) -> None:
        for _ in range(20):
            if not np.array_equal(staged.run(None, {"x": xs[k]})[0], want[k]):
                failures.append(f"thread {k}")

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures


def test_the_profiler_sees_every_node_of_a_staged_session(tmp_path):
    """Observers keep the sequential loop: a profile of a staged session lists each node once per run."""
    sess = InferenceSession(_branchy_model(), threads=2, inter_op="always")
    x = _x(8)
    want = sess.run(None, {"x": x})[0]
    trace = sess.profile({"x": x}, str(tmp_path / "t.json"), repeat=2)
    names = [e["name"] for e in trace["traceEvents"] if e.get("cat") == "Node"]
    assert sorted(names) == sorted(2 * [n.name for n in sess.program.step_nodes])
    np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)
