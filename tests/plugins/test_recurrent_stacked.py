"""RNN/GRU/LSTM's stacked path (default gates, full-length sequences: every direction per numpy call) computes
what the general step-by-step loop computes, and what onnxruntime computes."""

from __future__ import annotations

import numpy as np
import pytest

from minfer_core.testing.ops import assert_node_matches_onnxruntime
from minfer_ops_basic import recurrent

pytest.importorskip("onnxruntime")

GATES = {"RNN": 1, "GRU": 3, "LSTM": 4}
KERNELS = {"RNN": recurrent.rnn, "GRU": recurrent.gru, "LSTM": recurrent.lstm}


def inputs(op: str, num_dir: int, *, layout: int = 0, states: bool = True, bias: bool = True, seq: int = 5,
           batch: int = 3, size: int = 4, hidden: int = 6) -> list[np.ndarray | None]:
    """Seeded X, W, R, B, sequence_lens (all full), initial_h (and initial_c for LSTM)."""
    rng = np.random.default_rng(GATES[op] * 10 + num_dir)
    g = GATES[op]
    x = rng.standard_normal((batch, seq, size) if layout else (seq, batch, size)).astype(np.float32)
    w = (rng.standard_normal((num_dir, g * hidden, size)) * 0.5).astype(np.float32)
    r = (rng.standard_normal((num_dir, g * hidden, hidden)) * 0.5).astype(np.float32)
    b = (rng.standard_normal((num_dir, 2 * g * hidden)) * 0.3).astype(np.float32) if bias else None
    state = (batch, num_dir, hidden) if layout else (num_dir, batch, hidden)
    made = [x, w, r, b, np.full(batch, seq, np.int32)]
    for _ in range(2 if op == "LSTM" else 1):
        made.append(rng.standard_normal(state).astype(np.float32) if states else None)
    return made


def run(op: str, args: list, attrs: dict) -> tuple[np.ndarray, ...]:
    out = KERNELS[op].fn(*args, hidden_size=args[2].shape[-1], **attrs)
    return out if isinstance(out, tuple) else (out,)


CASES = [(op, direction, extra) for op in GATES for direction in ["forward", "reverse", "bidirectional"]
         for extra in ([{}, {"linear_before_reset": 1}] if op == "GRU" else [{}])]


@pytest.mark.parametrize("op,direction,extra", CASES)
@pytest.mark.parametrize("layout", [0, 1])
def test_stacked_path_matches_the_step_loop(monkeypatch, op, direction, extra, layout):
    """Every output of the stacked path equals the general loop's to float32 rounding (any direction, layout,
    GRU's linear_before_reset), and the stacked path is the one taken."""
    num_dir = 2 if direction == "bidirectional" else 1
    args = inputs(op, num_dir, layout=layout)
    attrs = dict(extra, direction=direction, layout=layout)
    taken = []
    stacked = recurrent.run_stacked
    monkeypatch.setattr(recurrent, "run_stacked", lambda *a: taken.append(1) or stacked(*a))
    fast = run(op, args, attrs)
    assert taken, "default gates on full sequences should take the stacked path"
    monkeypatch.setattr(recurrent, "FAST_DTYPES", ())
    slow = run(op, args, attrs)
    assert len(fast) == len(slow)
    for f, s in zip(fast, slow):
        assert f.shape == s.shape and f.dtype == s.dtype
        np.testing.assert_allclose(f, s, rtol=2e-5, atol=2e-6)


@pytest.mark.parametrize("op,direction,extra", CASES)
@pytest.mark.parametrize("states,bias", [(True, True), (False, False)])
def test_stacked_path_matches_onnxruntime(op, direction, extra, states, bias):
    """The stacked path agrees with onnxruntime, with and without initial states and bias."""
    num_dir = 2 if direction == "bidirectional" else 1
    args = inputs(op, num_dir, states=states, bias=bias)
    outputs = 3 if op == "LSTM" else 2
    assert_node_matches_onnxruntime(op, 14, args, {"hidden_size": 6, "direction": direction, **extra},
                                    num_outputs=outputs, rtol=1e-4, atol=1e-5)


def test_ragged_clipped_or_custom_gates_take_the_step_loop(monkeypatch):
    """Shorter sequences, clip, peepholes and non-default activations keep the general loop (it alone has them)."""
    monkeypatch.setattr(recurrent, "run_stacked", lambda *a: pytest.fail("stacked path taken"))
    args = inputs("LSTM", 1)
    ragged = list(args)
    ragged[4] = np.array([5, 2, 4], np.int32)
    run("LSTM", ragged, {})
    run("LSTM", args, {"clip": 1.0})
    run("LSTM", args + [np.zeros((1, 18), np.float32)], {})
    run("GRU", inputs("GRU", 1), {"activations": ["HardSigmoid", "Tanh"]})
    run("RNN", inputs("RNN", 1), {"activations": ["Relu"]})
