"""Random graphs of value-dependent ops agree with onnxruntime run after run, and never rewrite earlier outputs.

Each graph chains Resize, Reshape, Expand, Slice and Pad whose shapes, sizes,
starts or pads are runtime inputs, with unary ops between them (which may
write in place) and intermediate values as extra outputs (which may alias).
One session then runs several times with input shapes and runtime values
that alternate (so a plan made for one signature meets values it did not
see, and identity cases such as a scale of 1 or a full slice come and go).
Every run must equal onnxruntime's, no later run may change an output
already returned, and the caller's feeds must come back untouched.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import minfer_core
from minfer_core.testing.suite import suite_settings
from modelkit import make_model, ort_run, tensor

pytestmark = pytest.mark.fuzz

SUITE = suite_settings()
OPS = ("Resize", "Reshape", "Expand", "Slice", "Pad")
UNARY = ("Relu", "Neg", "Identity", None)


@dataclass
class Step:
    """One value-dependent node: its op, the rank it produces, and the names of its runtime inputs."""

    op: str
    rank_in: int
    rank_out: int
    inputs: list[str] = field(default_factory=list)
    variant: str = ""


def plan_graph(rnd: random.Random) -> tuple[int, list[Step], list[str]]:
    """(input rank, steps, extra outputs): a chain of 1-4 value-dependent ops with fixed ranks."""
    rank = rnd.randint(1, 4)
    steps, extra = [], []
    for i in range(rnd.randint(1, 4)):
        op = rnd.choice(OPS)
        out_rank = {"Reshape": rnd.randint(1, 4), "Expand": min(4, rank + rnd.randint(0, 1))}.get(op, rank)
        step = Step(op, rank, out_rank, variant=rnd.choice(["scales", "sizes"]) if op == "Resize" else "")
        steps.append(step)
        rank = out_rank
        if rnd.random() < 0.4:
            extra.append(i)
    return steps[0].rank_in, steps, [f"v{i}" for i in extra]


def build_model(rank: int, steps: list[Step], extra: list[str], rnd: random.Random) -> Any:
    """The ONNX model of a plan: x -> [op_i (runtime inputs) -> unary_i] -> y, plus the extra outputs."""
    nodes, inputs = [], [tensor("x", [f"d{j}" for j in range(rank)])]
    prev = "x"
    if rnd.random() < 0.7:  # the first op then reads a planned buffer, not the caller's feed
        nodes.append(helper.make_node("Relu", ["x"], ["r"]))
        prev = "r"
    for i, step in enumerate(steps):
        names = _runtime_inputs(step, i)
        step.inputs = [n for n in names if n]
        for n in step.inputs:
            elem = TensorProto.FLOAT if n.startswith("scales") else TensorProto.INT64
            inputs.append(tensor(n, [_input_length(step, n)], elem))
        nodes.append(helper.make_node(step.op, [prev] + names, [f"v{i}"], **({"mode": "nearest"} if step.op == "Resize" else {})))
        prev = f"v{i}"
        unary = rnd.choice(UNARY)
        if unary:
            nodes.append(helper.make_node(unary, [prev], [f"u{i}"]))
            prev = f"u{i}"
    outputs = [tensor(prev, None)] + [tensor(n, None) for n in extra if n != prev]
    return make_model(nodes, inputs, outputs, opset=18)


def _runtime_inputs(step: Step, i: int) -> list[str]:
    if step.op == "Resize":
        return ["", f"scales{i}"] if step.variant == "scales" else ["", "", f"sizes{i}"]
    if step.op == "Slice":
        return [f"starts{i}", f"ends{i}", f"axes{i}", f"steps{i}"]
    return {"Reshape": [f"shape{i}"], "Expand": [f"shape{i}"], "Pad": [f"pads{i}"]}[step.op]


def _input_length(step: Step, name: str) -> int:
    if name.startswith("pads"):
        return 2 * step.rank_in
    if name.startswith("shape"):
        return step.rank_out
    return step.rank_in


def draw_feeds(x_shape: list[int], steps: list[Step], rnd: random.Random) -> dict[str, np.ndarray]:
    """Feeds for one run: x of ``x_shape``, and fresh runtime values valid for the shapes they meet."""
    shape = list(x_shape)
    feeds = {"x": np.random.default_rng(rnd.randrange(2**32)).standard_normal(shape).astype(np.float32)}
    for step in steps:
        values, shape = _values(step, shape, rnd)
        feeds.update(values)
    return feeds


def _values(step: Step, shape: list[int], rnd: random.Random) -> tuple[dict[str, np.ndarray], list[int]]:
    """The runtime inputs of ``step`` for an input of ``shape``, and the output shape they give."""
    name = step.inputs[0]
    if step.op == "Resize":
        factors = [rnd.choice([1, 1, 2]) for _ in shape]
        out = [d * f for d, f in zip(shape, factors)]
        value = np.array(factors, np.float32) if step.variant == "scales" else np.array(out, np.int64)
        return {name: value}, out
    if step.op == "Reshape":
        return _reshape(name, shape, step.rank_out, rnd)
    if step.op == "Expand":
        lead = [rnd.choice([1, 2]) for _ in range(step.rank_out - len(shape))]
        out = lead + [rnd.choice([1, 2, 3]) if d == 1 else d for d in shape]
        return {name: np.array(out, np.int64)}, out
    if step.op == "Pad":
        pads = [rnd.choice([0, 0, 1, 2]) for _ in range(2 * len(shape))]
        out = [d + pads[j] + pads[j + len(shape)] for j, d in enumerate(shape)]
        return {name: np.array(pads, np.int64)}, out
    return _slice(step, shape, rnd)


def _reshape(name: str, shape: list[int], rank_out: int, rnd: random.Random) -> tuple[dict[str, np.ndarray], list[int]]:
    out = [1] * rank_out
    for factor in _factors(math.prod(shape)):
        out[rnd.randrange(rank_out)] *= factor
    value = list(out)
    if rnd.random() < 0.5:
        value[rnd.randrange(rank_out)] = -1
    return {name: np.array(value, np.int64)}, out


def _factors(n: int) -> list[int]:
    found, p = [], 2
    while n > 1:
        while n % p == 0:
            found.append(p)
            n //= p
        p += 1
    return found


def _slice(step: Step, shape: list[int], rnd: random.Random) -> tuple[dict[str, np.ndarray], list[int]]:
    starts, ends, strides, out = [], [], [], []
    for d in shape:
        if rnd.random() < 0.4:  # the whole axis: the identity case a plan may have seen as a view
            start, end, stride = 0, d, 1
        else:
            stride = rnd.choice([1, 1, 2, -1])
            start, end = (rnd.randint(0, d - 1), d) if stride > 0 else (d - 1, -d - 1)
        starts.append(start)
        ends.append(end)
        strides.append(stride)
        out.append(len(range(*slice(start, end if end >= 0 else None, stride).indices(d))))
    values = [np.array(v, np.int64) for v in (starts, ends, list(range(len(shape))), strides)]
    return dict(zip(step.inputs, values)), out


@settings(SUITE)
@given(seed=st.integers(0, 2**32 - 1), passes=st.sampled_from(["none", "all"]))
def test_value_dependent_graphs_match_onnxruntime_and_keep_earlier_outputs(seed, passes):
    """Runs with alternating shapes and runtime values match onnxruntime; no run rewrites an earlier output or a feed."""
    rnd = random.Random(seed)
    rank, steps, extra = plan_graph(rnd)
    model = build_model(rank, steps, extra, rnd)
    sess = minfer_core.InferenceSession(model.SerializeToString(), passes=passes)
    # two input-shape signatures, alternating; runtime values are fresh on every run, so a plan made on a
    # signature's first run meets values it never saw (a scale of 1 after 2, a full slice after a part)
    shapes = [[rnd.randint(1, 3) for _ in range(rank)] for _ in range(2)]
    runs = [draw_feeds(shapes[k], steps, rnd) for k in (0, 0, 1, 0, 1, 0, 0)]
    runs.append(runs[0])  # and an earlier run's very feeds again
    returned = []
    for i, feeds in enumerate(runs):
        kept = {k: v.copy() for k, v in feeds.items()}
        got = sess.run(None, feeds)
        want = ort_run(model, feeds)
        for name, g, w in zip([o.name for o in model.graph.output], got, want):
            np.testing.assert_array_equal(g, w, err_msg=f"seed {seed} run {i} output {name}")
        for k in feeds:
            np.testing.assert_array_equal(feeds[k], kept[k], err_msg=f"seed {seed} run {i}: feed {k} changed")
        returned.append([(g, g.copy()) for g in got])
    for i, outputs in enumerate(returned):
        for g, copy in outputs:
            np.testing.assert_array_equal(g, copy, err_msg=f"seed {seed}: an output of run {i} changed later")


def test_pad_of_zero_after_a_real_pad_keeps_the_earlier_output():
    """An output returned by a Pad run with zero pads is not rewritten by a later run (minimal reproducer)."""
    nodes = [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Pad", ["r", "pads"], ["y"])]
    model = make_model(nodes, [tensor("x", ["N"]), tensor("pads", [2], TensorProto.INT64)], [tensor("y", None)], opset=18)
    sess = minfer_core.InferenceSession(model.SerializeToString(), passes="none")
    x = np.array([1, 2, 3], np.float32)
    sess.run(None, {"x": x, "pads": np.array([1, 0])})  # the signature's first run really pads
    kept = sess.run(None, {"x": x, "pads": np.array([0, 0])})[0]  # zero pads: the kernel may return its input
    sess.run(None, {"x": np.array([7, 8, 9], np.float32), "pads": np.array([1, 0])})
    np.testing.assert_array_equal(kept, [1, 2, 3])
