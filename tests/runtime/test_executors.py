"""Executors: chosen by session option, the core's sequential one always there, the plugin's the default."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
from onnx import helper

import minfer_core
from minfer_core import Executor, InferenceSession, SequentialExecutor, hookimpl, intra_op_threads, parallel_for
from minfer_core.parallel import using_threads
from minfer_core.plugins import Registry, active_registry
from modelkit import make_model, tensor


def _model():
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Neg", ["a"], ["y"])]
    return make_model(nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])])


X = np.arange(-3, 3, dtype=np.float32).reshape(2, 3)


@pytest.mark.parametrize("threads,error", [(0, ValueError), (-1, ValueError), ("abc", ValueError),
                                           (2.5, TypeError), (True, TypeError), ([2], TypeError)])
def test_a_bad_thread_count_is_refused(threads, error):
    """threads= takes a positive int, "auto" or None; anything else is a clear error before build."""
    with pytest.raises(error, match="threads="):
        minfer_core.Engine(_model(), threads=threads)


@pytest.mark.parametrize("threads", [1, 2, np.int64(2), "auto", None])
def test_good_thread_counts_run(threads):
    """Counts (numpy's too), "auto" and None are accepted and give the same outputs."""
    (y,) = minfer_core.Engine(_model(), threads=threads).run(None, {"x": X})
    np.testing.assert_array_equal(y, -np.maximum(X, 0))


def test_the_plugin_executor_is_the_default_and_sequential_is_always_there(monkeypatch):
    """With minfer-parallel installed "threads" runs by default; parallel="sequential" picks the core's."""
    monkeypatch.delenv("MINFER_PARALLEL", raising=False)
    assert minfer_core.Engine(_model()).parallel == "threads"
    seq = minfer_core.Engine(_model(), parallel="sequential", threads=2)
    assert type(seq.executor) is SequentialExecutor
    np.testing.assert_array_equal(seq.run(None, {"x": X})[0], -np.maximum(X, 0))


def test_an_unknown_executor_name_lists_the_installed_ones():
    """A misspelt parallel= is refused with the names that exist."""
    with pytest.raises(ValueError, match=r"'thread'.*'threads', 'processes', 'sequential'"):
        minfer_core.Engine(_model(), parallel="thread")


def test_the_sequential_executor_refuses_inter_op():
    """inter_op needs threads: asking the sequential executor for it is an error, not ignored."""
    with pytest.raises(ValueError, match="inter_op='always' needs the 'threads' executor"):
        minfer_core.Engine(_model(), parallel="sequential", inter_op="always")


class _Counting(SequentialExecutor):
    runs = 0

    def run(self, vals, sig, observers, fresh=False):
        type(self).runs += 1
        return super().run(vals, sig, observers, fresh)


class _ThirdParty:
    @hookimpl
    def register_executors(self, register):
        register(Executor("counting", _Counting, priority=100))


def test_a_third_party_executor_registers_through_the_hook_and_wins_by_priority(minfer_plugin):
    """An executor from any plugin is chosen by name, and by default when its priority is the highest."""
    minfer_plugin(_ThirdParty())
    _Counting.runs = 0
    sess = InferenceSession(_model())
    assert sess.parallel == "counting"
    sess.run(None, {"x": X})
    assert _Counting.runs == 2  # build's warm-up run (static input shapes) and this one
    assert InferenceSession(_model(), parallel="threads").parallel == "threads"


def test_parallel_for_is_serial_without_an_executor_offering_threads():
    """The core's front doors run kernels serially when no installed executor provides threads."""
    seen = []
    with active_registry(Registry()), using_threads(4):
        assert intra_op_threads() == 1
        parallel_for(10, lambda lo, hi: seen.append((lo, hi)))
    assert seen == [(0, 10)]


def test_using_threads_takes_the_plugin_pool():
    """With minfer-parallel installed, the core's using_threads spreads parallel_for over its pool."""
    with using_threads(2):
        assert intra_op_threads() == 2


def test_a_pool_ends_its_threads_when_no_session_needs_it():
    """A session with an unusual thread count makes a pool; once the session is gone, so are its threads."""
    from minfer_parallel.pool import live_pools

    threads = 7
    sess = InferenceSession(_model(), threads=threads)
    sess.run(None, {"x": X})
    pool = sess.executor.pool
    assert pool.threads == threads and live_pools().get(threads) == 1
    workers = list(pool.workers)
    assert len(workers) == threads - 1 and all(w.is_alive() for w in workers)
    del sess
    gc.collect()
    assert threads not in live_pools()
    assert not any(w.is_alive() for w in workers)


def test_two_sessions_share_a_pool_until_the_last_is_gone():
    """Pools are counted per user: the first session's end leaves the second one's threads running."""
    from minfer_parallel.pool import live_pools

    a, b = InferenceSession(_model(), threads=5), InferenceSession(_model(), threads=5)
    assert a.executor.pool is b.executor.pool and live_pools()[5] == 2
    workers = list(a.executor.pool.workers)
    del a
    gc.collect()
    assert live_pools()[5] == 1 and all(w.is_alive() for w in workers)
    b.run(None, {"x": X})
    del b
    gc.collect()
    assert 5 not in live_pools()


def test_the_core_alone_runs_sequentially():
    """Without minfer-parallel (not loaded), sessions run with the core's sequential executor."""
    code = textwrap.dedent("""
        import numpy as np, sys
        sys.path.insert(0, sys.argv[1])
        import minfer_core
        from modelkit import make_model, tensor
        from onnx import helper
        model = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [3])], [tensor("y", [3])])
        sess = minfer_core.InferenceSession(model)
        print(sess.parallel, sess.run(None, {"x": np.array([-1, 0, 2], np.float32)})[0].tolist())
        print(sorted(sys.modules).count("minfer_parallel"), "threadpoolctl" in sys.modules)
    """)
    env = dict(os.environ, MINFER_PLUGINS="minfer-ops-basic")
    env.pop("MINFER_PARALLEL", None)
    tests = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = subprocess.run([sys.executable, "-c", code, tests], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["sequential [0.0, 0.0, 2.0]", "0 False"]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork")
def test_a_session_used_in_a_forked_child_makes_its_own_threads():
    """A session built and run before a fork (a process pool's worker) runs in the child on threads of its own."""
    from modelkit import child_exit_code

    seen = []
    sess = InferenceSession(_model(), threads=2)
    sess.run(None, {"x": X})
    pid = os.fork()
    if pid == 0:  # would wait forever for the parent's workers, which the child does not have
        try:
            with using_threads(2):
                parallel_for(4, lambda lo, hi: seen.extend(range(lo, hi)))
            (y,) = sess.run(None, {"x": X})
            os._exit(0 if sorted(seen) == [0, 1, 2, 3] and (y == -np.maximum(X, 0)).all() else 1)
        finally:
            os._exit(2)
    assert child_exit_code(pid, "the forked child hung in a session run") == 0


def test_blas_threads_are_set_from_any_python_thread():
    """Sessions run from any thread set numpy's BLAS to one thread (threadpoolctl's setter heeds one thread only)."""
    import threading

    from minfer_parallel.blas import get_blas_threads, set_blas_threads

    before = get_blas_threads()
    if before is None:
        pytest.skip("no BLAS whose thread count can be set here")
    seen = []

    def other():
        previous = set_blas_threads(1)
        seen.append(get_blas_threads())
        set_blas_threads(previous)

    set_blas_threads(2)  # this thread sets first
    try:
        worker = threading.Thread(target=other)
        worker.start()
        worker.join()
        assert seen == [1] and get_blas_threads() == 2
    finally:
        set_blas_threads(before)


def _count_mode_runs(monkeypatch):
    """The runs of planned shapes the threads executor makes, as the mode of each (`_run_in` with a mode)."""
    from minfer_parallel import executors

    modes = []
    real = executors.ThreadsExecutor._run_in

    def spy(self, vals, sig, observers, fresh, want, pool, mode):
        modes.append(mode)
        return real(self, vals, sig, observers, fresh, want, pool, mode)

    monkeypatch.setattr(executors.ThreadsExecutor, "_run_in", spy)
    return modes


def test_a_shapes_mode_is_timed_in_its_first_run_and_never_later(monkeypatch, tmp_path):
    """The first run of a shape plans it, then times runs of the plan in each mode (a trial's first run settles
    the threads, the best of the next few counts) and keeps one; every later run is one run in that mode. The
    choice is stored: a second session of the model times nothing and takes it."""
    from minfer_core import tuning
    from minfer_parallel import executors, procs

    monkeypatch.setenv("MINFER_CACHE", str(tmp_path))
    monkeypatch.delenv("MINFER_TUNE", raising=False)
    monkeypatch.setattr(tuning, "CALM", 0.0)  # stored whatever the machine's load did to the timing thread
    monkeypatch.setattr(executors, "SERIAL_RUN", 60.0)  # every run "short" (all TRIAL_RUNS timed), whatever the load
    modes = _count_mode_runs(monkeypatch)
    session = InferenceSession(_model(), threads=2)
    np.testing.assert_array_equal(session.run(None, {"x": X})[0], -np.maximum(X, 0))
    (sig,) = session.executor.teams
    chosen = session.executor.teams[sig]
    # the build's run on zeros planned the shape, then timed threads and serial (no kernel claims here) in
    # choose's rounds, a trial a settling run and TRIAL_RUNS timed ones (a short run); then the run above, in its mode
    runs = 1 + executors.TRIAL_RUNS
    trials = modes[1:-1]  # (later rounds may skip a clear loser: choose's CLEAR_LOSS)
    assert modes[0] is None and modes[-1] == chosen in (procs.THREADS, procs.SERIAL)
    assert trials[:2 * runs] == [procs.THREADS] * runs + [procs.SERIAL] * runs
    assert len(trials) in range(2 * runs, 2 * runs * tuning.ROUNDS + 1, runs)
    assert all(trials[i:i + runs] == [trials[i]] * runs for i in range(0, len(trials), runs))
    for _ in range(3):
        del modes[:]
        np.testing.assert_array_equal(session.run(None, {"x": X})[0], -np.maximum(X, 0))
        assert modes == [chosen]
    del modes[:]
    again = InferenceSession(_model(), threads=2)
    again.run(None, {"x": X})
    assert modes == [None, chosen] and list(again.executor.teams.values()) == [chosen]


def test_without_tuning_a_shape_takes_its_first_mode_untimed(monkeypatch, tmp_path):
    """MINFER_TUNE=0 (a deterministic first run): no trial runs; kernels may claim the threads if one did, else
    the pool splits them."""
    from minfer_parallel import procs

    monkeypatch.setenv("MINFER_CACHE", str(tmp_path))
    monkeypatch.setenv("MINFER_TUNE", "0")
    modes = _count_mode_runs(monkeypatch)
    session = InferenceSession(_model(), threads=2)
    session.run(None, {"x": X})
    assert modes == [None, procs.THREADS] and list(session.executor.teams.values()) == [procs.THREADS]


def test_a_long_run_never_tries_one_thread(monkeypatch, tmp_path):
    """Serial is timed only while another mode's best run is under SERIAL_RUN: a longer run would lose more on one
    thread than the hand-overs cost, and its trial would be a slow run."""
    from minfer_core import tuning
    from minfer_parallel import executors, procs

    monkeypatch.setenv("MINFER_CACHE", str(tmp_path))
    monkeypatch.delenv("MINFER_TUNE", raising=False)
    monkeypatch.setattr(tuning, "CALM", 0.0)
    monkeypatch.setattr(executors, "SERIAL_RUN", 0.0)  # every run is "long"
    modes = _count_mode_runs(monkeypatch)
    session = InferenceSession(_model(), threads=2)
    session.run(None, {"x": X})
    # the build's run on zeros, threads' trials (two runs) in each of choose's rounds (serial declined unrun), then
    # the run above
    assert modes == [None] + [procs.THREADS] * (2 * tuning.ROUNDS + 1)
    assert list(session.executor.teams.values()) == [procs.THREADS]


@pytest.mark.parametrize("first", ["threads", "serial", "serial-long"])
def test_a_new_shape_takes_the_mode_an_earlier_shape_chose(monkeypatch, tmp_path, first):
    """A session's later input shapes take the mode its first shape chose untimed (as kernels' choices do); one
    thread alone only while one run of the new shape that way takes under SERIAL_RUN (a larger shape may lose by
    far on one thread): else the new shape times its modes."""
    from minfer_core import tuning
    from minfer_parallel import executors

    monkeypatch.setenv("MINFER_CACHE", str(tmp_path))
    monkeypatch.delenv("MINFER_TUNE", raising=False)
    monkeypatch.setattr(tuning, "CALM", 0.0)
    monkeypatch.setattr(executors, "SERIAL_RUN", 0.0)  # the first shape settles on threads...
    nodes = [helper.make_node("Relu", ["x"], ["y"])]
    session = InferenceSession(make_model(nodes, [tensor("x", ["n", 3])], [tensor("y", ["n", 3])]), threads=2)
    session.run(None, {"x": X})
    (sig,) = session.executor.teams
    session.executor.teams[sig] = first  # ...or, for these cases, on one thread alone
    if first == "serial-long":
        session.executor.teams[sig] = "serial"
        monkeypatch.setattr(executors, "SERIAL_RUN", 0.0)  # the new shape's run on one thread is "too long"
    else:
        monkeypatch.setattr(executors, "SERIAL_RUN", 1.0)
    modes = _count_mode_runs(monkeypatch)
    np.testing.assert_array_equal(session.run(None, {"x": -np.ones((5, 3), np.float32)})[0], np.zeros((5, 3)))
    second = list(session.executor.teams.values())[1]
    if first == "threads":
        assert modes == [None] and second == "threads"
    elif first == "serial":  # one serial run to see it is short, then serial untimed
        assert modes == [None, "serial"] and second == "serial"
    else:
        assert modes[:2] == [None, "serial"] and "threads" in modes[2:] and second == "threads"  # timed


def test_a_shape_settled_on_one_thread_runs_without_the_pool(monkeypatch):
    """A session of two threads whose shape settled on the serial mode runs its kernels with no pool (parallel_for
    serial, intra_op_threads 1); the other modes run with the pool; the outputs are the same."""
    from minfer_parallel import executors, procs

    session = InferenceSession(_model(), threads=2)
    want = session.run(None, {"x": X})[0]
    session.run(None, {"x": X})
    (sig,) = session.executor.teams
    pools = []
    real = executors.using_pool
    monkeypatch.setattr(executors, "using_pool", lambda pool: pools.append(pool) or real(pool))
    for mode in (procs.SERIAL, procs.THREADS):
        session.executor.teams[sig] = mode
        np.testing.assert_array_equal(session.run(None, {"x": X})[0], want)
    assert pools[0] is None and pools[1] is session.executor.pool is not None
