"""What a new input shape's first run no longer pays: timing choices an earlier shape made, finding the BLAS."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

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


def test_a_prior_is_taken_untimed_and_not_stored(cache):
    """An earlier shape's choice (the prior) decides a new shape with no timing, and is not stored as if timed:
    a later process whose first shape this is times it."""
    time_one, ran = _timer([1.5, 1.0, 1.2])
    assert tuning.choose("op|prior", ["a", "b", "c"], time_one, prior="c") == 2
    assert ran == []
    assert not any(key.startswith("op|prior") for key in tuning.store().data)


def test_a_stored_choice_beats_the_prior():
    """A choice timed for this very key (an earlier process, `minfer tune`) is used rather than the prior."""
    tuning.store().put("op|stored|a,b,c", "a")
    time_one, ran = _timer([1.5, 1.0, 1.2])
    assert tuning.choose("op|stored", ["a", "b", "c"], time_one, prior="b") == 0
    assert ran == []


def test_tune_all_times_a_shape_that_has_a_prior(monkeypatch):
    """MINFER_TUNE=all (what `minfer tune` sets) times every new shape, the prior notwithstanding, and stores it."""
    monkeypatch.setenv("MINFER_TUNE", "all")
    time_one, ran = _timer([1.5, 1.0, 1.2])
    assert tuning.choose("op|all", ["a", "b", "c"], time_one, prior="c") == 1
    assert ran == [0, 1, 2, 2, 1, 0, 0, 1, 2][: 3 * tuning.ROUNDS]
    assert tuning.store().data["op|all|a,b,c"] == "b"


def test_a_choice_times_a_nodes_first_shape_and_reuses_its_choice_for_the_next(monkeypatch):
    """Choice times a node's first shape without a prior; each later new shape gets the last one chosen as its
    prior and runs it untimed."""
    priors, timed = [], []
    real = tuning.choose
    monkeypatch.setattr(tuning, "choose", lambda key, names, t, prior=None: priors.append(prior) or real(key, names, t, prior))
    fns = [lambda x: x + 1, lambda x: x + 2]
    monkeypatch.setattr(tuning, "seconds", lambda fn, *a, **k: timed.append(fns.index(fn)) or (2.0 if fn is fns[0] else 1.0))
    choice = tuning.Choice("op|node", ["slow", "fast"], fns)
    for n in (2, 3, 4):
        np.testing.assert_array_equal(choice(np.zeros(n, np.float32)), np.full(n, 2.0))
    assert priors == [None, "fast", "fast"]
    assert timed == [0, 1, 1, 0, 0, 1][: 2 * tuning.ROUNDS]  # (2.0 is not over CLEAR_LOSS times 1.0)


def test_a_symbolic_models_new_shapes_time_nothing(monkeypatch):
    """A model with a symbolic batch: its first shape times the choices (minfer-ops-conv's methods, and the
    kernels that apply when several plugins offer one), the next shapes none; their outputs stay right."""
    from minfer_ops_conv import depthwise, tuner

    timed = []
    real = tuning.choose
    for module in (tuning, tuner, depthwise):  # the core's choices and minfer-ops-conv's own
        monkeypatch.setattr(module, "choose", lambda key, names, t, prior=None: real(
            key, names, lambda i: timed.append(key) or t(i), prior))
    rng = np.random.default_rng(0)
    w = rng.standard_normal((64, 64, 3, 3)).astype(np.float32)
    model = make_model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
                       [tensor("x", ["N", 64, 28, 28])], [tensor("y", ["N", 64, 28, 28])], [numpy_helper.from_array(w, "w")])
    sess = minfer_core.InferenceSession(model, threads=1)
    ref = minfer_core.InferenceSession(model, threads=1, passes="none")
    for n in (1, 2, 3):
        x = rng.standard_normal((n, 64, 28, 28)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], ref.run(None, {"x": x})[0], rtol=1e-5, atol=1e-5)
        if n == 1:
            assert any(key.startswith("conv|") for key in timed), "minfer-ops-conv's methods timed"
            first = len(timed)
    assert len(timed) == first


@pytest.mark.parametrize("threads", [1, 2])
def test_a_session_with_threads_finds_the_blas_at_build(monkeypatch, threads):
    """Every run of a session given threads sets BLAS's thread count, so the build finds the BLAS (threadpoolctl's
    20-30 ms), also at threads=1 where no pool is made: no first run pays it."""
    found = []
    monkeypatch.setattr(executors, "get_blas_threads", lambda: found.append(1) or 1)
    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", ["N", 4])], [tensor("y", ["N", 4])])
    minfer_core.InferenceSession(model, threads=threads, parallel="threads")
    assert found
