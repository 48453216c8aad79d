"""Kernels: network blocks (LayerNormalization, RMSNormalization, RotaryEmbedding, Attention, RNN, GRU, LSTM)."""

from __future__ import annotations

import functools
import math
from typing import Any

import numpy as np

import minfer_core
from minfer_core import kernel

from .activation import by_rows, softmax
from .elementwise import arr, into, is_exotic


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


# float32/float64 rows whose stash type is their own go in blocks over the intra-op
# threads (`by_rows`), each a few long numpy calls into the output: row sums as
# matrix-vector products, sums of squares by einsum (np.mean over rows of 256 floats
# is 4x slower than the product). Other dtypes keep the whole-array path.
_ROW_TYPES = (np.dtype(np.float32), np.dtype(np.float64))
SPLIT_NORM = 1 << 21  # elements from which the rows are split over the threads (see below)


def _flat(p: np.ndarray | None, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray | None:
    """Scale or bias broadcast to the normalized shape, as one contiguous row (None stays None)."""
    if p is None:
        return None
    p = p.astype(dtype, copy=False)
    return p.reshape(-1) if p.shape == shape else np.ascontiguousarray(np.broadcast_to(p, shape)).reshape(-1)


def _normalized_rows(x: np.ndarray, y: np.ndarray, inv: np.ndarray, scale: np.ndarray, b: np.ndarray | None,
                     epsilon: float) -> None:
    """y = y * inv * scale (+ b) row by row, inv = 1 / sqrt(mean(y * y) + epsilon) computed here; x is y's source."""
    np.einsum("ij,ij->i", x, x, out=inv)
    inv /= np.asarray(x.shape[1], inv.dtype)
    inv += np.asarray(epsilon, inv.dtype)
    np.sqrt(inv, out=inv)
    np.divide(np.asarray(1, inv.dtype), inv, out=inv)
    np.multiply(x, inv[:, None], out=y)
    y *= scale
    if b is not None:
        y += b


def _layer_norm_rows(x: np.ndarray, y: np.ndarray, mean: np.ndarray, inv: np.ndarray, scale: np.ndarray,
                     b: np.ndarray | None, epsilon: float) -> None:
    np.matmul(x, _reciprocals(x.shape[1], x.dtype), out=mean)
    np.subtract(x, mean[:, None], out=y)
    _normalized_rows(y, y, inv, scale, b, epsilon)


@functools.lru_cache(maxsize=16)
def _reciprocals(size: int, dtype: np.dtype) -> np.ndarray:
    """A read-only vector of 1/size: ``rows @ it`` is the row means."""
    v = np.full(size, 1 / size, dtype)
    v.flags.writeable = False
    return v


def _row_path(x: np.ndarray, stash: np.dtype, axis: int, out: np.ndarray | None, *params: np.ndarray | None) -> bool:
    """Whether the blocked row kernels apply: x computes in its own float type, params broadcast to the rows,
    and out (the engine's buffers are C-contiguous) reshapes to rows as a view."""
    return (x.dtype == stash and stash in _ROW_TYPES and x.size > 0 and (out is None or out.flags.c_contiguous)
            and all(p is None or p.ndim <= x.ndim - axis % x.ndim for p in params))


@kernel("LayerNormalization", since=17, out=True)
def layer_normalization(x, scale, b=None, *, axis=-1, epsilon=1e-5, stash_type=1, out=None):
    """LayerNormalization-17: standardize over axes [axis, rank), then scale and shift; also Mean, InvStdDev."""
    stash = minfer_core.onnx_dtype(stash_type)
    outer, inner, stat_shape = _rows(x, axis)
    if not _row_path(x, stash, axis, out, scale, b):
        y, mean, inv_std = _layer_norm_whole(x, scale, b, outer, inner, stash, epsilon)
        return into(out, y), mean.reshape(stat_shape), inv_std.reshape(stat_shape)
    shape = x.shape[axis % x.ndim:]
    g, c = _flat(scale, shape, stash), _flat(b, shape, stash)
    y = np.empty(x.shape, x.dtype) if out is None else out
    x2, y2 = x.reshape(outer, inner), y.reshape(outer, inner)  # planned buffers are C-contiguous: a view
    mean, inv_std = np.empty(outer, stash), np.empty(outer, stash)
    by_rows(lambda lo, hi: _layer_norm_rows(x2[lo:hi], y2[lo:hi], mean[lo:hi], inv_std[lo:hi], g, c, epsilon),
            outer, inner, SPLIT_NORM)
    return y, mean.reshape(stat_shape), inv_std.reshape(stat_shape)


def _layer_norm_whole(x, scale, b, outer: int, inner: int, stash: np.dtype, epsilon: float) -> tuple[np.ndarray, ...]:
    v = x.astype(stash, copy=False).reshape(outer, inner)
    mean = np.mean(v, axis=1, keepdims=True)
    d = v - mean  # a fresh array: everything below works in place on it
    inv_std = 1 / np.sqrt(_mean_square(d) + np.asarray(epsilon, stash))[:, None]
    d *= inv_std
    y = d.reshape(x.shape)
    y *= scale.astype(stash, copy=False)
    if b is not None:
        y += b.astype(stash, copy=False)
    return arr(y, x.dtype), arr(mean, stash), arr(inv_std, stash)


@kernel("RMSNormalization", since=23, out=True)
def rms_normalization(x, scale, *, axis=-1, epsilon=1e-5, stash_type=1, out=None):
    """RMSNormalization-23: x / sqrt(mean(x*x over axes [axis, rank)) + epsilon) * scale."""
    stash = minfer_core.onnx_dtype(stash_type)
    outer, inner, _ = _rows(x, axis)
    if not _row_path(x, stash, axis, out, scale):
        v = x.astype(stash, copy=False).reshape(outer, inner)
        inv_rms = 1 / np.sqrt(_mean_square(v) + np.asarray(epsilon, stash))[:, None]
        y = (v * inv_rms).reshape(x.shape)
        y *= scale.astype(stash, copy=False)
        return into(out, arr(y, x.dtype))
    g = _flat(scale, x.shape[axis % x.ndim:], stash)
    y = np.empty(x.shape, x.dtype) if out is None else out
    x2, y2 = x.reshape(outer, inner), y.reshape(outer, inner)
    inv = np.empty(outer, stash)
    by_rows(lambda lo, hi: _normalized_rows(x2[lo:hi], y2[lo:hi], inv[lo:hi], g, None, epsilon), outer, inner,
            SPLIT_NORM)
    return y


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


