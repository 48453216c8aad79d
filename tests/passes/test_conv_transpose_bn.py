"""conv_bn_fusion on a ConvTranspose: the BatchNormalization after an upsampling head's ConvTranspose folds into its
weights and bias."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from minfer_core import Engine
from modelkit import make_model, ort_run, tensor


@pytest.mark.parametrize("group, bias", [(1, True), (2, False), (4, True)])
def test_batch_norm_after_conv_transpose_folds_and_keeps_outputs(group, bias):
    """ConvTranspose (group 1, 2, 4; with and without bias) -> BatchNormalization -> Relu becomes one ConvTranspose
    (+ the activation), and gives onnxruntime's outputs of the unfused graph."""
    rng = np.random.default_rng(group)
    c, per = 8, 3
    inits = [numpy_helper.from_array(rng.standard_normal((c, per, 2, 2), dtype=np.float32), "w")]
    inits += [numpy_helper.from_array(rng.standard_normal(group * per, dtype=np.float32), "b")] if bias else []
    m = group * per
    for name, lo, hi in (("scale", 0.5, 1.5), ("shift", -1, 1), ("mean", -1, 1), ("var", 0.2, 2)):
        inits.append(numpy_helper.from_array(rng.uniform(lo, hi, m).astype(np.float32), name))
    nodes = [helper.make_node("ConvTranspose", ["x", "w"] + (["b"] if bias else []), ["ct"], kernel_shape=[2, 2],
                              strides=[2, 2], group=group),
             helper.make_node("BatchNormalization", ["ct", "scale", "shift", "mean", "var"], ["bn"]),
             helper.make_node("Relu", ["bn"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, c, 5, 6])], [tensor("y", [1, m, 10, 12])], inits)
    engine = Engine(model, passes="all")
    assert "BatchNormalization" not in [n.op_type for n in engine.graph.nodes]
    assert "ChannelAffine" not in [n.op_type for n in engine.graph.nodes]
    x = rng.standard_normal((1, c, 5, 6), dtype=np.float32)
    np.testing.assert_allclose(engine.run(None, {"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-5)
