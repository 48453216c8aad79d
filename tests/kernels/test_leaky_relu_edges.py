"""LeakyRelu's edge values: x where x >= 0, alpha * x elsewhere, for every alpha, as ONNX and onnxruntime define it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from minfer_core import InferenceSession
from modelkit import make_model, ort_run

EDGES = np.array([np.inf, -np.inf, 0.0, -0.0, 1.5, -2.5, np.nan, 3e38, -3e38], np.float32)


@pytest.mark.parametrize("alpha", [0.0, -0.5, 0.01, 1.0, 2.5])
def test_leaky_relu_matches_the_formula_and_onnxruntime_on_edge_values(alpha):
    """+inf stays +inf at alpha 0, zeros keep their sign at a negative alpha, NaN stays NaN."""
    node = helper.make_node("LeakyRelu", ["x"], ["y"], alpha=alpha)
    model = make_model([node], [helper.make_tensor_value_info("x", TensorProto.FLOAT, [EDGES.size])],
                       [helper.make_tensor_value_info("y", TensorProto.FLOAT, [EDGES.size])])
    got = InferenceSession(model).run(None, {"x": EDGES})[0]
    with np.errstate(invalid="ignore", over="ignore"):
        want = np.where(EDGES >= 0, EDGES, EDGES * np.float32(alpha))
    np.testing.assert_array_equal(got, want)
    assert (np.signbit(got) == np.signbit(want))[~np.isnan(want)].all()
    np.testing.assert_array_equal(got, ort_run(model, {"x": EDGES})[0])
