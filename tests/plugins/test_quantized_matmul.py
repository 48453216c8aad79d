"""minfer-ops-basic's MatMulInteger and QLinearMatMul on a computed B: its constant zero point still counts."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from minfer_core import Engine
from modelkit import make_model, ort_run, tensor


@pytest.mark.parametrize("op_type", ["MatMulInteger", "QLinearMatMul"])
def test_constant_b_zero_point_of_a_computed_b_is_applied(op_type):
    """B an input (attention's K) and its zero point a constant read by nothing else: the kernel declares the zero
    point packed, so the engine passes None for it; the kernel keeps it itself (it was dropped: 0 used instead)."""
    rng = np.random.default_rng(0)
    feeds = {"a": rng.integers(0, 256, (2, 5, 7)).astype(np.uint8),
             "b": rng.integers(-128, 128, (2, 7, 3)).astype(np.int8)}
    consts = {"az": np.uint8(131), "bz": np.int8(-16)}
    if op_type == "MatMulInteger":
        node = helper.make_node("MatMulInteger", ["a", "b", "az", "bz"], ["y"])
        out = tensor("y", [2, 5, 3], TensorProto.INT32)
    else:
        consts.update(as_=np.float32(0.02), bs=np.float32(0.01), ys=np.float32(0.05), yz=np.uint8(128))
        node = helper.make_node("QLinearMatMul", ["a", "as_", "az", "b", "bs", "bz", "ys", "yz"], ["y"])
        out = tensor("y", [2, 5, 3], TensorProto.UINT8)
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
    model = make_model([node], [tensor("a", [2, 5, 7], TensorProto.UINT8), tensor("b", [2, 7, 3], TensorProto.INT8)],
                       [out], inits, opset=13)
    np.testing.assert_array_equal(Engine(model).run(None, feeds)[0], ort_run(model, feeds)[0])
