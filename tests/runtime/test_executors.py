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


def test_a_short_runs_modes_end_with_the_fastest_serial_included():
    """procs.ModeChoice times each mode in turn, one thread alone last, and keeps the one with the best run."""
    from minfer_parallel import procs

    choice = procs.ModeChoice(modes=(procs.TEAM, procs.THREADS, procs.SERIAL), serial_below=0.002)
    times = {procs.TEAM: 0.0009, procs.THREADS: 0.0012, procs.SERIAL: 0.0007}
    order = []
    while choice.mode is None:
        order.append(choice.want())
        choice.record(order[-1], times[order[-1]])
    assert order[:3] == [procs.TEAM, procs.THREADS, procs.SERIAL] and len(order) == 6
    assert choice.mode == procs.SERIAL and choice.team is False


def test_a_long_run_never_tries_one_thread():
    """Once every other mode's best run is serial_below or longer, the serial mode is dropped untried: its trial
    would be a slow run."""
    from minfer_parallel import procs

    choice = procs.ModeChoice(modes=(procs.THREADS, procs.SERIAL), serial_below=0.002)
    while choice.mode is None:
        mode = choice.want()
        assert mode == procs.THREADS
        choice.record(mode, 0.005)
    assert choice.mode == procs.THREADS and choice.modes == (procs.THREADS,)


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
        session.executor.teams[sig] = procs.ModeChoice(modes=(mode,))
        session.executor.teams[sig].mode = mode
        np.testing.assert_array_equal(session.run(None, {"x": X})[0], want)
    assert pools[0] is None and pools[1] is session.executor.pool is not None
