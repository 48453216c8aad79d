"""Kernel: LinearAttention-27, the recurrent (linear, gated, delta, gated-delta) attention of onnx 1.21+.

The state S of each key/value head is a (d_k, d_v) matrix updated once per
token; the output of a token reads S with the query. The recurrence runs in
float32 whatever the activations' dtype (as onnx's reference does), vectorized
over batch and heads; only the loop over time is Python.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from minfer_core import KernelError, kernel

_RULES = {  # update_rule -> (decays the state by exp(decay), corrects the write by the delta rule)
    "linear": (False, False),
    "gated": (True, False),
    "delta": (False, True),
    "gated_delta": (True, True),
}


@kernel("LinearAttention", since=27, prepare=True, views=False)
def linear_attention(ctx, *, q_num_heads, kv_num_heads, chunk_size=64, scale=0.0, update_rule="gated_delta"):
    """LinearAttention-27: S_t = a_t*S_{t-1} + k_t (x) w_t, o_t = scale * q_t^T S_t (chunk_size is a hint only)."""
    where = f"node {ctx.node_name or '<unnamed>'!r} (LinearAttention)"
    if update_rule not in _RULES:
        raise KernelError(f"{where}: update_rule {update_rule!r} is not one of {', '.join(_RULES)}")
    if q_num_heads <= 0 or kv_num_heads <= 0 or q_num_heads % kv_num_heads:
        raise KernelError(f"{where}: q_num_heads ({q_num_heads}) must be a positive multiple of kv_num_heads ({kv_num_heads})")
    gated, delta = _RULES[update_rule]

    def run(query, key, value, past_state=None, decay=None, beta=None):
        _check_gates(update_rule, gated, delta, decay, beta)
        return _attend(query, key, value, past_state, decay, beta, q_num_heads, kv_num_heads, scale)

    return run


def _check_gates(rule: str, gated: bool, delta: bool, decay, beta) -> None:
    """The decay input is required by the gated rules and refused by the others; beta likewise for the delta rules."""
    for name, needed, given in (("decay", gated, decay is not None), ("beta", delta, beta is not None)):
        if needed != given:
            verb = "requires" if needed else "takes no"
            raise ValueError(f"LinearAttention update_rule {rule!r} {verb} input {name!r}")


def _heads(x: np.ndarray, heads: int, what: str) -> np.ndarray:
    """(B, T, H*D) -> (T, B, H, D) float32, contiguous per time step."""
    if x.ndim != 3 or x.shape[-1] % heads:
        raise ValueError(f"LinearAttention {what} must be (B, T, {heads}*D), got shape {x.shape}")
    b, t, hd = x.shape
    return np.ascontiguousarray(x.reshape(b, t, heads, hd // heads).transpose(1, 0, 2, 3), dtype=np.float32)


def _attend(query, key, value, past_state, decay, beta, hq: int, hkv: int, scale: float):
    """Both outputs: (B, T, Hq*d_v) in the query's dtype, and the final state in the past state's (or query's)."""
    q, k, v = _heads(query, hq, "query"), _heads(key, hkv, "key"), _heads(value, hkv, "value")
    t, b, _, d_k = q.shape
    d_v = v.shape[-1]
    group = hq // hkv  # query head h reads kv head h // group
    if past_state is None:
        state = np.zeros((b, hkv, d_k, d_v), np.float32)
    elif past_state.shape != (b, hkv, d_k, d_v):
        raise ValueError(f"LinearAttention past_state has shape {past_state.shape}, expected {(b, hkv, d_k, d_v)}")
    else:
        state = past_state.astype(np.float32)  # a copy: the recurrence writes into it
    step = _stepper(k, v, _decay_factors(decay, b, t, hkv, d_k), _beta(beta, b, t, hkv))
    q = q.reshape(t, b, hkv, group, d_k)
    out = np.empty((t, b, hkv, group, d_v), np.float32)
    for i in range(t):
        step(state, i)
        np.matmul(q[i], state, out=out[i])
    out *= np.float32(scale if scale else 1.0 / np.sqrt(d_k))
    output = np.ascontiguousarray(out.reshape(t, b, hq * d_v).transpose(1, 0, 2), dtype=query.dtype)
    return output, state.astype(query.dtype if past_state is None else past_state.dtype, copy=False)


def _decay_factors(decay, b: int, t: int, hkv: int, d_k: int) -> np.ndarray | None:
    """exp(decay) as (T, B, Hkv, d_k or 1, 1): it scales the state's rows (one per key dimension)."""
    if decay is None:
        return None
    if decay.ndim != 3 or decay.shape[:2] != (b, t) or decay.shape[-1] not in (hkv, hkv * d_k):
        raise ValueError(f"LinearAttention decay must be (B, T, {hkv}) or (B, T, {hkv * d_k}), got shape {decay.shape}")
    per_key = decay.reshape(b, t, hkv, -1).transpose(1, 0, 2, 3)
    return np.exp(per_key.astype(np.float32))[..., None]


def _beta(beta, b: int, t: int, hkv: int) -> np.ndarray | None:
    """beta as (T, B, Hkv or 1, 1, 1): one update rate per head (or shared), scaling the corrected value row."""
    if beta is None:
        return None
    if beta.ndim != 3 or beta.shape[:2] != (b, t) or beta.shape[-1] not in (hkv, 1):
        raise ValueError(f"LinearAttention beta must be (B, T, {hkv}) or (B, T, 1), got shape {beta.shape}")
    return np.ascontiguousarray(beta.transpose(1, 0, 2), dtype=np.float32)[..., None, None]


def _stepper(k: np.ndarray, v: np.ndarray, decay: np.ndarray | None, beta: np.ndarray | None) -> Callable[[np.ndarray, int], None]:
    """The in-place update of the (B, Hkv, d_k, d_v) state by token i, for the rule the gates select."""
    keys = k[..., :, None]  # (T, B, Hkv, d_k, 1): outer products as broadcasts
    values = v[..., None, :]  # (T, B, Hkv, 1, d_v)

    def step(state: np.ndarray, i: int) -> None:
        if decay is not None:
            state *= decay[i]
        write = values[i]
        if beta is not None:  # delta rule: write only what the (decayed) state does not already recall for k_i
            write = beta[i] * (write - np.matmul(k[i][..., None, :], state))
        state += keys[i] * write

    return step
