"""RNN, GRU and LSTM with their default gates on full-length sequences: every direction at once.

At a recognizer's sizes (batch 1-8, hidden 48-96) a time step is a few
microseconds of arithmetic and a dozen numpy calls of ~1 us each, so the
calls are what this saves: the input projections of every step and
direction are one matmul before the loop, and each step makes one call per
operation over a (directions, batch, gates) block, in buffers laid out so
that most calls see contiguous arrays (a call on a strided slice of the
gates costs ~1 us, about three times a contiguous one here).

sigmoid(v) is computed as (1 + tanh(v / 2)) / 2 with the sigmoid gates'
columns of W, R and the biases halved beforehand (exact in binary floats):
one tanh then covers LSTM's four gates. Its absolute error is within an ulp
of 1, as onnxruntime's approximated sigmoid's is. The two biases are added
together first, as onnxruntime adds them.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

FAST_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))


def run_stacked(make_cell: Callable[..., Any], x: np.ndarray, w: np.ndarray, r: np.ndarray, b: np.ndarray,
                states: list[np.ndarray | None], reverse: bool) -> tuple[np.ndarray, list[np.ndarray]]:
    """Y (seq, dirs, batch, hidden) and the final states of a sequence-major op, every direction per call.

    The second direction (or the only one, when ``reverse``) reads x backwards; its outputs are flipped back.
    """
    seq, batch = x.shape[:2]
    num_dir, gates_h, hidden = r.shape
    backwards = [reverse or d == 1 for d in range(num_dir)]
    xs = np.stack([x[::-1] if back else x for back in backwards]).reshape(num_dir, seq * batch, x.shape[2])
    xw = np.matmul(xs, w.transpose(0, 2, 1)).reshape(num_dir, seq, batch, gates_h)
    cell = make_cell(xw.transpose(1, 0, 2, 3), r, b[:, :gates_h], b[:, gates_h:])  # xw as (seq, dirs, batch, gates)
    cur = [np.zeros((num_dir, batch, hidden), x.dtype) if s is None else np.array(s, x.dtype) for s in states]
    ys = np.empty((seq, num_dir, batch, hidden), x.dtype)
    for t in range(seq):
        cell.step(t, cur, ys[t])
        cur[0] = ys[t]  # H of this step, read by the next
    finals = [np.array(s) for s in cur]
    for d, back in enumerate(backwards):
        if back:
            ys[:, d] = ys[::-1, d].copy()
    return ys, finals


def _steps(v: np.ndarray) -> np.ndarray:
    """(seq, dirs, batch, k) in C order: one step's rows are one contiguous block."""
    return np.ascontiguousarray(v)


def _transposed(r: np.ndarray) -> np.ndarray:
    """R^T per direction, (dirs, hidden, gates), for H @ R^T."""
    return np.ascontiguousarray(r.transpose(0, 2, 1))


def _halves(size: int, halved: int, dtype: np.dtype) -> np.ndarray:
    """0.5 for the first ``halved`` of ``size`` gate columns (the sigmoid ones), 1 for the rest."""
    v = np.ones(size, dtype)
    v[:halved] = 0.5
    return v


class RnnCell:
    """H = tanh(X W^T + Wb + Rb + H R^T)."""

    def __init__(self, xw: np.ndarray, r: np.ndarray, wb: np.ndarray, rb: np.ndarray) -> None:
        self.xw, self.rt = _steps(xw + (wb + rb)[:, None, :]), _transposed(r)

    def step(self, t: int, cur: list[np.ndarray], h: np.ndarray) -> None:
        np.matmul(cur[0], self.rt, out=h)
        h += self.xw[t]
        np.tanh(h, out=h)


class LstmCell:
    """Gates i, o, f, c from X W^T + Wb + Rb + H R^T; C = f*C + i*tanh(c); H = o*tanh(C)."""

    def __init__(self, xw: np.ndarray, r: np.ndarray, wb: np.ndarray, rb: np.ndarray) -> None:
        n = r.shape[2]
        half = _halves(4 * n, 3 * n, xw.dtype)
        self.xw, self.rt = _steps((xw + (wb + rb)[:, None, :]) * half), _transposed(r) * half
        block = xw.shape[1:]  # (dirs, batch, gates): whole blocks, no broadcasting in the loop
        self.one = np.broadcast_to((half < 1).astype(xw.dtype), block).copy()
        self.half = np.broadcast_to(half, block).copy()
        self.g = np.empty(block, xw.dtype)

    def step(self, t: int, cur: list[np.ndarray], h: np.ndarray) -> None:
        h_prev, c = cur
        g, n = self.g, h.shape[-1]
        np.matmul(h_prev, self.rt, out=g)
        g += self.xw[t]
        np.tanh(g, out=g)
        g += self.one  # i, o, f: (1 + tanh(v / 2)) / 2; the cell candidate stays tanh(v)
        g *= self.half
        c *= g[..., 2 * n : 3 * n]
        cand = g[..., 3 * n :]
        cand *= g[..., :n]
        c += cand
        np.tanh(c, out=h)
        h *= g[..., n : 2 * n]


class GruCell:
    """Gates z, r from X W^T + Wb + Rb + H R^T; candidate tanh(X Wh^T + Wbh + r * (H Rh^T + Rbh)) with
    linear_before_reset, else tanh(X Wh^T + Wbh + (r * H) Rh^T + Rbh); H = cand + z * (H - cand)."""

    def __init__(self, xw: np.ndarray, r: np.ndarray, wb: np.ndarray, rb: np.ndarray,
                 linear_before_reset: int = 0) -> None:
        n = r.shape[2]
        rt = _transposed(r)
        self.lbr = linear_before_reset
        self.xzr = _steps((xw[..., : 2 * n] + (wb + rb)[:, None, : 2 * n]) * 0.5)
        self.rzr = np.ascontiguousarray(rt[..., : 2 * n] * 0.5)
        xh = xw[..., 2 * n :] + wb[:, None, 2 * n :]
        self.xh = _steps(xh if self.lbr else xh + rb[:, None, 2 * n :])
        self.rh, self.rbh = np.ascontiguousarray(rt[..., 2 * n :]), rb[:, None, 2 * n :]
        block = xw.shape[1:-1]
        self.zr = np.empty(block + (2 * n,), xw.dtype)
        self.cand, self.tmp = np.empty(block + (n,), xw.dtype), np.empty(block + (n,), xw.dtype)

    def step(self, t: int, cur: list[np.ndarray], h: np.ndarray) -> None:
        h_prev, zr, cand = cur[0], self.zr, self.cand
        n = h.shape[-1]
        np.matmul(h_prev, self.rzr, out=zr)
        zr += self.xzr[t]
        np.tanh(zr, out=zr)
        zr += 1
        zr *= 0.5
        if self.lbr:
            np.matmul(h_prev, self.rh, out=cand)
            cand += self.rbh
            cand *= zr[..., n:]
        else:
            np.multiply(zr[..., n:], h_prev, out=self.tmp)
            np.matmul(self.tmp, self.rh, out=cand)
        cand += self.xh[t]
        np.tanh(cand, out=cand)
        np.subtract(h_prev, cand, out=h)
        h *= zr[..., :n]
        h += cand


def is_default(names: Any, defaults: list[str]) -> bool:
    """Whether an activations attribute names the op's default gates (absent, or spelled out per direction)."""
    if not names:
        return True
    low, want = [n.lower() for n in names], [d.lower() for d in defaults]
    return low == want or low == want * 2
