"""The example third-party plugin (examples/minfer_contrib_example), pip-installed into the test env."""

from __future__ import annotations

import json
import os
import subprocess
import sys

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
    (tmp_path / "conftest.py").write_text("")
    cmd = [sys.executable, "-m", "pytest", "--minfer-passes=minfer-contrib-example", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "4 passed" in result.stdout  # its target strategy, random graphs, the pipeline, coverage


def test_installed_plugins_load_without_hypothesis_or_pytest():
    """Every installed plugin, the example's pass included, loads where hypothesis and pytest cannot be imported."""
    script = (
        "import sys, json\n"
        "sys.modules['hypothesis'] = sys.modules['pytest'] = None\n"
        "from minfer_core import get_registry\n"
        "reg = get_registry()\n"
        "print(json.dumps({'errors': {n: p.error for n, p in reg.plugins.items() if p.error},\n"
        "                  'passes': [p.name for p in reg.passes]}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "MINFER_STRICT_PLUGINS"}  # report a failure, do not raise it
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout)
    assert report["errors"] == {}
    assert "plain_scaled_tanh" in report["passes"]


def test_example_pass_rewrites_only_the_exact_case():
    """The pass turns ScaledTanh(1, 1) into Tanh and leaves other attributes alone."""
    from minfer_contrib_example.passes import plain_scaled_tanh

    from minfer_core import load_model

    graph = load_model(scaled_tanh_model())
    assert not plain_scaled_tanh(graph)  # alpha=2, beta=0.5: not exact, must not fire
    graph.nodes[0].attrs.clear()
    assert plain_scaled_tanh(graph) and graph.nodes[0].op_type == "Tanh"
