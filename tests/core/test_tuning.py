"""The core's timed choices (minfer_core.tuning): made once, stored per machine, never in a later run."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types

import numpy as np
import pytest
from onnx import helper, numpy_helper

from minfer_core import tuning
from minfer_core.cli import main
from modelkit import make_model, tensor


@pytest.fixture(autouse=True)
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("MINFER_CACHE", str(tmp_path))
    monkeypatch.delenv("MINFER_TUNE", raising=False)
    monkeypatch.setattr(tuning, "CALM", 0.0)  # faked times spend no CPU: timings count as undisturbed
    return tmp_path


def fake_times(times):
    """A time_one that reports ``times[i]`` for candidate i and records which it ran."""
    ran = []

    def time_one(i):
        ran.append(i)
        return times[i]

    return time_one, ran


def test_the_fastest_is_chosen_and_stored_for_a_later_process(cache):
    """choose times every candidate, keeps the fastest, and a fresh process reads it back without timing."""
    time_one, ran = fake_times([3.0, 1.0, 2.0])
    assert tuning.choose("op|shape", ["a", "b", "c"], time_one) == 1
    assert sorted(set(ran)) == [0, 1, 2]
    stored = tuning.ChoiceStore._read(next(cache.glob("tuning-*.jsonl")))
    assert stored == {"op|shape|a,b,c": "b"}
    script = ("from minfer_core import tuning\n"
              "print(tuning.choose('op|shape', ['a', 'b', 'c'], lambda i: 1 / 0))")  # timing would raise
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_a_timing_another_process_disturbed_holds_in_this_process_only(cache, monkeypatch):
    """A choice whose timing thread ran less than CALM of some timing (it waited for a CPU another process held)
    is not stored for later processes, and holds in this one; undisturbed timings are stored."""
    monkeypatch.setattr(tuning, "CALM", 0.8)
    clock = iter(range(10_000))  # the timing thread's CPU seconds: one between the two reads around a timing
    monkeypatch.setattr(tuning, "time", types.SimpleNamespace(thread_time=lambda: next(clock),
                                                              perf_counter=time.perf_counter))
    time_one, _ = fake_times([3.0, 1.0])  # 3 s of wall time, 1 of CPU: disturbed
    assert tuning.choose("op|busy", ["a", "b"], time_one) == 1
    assert not list(cache.glob("tuning-*.jsonl"))
    assert tuning.choose("op|busy", ["a", "b"], lambda i: 1 / 0) == 1  # kept here: not timed again
    time_one, _ = fake_times([1.0, 0.5])  # every timing ran on its CPU
    assert tuning.choose("op|calm", ["a", "b"], time_one) == 1
    assert tuning.ChoiceStore._read(next(cache.glob("tuning-*.jsonl"))) == {"op|calm|a,b": "b"}


def test_a_candidate_declining_unrun_leaves_the_timing_calm(cache, monkeypatch):
    """time_one may return inf for a candidate that does not run for this key (minfer-parallel's one thread alone
    on a long run): it loses, and the choice is stored, its zero CPU time being no sign of another process's load."""
    monkeypatch.setattr(tuning, "CALM", 0.8)
    clock = iter(range(10_000))  # one CPU second between the reads around a timing: calm for 1 s timings
    monkeypatch.setattr(tuning, "time", types.SimpleNamespace(thread_time=lambda: next(clock),
                                                              perf_counter=time.perf_counter))
    time_one, _ = fake_times([1.0, 1.0, float("inf")])
    assert tuning.choose("op|declined", ["a", "b", "c"], time_one) == 0
    assert tuning.ChoiceStore._read(next(cache.glob("tuning-*.jsonl"))) == {"op|declined|a,b,c": "a"}


def test_the_fingerprint_tells_cpu_generations_of_one_name_apart(monkeypatch):
    """Two CPUs that /proc/cpuinfo names alike ("AMD EPYC") but with another family or other flags get different
    fingerprints: choices timed on one are not read on the other."""
    import builtins
    import io

    real = builtins.open
    block = "processor\t: 0\nmodel name\t: AMD EPYC\ncpu family\t: 25\nmodel\t\t: 1\nstepping\t: 1\nflags\t\t: avx2\n\n"
    found = []
    for text in (block, block.replace(": 25", ": 26"), block.replace("avx2", "avx2 avx512f"), block):
        monkeypatch.setattr(builtins, "open", lambda path, *a, text=text, **k: io.StringIO(text + "processor\t: 1\n")
                            if path == "/proc/cpuinfo" else real(path, *a, **k))
        tuning.fingerprint.cache_clear()
        found.append(tuning.fingerprint())
    monkeypatch.undo()
    tuning.fingerprint.cache_clear()
    assert len(set(found[:3])) == 3 and found[3] == found[0]


def test_rounds_alternate_the_order_of_the_candidates(cache):
    """Every other round times the candidates backwards, so none always runs right after the same one
    (a kernel timed after a heavy one meets caches it evicted)."""
    time_one, ran = fake_times([1.5, 1.0, 1.2])
    tuning.choose("op|order", ["a", "b", "c"], time_one)
    assert ran == [0, 1, 2, 2, 1, 0, 0, 1, 2][: 3 * tuning.ROUNDS]


def test_a_clear_loser_of_the_first_round_is_not_timed_again(cache):
    """A first call is a cold one: a candidate over COLD_LOSS times the best in the first round sits out the later
    rounds, one over CLEAR_LOSS times the best after the second round the third."""
    time_one, ran = fake_times([1.0, 1.0 * tuning.CLEAR_LOSS + 0.1, 1.5, 1.0 * tuning.COLD_LOSS + 0.1])
    assert tuning.choose("op|loser", ["a", "b", "c", "d"], time_one) == 0
    assert ran == [0, 1, 2, 3, 2, 1, 0, 0, 2][: 4 + 3 + 2 * (tuning.ROUNDS - 2)]


def test_a_candidate_slow_only_on_its_first_call_is_timed_again(cache):
    """A kernel whose first call costs several times its later ones (its scratch and buffers touched first) is
    timed again after the first round, and wins where it is faster warm: resnet50's 7x7 stem by smallconv.py 6-23
    ms first and 2 warm, against numpy's Conv at 3.5, took numpy's under a CLEAR_LOSS after the first round."""
    calls = {0: iter([3.5e-3, 3.4e-3, 3.5e-3]), 1: iter([9e-3, 2e-3, 2.1e-3])}
    ran = []

    def time_one(i):
        ran.append(i)
        return next(calls[i])

    assert tuning.choose("op|cold", ["numpy", "compiled"], time_one) == 1
    assert ran == [0, 1, 1, 0, 0, 1]


def test_on_a_node_of_microseconds_a_slow_first_call_is_timed_again(cache):
    """Under WARM seconds a first call's own planning can make a faster kernel look a clear loser: every candidate
    runs the second round there, and one slow only on its first call wins; a clear loser of the first two rounds
    sits out the third."""
    calls = {0: iter([10e-6, 9e-6]), 1: iter([30e-6, 4e-6, 4e-6])}  # b: 30 us on its first call, 4 once planned
    ran = []

    def time_one(i):
        ran.append(i)
        return next(calls[i])

    assert tuning.choose("op|warm", ["a", "b"], time_one) == 1
    assert ran == [0, 1, 1, 0, 1]


def test_other_candidates_make_another_key():
    """A stored choice applies only to the same candidates: a new plugin's kernel is timed against the others."""
    tuning.choose("op", ["a", "b"], fake_times([1.0, 2.0])[0])
    time_one, ran = fake_times([5.0, 5.0, 1.0])
    assert tuning.choose("op", ["a", "b", "new"], time_one) == 2 and ran


def test_no_timing_in_a_later_run_of_a_shape():
    """A key first met during a planned run (the thread count changed) takes the first candidate untimed."""
    time_one, ran = fake_times([2.0, 1.0])
    token = tuning.STEADY.set(True)
    try:
        assert tuning.choose("later", ["a", "b"], time_one) == 0
    finally:
        tuning.STEADY.reset(token)
    assert ran == []
    assert tuning.choose("later", ["a", "b"], time_one) == 1  # the next first run times it


def test_a_choice_keeps_one_candidate_per_shape_in_later_runs(monkeypatch):
    """A Choice's later runs call the candidate chosen for their shapes, also after a second shape was met
    (its short path for a node that met one shape must not hide the second)."""
    calls = []
    fns = [lambda x, name=name: calls.append((name, x.shape)) for name in ("a", "b")]
    choice = tuning.Choice("node", ["a", "b"], fns)
    # the timing finds "b" faster on the one-element input, "a" on the two-element one
    monkeypatch.setattr(tuning, "choose", lambda key, names, time_one, prior=None: 1 if "(1,)" in key else 0)
    small, big = np.zeros(1), np.zeros(2)
    choice(small)
    token = tuning.STEADY.set(True)
    try:
        choice(small)
        assert calls[-1] == ("b", (1,))
    finally:
        tuning.STEADY.reset(token)
    choice(big)  # a new shape's first run
    token = tuning.STEADY.set(True)
    try:
        choice(small), choice(big)
    finally:
        tuning.STEADY.reset(token)
    assert calls[-2:] == [("b", (1,)), ("a", (2,))]


def test_timing_runs_apply_the_epilogue_into_a_copy_of_out(cache, monkeypatch):
    """A kernel may apply the epilogue in cache (a compiled rounding per tile) or in one more pass: the timing runs
    pass it, so its cost counts, but into a scratch copy of ``out``; the real output gets it once, from the chosen
    candidate's call. Without an ``out`` the timing runs get no epilogue (they could not leave the output alone)."""
    seen = []

    def kernel(name):
        def run(x, *, out=None, epilogue=None):
            seen.append((name, out, epilogue))
            y = out if out is not None else np.empty_like(x)
            np.add(x, 1, out=y)
            if epilogue is not None:
                epilogue(y, (slice(None),))
            return y
        run.label = name
        return run

    def timed(fn, *args, **kwargs):  # "lazy" is faster bare, slower with its epilogue (a second pass)
        fn(*args, **kwargs)
        return {("eager", False): 0.5, ("eager", True): 0.5, ("lazy", False): 0.4, ("lazy", True): 0.6}[
            (fn.label, kwargs.get("epilogue") is not None)]

    def double(y, region):
        np.multiply(y[region], 2, out=y[region])

    monkeypatch.setattr(tuning, "seconds", timed)
    choice = tuning.Choice("node", ["eager", "lazy"], [kernel("eager"), kernel("lazy")])
    x, out = np.ones(3), np.zeros(3)
    got = choice(x, out=out, epilogue=double)
    assert got is out and out.tolist() == [4.0, 4.0, 4.0]  # (1 + 1) * 2, once
    timing, final = seen[:-1], seen[-1]
    assert {name for name, _, _ in timing} == {"eager", "lazy"} and final[0] == "eager"
    assert all(o is not out and o.shape == out.shape and ep is double for _, o, ep in timing) and final[1] is out
    seen.clear()
    bare = tuning.Choice("node2", ["eager", "lazy"], [kernel("eager"), kernel("lazy")])
    bare(x, epilogue=double)
    assert all(ep is None for _, _, ep in seen[:-1]) and seen[-1][0] == "lazy" and seen[-1][2] is double


def test_a_static_nodes_choice_lets_the_losers_go(monkeypatch):
    """A node whose inputs have one static shape keeps only the chosen candidate once it chose (the others' packed
    weights were a second copy of the node's weights); a node of symbolic shapes keeps them all for its next shapes."""
    import gc
    import weakref

    class Candidate:
        def __init__(self, name):
            self.name = name

        def __call__(self, x):
            return self.name

    monkeypatch.setattr(tuning, "choose", lambda key, names, time_one, prior=None: 1 if len(names) > 1 else 0)
    for static, kept in ((True, 0), (False, 2)):
        fns = [Candidate("a"), Candidate("b"), Candidate("c")]
        refs = [weakref.ref(f) for f in fns]
        choice = tuning.Choice("node", ["a", "b", "c"], fns, static)
        del fns
        assert choice(np.zeros(1)) == "b"
        gc.collect()
        assert sum(r() is not None for r in refs if r is not refs[1]) == kept
        assert choice(np.zeros(2)) == "b"  # a later shape (which a static node never meets) runs "b" as well


def test_tuning_off_takes_the_first(monkeypatch, cache):
    """MINFER_TUNE=0: the first candidate (the highest priority), nothing timed or stored."""
    monkeypatch.setenv("MINFER_TUNE", "0")
    time_one, ran = fake_times([2.0, 1.0])
    assert tuning.choose("off", ["a", "b"], time_one) == 0 and ran == []
    assert not list(cache.glob("tuning-*.jsonl"))


def test_writes_merge_with_what_another_process_stored(cache):
    """Two stores of one file (two processes) keep each other's choices; a line cut short is skipped."""
    tuning.choose("first", ["a", "b"], fake_times([1.0, 2.0])[0])
    path = next(cache.glob("tuning-*.jsonl"))
    tuning.ChoiceStore(path).put("other|a,b", "a")  # another process's store
    with path.open("a") as fh:  # and one that died mid-write
        fh.write('\n["torn|a,b", "')
    tuning.choose("second", ["a", "b"], fake_times([2.0, 1.0])[0])
    assert tuning.ChoiceStore._read(path) == {"first|a,b": "a", "other|a,b": "a", "second|a,b": "b"}
    assert len([ln for ln in path.read_text().splitlines() if ln]) == 4  # appended: no rewrite per choice


def test_an_unwritable_cache_warns_and_the_choice_holds(cache):
    """A cache folder that cannot be written is a warning, not a failure; the process keeps its choice."""
    blocker = cache / "file"
    blocker.write_text("")
    store = tuning.ChoiceStore(blocker / "tuning.json")  # its folder is a file
    with pytest.warns(UserWarning, match="could not store"):
        store.put("k", "v")
    assert store.data["k"] == "v"


def _dynamic_conv_model():
    """A 3x3 conv with several methods to time (im2col at two tile sizes, Winograd): choices to store."""
    w = (np.random.default_rng(0).standard_normal((64, 64, 3, 3)) / 24).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    return make_model([node], [tensor("x", ["N", 64, 20, 20])], [tensor("y", None)], [numpy_helper.from_array(w, "w")])


def test_minfer_tune_runs_every_combination_and_stores(cache, tmp_path, capsys):
    """`minfer tune MODEL --dim N=1,2` runs each size once and reports where the choices went."""
    path = tmp_path / "m.onnx"
    path.write_bytes(_dynamic_conv_model().SerializeToString())
    assert main(["tune", str(path), "--dim", "N=1,2"]) == 0
    out = capsys.readouterr().out
    assert "tuned N=1" in out and "tuned N=2" in out and str(cache) in out
    stored = tuning.ChoiceStore._read(next(cache.glob("tuning-*.jsonl")))
    # the first size's conv choice: the core's among kernels (numba installed) or minfer-ops-conv's among its
    # methods (which, inside the core's timing, a clear loser leaves unstored: tuning.OUTER)
    assert any("(1, 64, 20, 20)" in k for k in stored)


def test_minfer_tune_refuses_when_tuning_is_off(monkeypatch, tmp_path, capsys):
    """MINFER_TUNE=0 and `minfer tune` contradict each other: a one-line error, exit 2."""
    monkeypatch.setenv("MINFER_TUNE", "0")
    path = tmp_path / "m.onnx"
    path.write_bytes(_dynamic_conv_model().SerializeToString())
    assert main(["tune", str(path)]) == 2
    assert "MINFER_TUNE=0" in capsys.readouterr().err


def test_the_stored_choices_are_read_at_build_not_in_a_first_run(cache, monkeypatch):
    """Building an engine reads the machine's choice file, so a first run of a new shape does not."""
    from minfer_core import Engine

    tuning.store().put("op|shape|a,b", "b")  # another process's choice on disk
    monkeypatch.setattr(tuning, "_STORES", {})
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", ["N", 4])], [tensor("y", ["N", 4])])
    Engine(model)
    (store,) = tuning._STORES.values()
    assert store.data == {"op|shape|a,b": "b"}


def test_planned_runs_call_each_shapes_chosen_kernel_directly(monkeypatch, minfer_plugin):
    """Once a shape is planned its step calls the kernel its Choice picked for that shape, with no Choice between:
    each of two shapes keeps its own pick, also after the second shape's plan grew the arena and rebound the first's."""
    from minfer_core import InferenceSession, hookimpl, kernel, op

    calls = []

    def make(name):
        @kernel("Twice", domain="test.settle", views=False, applies=lambda ctx, attrs: True)
        def twice(x):
            calls.append((name, x.shape))
            return x * 2
        twice.fn.__qualname__ = name  # the candidates' names tell them apart
        return twice

    a, b = make("cand_a"), make("cand_b")

    class Plugin:
        @hookimpl
        def register_ops(self, register):
            register(op("Twice", domain="test.settle"))

        @hookimpl
        def register_kernels(self, register):
            register(a)
            register(b)

    minfer_plugin(Plugin())
    # the timing picks cand_b for the 2-row input, cand_a for the 3-row one
    monkeypatch.setattr(tuning, "choose", lambda key, names, time_one, prior=None:
                        [n.endswith("cand_b") for n in names].index("(2, 4)" in key))
    nodes = [helper.make_node("Twice", ["x"], ["y"], domain="test.settle")]
    model = make_model(nodes, [tensor("x", ["N", 4])], [tensor("y", ["N", 4])],
                       extra_opsets=[helper.make_opsetid("test.settle", 1)])
    sess = InferenceSession(model, passes="none", threads=1)  # one thread: no runs timing the executor's modes
    for rows in (2, 2, 3, 3, 2):  # first runs of each shape, then planned ones
        x = np.full((rows, 4), rows, np.float32)
        np.testing.assert_array_equal(sess.run(None, {"x": x})[0], 2 * x)
    assert calls == [("cand_b", (2, 4))] * 2 + [("cand_a", (3, 4))] * 2 + [("cand_b", (2, 4))]
    assert isinstance(sess.program.specs[0].fn, tuning.Choice)
    picked = {sig[0][0][0]: steps[0][0] for sig, steps in sess.executor.plans.bound.items()}
    assert picked == {2: b.fn, 3: a.fn}


def test_another_candidate_must_beat_the_first_by_the_margin(cache):
    """names[0] (the top priority, the usual best) stays unless another is faster by more than MARGIN: a choice
    that noise could flip goes the declared way."""
    time_one, _ = fake_times([1.05, 1.0])
    assert tuning.MARGIN > 1.05
    assert tuning.choose("op|close", ["first", "second"], time_one) == 0
    time_one, _ = fake_times([1.5, 1.0])
    assert tuning.choose("op|clear", ["first", "second"], time_one) == 1


def test_a_caller_may_ask_for_its_own_margin(cache):
    """``margin=`` replaces MARGIN for one choice (the executor's modes, timed as whole runs, take a smaller one);
    the stored winner is the one it picked."""
    time_one, _ = fake_times([1.05, 1.0])
    assert tuning.choose("op|tight", ["first", "second"], time_one, margin=1.04) == 1
    assert tuning.store().data["op|tight|first,second"] == "second"
    time_one, _ = fake_times([1.03, 1.0])
    assert tuning.choose("op|within", ["first", "second"], time_one, margin=1.04) == 0


def test_minfer_tune_times_every_size_and_leaves_the_environment(cache, tmp_path, monkeypatch):
    """`minfer tune` runs its sizes with MINFER_TUNE=all (each size timed, also those a node's earlier size would
    decide untimed: tests/runtime/test_new_shape_costs.py), and restores MINFER_TUNE when it is done."""
    import os

    from minfer_ops_conv import tuner

    seen = []
    real = tuning.choose
    for module in (tuning, tuner):  # the core's choices among kernels and minfer-ops-conv's among its methods
        monkeypatch.setattr(module, "choose", lambda key, names, t, prior=None: seen.append(
            os.environ.get("MINFER_TUNE")) or real(key, names, t, prior))
    path = tmp_path / "m.onnx"
    path.write_bytes(_dynamic_conv_model().SerializeToString())
    assert main(["tune", str(path), "--dim", "N=1,2"]) == 0
    assert seen and set(seen) == {"all"}
    assert "MINFER_TUNE" not in os.environ


def test_a_plugins_choose_inside_a_timing_stops_when_its_usual_best_lost_clearly(cache):
    """While the core times a node's kernels, a candidate's own `choose` sees the others' best so far: when its
    first (usual best) method takes over CLEAR_LOSS times that, it stops there, untimed and unstored; a
    competitive candidate times its methods as usual; alone (no enclosing timing) nothing changes."""
    inner_ran = []

    def plugin_kernel(method_times):
        def time_one_outer():
            won = tuning.choose("inner|" + str(method_times), ["usual", "other", "third"],
                                lambda j: inner_ran.append(j) or method_times[j])
            return method_times[won]
        return time_one_outer

    slow = plugin_kernel([2e-3, 1.9e-3, 1.8e-3])  # over COLD_LOSS times the outer best: timed once
    assert tuning.choose("outer|a", ["numba", "numpy"], lambda i: [1e-4, slow][i] if i == 0 else slow()) == 0
    assert inner_ran == [0]  # one method, then it stopped: a clear loser of the outer timing
    assert not any(k.startswith("inner|") for k in tuning.store().data)
    inner_ran.clear()
    close = plugin_kernel([1.5e-4, 1.2e-4, 2e-4])
    tuning.choose("outer|b", ["numba", "numpy"], lambda i: 1e-4 if i == 0 else close())
    assert sorted(set(inner_ran)) == [0, 1, 2]  # competitive: every method timed
    inner_ran.clear()
    assert tuning.choose("inner|alone", ["usual", "other"], lambda j: inner_ran.append(j) or [5.0, 1.0][j]) == 1
    assert sorted(set(inner_ran)) == [0, 1]
