"""The example third-party plugin (examples/minfer_contrib_example), pip-installed into the test env."""

from __future__ import annotations

import numpy as np
from onnx import helper

from modelkit import make_model, tensor
from minfer_core import InferenceSession, get_registry


def scaled_tanh_model():
    nodes = [
        helper.make_node("ScaledTanh", ["x"], ["t"], domain="com.example", alpha=2.0, beta=0.5),
        helper.make_node("Relu", ["t"], ["y"]),
    ]
    return make_model(nodes, [tensor("x", ["n", 4])], [tensor("y", ["n", 4])], extra_opsets=[helper.make_opsetid("com.example", 1)])


def test_example_plugin_is_installed_through_its_entry_point():
    """pip-installing the example package is all it takes to register its op."""
    info = get_registry().plugins["minfer-contrib-example"]
    assert info.distribution == "minfer-contrib-example" and info.ops == ("com.example::ScaledTanh",)


def test_model_using_the_custom_op_runs():
    """A model mixing the custom op with standard ops gives alpha*tanh(beta*x), then Relu."""
    x = np.linspace(-3, 3, 8, dtype=np.float32).reshape(2, 4)
    sess = InferenceSession(scaled_tanh_model())
    (y,) = sess.run(None, {"x": x})
    np.testing.assert_allclose(y, np.maximum(2.0 * np.tanh(0.5 * x), 0), rtol=1e-6)
    assert y.dtype == np.float32


def test_custom_op_shape_inference_feeds_the_rest_of_the_graph():
    """The plugin's infer gives the custom op's output a type that downstream inference uses."""
    sess = InferenceSession(scaled_tanh_model())
    assert sess.graph.types["t"].shape == ("n", 4)
    assert sess.graph.types["t"].dtype == np.float32


def test_example_pass_gets_the_property_suite(tmp_path):
    """`pytest --minfer-passes=minfer-contrib-example` runs the whole property suite on the example's pass."""
    import subprocess
    import sys

    (tmp_path / "conftest.py").write_text("")
    cmd = [sys.executable, "-m", "pytest", "--minfer-passes=minfer-contrib-example", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "passed" in result.stdout and "failed" not in result.stdout


def test_example_pass_rewrites_only_the_exact_case():
    """The pass turns ScaledTanh(1, 1) into Tanh and leaves other attributes alone."""
    from minfer_contrib_example.passes import plain_scaled_tanh

    from minfer_core import load_model

    graph = load_model(scaled_tanh_model())
    assert not plain_scaled_tanh(graph)  # alpha=2, beta=0.5: not exact, must not fire
    graph.nodes[0].attrs.clear()
    assert plain_scaled_tanh(graph) and graph.nodes[0].op_type == "Tanh"
