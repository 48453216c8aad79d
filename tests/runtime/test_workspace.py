"""minfer_core.scratch: kernels' per-thread working memory, reused between calls and visible in memory_report."""

from __future__ import annotations

import gc
import os
import threading

import numpy as np
import pytest
from onnx import helper, numpy_helper

import minfer_core
from minfer_core import release_scratch, scratch, scratch_bytes
from minfer_core.parallel import using_threads
from modelkit import child_exit_code, make_model, tensor

NAME = "test-workspace"


@pytest.fixture(autouse=True)
def _clean():
    release_scratch(NAME)
    yield
    release_scratch(NAME)


def _in_thread(fn):
    result = []
    worker = threading.Thread(target=lambda: result.append(fn()))
    worker.start()
    worker.join()
    return result[0]


def test_same_name_reuses_the_buffer_and_keeps_its_largest_size():
    """A thread's next call with the name gets the same memory, grown to the largest size asked, never shrunk."""
    a = scratch(NAME, (4, 256), np.float32)
    assert a.shape == (4, 256) and a.dtype == np.float32 and a.flags.c_contiguous
    b = scratch(NAME, (16,), np.float64)
    assert np.shares_memory(a, b)
    big = scratch(NAME, (1024, 64), np.float32)
    assert not np.shares_memory(a, big)  # grown: new memory
    small = scratch(NAME, (8,), np.int16)
    assert np.shares_memory(big, small)
    assert release_scratch(NAME) == 1024 * 64 * 4


def test_each_thread_has_its_own_buffer():
    """Two threads asking for the same name never get the same memory (a parallel_for's ranges need no lock)."""
    mine = scratch(NAME, (1000,), np.float32)
    theirs = _in_thread(lambda: scratch(NAME, (1000,), np.float32))
    assert not np.shares_memory(mine, theirs)


def test_scratch_bytes_counts_live_threads_only():
    """scratch_bytes adds up every live thread's buffers; a thread that ended gives its buffers back."""
    before = scratch_bytes()
    scratch(NAME, (1 << 16,), np.uint8)
    assert scratch_bytes() == before + (1 << 16)
    _in_thread(lambda: scratch(NAME, (1 << 17,), np.uint8) is not None)
    gc.collect()
    assert scratch_bytes() == before + (1 << 16)


def test_release_others_only_keeps_the_callers_buffer():
    """release_scratch(..., others_only=True) drops other threads' buffers of the name and keeps the caller's."""
    mine = scratch(NAME, (512,), np.float32)
    done = threading.Event()
    held = []

    def other():
        held.append(scratch(NAME, (2048,), np.float32).nbytes)
        done.wait()

    worker = threading.Thread(target=other)
    worker.start()
    while not held:
        pass
    try:
        assert release_scratch(NAME, others_only=True) == 2048 * 4
        assert np.shares_memory(mine, scratch(NAME, (512,), np.float32))
        assert release_scratch(NAME) == 512 * 4
    finally:
        done.set()
        worker.join()


def test_memory_report_shows_the_scratch_kernels_hold():
    """memory_report's scratch_bytes includes what a run's kernels keep (a padded conv's im2col slab)."""
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 4, 3, 3)).astype(np.float32)
    node = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    model = make_model([node], [tensor("x", [1, 4, 16, 16])], [tensor("y", [1, 8, 16, 16])],
                       [numpy_helper.from_array(w, "w")])
    release_scratch()
    sess = minfer_core.InferenceSession(model, threads=1)
    with using_threads(1):
        report = sess.memory_report({"x": rng.standard_normal((1, 4, 16, 16)).astype(np.float32)})
    # the slab alone: 4 channels x 9 taps x 256 columns of float32
    assert report["scratch_bytes"] >= 4 * 9 * 256 * 4
    assert report["scratch_bytes"] == scratch_bytes()


def test_asking_again_for_the_same_shape_returns_the_same_view_until_released():
    """The steady state (a tile asking the same shape each run) costs a dict lookup; a release forgets the view."""
    a = scratch(NAME, (3, 5), np.float32)
    assert scratch(NAME, (3, 5), np.float32) is a
    assert scratch(NAME, (5, 3), np.float32) is not a
    b = scratch(NAME, (3, 5), np.float32)
    assert np.shares_memory(a, b)
    release_scratch(NAME)
    assert scratch(NAME, (3, 5), np.float32) is not b


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork-only")
def test_a_forked_child_can_register_new_threads_even_if_the_lock_was_held_at_the_fork():
    """The registry's lock is made anew in a forked child: a thread holding it at the fork cannot hang the child."""
    from minfer_core import workspace

    with workspace._every_lock:  # as if another thread held it at the moment of the fork
        pid = os.fork()
        if pid == 0:  # the child: a new thread's first scratch takes the lock
            try:
                ok = _in_thread(lambda: scratch(NAME, (4,), np.float32).size == 4)
                os._exit(0 if ok else 1)
            finally:
                os._exit(2)
    assert child_exit_code(pid, "the forked child hung on the scratch registry's lock") == 0
