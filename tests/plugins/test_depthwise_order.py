"""minfer-ops-numba's depthwise Conv sums its taps in onnxruntime's order: the same bits as its MLAS Conv.

onnxruntime's CPU Conv (the node's kernel at ORT_DISABLE_ALL and ORT_ENABLE_BASIC) expands a depthwise conv's
taps into a matrix and multiplies it by the weights with MLAS's one-row matrix kernel: (ky, kx) order in runs of
four taps, a run's products added left to right, then the run's sum added to the total, the taps left over as a
run of two and then of one, the bias last, each product and sum rounded on its own (loops.py's docstring). Both
numba kernels the core times against each other compute that, at any stride, pad, dilation and kernel size: a
model quantized per tensor then rounds the depthwise conv's output to onnxruntime's integers.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")
ort = pytest.importorskip("onnxruntime")

from minfer_core import KernelContext, TensorType  # noqa: E402
from minfer_ops_numba import channels, depthwise  # noqa: E402
from modelkit import make_model, tensor  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py

CASES = [  # (N, C, H, W), kernel, strides, pads, dilations: taps in runs of 4+4+1, 4x6+1, 4x12+1, 4x4, 4+2, 2+1
    ((1, 16, 20, 20), (3, 3), (1, 1), [1, 1, 1, 1], (1, 1)),
    ((2, 16, 21, 19), (3, 3), (2, 2), [1, 1, 1, 1], (1, 1)),
    ((1, 16, 14, 14), (5, 5), (1, 1), [2, 2, 2, 2], (1, 1)),
    ((1, 16, 23, 23), (5, 5), (2, 2), [2, 2, 2, 2], (1, 1)),
    ((1, 8, 12, 12), (7, 7), (1, 1), [3, 3, 3, 3], (1, 1)),
    ((1, 8, 15, 16), (3, 3), (1, 1), [1, 0, 2, 1], (2, 2)),
    ((1, 8, 12, 13), (4, 4), (2, 2), [3, 1, 0, 2], (1, 1)),
    ((1, 8, 12, 12), (2, 3), (1, 1), [0, 1, 1, 0], (1, 1)),
    ((1, 8, 12, 12), (3, 1), (2, 1), [1, 0, 1, 0], (1, 1)),
]


def onnxruntime_conv(x: np.ndarray, w: np.ndarray, b: np.ndarray, attrs: dict) -> np.ndarray:
    """The Conv as onnxruntime computes it with every graph optimization off (MLAS's Conv kernel)."""
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    model = make_model([node], [tensor("x", list(x.shape))], [tensor("y", None, TensorProto.FLOAT)], inits, opset=13)
    opts = ort.SessionOptions()
    opts.graph_optimization_level, opts.log_severity_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL, 3
    sess = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return sess.run(None, {"x": x})[0]


@pytest.mark.parametrize("kern", [depthwise.conv, depthwise.conv_rows, channels.conv_channels],
                         ids=["phase_planes", "row_loops", "channel_blocks"])
@pytest.mark.parametrize("shape, k, s, pads, d", CASES)
def test_depthwise_gives_onnxruntimes_bits(kern, shape, k, s, pads, d):
    """Each numba depthwise kernel gives onnxruntime's bits, bias included, at strides 1 and 2, pads and dilations."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((shape[1], 1) + k).astype(np.float32)
    b = rng.standard_normal(shape[1]).astype(np.float32)
    attrs = dict(group=shape[1], kernel_shape=list(k), strides=list(s), pads=pads, dilations=list(d))
    ctx = KernelContext("node", "Conv", 22, tuple(TensorType(a.dtype, a.shape) for a in (x, w, b)), (None,),
                        (None, w, b), 1)
    assert kern.applies(ctx, attrs)
    got = kern.prepared(ctx, attrs)(x, w, b)
    np.testing.assert_array_equal(got, onnxruntime_conv(x, w, b, attrs))
