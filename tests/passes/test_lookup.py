"""lookup_fusion: elementwise chains on an 8-bit value or a rounding's grid as one table lookup, exactly."""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from hypothesis import given, settings
from onnx import TensorProto, helper, numpy_helper

from minfer_core import Engine, get_registry
from minfer_core.testing.checks import check_pass
from minfer_passes import lookup
from modelkit import make_model, tensor

MS = "com.microsoft"


def _pass(name):
    return next(p for p in get_registry().passes if p.name == name)


def _scalars(inits, **values):
    for name, value in values.items():
        inits.append(numpy_helper.from_array(np.asarray(value), name))


def _qoperator_gelu(shape=(2, 3, 50)) -> onnx.ModelProto:
    """uint8 x -> DequantizeLinear -> Div sqrt 2 -> Erf -> QuantizeLinear -> QLinearAdd 1 -> QLinearMul(x, .) ->
    QLinearMul 0.5: the GELU of a QOperator transformer, as quantize_static writes it."""
    inits: list = []
    _scalars(inits, xs=np.float32(0.03), xz=np.uint8(120), sqrt2=np.float32(math.sqrt(2)), es=np.float32(0.008),
             ez=np.uint8(128), one=np.uint8(255), ones=np.float32(1 / 255), onez=np.uint8(0), a_s=np.float32(0.008),
             az=np.uint8(0), ms=np.float32(0.04), mz=np.uint8(30), half=np.uint8(255), halfs=np.float32(0.5 / 255),
             halfz=np.uint8(0), ys=np.float32(0.02), yz=np.uint8(30))
    nodes = [
        helper.make_node("DequantizeLinear", ["x", "xs", "xz"], ["xf"]),
        helper.make_node("Div", ["xf", "sqrt2"], ["d"]),
        helper.make_node("Erf", ["d"], ["e"]),
        helper.make_node("QuantizeLinear", ["e", "es", "ez"], ["eq"]),
        helper.make_node("QLinearAdd", ["eq", "es", "ez", "one", "ones", "onez", "a_s", "az"], ["aq"], domain=MS),
        helper.make_node("QLinearMul", ["x", "xs", "xz", "aq", "a_s", "az", "ms", "mz"], ["mq"], domain=MS),
        helper.make_node("QLinearMul", ["mq", "ms", "mz", "half", "halfs", "halfz", "ys", "yz"], ["y"], domain=MS),
    ]
    io = [tensor("x", list(shape), TensorProto.UINT8)], [tensor("y", list(shape), TensorProto.UINT8)]
    return make_model(nodes, *io, inits, opset=13, extra_opsets=[helper.make_opsetid(MS, 1)])


def _every_value(shape, dtype=np.uint8) -> np.ndarray:
    """Each of the 256 values at least once, in a scrambled order."""
    info = np.iinfo(dtype)
    values = np.resize(np.arange(info.min, info.max + 1), int(np.prod(shape))).astype(dtype)
    return np.random.default_rng(0).permutation(values).reshape(shape)


@settings(max_examples=40, deadline=None)
@given(lookup.patterns())
def test_pass_keeps_outputs_exactly(graph):
    """lookup_fusion keeps the outputs of elementwise chains on 8-bit values and on rounding grids (exact tables)."""
    check_pass(_pass("lookup_fusion"), graph, installed=get_registry().passes)


def test_qoperator_gelu_is_one_lookup_with_the_chains_bits():
    """The QOperator GELU chain (DQ, Div, Erf, Q, QLinearAdd, QLinearMul twice) builds to one Lookup on the uint8
    input: bit for bit what the unfused chain computes in minfer and in onnxruntime."""
    ort = pytest.importorskip("onnxruntime")
    model = _qoperator_gelu()
    x = _every_value((2, 3, 50))
    engine = Engine(model)
    assert [n.op_type for n in engine.graph.nodes] == ["Lookup"]
    got = engine.run(None, {"x": x})[0]
    want = Engine(model, disabled_passes=["lookup_fusion"]).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    oracle = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    np.testing.assert_array_equal(got, oracle.run(None, {"x": x})[0])


def _qdq_chain(read_twice: bool = False) -> onnx.ModelProto:
    """float x -> Q/DQ -> Tanh -> Q/DQ -> Mul(x's grid value, .) -> Q/DQ (and the first DQ also an output when
    ``read_twice``)."""
    inits: list = []
    _scalars(inits, s0=np.float32(0.05), z0=np.int8(3), s1=np.float32(0.01), z1=np.int8(0), s2=np.float32(0.02),
             z2=np.int8(-5))
    nodes = [helper.make_node("QuantizeLinear", ["x", "s0", "z0"], ["q0"]),
             helper.make_node("DequantizeLinear", ["q0", "s0", "z0"], ["d0"]),
             helper.make_node("Tanh", ["d0"], ["t"]),
             helper.make_node("QuantizeLinear", ["t", "s1", "z1"], ["q1"]),
             helper.make_node("DequantizeLinear", ["q1", "s1", "z1"], ["d1"]),
             helper.make_node("Mul", ["d0", "d1"], ["m"]),
             helper.make_node("QuantizeLinear", ["m", "s2", "z2"], ["q2"]),
             helper.make_node("DequantizeLinear", ["q2", "s2", "z2"], ["y"])]
    outputs = [tensor("y", [4, 70])] + ([tensor("d1", [4, 70])] if read_twice else [])
    return make_model(nodes, [tensor("x", [4, 70])], outputs, inits, opset=13)


def _grid_input(seed: int = 1) -> np.ndarray:
    """Values on and between grid points, ties, beyond the 8-bit range, NaN and infinities."""
    x = (np.random.default_rng(seed).standard_normal((4, 70)) * 4).astype(np.float32)
    x[0, :9] = [np.nan, np.inf, -np.inf, 0.025, -0.025, 0.075, 100.0, -100.0, -0.0]
    return x


def test_qdq_chain_on_a_rounding_grid_is_one_lookup():
    """A QDQ model's Tanh, Mul of two grid values and their roundings, read from one rounding's output, build to
    one Lookup of the float input (it rounds as that rounding did); outputs (NaN, infinities, ties included) equal
    the unfused graph's, and onnxruntime's but for NaN."""
    ort = pytest.importorskip("onnxruntime")
    model, x = _qdq_chain(), _grid_input()
    engine = Engine(model)
    assert [n.op_type for n in engine.graph.nodes] == ["Lookup"]  # the first rounding too: the lookup rounds x
    got = engine.run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, Engine(model, disabled_passes=["lookup_fusion"]).run(None, {"x": x})[0])
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    oracle = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    x[0, 0] = 0.0  # onnxruntime's QuantizeLinear saturates NaN where minfer's rounding keeps it
    np.testing.assert_array_equal(engine.run(None, {"x": x})[0], oracle.run(None, {"x": x})[0])


def test_a_chain_read_elsewhere_midway_is_left_alone():
    """A region value that is also a graph output would be a second exit: no Lookup."""
    engine = Engine(_qdq_chain(read_twice=True))
    assert "Lookup" not in {n.op_type for n in engine.graph.nodes}


@pytest.mark.parametrize("make,feed", [(_qoperator_gelu, lambda: {"x": _every_value((2, 3, 50))}),
                                       (_qdq_chain, lambda: {"x": _grid_input()})])
def test_portable_lowering_runs_in_onnxruntime_as_the_original(tmp_path, make, feed):
    """`minfer optimize --portable` writes a Lookup as its index in standard ops and a Gather: onnxruntime computes
    on it exactly what minfer computes on the original model (8-bit and float grid inputs)."""
    ort = pytest.importorskip("onnxruntime")
    from minfer_core.cli import main

    model = make()
    src, dst = tmp_path / "model.onnx", tmp_path / "portable.onnx"
    onnx.save(model, src)
    assert main(["optimize", str(src), str(dst), "--portable"]) == 0
    portable = onnx.load(str(dst))
    portable.ir_version = model.ir_version
    assert "Gather" in {n.op_type for n in portable.graph.node}
    assert {n.domain for n in portable.graph.node} == {""}
    feeds = feed()
    for x in feeds.values():
        x[np.isnan(x)] = 0  # onnxruntime's QuantizeLinear saturates NaN
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    session = ort.InferenceSession(portable.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    got = session.run(None, feeds)[0]
    np.testing.assert_array_equal(got, Engine(model).run(None, feeds)[0])


def test_numpy_kernel_indexes_as_the_definition():
    """Lookup's numpy kernel: T[x - low] for int8; T[clip(rint(x / scale), low, high) - low] for float, NaN to the
    spare last entry."""
    table = np.arange(258, dtype=np.float32) * 10
    x = np.array([-128, -1, 0, 127], np.int8)
    np.testing.assert_array_equal(lookup.lookup.fn(x, table[:256], low=-128.0, high=127.0), [0, 1270, 1280, 2550])
    xf = np.array([0.0, 0.25, 0.75, -1.0, 1e9, -1e9, np.nan, np.inf], np.float32)
    got = lookup.lookup.fn(xf, table[:12], scale=0.5, low=-2.0, high=8.0)
    np.testing.assert_array_equal(got, [20, 20, 40, 0, 100, 0, 110, 100])
