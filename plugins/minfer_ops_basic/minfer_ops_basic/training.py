"""Kernels: the optimizers of domain ai.onnx.preview.training (Adagrad, Adam, Momentum), one step each.

Each takes the learning rate R and the update count T (scalars), then its
variadic tensors grouped by role (all X, then all G, then each state), and
returns the new X of every tensor followed by each new state, as onnx lists them.
Arithmetic runs in each X's dtype (the scalars are Python floats, which numpy
does not let widen it).
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from minfer_core import kernel

TRAINING = "ai.onnx.preview.training"


def _groups(op: str, tensors: Sequence[np.ndarray], roles: str) -> list[tuple[np.ndarray, ...]]:
    """The variadic inputs as one tuple per optimized tensor, in the order of ``roles`` (e.g. 'XGH')."""
    per = len(roles)
    if not tensors or len(tensors) % per:
        raise ValueError(f"{op} takes R, T and {per} tensors ({', '.join(roles)}) per optimized tensor; got {len(tensors)} after R, T")
    n = len(tensors) // per
    return [tuple(tensors[j * n + i] for j in range(per)) for i in range(n)]


def _outputs(per_tensor: list[tuple[np.ndarray, ...]], like: list[np.ndarray]) -> tuple[np.ndarray, ...]:
    """Regroup per-tensor results role by role (all X_new, then each state), each as an array of its X's dtype."""
    roles = zip(*per_tensor)
    return tuple(np.asarray(a, dtype=x.dtype) for role in roles for a, x in zip(role, like))


@kernel("Adagrad", since=1, domain=TRAINING, views=False)
def adagrad(r, t, *tensors, decay_factor=0.0, epsilon=1e-6, norm_coefficient=0.0):
    """Adagrad-1 (training preview): X -= R/(1+T*decay) * G' / (sqrt(H + G'^2) + eps), G' = G + norm*X."""
    groups = _groups("Adagrad", tensors, "XGH")
    rate = r.item() / (1 + t.item() * decay_factor)
    results = []
    for x, g, h in groups:
        g_reg = norm_coefficient * x + g
        h_new = h + g_reg * g_reg
        results.append((x - rate * g_reg / (np.sqrt(h_new) + epsilon), h_new))
    return _outputs(results, [x for x, *_ in groups])


@kernel("Adam", since=1, domain=TRAINING, views=False)
def adam(r, t, *tensors, alpha=0.9, beta=0.999, epsilon=1e-6, norm_coefficient=0.0, norm_coefficient_post=0.0):
    """Adam-1 (training preview): moments V, H of G' = G + norm*X; X -= R' * V / (sqrt(H) + eps), then decays X."""
    groups = _groups("Adam", tensors, "XGVH")
    step = t.item()
    # bias correction of both moments, folded into the rate (none before the first update)
    rate = r.item() * math.sqrt(1 - beta**step) / (1 - alpha**step) if step > 0 else r.item()
    results = []
    for x, g, v, h in groups:
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + (1 - alpha) * g_reg
        h_new = beta * h + (1 - beta) * g_reg * g_reg
        x_new = x - rate * v_new / (np.sqrt(h_new) + epsilon)
        results.append(((1 - norm_coefficient_post) * x_new, v_new, h_new))
    return _outputs(results, [x for x, *_ in groups])


@kernel("Momentum", since=1, domain=TRAINING, views=False)
def momentum(r, t, *tensors, alpha, beta, mode, norm_coefficient):
    """Momentum-1 (training preview): V = alpha*V + beta'*G', X -= R*V ('standard') or R*(G' + alpha*V) ('nesterov')."""
    if mode not in ("standard", "nesterov"):
        raise ValueError(f"Momentum mode {mode!r} is not 'standard' or 'nesterov'")
    groups = _groups("Momentum", tensors, "XGV")
    rate = r.item()
    gain = beta if t.item() > 0 else 1.0  # the first update takes the whole gradient
    results = []
    for x, g, v in groups:
        g_reg = norm_coefficient * x + g
        v_new = alpha * v + gain * g_reg
        direction = v_new if mode == "standard" else g_reg + alpha * v_new
        results.append((x - rate * direction, v_new))
    return _outputs(results, [x for x, *_ in groups])
