"""A fused op's HardSwish/HardSigmoid epilogue runs the registered in-place kernel of the op (a plugin's faster one)."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import minfer_core
from minfer_core import Engine
from modelkit import make_model, tensor


@pytest.fixture(autouse=True)
def first_conv_method(monkeypatch):
    """Convs take their first candidate method: two engines compared bit for bit must not time different methods;
    nor may the core time kernels against each other. minfer-ops-numba's convs, when installed, take their Python
    path (an activation of no compiled form; BLAS from numpy), the one that calls the registered kernel per tile."""
    from minfer_ops_conv import conv

    monkeypatch.setattr(conv, "TUNE", False)
    monkeypatch.setenv("MINFER_TUNE", "0")
    try:
        from minfer_ops_numba import team
    except ImportError:
        return
    monkeypatch.setattr(team, "native", lambda epilogue: None)
    monkeypatch.setattr(team, "gemm_address", lambda: 0)


def _conv_then(act: str, **attrs: float) -> object:
    """x (1, 8, 5, 5) -> 1x1 Conv to 16 channels (one tile: its output is C-contiguous) -> ``act``."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((16, 8, 1, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(16).astype(np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"]), helper.make_node(act, ["c"], ["y"], **attrs)]
    return make_model(nodes, [tensor("x", [1, 8, 5, 5])], [tensor("y", [1, 16, 5, 5])], inits, opset=17)


def _recording(op: str, since: int, calls: list, inplace: bool) -> object:
    """A top-priority kernel of ``op`` computing it as minfer-passes' epilogue does, recording each call."""

    @minfer_core.kernel(op, since=since, priority=100, prepare=True, out=True, inplace=(0,) if inplace else (),
                        views=False)
    def recording(ctx, *, alpha=1 / 6, beta=0.5):
        """HardSwish/HardSigmoid, recording (whether in place, alpha, beta) per call."""

        def run(x, *, out=None):
            calls.append((out is x, alpha, beta))
            gate = x * np.float32(alpha) + np.float32(beta)
            np.clip(gate, 0, 1, out=gate)
            y = out if out is not None else np.empty_like(x)
            np.multiply(x, gate, out=y) if op == "HardSwish" else np.copyto(y, gate)
            return y

        return run

    return recording


@pytest.mark.parametrize("op, since, attrs", [("HardSwish", 14, {}), ("HardSigmoid", 6, {"alpha": 0.25, "beta": 0.4})])
def test_fused_activation_runs_the_registered_in_place_kernel(minfer_plugin, op, since, attrs):
    """FusedConv's activation is the registered kernel's call in place on the tile, with the node's attributes; the
    outputs are the unfused graph's, bit for bit."""
    calls: list = []
    kern = _recording(op, since, calls, inplace=True)

    class Plugin:
        @minfer_core.hookimpl
        def register_kernels(self, register):
            register(kern)

    minfer_plugin(Plugin())
    model = _conv_then(op, **attrs)
    engine = Engine(model)
    assert [n.op_type for n in engine.graph.nodes] == ["FusedConv"]
    x = np.random.default_rng(1).standard_normal((1, 8, 5, 5)).astype(np.float32) * 4
    got = engine.run(None, {"x": x})[0]
    want = {"alpha": 1 / 6, "beta": 0.5, **attrs}
    assert calls and all(c == (True, pytest.approx(want["alpha"]), pytest.approx(want["beta"])) for c in calls)
    np.testing.assert_array_equal(got, Engine(model, passes="none").run(None, {"x": x})[0])


def test_fused_activation_leaves_a_kernel_that_does_not_write_in_place(minfer_plugin):
    """A HardSwish kernel that does not declare it writes in place is not the epilogue's: numpy's passes are."""
    calls: list = []
    kern = _recording("HardSwish", 14, calls, inplace=False)

    class Plugin:
        @minfer_core.hookimpl
        def register_kernels(self, register):
            register(kern)

    minfer_plugin(Plugin())
    model = _conv_then("HardSwish")
    x = np.random.default_rng(1).standard_normal((1, 8, 5, 5)).astype(np.float32) * 4
    got = Engine(model).run(None, {"x": x})[0]
    assert calls == []
    np.testing.assert_allclose(got, Engine(model, passes="none").run(None, {"x": x})[0], rtol=1e-6, atol=1e-6)
