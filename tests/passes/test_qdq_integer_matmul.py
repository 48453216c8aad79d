"""qdq_integer_matmul: a QDQ MatMul of a constant 8-bit weight runs on the exact integer product."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from minfer_core import Engine
from minfer_passes.qdq_matmul import STEP
from modelkit import make_model, onnxruntime_levels, tensor

pytest.importorskip("onnxruntime")

K, N = 32, 24


def _model(per_column: bool = False, quantize_out: bool = True, extra: list | None = None,
           weight_input: bool = False) -> object:
    """x -> Q/DQ (uint8) -> MatMul(DQ(int8 W [K, N]), per tensor or per column) [-> Q/DQ], as quantize_static writes
    a linear layer; ``extra`` nodes appended (and their outputs made graph outputs); W a graph input if asked."""
    rng = np.random.default_rng(0)
    ws = (rng.random(N) * 0.01 + 0.002).astype(np.float32) if per_column else np.float32(0.0047)
    inits = [numpy_helper.from_array(np.float32(0.031), "xs"), numpy_helper.from_array(np.uint8(131), "xz"),
             numpy_helper.from_array(np.asarray(ws), "ws"),
             numpy_helper.from_array(np.zeros(np.shape(ws), np.int8), "wz"),
             numpy_helper.from_array(np.float32(0.02), "ys"), numpy_helper.from_array(np.uint8(120), "yz")]
    inputs = [tensor("x", [2, 5, K])]
    if weight_input:
        inputs.append(tensor("wq", [K, N], TensorProto.INT8))
    else:
        inits.append(numpy_helper.from_array(rng.integers(-127, 128, (K, N)).astype(np.int8), "wq"))
    node = helper.make_node
    nodes = [node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]), node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             node("DequantizeLinear", ["wq", "ws", "wz"], ["w"], axis=1), node("MatMul", ["xd", "w"], ["m"])]
    out = "m"
    if quantize_out:
        nodes += [node("QuantizeLinear", ["m", "ys", "yz"], ["mq"]),
                  node("DequantizeLinear", ["mq", "ys", "yz"], ["y"])]
        out = "y"
    outputs = [tensor(out, [2, 5, N])]
    for extra_node, shape in extra or []:
        nodes.append(extra_node)
        outputs.append(tensor(extra_node.output[0], shape))
    return make_model(nodes, inputs, outputs, inits, opset=13)


def _feeds(weight: bool = False) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(1)
    feeds = {"x": (2 * rng.standard_normal((2, 5, K))).astype(np.float32)}
    if weight:
        feeds["wq"] = rng.integers(-127, 128, (K, N)).astype(np.int8)
    return feeds


def _ops(engine: Engine) -> list[str]:
    return [n.op_type for n in engine.graph.nodes]


@pytest.mark.parametrize("per_column", [False, True])
@pytest.mark.parametrize("quantize_out", [True, False])
def test_qdq_matmul_becomes_scaled_matmul_integer_within_tolerance(per_column, quantize_out):
    """A QDQ MatMul of a constant int8 weight builds to one ScaledMatMulInteger (per column: and a Mul), no
    DequantizeLinear or float MatMul left, and its output stays within one output step of the unrewritten graph and
    of onnxruntime's two levels (bit-equal to ORT_ENABLE_ALL's integer form where no rounding follows)."""
    model, feeds = _model(per_column, quantize_out), _feeds()
    engine = Engine(model)
    ops = _ops(engine)
    assert ops.count("ScaledMatMulInteger") == 1 and ops.count("Mul") == int(per_column)
    assert not {"MatMul", "DequantMatMul", "DequantizeLinear"} & set(ops)
    got = engine.run(None, feeds)[0]
    plain = Engine(model, disabled_passes=["qdq_integer_matmul"])
    assert "ScaledMatMulInteger" not in _ops(plain)
    tolerance = STEP if quantize_out else 1e-5 * float(np.abs(got).max())
    for want in [plain.run(None, feeds)[0], *onnxruntime_levels(model, feeds)]:
        assert float(np.abs(got - want).max()) <= tolerance


def test_unquantized_matmul_equals_integer_sums_times_scale():
    """Without a rounding after it, the output is float32(exact integer sums) * float32(x_scale * w_scale): the
    integers are recomputed here in int64 (the float graph's summation order would differ by ulps)."""
    model, feeds = _model(quantize_out=False), _feeds()
    got = Engine(model).run(None, feeds)[0]
    xs, xz, ws = np.float32(0.031), 131, np.float32(0.0047)
    xq = np.clip(np.rint(feeds["x"] / xs) + xz, 0, 255).astype(np.int64) - xz
    wq = np.random.default_rng(0).integers(-127, 128, (K, N)).astype(np.int64)
    np.testing.assert_array_equal(got, (xq @ wq).astype(np.float32) * (xs * ws))


def test_shared_activation_dequantize_still_rewrites_and_stays_for_its_other_reader():
    """x's DequantizeLinear read by another node too (a transformer's Q, K and V read one): the MatMul reads the
    integers anyway, and the DequantizeLinear stays for the other reader."""
    model = _model(extra=[(helper.make_node("Relu", ["xd"], ["other"]), [2, 5, K])])
    engine = Engine(model)
    assert "ScaledMatMulInteger" in _ops(engine)
    feeds = _feeds()
    np.testing.assert_array_equal(engine.run(None, feeds)[1], Engine(model, passes="none").run(None, feeds)[1])


def test_weight_read_elsewhere_or_not_constant_is_left_alone():
    """A weight DequantizeLinear another node reads too (the float weight is needed anyway), or a weight that is a
    graph input (not constant), leaves the MatMul to the float path."""
    shared = _model(extra=[(helper.make_node("Relu", ["w"], ["w_relu"]), [K, N])])
    assert "ScaledMatMulInteger" not in _ops(Engine(shared))
    computed = _model(weight_input=True)
    engine = Engine(computed)
    assert "ScaledMatMulInteger" not in _ops(engine)
    feeds = _feeds(weight=True)
    np.testing.assert_array_equal(engine.run(None, feeds)[0], Engine(computed, passes="none").run(None, feeds)[0])


def test_portable_lowering_runs_in_onnxruntime(tmp_path, capsys):
    """`minfer optimize --portable` lowers the ScaledMatMulInteger back to standard ops, whose output onnxruntime
    gives within one output step of minfer's."""
    import onnx

    from minfer_core.cli import main

    model, feeds = _model(per_column=True), _feeds()
    onnx.save(model, str(tmp_path / "m.onnx"))
    assert main(["optimize", str(tmp_path / "m.onnx"), str(tmp_path / "p.onnx"), "--portable"]) == 0
    assert "qdq_integer_matmul" in capsys.readouterr().out
    lowered = onnx.load(str(tmp_path / "p.onnx"))
    assert {n.domain for n in lowered.graph.node} == {""}
    got = Engine(model).run(None, feeds)[0]
    for want in onnxruntime_levels(lowered, feeds):
        assert float(np.abs(got - want).max()) <= STEP
