"""Intra-op parallelism: parallel_for covers its range once, runs concurrently in a session, propagates errors."""

from __future__ import annotations

import threading

import numpy as np
import pytest

import minfer_core
from minfer_core import intra_op_threads, parallel_for
from minfer_core.parallel import using_threads
from minfer_parallel.pool import ThreadPool, acquire_pool, release_pool
from modelkit import child_exit_code


def _cover(n: int, parts: int | None = None) -> tuple[list[tuple[int, int]], set[str]]:
    seen: list[tuple[int, int]] = []
    names: set[str] = set()
    lock = threading.Lock()

    def fn(lo: int, hi: int) -> None:
        with lock:
            seen.append((lo, hi))
            names.add(threading.current_thread().name)

    parallel_for(n, fn, parts=parts)
    return sorted(seen), names


@pytest.mark.parametrize("n,parts", [(1, None), (2, None), (7, None), (100, 3), (5, 9)])
def test_ranges_cover_exactly_once(n, parts):
    with using_threads(2):
        seen, _ = _cover(n, parts)
    covered = [i for lo, hi in seen for i in range(lo, hi)]
    assert covered == list(range(n))
    assert all(lo < hi for lo, hi in seen)


def test_serial_outside_a_parallel_block():
    assert intra_op_threads() == 1
    seen, names = _cover(10)
    assert seen == [(0, 10)] and names == {threading.current_thread().name}


def test_work_runs_on_two_threads():
    barrier = threading.Barrier(2, timeout=10)  # only passes if both halves run at the same time

    def fn(lo: int, hi: int) -> None:
        barrier.wait()

    with using_threads(2):
        assert intra_op_threads() == 2
        parallel_for(2, fn)


def test_errors_reach_the_caller_after_all_parts_end():
    done = []

    def fn(lo: int, hi: int) -> None:
        if lo == 0:
            raise ValueError("part 0 failed")
        done.append(lo)

    with using_threads(2), pytest.raises(ValueError, match="part 0 failed"):
        parallel_for(2, fn)
    assert done == [1]
    # the pool still works afterwards
    with using_threads(2):
        seen, _ = _cover(4)
    assert [i for lo, hi in seen for i in range(lo, hi)] == [0, 1, 2, 3]


def test_nested_parallel_for_runs_serially_in_workers():
    inner: list[int] = []

    def outer(lo: int, hi: int) -> None:
        parallel_for(3, lambda a, b: inner.extend(range(a, b)))

    with using_threads(2):
        parallel_for(2, outer)
    assert sorted(inner) == [0, 0, 1, 1, 2, 2]


def test_workers_spin_only_while_a_run_uses_the_pool():
    """Inside a using_threads block the pool's workers are awake (spinning for work); after it, they sleep."""
    pool = acquire_pool(2)  # the pool using_threads(2) takes, held so that it outlives the block
    try:
        with using_threads(2):
            _cover(4)
            assert pool._awake  # woken by the first split, and kept awake until the block ends
        assert not pool._awake
    finally:
        release_pool(pool)


def test_pool_used_directly_wakes_and_parks_its_workers():
    pool = ThreadPool(3)
    seen: list[tuple[int, int]] = []
    lock = threading.Lock()

    def fn(lo: int, hi: int) -> None:
        with lock:
            seen.append((lo, hi))

    pool.run(9, fn, parts=3)
    assert sorted(seen) == [(0, 3), (3, 6), (6, 9)]
    assert not pool._awake  # parked again after a call made outside a using_threads block
    pool.close()
    assert not any(w.is_alive() for w in pool.workers)


def test_a_run_pins_its_thread_and_restores_it():
    """While a run uses a pool its thread stays on one CPU (the workers are kept off it); after, as before."""
    import os

    if not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("one CPU: nothing to pin")
    before = os.sched_getaffinity(0)
    with using_threads(2):
        inside = os.sched_getaffinity(0)
        with using_threads(2):
            nested = os.sched_getaffinity(0)
        assert os.sched_getaffinity(0) == inside
    assert len(inside) == 1 and nested == inside
    assert os.sched_getaffinity(0) == before


def test_the_pool_spins_only_with_a_cpu_per_thread(monkeypatch):
    """Two spinning threads on one CPU wait for each other until a scheduler tick: such pools sleep instead."""
    import os

    from minfer_parallel import pool as parallel

    if parallel._SPIN is None or not hasattr(os, "sched_getaffinity"):
        pytest.skip("no pthread spin locks or affinity masks here")
    cpus = len(os.sched_getaffinity(0))
    assert ThreadPool(cpus + 1).spins is False
    assert ThreadPool(cpus).spins is True
    monkeypatch.setenv("MINFER_POOL_SPIN", "0")
    pool = ThreadPool(2)
    assert pool.spins is False
    seen: list[tuple[int, int]] = []
    pool.run(4, lambda lo, hi: seen.append((lo, hi)), parts=2)  # the sleeping waits still work
    assert sorted(seen) == [(0, 2), (2, 4)]


def test_pool_needs_a_thread():
    with pytest.raises(ValueError):
        ThreadPool(0)


def test_session_runs_kernels_with_its_thread_count(monkeypatch):
    # untimed, the executor runs a two-thread session's shape with its pool (timed, this tiny model runs serial)
    monkeypatch.setenv("MINFER_TUNE", "0")
    seen: list[int] = []

    @minfer_core.kernel("Probe", domain="test.parallel")
    def probe(x):
        seen.append(intra_op_threads())
        return x + 1

    from onnx import TensorProto, helper

    node = helper.make_node("Probe", ["x"], ["y"], domain="test.parallel")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 21), helper.make_opsetid("test.parallel", 1)])

    class Plugin:
        @minfer_core.hookimpl
        def register_kernels(self, register):
            register(probe)

        @minfer_core.hookimpl
        def register_ops(self, register):
            register(minfer_core.op("Probe", domain="test.parallel", infer=minfer_core.same_as_input()))

    with minfer_core.use_plugins(Plugin()):
        for threads in (1, 2):
            sess = minfer_core.InferenceSession(model, passes="none", threads=threads)
            (y,) = sess.run(None, {"x": np.zeros(2, np.float32)})
            np.testing.assert_array_equal(y, np.ones(2, np.float32))
    assert seen[-1] == 2 and 1 in seen


@pytest.mark.skipif(not hasattr(__import__("os"), "fork"), reason="needs os.fork")
def test_a_forked_child_gets_its_own_workers():
    """After fork the child has none of the parent's worker threads: its parallel_for must not wait for them."""
    import os

    with using_threads(2):
        parallel_for(2, lambda lo, hi: None)  # the parent's pool exists and has run
    pid = os.fork()
    if pid == 0:  # child: would hang forever on the parent's (absent) workers
        try:
            done: list[int] = []
            with using_threads(2):
                parallel_for(4, lambda lo, hi: done.extend(range(lo, hi)))
            os._exit(0 if sorted(done) == [0, 1, 2, 3] else 1)
        finally:
            os._exit(2)
    assert child_exit_code(pid, "the forked child hung in parallel_for") == 0
