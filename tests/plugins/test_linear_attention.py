"""minfer-ops-basic LinearAttention-27: onnx's node cases, the spec's per-head recurrence, prefill/decode splits.

The oracles are onnx's stored node-case outputs and a float64 loop over each
(batch, head, token) written from the formulas of the operator's documentation.
"""

from __future__ import annotations

import numpy as np
import pytest

from minfer_core import InferenceSession, KernelError, MinferError
from minfer_core.testing.conformance import load_cases, run_case
from minfer_core.testing.ops import call_kernel, single_node_model
from minfer_ops_basic.plugin import KERNELS

CASES = [c for c in load_cases() if c.name.startswith("test_linear_attention") and not c.name.endswith("_expanded")]
RULES = ("linear", "gated", "delta", "gated_delta")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_linear_attention_node_case(case):
    """Each onnx node case of LinearAttention gives its stored outputs (dtype, shape, values)."""
    run_case(case)


def test_every_update_rule_has_a_node_case():
    """The node cases cover every rule (so a rule minfer gets wrong cannot hide from the test above)."""
    assert len(CASES) == 14
    assert {r for r in RULES for c in CASES if c.name.removeprefix("test_linear_attention_").startswith(r)} == set(RULES)


def spec_recurrence(q, k, v, state, decay, beta, hq, hkv, rule, scale):
    """The documented recurrence, one (batch, kv head, token) at a time in float64: (output, final state)."""
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    b_size, t_size, _ = q.shape
    d_k, d_v = q.shape[-1] // hq, v.shape[-1] // hkv
    group = hq // hkv
    out = np.zeros((b_size, t_size, hq * d_v))
    state = state.astype(np.float64).copy()
    for b in range(b_size):
        for h in range(hkv):
            s = state[b, h]
            for t in range(t_size):
                k_t, v_t = k[b, t, h * d_k:(h + 1) * d_k], v[b, t, h * d_v:(h + 1) * d_v]
                if rule in ("gated", "gated_delta"):
                    g = decay[b, t, h] if decay.shape[-1] == hkv else decay[b, t, h * d_k:(h + 1) * d_k]
                    s = np.exp(g)[..., None] * s if np.ndim(g) else np.exp(g) * s
                if rule in ("delta", "gated_delta"):
                    rate = beta[b, t, h if beta.shape[-1] == hkv else 0]
                    s = s + rate * np.outer(k_t, v_t - s.T @ k_t)
                else:
                    s = s + np.outer(k_t, v_t)
                for j in range(h * group, (h + 1) * group):
                    out[b, t, j * d_v:(j + 1) * d_v] = scale * s.T @ q[b, t, j * d_k:(j + 1) * d_k]
            state[b, h] = s
    return out, state


def run_minfer(q, k, v, past, decay, beta, **attrs):
    model, feeds = single_node_model("LinearAttention", 27, [q, k, v, past, decay, beta], attrs, num_outputs=2)
    return InferenceSession(model).run(None, feeds)


def random_inputs(rng, b, t, hq, hkv, d_k, d_v, rule, per_key_decay, scalar_beta):
    q = rng.standard_normal((b, t, hq * d_k)).astype(np.float32)
    k = rng.standard_normal((b, t, hkv, d_k))
    k = (k / np.linalg.norm(k, axis=-1, keepdims=True)).reshape(b, t, hkv * d_k).astype(np.float32)  # L2-normalized keys
    v = rng.standard_normal((b, t, hkv * d_v)).astype(np.float32)
    past = rng.standard_normal((b, hkv, d_k, d_v)).astype(np.float32)
    decay = -rng.uniform(0.01, 0.5, (b, t, hkv * d_k if per_key_decay else hkv)).astype(np.float32)
    beta = rng.uniform(0.1, 0.9, (b, t, 1 if scalar_beta else hkv)).astype(np.float32)
    return q, k, v, past, (decay if "gated" in rule else None), (beta if "delta" in rule else None)


@pytest.mark.parametrize("rule", RULES)
@pytest.mark.parametrize("heads", [(2, 2), (4, 2), (3, 1)], ids=["mha", "gqa", "mqa"])
@pytest.mark.parametrize("per_key_decay,scalar_beta", [(False, False), (True, True)])
def test_matches_the_documented_recurrence(rule, heads, per_key_decay, scalar_beta):
    """Every rule, with GQA/MQA head sharing, per-head or per-key decay and per-head or shared beta, follows the spec."""
    hq, hkv = heads
    rng = np.random.default_rng(hq * 10 + hkv + len(rule))
    q, k, v, past, decay, beta = random_inputs(rng, 2, 5, hq, hkv, 3, 4, rule, per_key_decay, scalar_beta)
    got, state = run_minfer(q, k, v, past, decay, beta, q_num_heads=hq, kv_num_heads=hkv, update_rule=rule)
    want, want_state = spec_recurrence(q, k, v, past, decay, beta, hq, hkv, rule, 1 / np.sqrt(3))
    assert (got.dtype, got.shape, state.dtype, state.shape) == (np.float32, want.shape, np.float32, past.shape)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(state, want_state, rtol=1e-4, atol=1e-5)


def test_prefill_then_decode_equals_one_pass():
    """Feeding present_state back as past_state continues the sequence exactly where one long call would be."""
    rng = np.random.default_rng(7)
    q, k, v, past, decay, beta = random_inputs(rng, 1, 6, 4, 2, 4, 3, "gated_delta", True, False)
    attrs = dict(q_num_heads=4, kv_num_heads=2, scale=0.25)
    whole, whole_state = run_minfer(q, k, v, past, decay, beta, **attrs)
    state, parts = past, []
    for lo, hi in ((0, 4), (4, 5), (5, 6)):  # a prefill of 4 tokens, then two decode steps
        out, state = run_minfer(q[:, lo:hi], k[:, lo:hi], v[:, lo:hi], state, decay[:, lo:hi], beta[:, lo:hi], **attrs)
        parts.append(out)
    np.testing.assert_allclose(np.concatenate(parts, axis=1), whole, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(state, whole_state, rtol=1e-5, atol=1e-6)


def test_float32_state_with_float16_activations_keeps_the_state_dtype():
    """present_state takes past_state's dtype (float32 here) while the output keeps the query's (float16)."""
    rng = np.random.default_rng(3)
    q, k, v, past, _, _ = random_inputs(rng, 1, 3, 2, 2, 4, 4, "linear", False, False)
    got, state = run_minfer(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16), past, None, None,
                            q_num_heads=2, kv_num_heads=2, update_rule="linear")
    want, want_state = spec_recurrence(q.astype(np.float16), k.astype(np.float16), v.astype(np.float16), past, None, None,
                                       2, 2, "linear", 0.5)
    assert (got.dtype, state.dtype) == (np.float16, np.float32)
    np.testing.assert_allclose(got, want, rtol=2e-3, atol=2e-3)
    np.testing.assert_allclose(state, want_state, rtol=1e-4, atol=1e-4)


def test_unknown_update_rule_is_refused_when_prepared():
    """An update_rule outside linear/gated/delta/gated_delta is a KernelError that lists the rules (onnx's inference refuses it too)."""
    q = np.zeros((1, 1, 4), np.float32)
    with pytest.raises(KernelError, match="'lstm' is not one of linear, gated, delta, gated_delta"):
        call_kernel(KERNELS, "LinearAttention", 27, q, q, q, num_outputs=2, q_num_heads=1, kv_num_heads=1, update_rule="lstm")
    model, _ = single_node_model("LinearAttention", 27, [q, q, q], dict(q_num_heads=1, kv_num_heads=1, update_rule="lstm"), 2)
    with pytest.raises(MinferError, match="lstm|update_rule"):
        InferenceSession(model)


def test_query_heads_must_be_a_multiple_of_kv_heads():
    """q_num_heads=3 over kv_num_heads=2 cannot share heads evenly: a KernelError naming both counts."""
    q = np.zeros((1, 1, 6), np.float32)
    with pytest.raises(KernelError, match=r"q_num_heads \(3\) must be a positive multiple of kv_num_heads \(2\)"):
        call_kernel(KERNELS, "LinearAttention", 27, q, q, q, num_outputs=2, q_num_heads=3, kv_num_heads=2, update_rule="linear")


def test_gated_rule_without_decay_names_the_missing_input():
    """The default rule gated_delta needs decay: calling the kernel without it fails naming the input, not in numpy."""
    q = np.ones((1, 1, 4), np.float32)
    with pytest.raises(ValueError, match="'gated_delta' requires input 'decay'"):
        call_kernel(KERNELS, "LinearAttention", 27, q, q, q, None, None, np.ones((1, 1, 1), np.float32),
                    num_outputs=2, q_num_heads=1, kv_num_heads=1)
