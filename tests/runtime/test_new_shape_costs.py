"""What a new input shape's first run no longer pays: timing rounds an earlier shape's choice settles, finding the BLAS."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import minfer_core
from minfer_core import tuning
from minfer_parallel import executors
from modelkit import make_model, tensor


@pytest.fixture(autouse=True)
def cache(monkeypatch, tmp_path):
    monkeypatch.setenv("MINFER_CACHE", str(tmp_path))
    monkeypatch.delenv("MINFER_TUNE", raising=False)
    return tmp_path


def _timer(times):
    ran = []
    return (lambda i: ran.append(i) or times[i]), ran


def test_a_prior_that_wins_the_first_round_ends_the_timing():
    """When the prior wins the first round, no candidate is timed again, and the prior is the choice."""
    time_one, ran = _timer([1.5, 1.0, 1.2])
    assert tuning.choose("op|prior-wins", ["a", "b", "c"], time_one, prior="b") == 1
    assert ran == [0, 1, 2]


def test_a_prior_that_loses_the_first_round_changes_nothing():
    """A prior beaten in the first round leaves every round to run, as without one."""
    time_one, ran = _timer([1.5, 1.0, 1.2])
    assert tuning.choose("op|prior-loses", ["a", "b", "c"], time_one, prior="c") == 1
    assert ran == [0, 1, 2, 2, 1, 0][: 3 * tuning.ROUNDS]


def test_a_choice_passes_its_last_shapes_choice_as_the_next_shapes_prior(monkeypatch):
    """Choice times a node's first shape without a prior; each later new shape has the last one chosen as its
    prior, so when that one wins again every candidate is timed once."""
    priors, timed = [], []
    real = tuning.choose
    monkeypatch.setattr(tuning, "choose", lambda key, names, t, prior=None: priors.append(prior) or real(key, names, t, prior))
    fns = [lambda x: x + 1, lambda x: x + 2]
    monkeypatch.setattr(tuning, "seconds", lambda fn, *a, **k: timed.append(fns.index(fn)) or (2.0 if fn is fns[0] else 1.0))
    choice = tuning.Choice("op|node", ["slow", "fast"], fns)
    for n in (2, 3, 4):
        np.testing.assert_array_equal(choice(np.zeros(n, np.float32)), np.full(n, 2.0))
    assert priors == [None, "fast", "fast"]
    assert timed == [0, 1, 1, 0] + [0, 1] * 2


@pytest.mark.parametrize("threads", [1, 2])
def test_a_session_with_threads_finds_the_blas_at_build(monkeypatch, threads):
    """Every run of a session given threads sets BLAS's thread count, so the build finds the BLAS (threadpoolctl's
    20-30 ms), also at threads=1 where no pool is made: no first run pays it."""
    found = []
    monkeypatch.setattr(executors, "get_blas_threads", lambda: found.append(1) or 1)
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", ["N", 4])], [tensor("y", ["N", 4])])
    minfer_core.InferenceSession(model, threads=threads, parallel="threads")
    assert found
