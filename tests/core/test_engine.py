"""The engine's contract: onnxruntime's call shape, intermediates, and errors that name things."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from modelkit import make_model, tensor
from minfer_core import BadFeedError, InferenceSession, UnsupportedOpError


def small_model():
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"), helper.make_node("Add", ["h", "b"], ["y"], name="add")]
    b = helper.make_tensor("b", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    return make_model(nodes, [tensor("x", ["batch", 3])], [tensor("y", ["batch", 3])], [b])


def test_run_matches_numpy_and_reports_io():
    """run(None, feeds) returns every output; get_inputs/get_outputs describe them like onnxruntime."""
    sess = InferenceSession(small_model())
    x = np.array([[-1, 0, 1]], np.float32)
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_array_equal(y, [[1, 2, 4]])
    (inp,) = sess.get_inputs()
    assert (inp.name, inp.type, inp.shape) == ("x", "tensor(float)", ["batch", 3])
    assert sess.get_outputs()[0].name == "y"


def test_intermediate_values_are_returned_by_name():
    """intermediate=True also returns every value computed in the run."""
    sess = InferenceSession(small_model(), passes="basic")  # "extended" fuses Relu + Add: h is then never computed
    outputs, values = sess.run(None, {"x": np.array([[-1, 0, 1]], np.float32)}, intermediate=True)
    np.testing.assert_array_equal(values["h"], [[0, 0, 1]])
    assert np.array_equal(values["y"], outputs[0])


def test_unknown_op_names_op_domain_opset_and_node():
    """An unsupported op is reported with its type, domain, opset and node names, all at once."""
    nodes = [
        helper.make_node("Frobnicate", ["x"], ["a"], name="f1", domain="com.acme"),
        helper.make_node("Relu", ["a"], ["b"], name="r"),
        helper.make_node("Frobnicate", ["b"], ["c"], name="f2", domain="com.acme"),
        helper.make_node("Wibble", ["c"], ["y"], name="w1"),
    ]
    model = make_model(nodes, [tensor("x", [3])], [tensor("y", [3])], extra_opsets=[helper.make_opsetid("com.acme", 2)])
    with pytest.raises(UnsupportedOpError) as info:
        InferenceSession(model)
    msg = str(info.value)
    assert "3 node(s)" in msg
    assert "Frobnicate (domain 'com.acme', opset 2) at 2 node(s): 'f1', 'f2'" in msg
    assert "Wibble (the default domain, opset 17) at 1 node(s): 'w1'" in msg


@pytest.mark.parametrize(
    "feeds,pattern",
    [
        ({"x": np.zeros((2, 4), np.float32)}, r"'x' expects shape \[batch, 3\], got \(2, 4\): dim 1 must be 3"),
        ({"x": np.zeros((2, 3), np.float64)}, r"'x' expects dtype float32, got float64"),
        ({"x": np.zeros((3,), np.float32)}, r"'x' expects rank 2"),
        ({}, r"missing feed for input\(s\) \['x'\]"),
        ({"x": np.zeros((1, 3), np.float32), "z": np.zeros(1)}, r"unknown input name\(s\) \['z'\]"),
    ],
    ids=["shape", "dtype", "rank", "missing", "unknown"],
)
def test_bad_feeds_are_named_errors(feeds, pattern):
    """Each bad feed raises BadFeedError naming the input, expected and actual."""
    with pytest.raises(BadFeedError, match=pattern):
        InferenceSession(small_model()).run(None, feeds)


def test_unknown_output_name_is_an_error():
    """Asking for an output the model lacks is a BadFeedError listing the real ones."""
    with pytest.raises(BadFeedError, match=r"unknown output 'nope'.*\['y'\]"):
        InferenceSession(small_model()).run(["nope"], {"x": np.zeros((1, 3), np.float32)})


def test_outputs_are_not_overwritten_by_later_runs():
    """An array returned by run keeps its values after further runs."""
    sess = InferenceSession(small_model())
    first = sess.run(None, {"x": np.ones((1, 3), np.float32)})[0]
    kept = first.copy()
    sess.run(None, {"x": np.full((1, 3), 7, np.float32)})
    np.testing.assert_array_equal(first, kept)


def test_core_alone_names_missing_ops_and_the_package_to_install(tmp_path):
    """With no op plugin loaded, the error says which ops are missing and what provides them."""
    path = tmp_path / "m.onnx"
    path.write_bytes(small_model().SerializeToString())
    code = (
        "import minfer_core as m, sys\n"
        "try:\n    m.InferenceSession(sys.argv[1])\n"
        "except m.UnsupportedOpError as e:\n    print(e)\n"
    )
    env = {"MINFER_PLUGINS": "nothing-at-all", "PATH": ""}
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, env=env, check=True).stdout
    assert "Relu (the default domain, opset 17) at 1 node(s): 'relu' -> install minfer-ops-basic" in out
    assert "Add" in out


def test_each_first_party_plugin_declares_what_it_registers():
    """Each first-party plugin's minfer_provides.json lists exactly the ops it registers (scripts/update_known_ops.py)."""
    sys.path.insert(0, str(Path(__file__).parents[2] / "scripts"))
    from update_known_ops import provides_paths, registered_ops

    from minfer_core.provides import declared_ops

    registered = registered_ops()
    assert set(registered) == {"minfer-ops-basic", "minfer-ops-conv", "minfer-ops-ml", "minfer-passes"}
    for dist, ops in registered.items():
        assert sorted(declared_ops()[dist]) == ops, f"run scripts/update_known_ops.py ({provides_paths()[dist]} is stale)"


def test_the_core_keeps_no_list_of_first_party_ops():
    """Adding an op to a plugin edits no core file: the core ships no op list of its own."""
    import minfer_core

    core = Path(minfer_core.__file__).parent
    assert not list(core.glob("*.json")), "op lists belong in the plugins' minfer_provides.json"


def test_outputs_never_alias_the_callers_feeds_or_the_weights():
    """Writing into a returned array changes neither the feed nor later runs (onnxruntime returns copies too)."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [3], [1.0, 2.0, 3.0])
    shape = helper.make_tensor("s", TensorProto.INT64, [1], [6])
    nodes = [
        helper.make_node("Identity", ["x"], ["y"]),
        helper.make_node("Reshape", ["x", "s"], ["z"]),
        helper.make_node("Identity", ["w"], ["v"]),
    ]
    model = make_model(nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3]), tensor("z", [6]), tensor("v", [3])], [w, shape])
    for passes in ("none", "all"):
        sess = InferenceSession(model, passes=passes)
        x = np.ones((2, 3), np.float32)
        y, z, v = sess.run(None, {"x": x})
        assert not np.shares_memory(y, x) and not np.shares_memory(z, x)
        v[0] = 99
        np.testing.assert_array_equal(sess.run(None, {"x": x})[2], [1, 2, 3])
