"""minfer-ops-basic control flow (If, Loop, Scan): onnx's node cases, and models against onnxruntime.

The models are the issue's must-shows, built with onnx.helper: a streaming
LSTM behind an If on the sample rate whose state is fed back between calls,
a while-loop whose trip count follows the input's values, and Scan RNNs
(Scan-9+ with axes and directions, Scan-8 with a batch axis and sequence
lengths). Each runs with every pass and with none.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T, helper

from minfer_core import Engine, InferenceSession
from minfer_core.testing.conformance import load_cases, run_case
from modelkit import make_model, ort_run, tensor

RTOL, ATOL = 1e-3, 1e-5
PASSES = ["none", "all"]

# ---- onnx's node cases ---------------------------------------------------------------------------

CONTROL = ("If", "Loop", "Scan")


def _uses_control_flow(case) -> bool:
    def ops(graph):
        for node in graph.node:
            yield node.op_type
            for attr in node.attribute:
                if attr.type == onnx.AttributeProto.GRAPH:
                    yield from ops(attr.g)

    return bool(set(ops(case.proto.graph)) & set(CONTROL))


CASES = [c for c in load_cases() if _uses_control_flow(c)]


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case(case):
    """Every onnx node case holding an If, Loop or Scan (_expanded ones, sequences and optionals too) matches onnx."""
    run_case(case)


# ---- models against onnxruntime ------------------------------------------------------------------


def _check(model, feeds_list, passes):
    """minfer (one session, several runs) matches onnxruntime on every feed set; returns minfer's outputs."""
    sess = InferenceSession(model.SerializeToString(), passes=passes)
    results = []
    for feeds in feeds_list:
        want, got = ort_run(model, feeds), sess.run(None, feeds)
        assert len(got) == len(want)
        for g, w in zip(got, want):
            assert g.dtype == w.dtype and g.shape == w.shape
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
        results.append(got)
    return results


def _const(name, array):
    return helper.make_tensor(name, helper.np_dtype_to_tensor_dtype(array.dtype), array.shape, array.flatten().tolist())


def streaming_lstm_model(hidden=8, features=4, batch=2):
    """A streaming LSTM: at 16 kHz it reads every frame, otherwise every second one (an If on ``rate``);
    both branches run one LSTM on the outer weights and the state (h, c) the caller feeds back."""
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((1, 4 * hidden, features)) * 0.3).astype(np.float32)
    r = (rng.standard_normal((1, 4 * hidden, hidden)) * 0.3).astype(np.float32)
    b = (rng.standard_normal((1, 8 * hidden)) * 0.1).astype(np.float32)
    proj = (rng.standard_normal((hidden, 3)) * 0.5).astype(np.float32)

    def branch(name, frames):
        nodes = list(frames) + [helper.make_node("LSTM", [f"{name}_x", "W", "R", "B", "", "h_in", "c_in"],
                                                 [f"{name}_y", f"{name}_h", f"{name}_c"], hidden_size=hidden)]
        outs = [tensor(f"{name}_y", ["T2", 1, batch, hidden]), tensor(f"{name}_h", [1, batch, hidden]),
                tensor(f"{name}_c", [1, batch, hidden])]
        return helper.make_graph(nodes, name, [], outs)

    full = branch("full", [helper.make_node("Identity", ["x"], ["full_x"])])
    half = branch("half", [helper.make_node("Slice", ["x", "s0", "send", "s0", "s2"], ["half_x"])])
    half.initializer.extend([_const("s0", np.array([0], np.int64)), _const("s2", np.array([2], np.int64)),
                             _const("send", np.array([1 << 30], np.int64))])
    nodes = [
        helper.make_node("Equal", ["rate", "khz16"], ["is16"]),
        helper.make_node("If", ["is16"], ["y", "h_out", "c_out"], then_branch=full, else_branch=half),
        helper.make_node("Squeeze", ["h_out", "zero"], ["h2"]),
        helper.make_node("MatMul", ["h2", "P"], ["logits"]),
    ]
    inits = [_const("W", w), _const("R", r), _const("B", b), _const("P", proj),
             _const("khz16", np.array(16000, np.int64)), _const("zero", np.array([0], np.int64))]
    inputs = [tensor("x", ["T", batch, features]), tensor("rate", [], T.INT64),
              tensor("h_in", [1, batch, hidden]), tensor("c_in", [1, batch, hidden])]
    outputs = [tensor("logits", [batch, 3]), tensor("h_out", [1, batch, hidden]), tensor("c_out", [1, batch, hidden])]
    return make_model(nodes, inputs, outputs, inits, opset=17)


@pytest.mark.parametrize("passes", PASSES)
def test_streaming_lstm_behind_an_if_carries_its_state_between_calls(passes):
    """An If + LSTM model fed its own (h, c) back over several calls at both rates matches onnxruntime."""
    model = streaming_lstm_model()
    sess = InferenceSession(model.SerializeToString(), passes=passes)
    rng = np.random.default_rng(1)
    state = {"h_in": np.zeros((1, 2, 8), np.float32), "c_in": np.zeros((1, 2, 8), np.float32)}
    ort_state = dict(state)
    for call, rate in enumerate([16000, 16000, 8000, 16000, 8000]):
        chunk = {"x": rng.standard_normal((5 + call, 2, 4)).astype(np.float32), "rate": np.array(rate, np.int64)}
        got = sess.run(None, {**chunk, **state})
        want = ort_run(model, {**chunk, **ort_state})
        for g, w in zip(got, want):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL)
        state = {"h_in": got[1], "c_in": got[2]}
        ort_state = {"h_in": want[1], "c_in": want[2]}
    assert np.abs(state["h_in"]).max() > 0.05  # the state really moved


def while_norm_model(with_trip_count=False):
    """A while loop: halve-and-rotate ``x`` until its L2 norm falls below ``thr`` (how many rounds depends on
    the values); scan outputs: each round's norm, its vector, its iteration number. With ``with_trip_count``
    the trip count is computed from the input too (its largest value, clipped to [0, 6])."""
    body = helper.make_graph(
        [
            helper.make_node("Mul", ["v_in", "decay"], ["scaled"]),  # "decay" is read from the outer graph
            helper.make_node("Sin", ["scaled"], ["wobble"]),
            helper.make_node("Mul", ["wobble", "tenth"], ["small"]),
            helper.make_node("Add", ["scaled", "small"], ["v_out"]),
            helper.make_node("ReduceL2", ["v_out"], ["norm"], keepdims=0),
            helper.make_node("Greater", ["norm", "thr"], ["c_out"]),
            helper.make_node("Identity", ["v_out"], ["v_scan"]),
            helper.make_node("Identity", ["i"], ["i_scan"]),
        ],
        "body", [tensor("i", [], T.INT64), tensor("c_in", [], T.BOOL), tensor("v_in", ["N"])],
        [tensor("c_out", [], T.BOOL), tensor("v_out", ["N"]), tensor("norm", []), tensor("v_scan", ["N"]),
         tensor("i_scan", [], T.INT64)],
        [_const("tenth", np.array(0.1, np.float32))])
    nodes = [helper.make_node("ReduceL2", ["x"], ["norm0"], keepdims=0),
             helper.make_node("Greater", ["norm0", "thr"], ["go"])]
    trip = ""
    if with_trip_count:
        nodes += [helper.make_node("ReduceMax", ["x"], ["top"], keepdims=0),
                  helper.make_node("Clip", ["top", "lo", "hi"], ["topc"]),
                  helper.make_node("Cast", ["topc"], ["trip"], to=T.INT64)]
        trip = "trip"
    nodes.append(helper.make_node("Loop", [trip, "go", "x"], ["final", "norms", "rounds", "iters"], body=body))
    inits = [_const("decay", np.array(0.5, np.float32)), _const("thr", np.array(0.1, np.float32)),
             _const("lo", np.array(0.0, np.float32)), _const("hi", np.array(6.0, np.float32))]
    outputs = [tensor("final", ["N"]), tensor("norms", ["K"]), tensor("rounds", ["K", "N"]), tensor("iters", ["K"], T.INT64)]
    return make_model(nodes, [tensor("x", ["N"])], outputs, inits, opset=17)


@pytest.mark.parametrize("passes", PASSES)
@pytest.mark.parametrize("with_trip_count", [False, True], ids=["while", "while_and_trip_count"])
def test_data_dependent_loop_matches_onnxruntime(passes, with_trip_count):
    """A Loop whose condition (and trip count) comes from the input's values stops where onnxruntime's does,
    with the same scan outputs: several rounds, one, and none (empty scan outputs of the right shape)."""
    model = while_norm_model(with_trip_count)
    feeds = [{"x": np.array(v, np.float32)} for v in ([3.0, -4.0, 2.5], [0.1, 0.15, -0.05], [0.01, 0.02, 0.0], [5.5, 0.2])]
    results = _check(model, feeds, passes)
    counts = [len(r[1]) for r in results]
    assert len(set(counts)) >= 3 and 0 in counts  # really data-dependent, zero rounds included
    assert results[2][2].shape[0] == 0 and results[2][3].dtype == np.int64  # (0, 0) as onnxruntime: N is symbolic


def counting_loop_model(stop_at):
    """A Loop with only a trip count (int64[1], as some exporters write it): the body doubles ``v`` and says
    to go on while its iteration number is below ``stop_at`` (read from the outer graph)."""
    body = helper.make_graph(
        [helper.make_node("Less", ["i", "stop_at"], ["c_out"]), helper.make_node("Add", ["v_in", "v_in"], ["v_out"]),
         helper.make_node("Identity", ["v_out"], ["v_scan"])],
        "body", [tensor("i", [], T.INT64), tensor("c_in", [], T.BOOL), tensor("v_in", [2])],
        [tensor("c_out", [], T.BOOL), tensor("v_out", [2]), tensor("v_scan", [2])])
    node = helper.make_node("Loop", ["M", "", "v"], ["final", "all"], body=body)
    return make_model([node], [tensor("M", [1], T.INT64), tensor("v", [2])],
                      [tensor("final", [2]), tensor("all", [None, 2])],
                      [_const("stop_at", np.array(stop_at, np.int64))])


@pytest.mark.parametrize("stop_at", [1, 10])
def test_loop_with_only_a_trip_count_still_reads_the_body_condition(stop_at):
    """With the condition input omitted, the body's condition still ends the loop, as in onnxruntime."""
    feeds = [{"M": np.array([m], np.int64), "v": np.array([1.0, -0.5], np.float32)} for m in (0, 4)]
    results = _check(counting_loop_model(stop_at), feeds, "all")
    assert len(results[1][1]) == min(4, stop_at + 1)


def scan_rnn_model(opset=17):
    """Scan-9+ RNN over x [B, T, I] along axis 1, a second scan input reading x backwards, a running sum
    state; scan outputs along axis 1, one prepended (reverse direction), one along axis -1."""
    rng = np.random.default_rng(2)
    wx, wr, wh = (rng.standard_normal(s).astype(np.float32) * 0.4 for s in [(4, 6), (4, 6), (6, 6)])
    body = helper.make_graph(
        [
            helper.make_node("MatMul", ["x_t", "Wx"], ["a"]),
            helper.make_node("MatMul", ["xr_t", "Wr"], ["b"]),
            helper.make_node("MatMul", ["h", "Wh"], ["c"]),
            helper.make_node("Sum", ["a", "b", "c"], ["pre"]),
            helper.make_node("Tanh", ["pre"], ["h_next"]),
            helper.make_node("Add", ["acc", "x_t"], ["acc_next"]),
            helper.make_node("Identity", ["h_next"], ["y"]),
            helper.make_node("Identity", ["acc_next"], ["cum"]),
            helper.make_node("Neg", ["h_next"], ["y_last"]),
        ],
        "cell", [tensor("h", ["B", 6]), tensor("acc", ["B", 4]), tensor("x_t", ["B", 4]), tensor("xr_t", ["B", 4])],
        [tensor("h_next", ["B", 6]), tensor("acc_next", ["B", 4]), tensor("y", ["B", 6]), tensor("cum", ["B", 4]),
         tensor("y_last", ["B", 6])])
    scan = helper.make_node("Scan", ["h0", "acc0", "x", "x"], ["h_T", "acc_T", "ys", "cums", "ys_last"], body=body,
                            num_scan_inputs=2, scan_input_axes=[1, 1], scan_input_directions=[0, 1],
                            scan_output_axes=[1, 0, -1], scan_output_directions=[0, 1, 0])
    inits = [_const("Wx", wx), _const("Wr", wr), _const("Wh", wh)]
    inputs = [tensor("h0", ["B", 6]), tensor("acc0", ["B", 4]), tensor("x", ["B", "T", 4])]
    outputs = [tensor("h_T", ["B", 6]), tensor("acc_T", ["B", 4]), tensor("ys", ["B", "T", 6]),
               tensor("cums", ["T", "B", 4]), tensor("ys_last", ["B", 6, "T"])]
    return make_model([scan], inputs, outputs, inits, opset=opset)


@pytest.mark.parametrize("passes", PASSES)
def test_scan_rnn_with_axes_and_directions_matches_onnxruntime(passes):
    """Scan-16 over axis 1 forwards and backwards, outputs on axes 1, 0 (prepended) and -1, for several lengths."""
    rng = np.random.default_rng(3)
    feeds = [{"h0": rng.standard_normal((2, 6)).astype(np.float32), "acc0": rng.standard_normal((2, 4)).astype(np.float32),
              "x": rng.standard_normal((2, t, 4)).astype(np.float32)} for t in (5, 1, 7)]
    _check(scan_rnn_model(), feeds, passes)


def scan8_model():
    """Scan-8: a cumulative sum and a running max per batch entry, over its own sequence length, one input reversed."""
    body = helper.make_graph(
        [helper.make_node("Add", ["s", "a_t"], ["s_next"]), helper.make_node("Max", ["m", "b_t"], ["m_next"]),
         helper.make_node("Identity", ["s_next"], ["s_scan"]), helper.make_node("Mul", ["m_next", "s_next"], ["p_scan"])],
        "body", [tensor("s", [3]), tensor("m", [3]), tensor("a_t", [3]), tensor("b_t", [3])],
        [tensor("s_next", [3]), tensor("m_next", [3]), tensor("s_scan", [3]), tensor("p_scan", [3])])
    scan = helper.make_node("Scan", ["lens", "s0", "m0", "a", "b"], ["s_T", "m_T", "ss", "ps"], body=body,
                            num_scan_inputs=2, directions=[0, 1])
    inputs = [tensor("lens", [2], T.INT64), tensor("s0", [2, 3]), tensor("m0", [2, 3]), tensor("a", [2, 5, 3]),
              tensor("b", [2, 5, 3])]
    outputs = [tensor("s_T", [2, 3]), tensor("m_T", [2, 3]), tensor("ss", [2, 5, 3]), tensor("ps", [2, 5, 3])]
    return make_model([scan], inputs, outputs, opset=8)


@pytest.mark.parametrize("passes", PASSES)
def test_scan8_with_batch_axis_and_sequence_lengths_matches_onnxruntime(passes):
    """Scan-8 runs each batch entry over its own length (zero padding after it), a reversed input within it."""
    rng = np.random.default_rng(4)
    base = {n: rng.standard_normal(s).astype(np.float32) for n, s in [("s0", (2, 3)), ("m0", (2, 3)), ("a", (2, 5, 3)),
                                                                        ("b", (2, 5, 3))]}
    feeds = [{**base, "lens": np.array(lens, np.int64)} for lens in ([5, 5], [3, 5], [1, 2])]
    _check(scan8_model(), feeds, passes)


# ---- the constant-If pass and liveness -----------------------------------------------------------


def constant_if_model():
    """An If whose condition is computed from constants only (folding makes it known), inside a small graph;
    the taken branch holds a constant of its own and returns one value twice and an outer one (which
    onnxruntime refuses: the test's oracle is numpy)."""
    then_g = helper.make_graph(
        [helper.make_node("Mul", ["a", "two"], ["t"]), helper.make_node("Relu", ["t"], ["t2"])], "then", [],
        [tensor("t2", [3]), tensor("t2", [3]), tensor("a", [3])], [_const("two", np.array(2.0, np.float32))])
    else_g = helper.make_graph(
        [helper.make_node("Neg", ["a"], ["e"])], "else", [], [tensor("e", [3]), tensor("e", [3]), tensor("e", [3])])
    nodes = [helper.make_node("Abs", ["x"], ["a"]), helper.make_node("Less", ["k1", "k2"], ["cond"]),
             helper.make_node("If", ["cond"], ["y1", "y2", "y3"], then_branch=then_g, else_branch=else_g),
             helper.make_node("Add", ["y1", "y2"], ["z"])]
    inits = [_const("k1", np.array(1.0, np.float32)), _const("k2", np.array(2.0, np.float32))]
    return make_model(nodes, [tensor("x", [3])], [tensor("z", [3]), tensor("y2", [3]), tensor("y3", [3])], inits)


def test_constant_if_is_inlined_and_keeps_outputs():
    """With passes, an If whose condition folds to a constant becomes its taken branch's nodes, same outputs."""
    model = constant_if_model()
    x = np.array([-1.5, 0.5, 2.0], np.float32)
    inlined = Engine(model.SerializeToString(), passes="all")
    assert "If" not in {n.op_type for n in inlined.graph.nodes}
    assert any(r.name == "constant_if_inlining" and r.changed for r in inlined.pass_results)
    assert inlined.graph.outputs == ["z", "y2", "y3"]
    want = [4 * np.abs(x), 2 * np.abs(x), np.abs(x)]
    for passes in PASSES:
        for g, w in zip(InferenceSession(model.SerializeToString(), passes=passes).run(None, {"x": x}), want):
            np.testing.assert_allclose(g, w, rtol=1e-6)


def liveness_model():
    """``kept`` is computed early and read only inside the If's branches; a chain of same-sized values runs
    in between, whose buffers would take its place if the plan thought it dead."""
    then_g = helper.make_graph([helper.make_node("Add", ["kept", "c3"], ["t"])], "then", [], [tensor("t", [64])])
    else_g = helper.make_graph([helper.make_node("Sub", ["kept", "c3"], ["e"])], "else", [], [tensor("e", [64])])
    nodes = [helper.make_node("Add", ["x", "one"], ["kept"]), helper.make_node("Mul", ["x", "one"], ["c1"]),
             helper.make_node("Sin", ["c1"], ["c2"]), helper.make_node("Cos", ["c2"], ["c3"]),
             helper.make_node("If", ["flag"], ["y"], then_branch=then_g, else_branch=else_g)]
    return make_model(nodes, [tensor("x", [64]), tensor("flag", [], T.BOOL)], [tensor("y", [64])],
                      [_const("one", np.array(1.0, np.float32))])


@pytest.mark.parametrize("passes", PASSES)
def test_a_value_read_only_inside_a_body_stays_alive(passes):
    """An outer value whose only readers are a body's nodes is kept (not freed, not overwritten) until the If runs."""
    model = liveness_model()
    x = np.linspace(-2, 2, 64, dtype=np.float32)
    c3 = np.cos(np.sin(x))
    sess = InferenceSession(model.SerializeToString(), passes=passes)
    for _ in range(2):  # the second run goes through the memory plan
        for flag, want in ((True, x + 1 + c3), (False, x + 1 - c3)):
            np.testing.assert_allclose(sess.run(None, {"x": x, "flag": np.array(flag)})[0], want, rtol=1e-6)


def test_a_body_may_read_its_nodes_own_input():
    """A branch may read the If's condition from the outer scope (it is both an input and an implicit read)."""
    then_g = helper.make_graph([helper.make_node("Cast", ["c"], ["cf"], to=T.FLOAT),
                                helper.make_node("Add", ["x", "cf"], ["t"])], "then", [], [tensor("t", [3])])
    else_g = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [], [tensor("e", [3])])
    model = make_model([helper.make_node("If", ["c"], ["y"], then_branch=then_g, else_branch=else_g)],
                       [tensor("x", [3]), tensor("c", [], T.BOOL)], [tensor("y", [3])])
    feeds = {"x": np.ones(3, np.float32), "c": np.array(True)}
    np.testing.assert_allclose(InferenceSession(model.SerializeToString()).run(None, feeds)[0], ort_run(model, feeds)[0])
