"""The strict build (issue 14): invalid models are refused naming the node, expansion has no depth limit, passes roll back."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from modelkit import make_model, ort_run, tensor
from minfer_core import (
    Engine,
    InferenceSession,
    InvalidGraphError,
    MinferError,
    ModelLoadError,
    Pass,
    PassError,
    ShapeInferenceError,
    hookimpl,
    use_plugins,
)
from minfer_core.errors import PassWarning


def relu_model(**kw):
    return make_model([helper.make_node("Relu", ["x"], ["y"], name="relu0", **kw)], [tensor("x", [2])], [tensor("y", [2])])


def invalid_models():
    """(case id, model, minfer error type, what the message must say) for models onnxruntime refuses."""
    no_opset = relu_model()
    del no_opset.opset_import[:]
    opset99 = make_model([helper.make_node("Relu", ["x"], ["y"], name="relu0")], [tensor("x", [2])], [tensor("y", [2])], opset=99)
    no_graph = onnx.ModelProto(ir_version=10)
    no_graph.opset_import.add().version = 17
    return [
        ("add_float_int", make_model([helper.make_node("Add", ["a", "b"], ["y"], name="add0")],
                                     [tensor("a", [2]), tensor("b", [2], TensorProto.INT64)], [tensor("y", [2])]),
         ShapeInferenceError, "'add0'"),
        ("softmax_axis", make_model([helper.make_node("Softmax", ["x"], ["y"], name="sm0", axis=5)],
                                    [tensor("x", [2, 3])], [tensor("y", [2, 3])]), ShapeInferenceError, "'sm0'.*axis"),
        ("relu_two_outputs", make_model([helper.make_node("Relu", ["x"], ["y", "z"], name="relu0")], [tensor("x", [2])],
                                        [tensor("y", [2]), tensor("z", [2])]), InvalidGraphError, "'relu0'.*2 output"),
        ("relu_two_inputs", make_model([helper.make_node("Relu", ["x", "x"], ["y"], name="relu0")], [tensor("x", [2])],
                                       [tensor("y", [2])]), InvalidGraphError, "'relu0'.*2 input"),
        ("attribute_type", make_model([helper.make_node("Softmax", ["x"], ["y"], name="sm0", axis=1.0)],
                                      [tensor("x", [2, 3])], [tensor("y", [2, 3])]), InvalidGraphError, "'sm0'.*'axis'.*INT"),
        ("unknown_attribute", relu_model(foo=1), InvalidGraphError, "'relu0'.*'foo'"),
        ("no_opset_import", no_opset, InvalidGraphError, "'relu0'.*opset_import"),
        ("opset_99", opset99, InvalidGraphError, "opset 99"),
        ("unknown_element_type", make_model([helper.make_node("Relu", ["x"], ["y"], name="relu0")], [tensor("x", [2], 99)],
                                            [tensor("y", [2])]), ModelLoadError, "element type 99"),
        ("no_graph", no_graph, ModelLoadError, "no graph"),
    ]


@pytest.mark.parametrize("case", invalid_models(), ids=lambda c: c[0])
def test_an_invalid_model_is_refused_at_build_naming_the_node(case):
    """Each model onnxruntime refuses is refused by the build with a minfer error that says what is wrong where."""
    _, model, error, message = case
    with pytest.raises(Exception):  # the oracle: onnxruntime refuses it too
        ort_run(model, {})
    with pytest.raises(error, match=message):
        InferenceSession(model)


def test_the_lenient_build_keeps_recording_inference_failures():
    """strict=False builds a schema-breaking model and records the failure, as earlier versions did."""
    model = make_model([helper.make_node("Softmax", ["x"], ["y"], name="sm0", axis=5)], [tensor("x", [2, 3])], [tensor("y", [2, 3])])
    engine = Engine(model, strict=False)
    assert "node 'sm0' (Softmax)" in engine.inference_failures


def test_valid_models_still_build_strictly():
    """A valid model with an empty optional input, defaulted attributes and variadic outputs passes the checks."""
    nodes = [
        helper.make_node("Clip", ["x", "", "hi"], ["c"], name="clip"),
        helper.make_node("Split", ["c"], ["a", "b"], axis=0, num_outputs=2, name="split"),
        helper.make_node("Sum", ["a", "b", "a"], ["y"], name="sum"),
    ]
    inits = [helper.make_tensor("hi", TensorProto.FLOAT, [], [0.5])]
    model = make_model(nodes, [tensor("x", [4])], [tensor("y", [2])], inits, opset=18)
    x = np.array([1.0, -2.0, 0.25, 3.0], np.float32)
    np.testing.assert_allclose(InferenceSession(model).run(None, {"x": x})[0], ort_run(model, {"x": x})[0])


def nested_functions(depth, recursive=False):
    """A model whose F0 calls F1 ... calls F{depth-1}, which is a Relu (or calls F0 again when ``recursive``)."""
    domain = "test.local"
    functions = []
    for i in range(depth):
        last = i == depth - 1
        inner = (helper.make_node("F0", ["a"], ["b"], domain=domain) if recursive else helper.make_node("Relu", ["a"], ["b"])) \
            if last else helper.make_node(f"F{i + 1}", ["a"], ["b"], domain=domain)
        functions.append(helper.make_function(domain, f"F{i}", ["a"], ["b"], [inner],
                                              [helper.make_opsetid("", 17), helper.make_opsetid(domain, 1)]))
    model = make_model([helper.make_node("F0", ["x"], ["y"], domain=domain, name="call")], [tensor("x", [2])],
                       [tensor("y", [2])], extra_opsets=[helper.make_opsetid(domain, 1)])
    model.functions.extend(functions)
    return model


def test_function_expansion_has_no_depth_limit():
    """Twelve nested model-local functions expand and run like onnxruntime."""
    model = nested_functions(12)
    x = np.array([-1.0, 3.0], np.float32)
    np.testing.assert_array_equal(InferenceSession(model).run(None, {"x": x})[0], ort_run(model, {"x": x})[0])


def test_a_recursive_function_is_reported_as_recursion():
    """A function that calls itself is an InvalidGraphError naming the cycle, not "install a plugin"."""
    with pytest.raises(InvalidGraphError, match=r"calls itself \(test.local::F0 -> test.local::F1 -> test.local::F0\)"):
        InferenceSession(nested_functions(2, recursive=True))


class Crashing:
    """A plugin whose pass first breaks the graph, then raises."""

    __name__ = "crashing-pass"

    @hookimpl
    def register_passes(self, register):
        def crash(graph):
            graph.remove_node(graph.nodes[0])  # a half-done rewrite ...
            raise RuntimeError("pass bug")  # ... then the crash

        register(Pass("contract_crash", crash, "basic"))


def test_a_crashing_pass_is_rolled_back_with_a_warning_and_the_model_runs(monkeypatch):
    """Outside strict mode a pass that raises is undone and reported as a PassWarning; the outputs are right."""
    monkeypatch.delenv("MINFER_STRICT_PLUGINS", raising=False)
    with use_plugins(Crashing()):
        with pytest.warns(PassWarning, match=r"contract_crash.*pass bug.*rolled back"):
            sess = InferenceSession(relu_model(), passes=["contract_crash"])
    np.testing.assert_array_equal(sess.run(None, {"x": np.array([-1, 2], np.float32)})[0], [0, 2])


def test_strict_plugins_mode_makes_a_crashing_pass_an_error(monkeypatch):
    """With MINFER_STRICT_PLUGINS=1 (the test suite's mode) a crashing pass is a PassError naming it."""
    monkeypatch.setenv("MINFER_STRICT_PLUGINS", "1")
    with use_plugins(Crashing()):
        with pytest.raises(PassError, match="contract_crash"):
            InferenceSession(relu_model(), passes=["contract_crash"])


def test_every_refusal_is_a_minfer_error():
    """The refusals are minfer's own error types, so callers catch one base class."""
    for _, model, error, _ in invalid_models():
        assert issubclass(error, MinferError)
        with pytest.raises(MinferError):
            InferenceSession(model)
