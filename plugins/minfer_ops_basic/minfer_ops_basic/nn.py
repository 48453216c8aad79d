"""Kernels: network blocks (LayerNormalization, RMSNormalization, RotaryEmbedding, Attention, RNN, GRU, LSTM)."""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

import minfer_core
from minfer_core import kernel

from .activation import sigmoid, softmax
from .elementwise import arr, is_exotic


def _wide(dtype: np.dtype) -> np.dtype:
    """Where to compute: half and ml_dtypes floats in float32, float32/float64 as they are."""
    if is_exotic(dtype) or dtype.itemsize < 4:
        return np.dtype(np.float32)
    return dtype


def _rows(x: np.ndarray, axis: int) -> tuple[int, int, tuple[int, ...]]:
    """Normalizing over axes [axis, rank) is normalizing the rows of x as (outer, inner)."""
    axis = axis % x.ndim
    outer = math.prod(x.shape[:axis])
    return outer, math.prod(x.shape[axis:]), x.shape[:axis] + (1,) * (x.ndim - axis)


def _mean_square(rows: np.ndarray) -> np.ndarray:
    """Row-wise mean of squares without materializing the squares."""
    return np.einsum("ij,ij->i", rows, rows) / np.asarray(max(rows.shape[1], 1), rows.dtype)


@kernel("LayerNormalization", since=17)
def layer_normalization(x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1):
    """LayerNormalization-17: standardize over axes [axis, rank), then scale and shift; also Mean, InvStdDev."""
    stash = minfer_core.onnx_dtype(stash_type)
    outer, inner, stat_shape = _rows(x, axis)
    v = x.astype(stash, copy=False).reshape(outer, inner)
    mean = np.mean(v, axis=1, keepdims=True)
    d = v - mean  # a fresh array: everything below works in place on it
    inv_std = 1 / np.sqrt(_mean_square(d) + np.asarray(epsilon, stash))[:, None]
    d *= inv_std
    y = d.reshape(x.shape)
    y *= scale.astype(stash, copy=False)
    if b is not None:
        y += b.astype(stash, copy=False)
    return arr(y, x.dtype), arr(mean.reshape(stat_shape), stash), arr(inv_std.reshape(stat_shape), stash)


@kernel("RMSNormalization", since=23)
def rms_normalization(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1):
    """RMSNormalization-23: x / sqrt(mean(x*x over axes [axis, rank)) + epsilon) * scale."""
    stash = minfer_core.onnx_dtype(stash_type)
    outer, inner, _ = _rows(x, axis)
    v = x.astype(stash, copy=False).reshape(outer, inner)
    inv_rms = 1 / np.sqrt(_mean_square(v) + np.asarray(epsilon, stash))[:, None]
    y = (v * inv_rms).reshape(x.shape)
    y *= scale.astype(stash, copy=False)
    return arr(y, x.dtype)


# --- RotaryEmbedding ---------------------------------------------------------


@kernel("RotaryEmbedding", since=23)
def rotary_embedding(x, cos_cache, sin_cache, position_ids=None, *, interleaved=0, num_heads=None, rotary_embedding_dim=0):
    """RotaryEmbedding-23: rotate the first rotary_embedding_dim features of each head by position."""
    if x.ndim == 4:  # (batch, heads, seq, head_size): work as (batch, seq, heads, head_size)
        heads_last = x.transpose(0, 2, 1, 3)
    else:
        batch, seq, hidden = x.shape
        heads_last = x.reshape(batch, seq, num_heads, hidden // num_heads)
    rot_dim = rotary_embedding_dim or heads_last.shape[-1]
    half = rot_dim // 2
    if position_ids is not None:
        cos_cache, sin_cache = cos_cache[position_ids], sin_cache[position_ids]
    wide = _wide(x.dtype)
    cos = cos_cache.astype(wide)[:, :, None, :]  # (batch, seq, 1, rot_dim/2)
    sin = sin_cache.astype(wide)[:, :, None, :]
    out = heads_last.astype(wide)  # a fresh copy that the rotation overwrites
    # the rotated pairs are (i, i + half), or (2i, 2i + 1) when interleaved
    first = slice(0, rot_dim, 2) if interleaved else slice(0, half)
    second = slice(1, rot_dim, 2) if interleaved else slice(half, rot_dim)
    x1, x2 = out[..., first].copy(), out[..., second].copy()
    out[..., first] = cos * x1 - sin * x2
    out[..., second] = sin * x1 + cos * x2
    out = out.astype(x.dtype, copy=False)
    if x.ndim == 4:
        return np.ascontiguousarray(out.transpose(0, 2, 1, 3))
    return out.reshape(x.shape)


# --- Attention ---------------------------------------------------------------


def _heads_first(t: np.ndarray, num_heads: int | None) -> np.ndarray:
    """(batch, seq, heads*size) -> (batch, heads, seq, size); 4-D inputs are already so."""
    if t.ndim == 4:
        return t
    batch, seq, hidden = t.shape
    return t.reshape(batch, seq, num_heads, hidden // num_heads).transpose(0, 2, 1, 3)


def _allowed(sq: int, total: int, offset: np.ndarray, causal: int, left: int, right: int) -> np.ndarray | None:
    """Boolean (batch|1, 1, sq, total) of keys each query may see by position, or None if all."""
    if not causal and left < 0 and right < 0:
        return None
    pos = offset.reshape(-1, 1, 1, 1) + np.arange(sq).reshape(1, 1, sq, 1)  # absolute query position
    key = np.arange(total).reshape(1, 1, 1, total)
    ok = np.ones(np.broadcast_shapes(pos.shape, key.shape), dtype=bool)
    if causal:
        ok &= key <= pos
    if left >= 0:
        ok &= key >= pos - left
    if right >= 0:
        ok &= key <= pos + right
    return ok


def _mask_bias(attn_mask: np.ndarray | None, total: int, dtype: np.dtype) -> np.ndarray | None:
    """attn_mask as an additive bias: bool False -> -inf, floats added; short masks padded with -inf."""
    if attn_mask is None:
        return None
    if attn_mask.dtype == np.bool_:
        bias = np.where(attn_mask, 0, -np.inf).astype(dtype)
    else:
        bias = attn_mask.astype(dtype)
    short = total - bias.shape[-1]
    if short > 0:
        pad = [(0, 0)] * (bias.ndim - 1) + [(0, short)]
        bias = np.pad(bias, pad, constant_values=-np.inf)
    return bias


def _attention(q, k, v, attn_mask, past_key, past_value, nonpad, a: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """Scaled dot-product attention with GQA, KV cache, causal/window masks and softcap."""
    out_dtype, three_d = q.dtype, q.ndim == 3
    q = _heads_first(q, a["q_num_heads"])
    k = _heads_first(k, a["kv_num_heads"])
    v = _heads_first(v, a["kv_num_heads"])
    past = 0
    if past_key is not None:
        past = past_key.shape[2]
        k, v = np.concatenate([past_key, k], axis=2), np.concatenate([past_value, v], axis=2)
    present_k, present_v = k, v
    batch, heads, sq, head_size = q.shape
    total = k.shape[2]
    wide = _wide(out_dtype)
    # Compute in float32 for half types, but round every stage to T1 as the function body's
    # T1-typed intermediates do; bfloat16 results differ by whole ulps otherwise.
    t1 = (lambda t: t) if wide == out_dtype else (lambda t: t.astype(out_dtype).astype(wide))
    if heads != k.shape[1]:  # grouped-query attention: each kv head serves heads/kv_heads query heads
        k = np.repeat(k, heads // k.shape[1], axis=1)
        v = np.repeat(v, heads // v.shape[1], axis=1)
    scale = a["scale"] if a["scale"] is not None else 1 / math.sqrt(head_size)
    root = t1(np.asarray(math.sqrt(scale), wide))  # Q and K are each scaled by sqrt(scale)
    scores = t1(np.matmul(t1(q.astype(wide) * root), t1(k.astype(wide) * root).swapaxes(-1, -2)))
    stages = [scores]
    if a["softcap"] > 0:
        cap = np.asarray(a["softcap"], wide)
        scores = t1(cap * np.tanh(t1(scores / cap)))
    stages.append(scores)
    bias = _bias(attn_mask, nonpad, a, sq, total, past_key is not None and past, wide)
    if bias is not None:
        scores = t1(scores + bias)
    stages.append(scores)
    probs = t1(_guarded_softmax(scores, bias, a["softmax_precision"], out_dtype))
    stages.append(probs)
    y = np.matmul(probs, v.astype(wide))
    if three_d:
        y = y.transpose(0, 2, 1, 3).reshape(batch, sq, -1)
    qk = stages[a["qk_matmul_output_mode"]]
    return arr(y, out_dtype), present_k, present_v, arr(qk, out_dtype)


def _bias(attn_mask, nonpad, a: dict[str, Any], sq: int, total: int, past: int, wide: np.dtype) -> np.ndarray | None:
    """The additive bias: attn_mask plus -inf wherever causality, windows or padding block a key."""
    if not past and nonpad is not None:  # an external cache: queries sit at the end of the valid keys
        offset = nonpad.astype(np.int64) - sq
    else:
        offset = np.asarray([past], dtype=np.int64)
    allowed = _allowed(sq, total, offset, a["is_causal"], a["left"], a["right"])
    if nonpad is not None:  # keys past each batch's valid length are padding
        valid = np.arange(total).reshape(1, 1, 1, total) < nonpad.reshape(-1, 1, 1, 1)
        allowed = valid if allowed is None else allowed & valid
    bias = _mask_bias(attn_mask, total, wide)
    if allowed is not None:
        blocked = np.where(allowed, 0, -np.inf).astype(wide)
        bias = blocked if bias is None else bias + blocked
    return bias


def _guarded_softmax(scores: np.ndarray, bias: np.ndarray | None, precision: int | None, t1: np.dtype) -> np.ndarray:
    """Softmax over keys; a row whose bias blocks every key is zeros, not NaN (decided on the bias, as ONNX says)."""
    dtype = t1 if precision is None else minfer_core.onnx_dtype(precision)
    with np.errstate(invalid="ignore"):  # computed natively in that dtype, as the reference rounds
        probs = softmax(scores.astype(dtype), -1).astype(scores.dtype)
    if bias is None:
        return probs
    dead = np.isneginf(np.max(bias, axis=-1, keepdims=True))
    return np.where(dead, 0, probs).astype(scores.dtype) if dead.any() else probs


def _attrs(**kw: Any) -> dict[str, Any]:
    kw.setdefault("left", -1)
    kw.setdefault("right", -1)
    return kw


@kernel("Attention", since=25)
def attention(
    q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
    is_causal=0, kv_num_heads=None, left_window_size=-1, q_num_heads=None, qk_matmul_output_mode=0,
    right_window_size=-1, scale=None, softcap=0.0, softmax_precision=None,
):  # fmt: skip
    """Attention-25: adds left/right sliding-window bounds to Attention-24."""
    a = _attrs(is_causal=is_causal, kv_num_heads=kv_num_heads, q_num_heads=q_num_heads, scale=scale,
               qk_matmul_output_mode=qk_matmul_output_mode, softcap=softcap, softmax_precision=softmax_precision,
               left=left_window_size, right=right_window_size)  # fmt: skip
    return _attention(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, a)


@kernel("Attention", since=24)
def attention_24(
    q, k, v, attn_mask=None, past_key=None, past_value=None, nonpad_kv_seqlen=None, *,
    is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0,
    scale=None, softcap=0.0, softmax_precision=None,
):  # fmt: skip
    """Attention-24: adds nonpad_kv_seqlen (external KV cache) to Attention-23."""
    a = _attrs(is_causal=is_causal, kv_num_heads=kv_num_heads, q_num_heads=q_num_heads, scale=scale,
               qk_matmul_output_mode=qk_matmul_output_mode, softcap=softcap, softmax_precision=softmax_precision)  # fmt: skip
    return _attention(q, k, v, attn_mask, past_key, past_value, nonpad_kv_seqlen, a)


@kernel("Attention", since=23)
def attention_23(
    q, k, v, attn_mask=None, past_key=None, past_value=None, *,
    is_causal=0, kv_num_heads=None, q_num_heads=None, qk_matmul_output_mode=0,
    scale=None, softcap=0.0, softmax_precision=None,
):  # fmt: skip
    """Attention-23: scaled dot-product attention (MHA/GQA/MQA) with optional KV cache."""
    a = _attrs(is_causal=is_causal, kv_num_heads=kv_num_heads, q_num_heads=q_num_heads, scale=scale,
               qk_matmul_output_mode=qk_matmul_output_mode, softcap=softcap, softmax_precision=softmax_precision)  # fmt: skip
    return _attention(q, k, v, attn_mask, past_key, past_value, None, a)


# --- RNN, GRU, LSTM ----------------------------------------------------------------

_ACTIVATIONS: dict[str, tuple[Callable[..., np.ndarray], float | None, float | None]] = {
    # name: (fn(x, alpha, beta), default alpha or None if unused, default beta or None)
    "relu": (lambda x, a, b: np.maximum(x, 0), None, None),
    "tanh": (lambda x, a, b: np.tanh(x), None, None),
    "sigmoid": (lambda x, a, b: sigmoid(x), None, None),
    "affine": (lambda x, a, b: a * x + b, 1.0, 0.0),
    "leakyrelu": (lambda x, a, b: np.where(x >= 0, x, a * x), 0.01, None),
    "thresholdedrelu": (lambda x, a, b: np.where(x >= a, x, 0), 1.0, None),
    "scaledtanh": (lambda x, a, b: a * np.tanh(b * x), 1.0, 1.0),
    "hardsigmoid": (lambda x, a, b: np.clip(a * x + b, 0, 1), 0.2, 0.5),
    "elu": (lambda x, a, b: np.where(x >= 0, x, a * np.expm1(x)), 1.0, None),
    "softsign": (lambda x, a, b: x / (1 + np.abs(x)), None, None),
    "softplus": (lambda x, a, b: np.logaddexp(0, x), None, None),
}


def _activation_fns(names, alphas, betas, defaults: list[str], num_dir: int) -> list[list[Callable]]:
    """Per direction, the gate activations; alpha/beta values are consumed in order by those that take them."""
    names = list(names or defaults * num_dir)
    if len(names) == len(defaults) and num_dir == 2:
        names *= 2
    alphas, betas = list(alphas or []), list(betas or [])
    fns = []
    for name in names:
        fn, da, db = _ACTIVATIONS[name.lower()]
        a = alphas.pop(0) if da is not None and alphas else da
        b = betas.pop(0) if db is not None and betas else db
        fns.append(lambda x, fn=fn, a=a, b=b: fn(x, a, b))
    k = len(defaults)
    return [fns[d * k : (d + 1) * k] for d in range(num_dir)]


def _reverse_valid(t: np.ndarray, lens: np.ndarray) -> np.ndarray:
    """Reverse each batch entry's first lens[b] steps along axis 0, leaving the padding in place."""
    steps = np.arange(t.shape[0])[:, None]
    idx = np.where(steps < lens[None, :], lens[None, :] - 1 - steps, steps)
    return t[idx, np.arange(t.shape[1])[None, :]]


def _recurrent(step, x, w, r, b, lens, states, a: dict[str, Any]) -> tuple[np.ndarray, ...]:
    """Run ``step`` over time for each direction; returns Y and the final value of each state."""
    if a["layout"]:  # batch-major in and out
        x = x.swapaxes(0, 1)
        states = [None if s is None else s.swapaxes(0, 1) for s in states]
    seq, batch = x.shape[:2]
    num_dir, gates_h, hidden = r.shape
    lens = np.full(batch, seq, np.int64) if lens is None else lens.astype(np.int64)
    masked = bool((lens < seq).any())
    if b is None:
        b = np.zeros((num_dir, 2 * gates_h), x.dtype)
    acts = _activation_fns(a["activations"], a["activation_alpha"], a["activation_beta"], a["defaults"], num_dir)
    ys, finals = [], []
    for d in range(num_dir):
        reverse = a["direction"] == "reverse" or d == 1
        xd = _reverse_valid(x, lens) if reverse else x
        xw = xd @ w[d].T + b[d, :gates_h]  # the input projection of every step at once
        cur = [np.zeros((batch, hidden), x.dtype) if s is None else s[d] for s in states]
        y = np.zeros((seq, batch, hidden), x.dtype)
        for t in range(seq):
            new = step(xw[t], cur, r[d], b[d, gates_h:], acts[d], d)
            if masked:  # finished sequences keep their state and output zeros
                live = (t < lens)[:, None]
                new = [np.where(live, n, c) for n, c in zip(new, cur)]
                y[t] = np.where(live, new[0], 0)
            else:
                y[t] = new[0]
            cur = new
        ys.append(_reverse_valid(y, lens) if reverse else y)
        finals.append(cur)
    out_y = np.stack(ys, axis=1)  # (seq, num_dir, batch, hidden)
    out_states = [np.stack([f[i] for f in finals]) for i in range(len(states))]
    if a["layout"]:
        out_y = out_y.transpose(2, 0, 1, 3)
        out_states = [s.swapaxes(0, 1) for s in out_states]
    return (out_y, *out_states)


def _clipper(clip: float | None) -> Callable[[np.ndarray], np.ndarray]:
    return (lambda v: v) if clip is None else (lambda v: np.clip(v, -clip, clip))


def _rnn(x, w, r, b, lens, h0, a: dict[str, Any]) -> tuple[np.ndarray, ...]:
    clip = _clipper(a["clip"])

    def step(xw, cur, r, rb, acts, d):
        return [acts[0](clip(xw + cur[0] @ r.T + rb))]

    return _recurrent(step, x, w, r, b, lens, [h0], dict(a, defaults=["Tanh"]))


def _gru(x, w, r, b, lens, h0, a: dict[str, Any]) -> tuple[np.ndarray, ...]:
    clip, lbr = _clipper(a["clip"]), a["linear_before_reset"]

    def step(xw, cur, r, rb, acts, d):
        h, n = cur[0], r.shape[1]
        hr = h @ r.T + rb  # gate order z, r, h
        z = acts[0](clip(xw[:, :n] + hr[:, :n]))
        reset = acts[0](clip(xw[:, n : 2 * n] + hr[:, n : 2 * n]))
        if lbr:
            cand = acts[1](clip(xw[:, 2 * n :] + reset * hr[:, 2 * n :]))
        else:
            cand = acts[1](clip(xw[:, 2 * n :] + (reset * h) @ r[2 * n :].T + rb[2 * n :]))
        return [(1 - z) * cand + z * h]

    return _recurrent(step, x, w, r, b, lens, [h0], dict(a, defaults=["Sigmoid", "Tanh"]))


def _lstm(x, w, r, b, lens, h0, c0, p, a: dict[str, Any]) -> tuple[np.ndarray, ...]:
    clip = _clipper(a["clip"])

    def step(xw, cur, r, rb, acts, d):
        h, c = cur
        n = r.shape[1]
        g = xw + h @ r.T + rb  # gate order i, o, f, c; peepholes i, o, f
        pi, po, pf = (0, 0, 0) if p is None else (p[d, :n], p[d, n : 2 * n], p[d, 2 * n :])
        i = acts[0](clip(g[:, :n] + pi * c))
        f = 1 - i if a["input_forget"] else acts[0](clip(g[:, 2 * n : 3 * n] + pf * c))
        c_new = f * c + i * acts[1](clip(g[:, 3 * n :]))
        o = acts[0](clip(g[:, n : 2 * n] + po * c_new))
        return [o * acts[2](c_new), c_new]

    return _recurrent(step, x, w, r, b, lens, [h0, c0], dict(a, defaults=["Sigmoid", "Tanh", "Tanh"]))


def _rnn_attrs(direction: str, layout: int = 0, **kw: Any) -> dict[str, Any]:
    # GRU-1's schema spells its default direction "foward"
    return dict(kw, direction="forward" if direction == "foward" else direction, layout=layout)


@kernel("RNN", since=14)
def rnn(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
        activations=["Tanh", "Tanh"], clip=None, direction="forward", hidden_size=None, layout=0):  # fmt: skip  # noqa: B006
    """RNN-14: Elman RNN, H = f(X W^T + H R^T + b), optionally batch-major (layout=1)."""
    a = _rnn_attrs(direction, layout, activations=activations, activation_alpha=activation_alpha, activation_beta=activation_beta, clip=clip)
    return _rnn(x, w, r, b, sequence_lens, initial_h, a)


@kernel("RNN", since=7)
def rnn_7(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
          activations=["Tanh", "Tanh"], clip=None, direction="forward", hidden_size=None):  # fmt: skip  # noqa: B006
    """RNN-7: as RNN-14, sequence-major only."""
    a = _rnn_attrs(direction, activations=activations, activation_alpha=activation_alpha, activation_beta=activation_beta, clip=clip)
    return _rnn(x, w, r, b, sequence_lens, initial_h, a)


@kernel("RNN", since=1)
def rnn_1(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
          activations=["Tanh", "Tanh"], clip=None, direction="forward", hidden_size=None, output_sequence=0):  # fmt: skip  # noqa: B006
    """RNN-1: as RNN-7 (Y is always produced, so output_sequence changes nothing)."""
    a = _rnn_attrs(direction, activations=activations, activation_alpha=activation_alpha, activation_beta=activation_beta, clip=clip)
    return _rnn(x, w, r, b, sequence_lens, initial_h, a)


@kernel("GRU", since=14)
def gru(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
        activations=None, clip=None, direction="forward", hidden_size=None, layout=0, linear_before_reset=0):  # fmt: skip
    """GRU-14: gated recurrent unit (gates z, r, h), optionally batch-major (layout=1)."""
    a = _rnn_attrs(direction, layout, activations=activations, activation_alpha=activation_alpha, activation_beta=activation_beta,
                   clip=clip, linear_before_reset=linear_before_reset)  # fmt: skip
    return _gru(x, w, r, b, sequence_lens, initial_h, a)


@kernel("GRU", since=7)
def gru_7(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
          activations=None, clip=None, direction="forward", hidden_size=None, linear_before_reset=0):  # fmt: skip
    """GRU-7: as GRU-14, sequence-major only."""
    return gru.fn(x, w, r, b, sequence_lens, initial_h, activation_alpha=activation_alpha, activation_beta=activation_beta,
                  activations=activations, clip=clip, direction=direction, linear_before_reset=linear_before_reset)  # fmt: skip


@kernel("GRU", since=3)
def gru_3(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
          activations=None, clip=None, direction="forward", hidden_size=None, linear_before_reset=0, output_sequence=0):  # fmt: skip
    """GRU-3: as GRU-7 (output_sequence changes nothing: Y is always produced)."""
    return gru.fn(x, w, r, b, sequence_lens, initial_h, activation_alpha=activation_alpha, activation_beta=activation_beta,
                  activations=activations, clip=clip, direction=direction, linear_before_reset=linear_before_reset)  # fmt: skip


@kernel("GRU", since=1)
def gru_1(x, w, r, b=None, sequence_lens=None, initial_h=None, *, activation_alpha=None, activation_beta=None,
          activations=None, clip=None, direction="foward", hidden_size=None, output_sequence=0):  # fmt: skip
    """GRU-1: as GRU-3 without linear_before_reset."""
    return gru.fn(x, w, r, b, sequence_lens, initial_h, activation_alpha=activation_alpha, activation_beta=activation_beta,
                  activations=activations, clip=clip, direction=direction)  # fmt: skip


@kernel("LSTM", since=14)
def lstm(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *, activation_alpha=None,
         activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None, input_forget=0, layout=0):  # fmt: skip
    """LSTM-14: long short-term memory (gates i, o, f, c, optional peepholes), optionally batch-major."""
    a = _rnn_attrs(direction, layout, activations=activations, activation_alpha=activation_alpha, activation_beta=activation_beta,
                   clip=clip, input_forget=input_forget)  # fmt: skip
    return _lstm(x, w, r, b, sequence_lens, initial_h, initial_c, p, a)


@kernel("LSTM", since=7)
def lstm_7(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *, activation_alpha=None,
           activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None, input_forget=0):  # fmt: skip
    """LSTM-7: as LSTM-14, sequence-major only."""
    return lstm.fn(x, w, r, b, sequence_lens, initial_h, initial_c, p, activation_alpha=activation_alpha, activation_beta=activation_beta,
                   activations=activations, clip=clip, direction=direction, input_forget=input_forget)  # fmt: skip


@kernel("LSTM", since=1)
def lstm_1(x, w, r, b=None, sequence_lens=None, initial_h=None, initial_c=None, p=None, *, activation_alpha=None,
           activation_beta=None, activations=None, clip=None, direction="forward", hidden_size=None, input_forget=0,
           output_sequence=0):  # fmt: skip
    """LSTM-1: as LSTM-7 (output_sequence changes nothing: Y is always produced)."""
    return lstm.fn(x, w, r, b, sequence_lens, initial_h, initial_c, p, activation_alpha=activation_alpha, activation_beta=activation_beta,
                   activations=activations, clip=clip, direction=direction, input_forget=input_forget)  # fmt: skip


KERNELS: list = [layer_normalization, rms_normalization, rotary_embedding, attention, attention_24, attention_23]
KERNELS += [rnn, rnn_7, rnn_1, gru, gru_7, gru_3, gru_1, lstm, lstm_7, lstm_1]
