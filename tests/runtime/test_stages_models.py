"""The light model-zoo models with branches give the same outputs with concurrent stages as with one thread."""

from __future__ import annotations

import numpy as np
import pytest

from modelkit import ort_run
from minfer_core import InferenceSession
from minfer_core.testing.zoo import randomized

BRANCHY = ("inception_v1", "inception_v2", "squeezenet", "shufflenet", "resnet50")


@pytest.fixture
def fixed_methods(monkeypatch):
    """Kernels, conv and depthwise methods chosen without timing, so two sessions pick the same ones."""
    monkeypatch.setenv("MINFER_TUNE", "0")  # the core's timed choice among plugins' kernels (minfer-ops-numba's)
    conv = pytest.importorskip("minfer_ops_conv.conv")
    depthwise = pytest.importorskip("minfer_ops_conv.depthwise")
    monkeypatch.setattr(conv, "TUNE", False)
    monkeypatch.setattr(depthwise, "TUNE", False)


@pytest.mark.parametrize("name", BRANCHY)
def test_stages_match_one_thread_bitwise(name, fixed_methods):
    """Every run of independent steps as a stage (2 threads): outputs bitwise those of threads=1, and ORT's."""
    model = randomized(f"light_{name}", seed=1)
    staged = InferenceSession(model, threads=2, inter_op="always")
    serial = InferenceSession(model, threads=1, inter_op="never")
    (inp,) = staged.get_inputs()
    want_ort = None
    for seed in (2, 3):
        x = np.random.default_rng(seed).standard_normal(inp.shape).astype(np.float32)
        want = serial.run(None, {inp.name: x})
        for _ in range(2):  # the discovery run (sequential), then the staged loop
            got = staged.run(None, {inp.name: x})
            for g, w in zip(got, want):
                np.testing.assert_array_equal(g, w)
        want_ort = ort_run(model, {inp.name: x})
        for g, w in zip(got, want_ort):
            np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5)
    assert staged.executor.stages[staged.executor.plans.last][0], f"{name} has branches: some stage should have been planned"
    report = staged.memory_report()
    assert report["arena_bytes"] <= 1.15 * report["live_set_bytes"]
