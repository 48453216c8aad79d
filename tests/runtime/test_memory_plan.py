"""The memory planner: reuse, in-place, views, output safety, and no allocations on repeated runs."""

from __future__ import annotations

import tracemalloc

import numpy as np
from hypothesis import given
from hypothesis import strategies as st
from onnx import TensorProto, helper

from modelkit import make_model, tensor
from minfer_core import InferenceSession, hookimpl
from minfer_core.memory import Block, align, live_set_bytes, place

from . import outkernels as ok
from .outkernels import node

N = 128  # activations of 128x128 float32 = 64 KiB


def _bias(name: str = "b", value: float = 0.5):
    return helper.make_tensor(name, TensorProto.FLOAT, [N], np.full(N, value, np.float32).tolist())


def chain_model(depth: int = 8):
    """x -> (AddOut b -> ReluOut) * depth -> Twice -> y, all [N, N]."""
    nodes, cur = [], "x"
    for i in range(depth):
        nodes.append(node("AddOut", [cur, "b"], [f"a{i}"], f"add{i}"))
        nodes.append(node("ReluOut", [f"a{i}"], [f"r{i}"], f"relu{i}"))
        cur = f"r{i}"
    nodes.append(node("Twice", [cur], ["y"], "twice"))
    return make_model(nodes, [tensor("x", [N, N])], [tensor("y", [N, N])], [_bias()], extra_opsets=[ok.opset()])


def chain_reference(x: np.ndarray, depth: int = 8) -> np.ndarray:
    for _ in range(depth):
        x = np.maximum(x + np.float32(0.5), 0)
    return x * 2


def _feed(seed: int) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((N, N)).astype(np.float32)


def test_repeated_runs_reuse_the_same_buffers(out_plugin):
    """From the second run of a shape on, every out= buffer is the one the previous run used."""
    sess = InferenceSession(chain_model())
    sess.run(None, {"x": _feed(0)})
    ids = []
    for seed in (1, 2):
        ok.SEEN_OUT.clear()
        (y,) = sess.run(None, {"x": _feed(seed)})
        np.testing.assert_allclose(y, chain_reference(_feed(seed)), rtol=1e-6)
        ids.append(list(ok.SEEN_OUT))
    assert ids[0] and ids[0] == ids[1]


def test_second_run_allocates_no_activation_buffers(out_plugin):
    """A run of an already planned shape allocates only its returned output, no activations."""
    sess = InferenceSession(chain_model(depth=12))
    x = _feed(0)
    sess.run(None, {"x": x})
    tracemalloc.start()
    try:
        sess.run(None, {"x": x})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    activation = N * N * 4
    assert peak < 1.5 * activation  # the output (Twice allocates it) and small change, not 24 activations


def test_elementwise_runs_in_place_on_a_dying_input(out_plugin):
    """ReluOut writes into the buffer of the AddOut result it consumes, since that dies there."""
    sess = InferenceSession(chain_model(depth=2))
    sess.run(None, {"x": _feed(0)})
    ok.SEEN_OUT.clear()
    sess.run(None, {"x": _feed(1)})
    by_node = dict(ok.SEEN_OUT)
    assert by_node["relu0"] == by_node["add0"]
    assert sess.memory_report()["inplace_steps"] >= 2


def test_arena_is_near_the_live_set_and_far_below_naive(out_plugin):
    """The planned arena stays within 1.15x of the live-set bound; naive is the sum of all buffers."""
    sess = InferenceSession(chain_model(depth=12))
    report = sess.memory_report({"x": _feed(0)})
    assert report["arena_bytes"] <= 1.15 * report["live_set_bytes"]
    assert report["naive_bytes"] >= 10 * report["arena_bytes"]
    assert report["allocated_arena_bytes"] >= N * N * 4
    assert report["arena_backed_buffers"] >= 1


def view_model():
    """a = x + b; v = Flat(a); c = x + b2; w = Flat(c); y = v + w: v must keep a's buffer alive past Flat."""
    nodes = [
        node("AddOut", ["x", "b"], ["a"], "add_a"),
        node("Flat", ["a"], ["v"], "flat_a"),
        node("AddOut", ["x", "b2"], ["c"], "add_c"),
        node("Flat", ["c"], ["w"], "flat_c"),
        node("AddOut", ["v", "w"], ["y"], "add_y"),
    ]
    inits = [_bias("b", 1.0), _bias("b2", 100.0)]
    return make_model(nodes, [tensor("x", [N, N])], [tensor("y", [N * N])], inits, extra_opsets=[ok.opset()])


def test_views_extend_their_source_lifetime(out_plugin):
    """A view's source buffer is not reused while the view is still to be read."""
    sess = InferenceSession(view_model())
    for seed in range(3):
        x = _feed(seed)
        (y,) = sess.run(None, {"x": x})
        np.testing.assert_allclose(y, (2 * x + 101).reshape(-1), rtol=1e-6)


def test_outputs_are_never_overwritten_by_a_later_run(out_plugin):
    """An output (here a view of an arena-eligible value) keeps its values after later runs."""
    nodes = [node("AddOut", ["x", "b"], ["a"], "add"), node("Flat", ["a"], ["y"], "flat")]
    model = make_model(nodes, [tensor("x", [N, N])], [tensor("y", [N * N])], [_bias()], extra_opsets=[ok.opset()])
    sess = InferenceSession(model)
    first = [sess.run(None, {"x": _feed(s)})[0] for s in range(3)]
    for s, y in enumerate(first):
        np.testing.assert_array_equal(y, (_feed(s) + np.float32(0.5)).reshape(-1))


def test_intermediate_values_stay_distinct(out_plugin):
    """intermediate=True returns every value un-aliased, even after planned runs."""
    sess = InferenceSession(chain_model(depth=2))
    x = _feed(0)
    sess.run(None, {"x": x})
    _, values = sess.run(None, {"x": x}, intermediate=True)
    np.testing.assert_allclose(values["a0"], x + np.float32(0.5))
    np.testing.assert_allclose(values["r1"], chain_reference(x, 2) / 2)


blocks = st.lists(
    st.tuples(st.integers(1, 5000), st.integers(0, 30), st.integers(0, 10)).map(lambda t: (t[0], t[1], t[1] + t[2])),
    min_size=1,
    max_size=40,
)


@given(blocks)
def test_placement_never_overlaps_blocks_live_together(spec):
    """Blocks live at a common step get disjoint byte ranges; the arena is at least the live set."""
    bs = [Block(i, size, s, e) for i, (size, s, e) in enumerate(spec)]
    offsets, top = place(bs)
    for a in bs:
        for b in bs:
            if a.key < b.key and a.start <= b.end and b.start <= a.end:
                oa, ob = offsets[a.key], offsets[b.key]
                assert oa + align(a.size) <= ob or ob + align(b.size) <= oa
        assert offsets[a.key] % 64 == 0 and offsets[a.key] + a.size <= top
    assert top >= live_set_bytes(bs, 41)


def test_alternating_shapes_share_one_arena(out_plugin):
    """Plans for different input shapes index one grow-only arena: alternating shapes allocate nothing new."""
    nodes = [node("AddOut", ["x", "b"], ["a"], "add"), node("ReluOut", ["a"], ["r"], "relu"), node("Twice", ["r"], ["y"], "t")]
    model = make_model(nodes, [tensor("x", ["M", N])], [tensor("y", ["M", N])], [_bias()], extra_opsets=[ok.opset()])
    sess = InferenceSession(model)
    for m in (4, 64, 4):
        sess.run(None, {"x": np.ones((m, N), np.float32)})
    arena = sess.executor.plans.arena
    for i, m in enumerate((64, 4, 17, 4, 64)):
        x = np.random.default_rng(i).standard_normal((m, N)).astype(np.float32)
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], 2 * np.maximum(x + np.float32(0.5), 0), rtol=1e-6)
    assert sess.executor.plans.arena is arena  # 17 rows fit in the arena sized for 64


def test_concurrent_runs_do_not_share_the_arena(out_plugin):
    """Runs from several threads at once each get correct results (only one uses the arena)."""
    from concurrent.futures import ThreadPoolExecutor

    sess = InferenceSession(chain_model(depth=6))
    sess.run(None, {"x": _feed(0)})

    def one(seed: int) -> bool:
        x = _feed(seed)
        return bool(np.allclose(sess.run(None, {"x": x})[0], chain_reference(x, 6), rtol=1e-6))

    with ThreadPoolExecutor(4) as pool:
        assert all(pool.map(one, range(40)))


def test_real_kernels_write_into_the_same_arena_buffers_each_run():
    """With the installed plugins, every out=-capable step of a CNN writes into the arena, at the same address each run."""
    from minfer_core.plugins import use_plugins

    from .test_dynamic_shapes import conv_model

    addresses: list[dict[str, int]] = []

    class Where:
        @hookimpl
        def register_observers(self, register):
            register(self)

        def on_node_start(self, node):
            pass

        def on_node_end(self, node, outputs):
            addresses[-1][node.outputs[0]] = outputs[0].__array_interface__["data"][0]

    with use_plugins(Where()):
        sess = InferenceSession(conv_model(), passes="none")
        x = np.random.default_rng(0).standard_normal((2, 3, 16, 16)).astype(np.float32)
        for _ in range(3):
            addresses.append({})
            sess.run(None, {"x": x})
    lo = sess.executor.plans.arena.__array_interface__["data"][0]
    hi = lo + sess.executor.plans.arena.nbytes
    slot_names = {s: n for n, s in sess.program.slots.items()}
    # a view kernel's output (Flatten of an arena buffer) sits in the arena too, at its source's address
    views = {slot_names[sp.outs[0]] for sp in sess.program.specs if sp.kernel.views}
    backed = [n for n in addresses[1] if addresses[1][n] == addresses[2][n] and lo <= addresses[1][n] < hi
              and n not in views]
    out_steps = [sp.outs[0] for sp in sess.program.specs if sp.kernel.out and sp.outs[0] not in sess.program.graph_outputs]
    assert out_steps, "no installed kernel declares out=True"
    assert sorted(backed) == sorted(slot_names[s] for s in out_steps)


def test_weights_packed_by_every_reader_are_released(out_plugin):
    """An initializer that all its readers pre-packed (Kernel.packed) is freed; one also read plainly is kept."""
    nodes = [
        node("ScaleBy", ["x", "w"], ["a"], "s1"),
        node("ScaleBy", ["a", "w"], ["b"], "s2"),
        node("ScaleBy", ["b", "v"], ["c"], "s3"),
        node("AddOut", ["c", "v"], ["y"], "add"),
    ]
    w = helper.make_tensor("w", TensorProto.FLOAT, [N], np.full(N, 2.0, np.float32).tolist())
    v = helper.make_tensor("v", TensorProto.FLOAT, [N], np.full(N, 3.0, np.float32).tolist())
    model = make_model(nodes, [tensor("x", [N, N])], [tensor("y", [N, N])], [w, v], extra_opsets=[ok.opset()])
    sess = InferenceSession(model)
    assert sess.program.released == ["w"] and "v" in sess.graph.initializers
    assert sess.graph.type_of("w").shape == (N,) and sess.program.template[sess.program.slots["w"]] is None
    x = _feed(0)
    for _ in range(2):
        np.testing.assert_allclose(sess.run(None, {"x": x})[0], x * 12 + 3, rtol=1e-6)


def test_in_place_never_writes_over_a_view_of_another_input():
    """Add(Transpose(a), a) must not compute in place into the transposed view of a, across runs."""
    nodes = [
        helper.make_node("Relu", ["x"], ["a"]),
        helper.make_node("Transpose", ["a"], ["t"]),
        helper.make_node("Add", ["t", "a"], ["s"]),
        helper.make_node("Neg", ["s"], ["y"]),
    ]
    model = make_model(nodes, [tensor("x", [64, 64])], [tensor("y", [64, 64])])
    x = np.random.default_rng(0).standard_normal((64, 64)).astype(np.float32)
    want = -(np.maximum(x, 0).T + np.maximum(x, 0))
    for passes in ("none", "all"):
        sess = InferenceSession(model, passes=passes)
        for _ in range(3):  # the first run discovers, later ones run the arena plan
            np.testing.assert_array_equal(sess.run(None, {"x": x})[0], want)
