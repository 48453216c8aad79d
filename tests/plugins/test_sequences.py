"""Sequence and optional ops (minfer_ops_basic.sequences): onnx's cases, onnxruntime, memory safety, feeds."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from modelkit import make_model, ort_run, tensor
from onnx import TensorProto, helper, numpy_helper

from minfer_core import InferenceSession, KernelError, get_registry, hookimpl, kernel, use_plugins
from minfer_core.testing import backend
from minfer_core.testing.conformance import assert_similar, claimed, load_cases, run_case

# onnx's node cases of these ops, and the control-flow ones that carry sequences and optionals
NAMES = re.compile(r"test_(sequence_|split_to_sequence_|optional_|identity_sequence|if_seq|if_opt|loop13_seq|loop16_seq_none)")
CASES = [c for c in load_cases() if NAMES.match(c.name)]  # SequenceMap's _expanded cases: Loop over the Sequence ops
SIMPLE = Path(onnx.__file__).parent / "backend" / "test" / "data" / "simple"


def seq(name: str, elem: int, shape) -> onnx.ValueInfoProto:
    """A graph input or output declared as a sequence of ``elem`` tensors of ``shape``."""
    return helper.make_value_info(name, helper.make_sequence_type_proto(helper.make_tensor_type_proto(elem, shape)))


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_node_case(case):
    """Each onnx node case of a sequence or optional op gives onnx's outputs (sequences compared tensor by tensor)."""
    if not claimed(case):
        pytest.skip(f"no installed plugin provides every op of {case.name} (If/Loop come with control flow)")
    run_case(case)


def test_the_cases_cover_every_sequence_and_optional_op():
    """The node cases above reach every op this module provides but SequenceConstruct/Empty/Erase/At (models below)."""
    ops = {c.op_type[1] for c in CASES}
    assert {"SequenceInsert", "SequenceMap", "SplitToSequence", "OptionalHasElement", "OptionalGetElement"} <= ops


SIMPLE_MODELS = sorted(p.name for p in SIMPLE.glob("test_sequence_model*")) if SIMPLE.is_dir() else []


@pytest.mark.parametrize("name", SIMPLE_MODELS)
def test_onnx_sequence_model(name):
    """onnx's simple sequence models (Empty, Construct, Insert, Erase, At, Length, Split, Concat) give onnx's outputs."""
    folder = SIMPLE / name
    model = onnx.load(str(folder / "model.onnx"))
    data = folder / "test_data_set_0"
    load = lambda pattern: [numpy_helper.to_array(onnx.load_tensor(str(p))) for p in sorted(data.glob(pattern))]  # noqa: E731
    got = backend.prepare(model).run(load("input_*.pb"))
    for i, e in enumerate(load("output_*.pb")):
        assert_similar(got[i], e, 1e-3, 1e-7, f"{name} output {i}")


def test_simple_models_found():
    """onnx's wheel ships the eight simple sequence models the test above runs."""
    assert len(SIMPLE_MODELS) == 8


# --- a model against onnxruntime ------------------------------------------------------


def _ints(name: str, values) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(values, dtype=np.int64), name)


def sequence_model() -> onnx.ModelProto:
    """Every sequence and optional op on intermediates of a small float graph."""
    node = helper.make_node
    nodes = [
        node("Relu", ["x"], ["r"]), node("Neg", ["x"], ["n"]), node("Sigmoid", ["x"], ["sg"]),
        node("SequenceEmpty", [], ["s0"], dtype=TensorProto.FLOAT),
        node("SequenceInsert", ["s0", "r"], ["s1"]),
        node("SequenceInsert", ["s1", "n", "zero"], ["s2"]),            # [n, r]
        node("SequenceConstruct", ["x", "r", "sg"], ["s3"]),
        node("SequenceErase", ["s3", "minus2"], ["s4"]),                # [x, sg]
        node("SequenceErase", ["s4"], ["s5"]),                          # [x]
        node("SequenceLength", ["s3"], ["len3"]),
        node("SequenceAt", ["s4", "one"], ["at"]),                      # sg
        node("ConcatFromSequence", ["s2"], ["cat"], axis=0),            # [n; r]: 6x4
        node("ConcatFromSequence", ["s4"], ["stack"], axis=-1, new_axis=1),
        node("SplitToSequence", ["cat", "sizes"], ["sp"], axis=0),
        node("SplitToSequence", ["r"], ["rows"], axis=0, keepdims=0),
        node("SplitToSequence", ["sg", "two"], ["cols"], axis=1),
        node("SequenceLength", ["rows"], ["nrows"]),
        node("SequenceAt", ["sp", "minus1"], ["last"]),
        node("Optional", ["r"], ["opt"]),
        node("OptionalHasElement", ["opt"], ["has"]),
        node("OptionalGetElement", ["opt"], ["got"]),
        node("Add", ["got", "at"], ["y"]),
        # from constants alone: constant folding must leave sequences and optionals to run time
        node("Optional", [], ["empty"], type=helper.make_tensor_type_proto(TensorProto.FLOAT, [2])),
        node("OptionalHasElement", ["empty"], ["has_empty"]),
        node("SequenceConstruct", ["sizes", "two"], ["consts"]),
        node("SequenceLength", ["consts"], ["nconsts"]),
    ]
    inits = [_ints("zero", 0), _ints("one", 1), _ints("two", 2), _ints("minus1", -1), _ints("minus2", -2),
             _ints("sizes", [1, 2, 3])]
    outs = [tensor("y", None), tensor("cat", None), tensor("stack", None), tensor("len3", None, TensorProto.INT64),
            tensor("nrows", None, TensorProto.INT64), tensor("last", None), tensor("has", None, TensorProto.BOOL),
            tensor("has_empty", None, TensorProto.BOOL), tensor("nconsts", None, TensorProto.INT64),
            seq("s2", TensorProto.FLOAT, None), seq("s5", TensorProto.FLOAT, None),
            seq("cols", TensorProto.FLOAT, None), seq("rows", TensorProto.FLOAT, None)]
    return make_model(nodes, [tensor("x", [3, 4])], outs, inits, opset=18)


@pytest.mark.filterwarnings("error::minfer_core.errors.PassWarning")  # a pass failing on sequences fails the test
@pytest.mark.parametrize("passes", ["none", "all"])
def test_sequence_model_matches_onnxruntime(passes):
    """A graph using every sequence and optional op gives onnxruntime's outputs, with and without passes, run after run."""
    model = sequence_model()
    x = np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)
    want = ort_run(model, {"x": x})
    sess = InferenceSession(model.SerializeToString(), passes=passes)
    for _ in range(3):  # the first run discovers and plans, the later ones run in the arena
        for i, (g, w) in enumerate(zip(sess.run(None, {"x": x}), want)):
            assert_similar(g, w, 1e-6, 1e-6, f"output {sess.get_outputs()[i].name}")


SPLITS = [  # (split values or None, SplitToSequence attributes, ConcatFromSequence attributes)
    (None, {"axis": 1}, {"axis": 1}),
    (None, {"axis": -1, "keepdims": 0}, {"axis": -1, "new_axis": 1}),
    (3, {"axis": 1}, {"axis": -1}),                      # chunks of 3 along 7: the last one shorter
    ([2, 0, 5], {"axis": -1, "keepdims": 0}, {"axis": 1}),  # keepdims applies only without split
    ([1, 1], {"axis": 0}, {"axis": 0, "new_axis": 1}),
]


@pytest.mark.parametrize("split, split_attrs, concat_attrs", SPLITS)
def test_split_and_concat_match_onnxruntime(split, split_attrs, concat_attrs):
    """SplitToSequence and ConcatFromSequence agree with onnxruntime on scalar, list and absent splits and axes."""
    inputs = ["x"] if split is None else ["x", "split"]
    nodes = [helper.make_node("SplitToSequence", inputs, ["s"], **split_attrs),
             helper.make_node("SequenceLength", ["s"], ["n"]),
             helper.make_node("ConcatFromSequence", ["s"], ["y"], **concat_attrs)]
    inits = [] if split is None else [_ints("split", split)]
    outs = [tensor("y", None, TensorProto.INT32), tensor("n", None, TensorProto.INT64), seq("s", TensorProto.INT32, None)]
    model = make_model(nodes, [tensor("x", [2, 7], TensorProto.INT32)], outs, inits, opset=18)
    feeds = {"x": np.arange(14, dtype=np.int32).reshape(2, 7)}
    for i, (g, w) in enumerate(zip(InferenceSession(model.SerializeToString()).run(None, feeds), ort_run(model, feeds))):
        assert_similar(g, w, 0, 0, f"output {i}")


def sequence_map_model() -> onnx.ModelProto:
    """SequenceMap over a split sequence and a tensor, the body also reading an outer-scope value."""
    body = helper.make_graph(
        [helper.make_node("Mul", ["e", "t"], ["m"]), helper.make_node("Add", ["m", "w"], ["o"]),
         helper.make_node("Shape", ["e"], ["shp"])],
        "body", [tensor("e", None), tensor("t", None)],
        [tensor("o", None), tensor("shp", None, TensorProto.INT64)])
    nodes = [helper.make_node("Exp", ["t"], ["w"]),
             helper.make_node("SplitToSequence", ["x", "sizes"], ["seq"], axis=0),
             helper.make_node("SequenceMap", ["seq", "t"], ["outs", "shapes"], body=body),
             helper.make_node("ConcatFromSequence", ["outs"], ["y"], axis=0)]
    outs = [tensor("y", None), seq("shapes", TensorProto.INT64, None)]
    return make_model(nodes, [tensor("x", [4, 3]), tensor("t", [3])], outs, [_ints("sizes", [1, 3])], opset=17)


@pytest.mark.filterwarnings("error::minfer_core.errors.PassWarning")
@pytest.mark.parametrize("passes", ["none", "all"])
def test_sequence_map_matches_onnxruntime(passes):
    """SequenceMap runs its body per element with tensor and outer-scope inputs as onnxruntime does."""
    model = sequence_map_model()
    rng = np.random.default_rng(1)
    feeds = {"x": rng.standard_normal((4, 3)).astype(np.float32), "t": rng.standard_normal(3).astype(np.float32)}
    want = ort_run(model, feeds)
    sess = InferenceSession(model.SerializeToString(), passes=passes)
    for _ in range(2):
        for i, (g, w) in enumerate(zip(sess.run(None, feeds), want)):
            assert_similar(g, w, 1e-6, 1e-6, f"output {i}")


def test_sequence_map_over_empty_sequences_and_unequal_lengths():
    """SequenceMap maps an empty sequence to empty ones, and sequences of unequal length are an error naming both."""
    body = helper.make_graph([helper.make_node("Add", ["a", "b"], ["c"])], "body", [tensor("a", None), tensor("b", None)],
                             [tensor("c", None)])
    nodes = [helper.make_node("SequenceMap", ["s", "t"], ["u"], body=body, name="map")]
    model = make_model(nodes, [seq("s", TensorProto.FLOAT, None), seq("t", TensorProto.FLOAT, None)],
                       [seq("u", TensorProto.FLOAT, None)], opset=17)
    sess = InferenceSession(model.SerializeToString())
    assert sess.run(None, {"s": [], "t": []}) == [[]]
    one = np.ones(2, np.float32)
    with pytest.raises(KernelError, match=r"map.*the input sequences differ in length: \[2, 1\]"):
        sess.run(None, {"s": [one, one], "t": [one]})


# --- memory safety ---------------------------------------------------------------------------


def reuse_model() -> onnx.ModelProto:
    """Sequences of an intermediate whose buffer the plan hands on, and an optional of another (a declared view)."""
    node = helper.make_node
    nodes = [node("Relu", ["x"], ["a"]),
             node("SequenceConstruct", ["a"], ["sa"]),
             node("SequenceEmpty", [], ["e"]), node("SequenceInsert", ["e", "a"], ["sb"]),
             node("SplitToSequence", ["a"], ["sc"]),
             node("Sigmoid", ["x"], ["b"]), node("Optional", ["b"], ["ob"])]
    # intermediates of a's shape made after its last reader, each a new buffer (x + x is never computed in place)
    prev = "x"
    for i in range(4):
        nodes.append(node("Add", [prev, prev], [f"t{i}"]))
        prev = f"t{i}"
    nodes += [node("ConcatFromSequence", ["sa"], ["ya"], axis=0), node("ConcatFromSequence", ["sb"], ["yb"], axis=0),
              node("ConcatFromSequence", ["sc"], ["yc"], axis=0), node("OptionalGetElement", ["ob"], ["gb"]),
              node("Sub", ["gb", prev], ["yo"])]
    outs = [tensor(n, None) for n in ("ya", "yb", "yc", "yo")]
    return make_model(nodes, [tensor("x", [8, 16])], outs, opset=18)


def _reuse_outputs(x: np.ndarray) -> list[np.ndarray]:
    sess = InferenceSession(reuse_model().SerializeToString(), passes="none")
    return [sess.run(None, {"x": x}) for _ in range(3)][-1]  # the runs after the first reuse the planned buffers


def test_sequences_and_optionals_are_unaffected_by_buffer_reuse():
    """Tensors put into sequences and optionals keep their values after the planner reuses their buffers."""
    x = np.random.default_rng(2).standard_normal((8, 16)).astype(np.float32)
    a, b = np.maximum(x, 0), 1 / (1 + np.exp(-x))
    for g, w in zip(_reuse_outputs(x), [a, a, a, b - 16 * x]):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)


# kernels that keep references instead of copies: the bug the copies prevent
@kernel("SequenceConstruct", since=11, priority=10)
def _construct_by_reference(*inputs):
    return (list(inputs),)


@kernel("SequenceInsert", since=11, priority=10)
def _insert_by_reference(seq, tensor, position=None):
    return ([*seq, tensor],)


@kernel("SplitToSequence", since=11, priority=10)
def _split_by_reference(input, split=None, *, axis=0, keepdims=1):
    return ([input[i:i + 1] for i in range(len(input))],)


@pytest.mark.parametrize("output, by_reference", [
    (0, _construct_by_reference), (1, _insert_by_reference), (2, _split_by_reference)])
def test_buffer_reuse_test_catches_a_kernel_that_does_not_copy(output, by_reference):
    """The reuse model really hands the member's buffer on: a kernel keeping a reference gives a wrong output."""

    class Plugin:
        __name__ = "by-reference"

        @hookimpl
        def register_kernels(self, register):
            register(by_reference)

    x = np.random.default_rng(2).standard_normal((8, 16)).astype(np.float32)
    with use_plugins(Plugin()):
        got = _reuse_outputs(x)
    assert not np.allclose(got[output], np.maximum(x, 0))


# --- feeds and errors -------------------------------------------------------------------------


def seq_input_model() -> onnx.ModelProto:
    nodes = [helper.make_node("SequenceInsert", ["s", "x"], ["s2"]),
             helper.make_node("SequenceErase", ["s2", "zero"], ["s3"]),
             helper.make_node("ConcatFromSequence", ["s3"], ["y"], axis=0)]
    return make_model(nodes, [seq("s", TensorProto.FLOAT, [None, 2]), tensor("x", [1, 2])],
                      [tensor("y", None), seq("s3", TensorProto.FLOAT, None)], [_ints("zero", 0)], opset=18)


def test_sequence_input_takes_a_list_and_is_typed_as_onnxruntime_types_it():
    """A graph input declared as a sequence accepts a list, is left unchanged, and is typed "seq(tensor(float))"."""
    ort = pytest.importorskip("onnxruntime")
    model = seq_input_model()
    sess = InferenceSession(model.SerializeToString())
    oracle = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    assert [i.type for i in sess.get_inputs()] == [i.type for i in oracle.get_inputs()]
    assert sess.get_inputs()[0].type == "seq(tensor(float))"
    assert [o.type for o in sess.get_outputs()] == [o.type for o in oracle.get_outputs()]
    items = [np.ones((2, 2), np.float32), np.full((1, 2), 2, np.float32)]
    feeds = {"s": list(items), "x": np.full((1, 2), 3, np.float32)}
    for g, w in zip(sess.run(None, feeds), oracle.run(None, feeds)):
        assert_similar(g, w, 0, 0, "output")
    assert len(feeds["s"]) == 2 and all(a is b for a, b in zip(feeds["s"], items))  # the caller's list is untouched


def test_sequence_at_out_of_range_names_the_node():
    """SequenceAt past the end is a KernelError naming the node and the accepted positions."""
    nodes = [helper.make_node("SequenceConstruct", ["x", "x"], ["s"]),
             helper.make_node("SequenceAt", ["s", "p"], ["y"], name="pick")]
    model = make_model(nodes, [tensor("x", [2]), tensor("p", [], TensorProto.INT64)], [tensor("y", None)], opset=18)
    sess = InferenceSession(model.SerializeToString())
    assert sess.run(None, {"x": np.ones(2, np.float32), "p": np.array(-2)})[0].tolist() == [1, 1]
    with pytest.raises(KernelError, match=r"pick.*position 2 is out of range for a sequence of 2 tensors \(accepted: -2..1\)"):
        sess.run(None, {"x": np.ones(2, np.float32), "p": np.array(2)})


def test_optional_get_element_of_an_empty_optional_says_so():
    """OptionalGetElement of an empty optional is a KernelError that points at OptionalHasElement."""
    nodes = [helper.make_node("Optional", [], ["o"], type=helper.make_tensor_type_proto(TensorProto.FLOAT, [2])),
             helper.make_node("OptionalGetElement", ["o"], ["y"])]
    model = make_model(nodes, [], [tensor("y", None)], opset=18)
    with pytest.raises(KernelError, match="the optional is empty"):
        InferenceSession(model.SerializeToString()).run(None, {})


def test_every_op_is_claimed_by_minfer_ops_basic():
    """minfer-ops-basic claims each sequence and optional op."""
    ops = {"SequenceConstruct", "SequenceEmpty", "SequenceInsert", "SequenceAt", "SequenceErase", "SequenceLength",
           "SequenceMap", "SplitToSequence", "ConcatFromSequence", "Optional", "OptionalHasElement", "OptionalGetElement"}
    reg = get_registry()
    assert {op for op in ops if any(c.plugin == "minfer-ops-basic" for c in reg.ops.get(("", op), ()))} == ops
