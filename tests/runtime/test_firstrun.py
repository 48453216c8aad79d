"""First-run costs: a new pool's threads are warmed at build, a new arena's pages are written as it is made, the conv
tuner times less and outside its one-time work, and the machine fingerprint starts no subprocess."""

from __future__ import annotations

import platform

import numpy as np
import pytest
from onnx import helper

import minfer_core
from minfer_core import tuning
from minfer_parallel import warmup
from minfer_parallel.blas import get_blas_threads
from minfer_parallel.pool import ThreadPool, acquire_pool, release_pool
from modelkit import make_model, tensor


def test_a_new_pool_is_warmed_on_every_thread():
    """acquire_pool warms the pool it makes: each of its threads ran the warm-up GEMM once."""
    pool = acquire_pool(3)
    try:
        assert pool.warmed == 3
    finally:
        release_pool(pool)


def test_warm_runs_on_each_thread_and_leaves_blas_and_workers_as_they_were():
    """warm reaches every thread of a pool, then the workers sleep again and BLAS keeps its thread count."""
    pool = ThreadPool(2)
    before = get_blas_threads()
    try:
        assert warmup.warm(pool) == 2
        assert not pool._awake and pool._users == 0
        assert get_blas_threads() == before
    finally:
        pool.close()


def test_warm_skips_a_one_thread_pool():
    """A pool without workers has nothing to warm."""
    pool = ThreadPool(1)
    assert warmup.warm(pool) == 0
    pool.close()


def test_an_arena_is_written_page_by_page_as_it_is_made():
    """touched writes one byte of every page of the memory its allocator returns, and nothing else."""
    made = warmup.touched(lambda n: np.full(n, 7, np.uint8))(3 * warmup.PAGE + 5)
    pages = np.zeros(made.size, bool)
    pages[:: warmup.PAGE] = True
    assert (made[pages] == 0).all() and (made[~pages] == 7).all()
    assert warmup.touched(None)(10).shape == (10,)


def test_the_threads_executor_makes_touched_arenas():
    """A session on the threads executor makes its arena through touched (its faults land in the discovery run)."""
    nodes = [helper.make_node("Add", ["x", "x"], ["h"]), helper.make_node("Mul", ["h", "h"], ["n"]),
             helper.make_node("Add", ["n", "n"], ["y"])]
    model = make_model(nodes, [tensor("x", [64, 256])], [tensor("y", [64, 256])])
    sess = minfer_core.InferenceSession(model, passes="none", threads=2)
    x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, 2 * (2 * x) ** 2, rtol=1e-6)
    plans = sess.executor.plans
    assert getattr(plans.allocate, "touches", False) and plans.arena.nbytes > 0


def test_winograd_weights_are_g_g_gt_per_filter():
    """transform_weights gives G g G^T for every filter, laid out (16, M, C)."""
    from minfer_ops_conv import winograd

    w = np.random.default_rng(1).standard_normal((5, 3, 3, 3)).astype(np.float32)
    g = winograd._MATRICES[2][1]
    want = np.stack([[g @ w[m, c].astype(np.float64) @ g.T for c in range(3)] for m in range(5)])  # (M, C, 4, 4)
    got = winograd.transform_weights(w)
    assert got.shape == (16, 5, 3) and got.dtype == np.float32
    np.testing.assert_allclose(got, want.transpose(2, 3, 0, 1).reshape(16, 5, 3), rtol=1e-6, atol=1e-6)


def _recording_plans(calls: list[str]) -> list:
    def plan(name: str):
        def run(x, p, y, bias, epilogue):
            calls.append(name)
            y[...] = x + (0 if bias is None else bias)
            if epilogue is not None:
                epilogue(y, (slice(0, 1), slice(0, 2), slice(0, 3)))
        run.__qualname__ = name
        return run
    return [plan("a"), plan("b")]


def _tuned_call(monkeypatch, winner: int) -> tuple[list[str], list[tuple], np.ndarray]:
    from minfer_ops_conv import tuner

    def choose(key, names, time_one, prior=None):  # every candidate timed once, in order; the given one wins
        for i in range(len(names)):
            time_one(i)
        return winner

    monkeypatch.setattr(tuner, "choose", choose)
    calls: list[str] = []
    regions: list[tuple] = []
    x = np.ones((1, 2, 3, 3), np.float32)
    y = np.full_like(x, np.nan)
    tuner.Tuned(_recording_plans(calls))(x, None, y, None, lambda out, region: regions.append(region))
    return calls, regions, y


def test_a_winner_timed_last_is_not_run_again(monkeypatch):
    """When the chosen plan was the last one timed, its output stands and only the epilogue is applied, once."""
    calls, regions, y = _tuned_call(monkeypatch, winner=1)
    assert calls == ["a", "b"] and len(regions) == 1 and (y == 1).all()
    assert regions[0] == (slice(0, 1), slice(0, 2), slice(0, 3))


def test_a_winner_timed_earlier_computes_the_result_again(monkeypatch):
    """When another plan wrote the output last, the chosen one runs again with the epilogue."""
    calls, regions, _ = _tuned_call(monkeypatch, winner=0)
    assert calls == ["a", "b", "a"] and len(regions) == 1


def test_a_plans_setup_runs_before_the_first_timing(monkeypatch):
    """A plan's one-time setup (Winograd's weight transform) is done before any candidate is timed."""
    from minfer_ops_conv import tuner

    calls: list[str] = []
    plans = _recording_plans(calls)
    plans[1].setup = lambda p: calls.append("setup")
    monkeypatch.setattr(tuner, "choose", lambda key, names, time_one, prior=None: [time_one(i) for i in range(2)] and 0)
    x = np.ones((1, 2, 3, 3), np.float32)
    tuner.Tuned(plans)(x, None, np.empty_like(x), None, None)
    assert calls[0] == "setup" and calls.count("setup") == 1


def _timed_twice(monkeypatch, seconds: dict[str, float]) -> list[str]:
    from minfer_ops_conv import tuner

    def choose(key, names, time_one, prior=None):  # the core's order: every candidate, then every candidate again
        best = [float("inf")] * len(names)
        for _ in range(2):
            for i in range(len(names)):
                best[i] = min(best[i], time_one(i))
        return best.index(min(best))

    def fixed(plan, x, p, y, bias):
        plan(x, p, y, bias, None)
        return seconds[plan.__qualname__]

    monkeypatch.setattr(tuner, "choose", choose)
    monkeypatch.setattr(tuner, "_seconds", fixed)
    calls: list[str] = []
    x = np.ones((1, 2, 3, 3), np.float32)
    tuner.Tuned(_recording_plans(calls))(x, None, np.empty_like(x), None, None)
    return calls


def test_a_clear_loser_is_timed_once(monkeypatch):
    """A candidate more than CLEAR_LOSS times slower than the best in the first round is not timed again."""
    from minfer_ops_conv import tuner

    # b is not run in the second round, so a is the last one timed and its output stands
    assert _timed_twice(monkeypatch, {"a": 1.0, "b": 1.0 + tuner.CLEAR_LOSS}) == ["a", "b", "a"]
    assert _timed_twice(monkeypatch, {"a": 1.0, "b": 1.5}) == ["a", "b", "a", "b", "a"]


def test_the_machine_fingerprint_starts_no_subprocess_where_cpuinfo_names_the_cpu(monkeypatch):
    """fingerprint reads /proc/cpuinfo before platform.processor(), which runs `uname -p` in a subprocess."""
    try:
        named = any(ln.startswith("model name") for ln in open("/proc/cpuinfo"))
    except OSError:
        named = False
    if not named:
        pytest.skip("no CPU model name in /proc/cpuinfo here")
    before = tuning.fingerprint()

    def spawns() -> str:
        raise AssertionError("platform.processor() was called")

    monkeypatch.setattr(platform, "processor", spawns)
    tuning.fingerprint.cache_clear()
    try:
        assert tuning.fingerprint() == before
    finally:
        tuning.fingerprint.cache_clear()


@pytest.mark.parametrize("side, trims", [(16, False), (768, True)])
def test_the_heap_is_trimmed_only_before_a_large_arena(monkeypatch, side, trims):
    """malloc_trim runs when a new arena of 4 MB or more is made (it returns the first run's heap), not for a
    small model, whose first run it would only slow."""
    from minfer_core import sequential

    calls = []
    monkeypatch.setattr(sequential, "_trim_heap", lambda: calls.append(1))
    nodes = [helper.make_node("Add", ["x", "x"], ["a"]), helper.make_node("Mul", ["a", "a"], ["b"]),
             helper.make_node("Sub", ["b", "a"], ["y"])]  # b lives in the arena: side 768 makes it 9 MB
    model = make_model(nodes, [tensor("x", [4, side, side])], [tensor("y", [4, side, side])])
    sess = minfer_core.InferenceSession(model.SerializeToString(), passes="none", parallel="sequential")
    sess.run(None, {"x": np.ones((4, side, side), np.float32)})
    assert bool(calls) is trims
