"""Kernels: the recurrent family (RNN, GRU, LSTM), every version, layout and direction."""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from minfer_core import kernel

from .activation import sigmoid
from .recurrent_stacked import FAST_DTYPES, GruCell, LstmCell, RnnCell, is_default, run_stacked

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


def _recurrent(step, x, w, r, b, lens, states, a: dict[str, Any], cell=None) -> tuple[np.ndarray, ...]:
    """Run ``step`` over time for each direction; returns Y and the final value of each state.

    ``cell``: the op's stacked cell (recurrent_stacked) when its gates are the default ones, without clip or
    peepholes: with every sequence full length all directions then run at once (`run_stacked`).
    """
    if a["layout"]:  # batch-major in and out
        x = x.swapaxes(0, 1)
        states = [None if s is None else s.swapaxes(0, 1) for s in states]
    seq, batch = x.shape[:2]
    full = lens is None or bool((lens.astype(np.int64) >= seq).all())
    if b is None:
        b = np.zeros((r.shape[0], 2 * r.shape[1]), x.dtype)
    if cell is not None and full and seq and x.dtype in FAST_DTYPES:
        out_y, out_states = run_stacked(cell, x, w, r, b, states, a["direction"] == "reverse")
    else:
        out_y, out_states = _stepwise(step, x, w, r, b, lens, states, a)
    if a["layout"]:
        out_y = out_y.transpose(2, 0, 1, 3)
        out_states = [s.swapaxes(0, 1) for s in out_states]
    return (out_y, *out_states)


def _stepwise(step, x, w, r, b, lens, states, a: dict[str, Any]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The general loop: one direction at a time, any activations, clip, peepholes and sequence lengths."""
    seq, batch = x.shape[:2]
    num_dir, gates_h, hidden = r.shape
    lens = np.full(batch, seq, np.int64) if lens is None else lens.astype(np.int64)
    masked = bool((lens < seq).any())
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
    return out_y, [np.stack([f[i] for f in finals]) for i in range(len(states))]


def _clipper(clip: float | None) -> Callable[[np.ndarray], np.ndarray]:
    return (lambda v: v) if clip is None else (lambda v: np.clip(v, -clip, clip))


def _rnn(x, w, r, b, lens, h0, a: dict[str, Any]) -> tuple[np.ndarray, ...]:
    clip = _clipper(a["clip"])

    def step(xw, cur, r, rb, acts, d):
        return [acts[0](clip(xw + cur[0] @ r.T + rb))]

    cell = RnnCell if a["clip"] is None and is_default(a["activations"], ["Tanh"]) else None
    return _recurrent(step, x, w, r, b, lens, [h0], dict(a, defaults=["Tanh"]), cell)


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

    fast = a["clip"] is None and is_default(a["activations"], ["Sigmoid", "Tanh"])
    cell = functools.partial(GruCell, linear_before_reset=lbr) if fast else None
    return _recurrent(step, x, w, r, b, lens, [h0], dict(a, defaults=["Sigmoid", "Tanh"]), cell)


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

    fast = a["clip"] is None and p is None and not a["input_forget"]
    cell = LstmCell if fast and is_default(a["activations"], ["Sigmoid", "Tanh", "Tanh"]) else None
    return _recurrent(step, x, w, r, b, lens, [h0, c0], dict(a, defaults=["Sigmoid", "Tanh", "Tanh"]), cell)


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


