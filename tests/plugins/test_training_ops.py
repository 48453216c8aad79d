"""minfer-ops-basic's ai.onnx.preview.training optimizers (Adagrad, Adam, Momentum): node cases and the documented formulas.

The oracles are onnx's stored node-case outputs and, on inputs of our own (two
tensors at once, T > 0, non-zero regularization), the pseudo code of each
operator's documentation written out in float64 below.
"""

from __future__ import annotations

import numpy as np
import pytest

from minfer_core import InferenceSession, KernelError, MinferError
from minfer_core.testing.conformance import load_cases, run_case
from minfer_core.testing.ops import single_node_model

TRAINING = "ai.onnx.preview.training"
NAMES = ("test_adagrad", "test_adagrad_multiple", "test_adam", "test_adam_multiple",
         "test_momentum", "test_momentum_multiple", "test_nesterov_momentum")
CASES = [c for c in load_cases() if c.name in NAMES]


def test_all_training_node_cases_are_found():
    """The seven onnx node cases of the training optimizers exist (so the parametrized test below cannot pass empty)."""
    assert sorted(c.name for c in CASES) == sorted(NAMES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_training_node_case(case):
    """Each onnx node case of Adagrad, Adam and Momentum gives its stored outputs."""
    run_case(case)


def run_optimizer(op_type, r, t, tensors, attrs, num_outputs):
    """minfer's outputs of one optimizer node fed R, T and the tensors."""
    model, feeds = single_node_model(op_type, 1, [r, t, *tensors], attrs, num_outputs, domain=TRAINING)
    return InferenceSession(model).run(None, feeds)


def two_tensors(dtype, roles, seed):
    """Per role (X, G, then states), two tensors of different shapes; states are non-negative like H is."""
    rng = np.random.default_rng(seed)
    shapes = [(3, 4), (5,)]
    return [[np.abs(rng.standard_normal(s)).astype(dtype) if role == "H" else rng.standard_normal(s).astype(dtype)
             for s in shapes] for role in roles]


def assert_outputs(got, want, dtype):
    for i, (g, w) in enumerate(zip(got, want)):
        assert (g.dtype, g.shape) == (np.dtype(dtype), w.shape), f"output {i}: {g.dtype}{g.shape}"
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6, err_msg=f"output {i}")


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_adagrad_follows_its_pseudo_code(dtype):
    """Adagrad on two tensors: r = R/(1+T*decay), G' = norm*X+G, H' = H+G'^2, X' = X - r*G'/(sqrt(H')+eps)."""
    (x1, x2), (g1, g2), (h1, h2) = two_tensors(dtype, "XGH", 1)
    attrs = dict(decay_factor=0.1, epsilon=1e-3, norm_coefficient=0.01)
    r, t = np.array(0.5, dtype), np.array(3, np.int64)
    got = run_optimizer("Adagrad", r, t, [x1, x2, g1, g2, h1, h2], attrs, 4)
    rate = 0.5 / (1 + 3 * 0.1)
    want_x, want_h = [], []
    for x, g, h in ((x1, g1, h1), (x2, g2, h2)):
        gr = 0.01 * x.astype(np.float64) + g
        want_h.append(h + gr * gr)
        want_x.append(x - rate * gr / (np.sqrt(want_h[-1]) + 1e-3))
    assert_outputs(got, want_x + want_h, dtype)


@pytest.mark.parametrize("step", [0, 4])
def test_adam_follows_its_pseudo_code(step):
    """Adam on two tensors, with bias correction only when T > 0 and the post-update decay of X."""
    (x1, x2), (g1, g2), (v1, v2), (h1, h2) = two_tensors(np.float32, "XGVH", 2)
    alpha, beta, eps, norm, post = 0.8, 0.95, 1e-4, 0.02, 0.1
    attrs = dict(alpha=alpha, beta=beta, epsilon=eps, norm_coefficient=norm, norm_coefficient_post=post)
    got = run_optimizer("Adam", np.array(0.1, np.float32), np.array(step, np.int64), [x1, x2, g1, g2, v1, v2, h1, h2], attrs, 6)
    rate = 0.1 * np.sqrt(1 - beta**step) / (1 - alpha**step) if step > 0 else 0.1
    want = {"X": [], "V": [], "H": []}
    for x, g, v, h in ((x1, g1, v1, h1), (x2, g2, v2, h2)):
        gr = norm * x.astype(np.float64) + g
        want["V"].append(alpha * v + (1 - alpha) * gr)
        want["H"].append(beta * h + (1 - beta) * gr * gr)
        want["X"].append((1 - post) * (x - rate * want["V"][-1] / (np.sqrt(want["H"][-1]) + eps)))
    assert_outputs(got, want["X"] + want["V"] + want["H"], np.float32)


@pytest.mark.parametrize("mode", ["standard", "nesterov"])
@pytest.mark.parametrize("step", [0, 2])
def test_momentum_follows_its_pseudo_code(mode, step):
    """Momentum on two tensors: beta applies from T > 0 (1 before); nesterov steps along G' + alpha*V'."""
    (x1, x2), (g1, g2), (v1, v2) = two_tensors(np.float64, "XGV", 3)
    alpha, beta, norm = 0.7, 0.3, 0.05
    attrs = dict(alpha=alpha, beta=beta, mode=mode, norm_coefficient=norm)
    got = run_optimizer("Momentum", np.array(0.2), np.array(step, np.int64), [x1, x2, g1, g2, v1, v2], attrs, 4)
    gain = beta if step > 0 else 1.0
    want_x, want_v = [], []
    for x, g, v in ((x1, g1, v1), (x2, g2, v2)):
        gr = norm * x + g
        want_v.append(alpha * v + gain * gr)
        want_x.append(x - 0.2 * (want_v[-1] if mode == "standard" else gr + alpha * want_v[-1]))
    assert_outputs(got, want_x + want_v, np.float64)


def test_unknown_momentum_mode_is_named():
    """A Momentum mode other than standard/nesterov fails naming the mode and the two that exist."""
    (x,), (g,), (v,) = ([np.ones(3, np.float32)] for _ in range(3))
    attrs = dict(alpha=0.9, beta=0.1, mode="heavy_ball", norm_coefficient=0.0)
    with pytest.raises(KernelError) as info:
        run_optimizer("Momentum", np.array(0.1, np.float32), np.array(1, np.int64), [x, g, v], attrs, 2)
    assert "'heavy_ball' is not 'standard' or 'nesterov'" in str(info.value) + str(info.value.__cause__)


def test_tensor_count_that_is_not_a_multiple_of_the_roles_is_refused():
    """Adagrad with 4 tensors after R, T (not X, G, H per tensor) fails saying how the inputs are grouped."""
    x = np.ones(3, np.float32)
    with pytest.raises(MinferError) as info:
        run_optimizer("Adagrad", np.array(0.1, np.float32), np.array(1, np.int64), [x, x, x, x], {}, 2)
    assert "3 tensors (X, G, H) per optimized tensor; got 4" in str(info.value) + str(info.value.__cause__)
