"""A dynamically quantized linear layer (DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul -> Add) runs as one
ai.minfer::ScaledMatMulInteger: bit for bit the unfused nodes (NaN and infinities too, the exact float32 GEMM and
its fallback), with and without minfer-ops-numba, near onnxruntime, and lowered back for --portable."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from modelkit import make_model, ort_run, tensor
from onnx import TensorProto, helper, numpy_helper

from minfer_core import Engine

pytest.importorskip("onnxruntime")
# no module-wide numba_plugin: a run without minfer-ops-numba (MINFER_PLUGINS) checks the numpy path against the
# numpy DynamicQuantizeLinear; the tests taking ``numba_plugin`` check it against the compiled one in every run

RNG = np.random.default_rng(15)
FUSION = "integer_matmul_fusion"


def dynamic_layers(k: int = 16, n: int = 8, layers: int = 1, bias: bool = True, weights: np.ndarray | None = None,
                   w_type: type = np.int8, w_zero_point: int = 0) -> onnx.ModelProto:
    """quantize_dynamic's linear layers on one input x (1, 5, k): one DynamicQuantizeLinear, read by ``layers``
    MatMulInteger -> Cast -> Mul(x_scale * w_scale) [-> Add(bias)] chains, each an output."""
    nodes = [helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "xs", "xz"])]
    inits, outputs = [], []
    for i in range(layers):
        w = weights if weights is not None else RNG.integers(-127, 128, (k, n)).astype(w_type)
        inits += [numpy_helper.from_array(w.astype(w_type), f"w{i}"),
                  numpy_helper.from_array(np.asarray(w_zero_point, w_type), f"wz{i}"),
                  numpy_helper.from_array(np.float32(0.01 + 0.003 * i), f"ws{i}"),
                  numpy_helper.from_array(RNG.uniform(-1, 1, n).astype(np.float32), f"b{i}")]
        last = f"y{i}" if bias else f"out{i}"
        nodes += [helper.make_node("Mul", ["xs", f"ws{i}"], [f"s{i}"]),
                  helper.make_node("MatMulInteger", ["xq", f"w{i}", "xz", f"wz{i}"], [f"acc{i}"]),
                  helper.make_node("Cast", [f"acc{i}"], [f"f{i}"], to=TensorProto.FLOAT),
                  helper.make_node("Mul", [f"f{i}", f"s{i}"], [last])]
        if bias:
            nodes.append(helper.make_node("Add", [last, f"b{i}"], [f"out{i}"]))
        outputs.append(tensor(f"out{i}", None))
    return make_model(nodes, [tensor("x", [1, 5, k])], outputs, inits, opset=13)


def _both(model: onnx.ModelProto, x: np.ndarray) -> tuple[Engine, list[np.ndarray], list[np.ndarray]]:
    engine = Engine(model)
    unfused = Engine(model, disabled_passes=(FUSION,)).run(None, {"x": x})
    return engine, engine.run(None, {"x": x}), unfused


def _ops(engine: Engine) -> list[str]:
    return [n.op_type for n in engine.graph.nodes]


@pytest.mark.parametrize("numba", [False, True])
@pytest.mark.parametrize("w_type, w_zero_point", [(np.int8, 0), (np.uint8, 131)])
@pytest.mark.parametrize("bias", [True, False])
def test_dynamic_layer_is_one_node_with_the_unfused_bits(request, bias, w_type, w_zero_point, numba):
    """One DynamicQuantizeLinear read by one layer: the five nodes become one ScaledMatMulInteger (dynamic_input,
    the bias its input 5) whose output equals the unfused graph's bit for bit (its DynamicQuantizeLinear the
    compiled kernel or, in a run without minfer-ops-numba, numpy's), and onnxruntime's closely."""
    if numba:
        request.getfixturevalue("numba_plugin")
    model = dynamic_layers(bias=bias, w_type=w_type, w_zero_point=w_zero_point)
    x = (2 * RNG.standard_normal((1, 5, 16))).astype(np.float32)
    engine, got, want = _both(model, x)
    assert _ops(engine) == ["ScaledMatMulInteger"], _ops(engine)
    node = engine.graph.nodes[0]
    assert node.attrs.get("dynamic_input") == 1 and len(node.inputs) == (6 if bias else 5)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_shared_dynamic_quantization_stays_and_each_layer_fuses():
    """A DynamicQuantizeLinear read by three layers (a transformer's Q, K, V) stays; each layer's MatMulInteger ->
    Cast -> Mul -> Add becomes one ScaledMatMulInteger reading its outputs, bit for bit the unfused graph."""
    model = dynamic_layers(layers=3)
    x = RNG.standard_normal((1, 5, 16)).astype(np.float32)
    engine, got, want = _both(model, x)
    assert sorted(_ops(engine)).count("ScaledMatMulInteger") == 3 and "MatMulInteger" not in _ops(engine)
    assert "DynamicQuantizeLinear" in _ops(engine) and "Cast" not in _ops(engine)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


@pytest.mark.parametrize("numba", [False, True])
@pytest.mark.parametrize("special", [np.nan, np.inf, -np.inf])
def test_nan_and_infinities_quantize_as_the_unfused_graph(request, special, numba):
    """An input holding NaN or an infinity goes through DynamicQuantizeLinear's own kernel: the fused layer's output
    (NaN where the unfused one has NaN) equals the unfused graph's bit for bit."""
    if numba:
        request.getfixturevalue("numba_plugin")
    model = dynamic_layers()
    x = RNG.standard_normal((1, 5, 16)).astype(np.float32)
    x[0, 2, 3] = special
    with np.errstate(all="ignore"):
        _, got, want = _both(model, x)
    np.testing.assert_array_equal(got[0], want[0])


def test_product_beyond_the_float32_bound_uses_the_exact_fallback():
    """Weights whose column L1 norm times 255 reaches 2**24 (K = 600, every weight -127): the exact int32 fallback,
    still bit for bit the unfused graph (which also falls back), integers beyond float32's exact range included."""
    k = 600
    model = dynamic_layers(k=k, weights=np.full((k, 8), -127, np.int8))
    x = np.abs(RNG.standard_normal((1, 5, k))).astype(np.float32) + 1  # zero point 0: |q| up to 255
    x[0, 0, :] = 1000.0
    _, got, want = _both(model, x)
    assert float(np.abs(got[0]).max()) > 0
    np.testing.assert_array_equal(got[0], want[0])


def test_quantized_input_and_per_run_scale_fuse_without_dynamic_input():
    """MatMulInteger of a uint8 graph input -> Cast -> Mul by a scale fed at run -> Add: one ScaledMatMulInteger
    without dynamic_input, bit for bit the unfused graph."""
    w = RNG.integers(-127, 128, (16, 8)).astype(np.int8)
    nodes = [helper.make_node("MatMulInteger", ["q", "w", "qz"], ["acc"]),
             helper.make_node("Cast", ["acc"], ["f"], to=TensorProto.FLOAT),
             helper.make_node("Mul", ["s", "f"], ["y"]),
             helper.make_node("Add", ["b", "y"], ["out"])]
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.uint8(77), "qz"),
             numpy_helper.from_array(RNG.uniform(-1, 1, (1, 8)).astype(np.float32), "b")]
    model = make_model(nodes, [tensor("q", [3, 16], TensorProto.UINT8), tensor("s", [])], [tensor("out", None)],
                       inits, opset=13)
    feeds = {"q": RNG.integers(0, 256, (3, 16)).astype(np.uint8), "s": np.float32(0.0123)}
    engine = Engine(model)
    assert _ops(engine) == ["ScaledMatMulInteger"] and not engine.graph.nodes[0].attrs.get("dynamic_input")
    want = Engine(model, disabled_passes=(FUSION,)).run(None, feeds)[0]
    np.testing.assert_array_equal(engine.run(None, feeds)[0], want)


def test_intermediate_graph_output_is_not_fused_through():
    """A Cast output that is also a graph output keeps MatMulInteger -> Cast: the pass never fuses through it."""
    model = dynamic_layers()
    model.graph.output.append(tensor("f0", None))
    x = RNG.standard_normal((1, 5, 16)).astype(np.float32)
    engine, got, want = _both(model, x)
    assert "MatMulInteger" in _ops(engine) and "ScaledMatMulInteger" not in _ops(engine)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_onnxruntime_dynamic_model_fuses_exactly(tmp_path):
    """A MatMul + Add model through onnxruntime's quantize_dynamic: every linear layer becomes one
    ScaledMatMulInteger, bit for bit the unfused graph, near onnxruntime on the same quantized model."""
    from modelkit import quantized_by_onnxruntime

    w1, w2 = (RNG.standard_normal(s).astype(np.float32) for s in ((32, 64), (64, 16)))
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["h1"]),
             helper.make_node("Relu", ["h1"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["o"]),
             helper.make_node("Add", ["o", "b2"], ["y"])]
    inits = [numpy_helper.from_array(v, k) for k, v in (("w1", w1), ("w2", w2), ("b1", np.ones(64, np.float32)),
                                                         ("b2", np.zeros(16, np.float32)))]
    model = quantized_by_onnxruntime(make_model(nodes, [tensor("x", [4, 32])], [tensor("y", None)], inits, opset=13),
                                     tmp_path, "dynamic")
    x = RNG.standard_normal((4, 32)).astype(np.float32)
    engine, got, want = _both(model, x)
    assert _ops(engine).count("ScaledMatMulInteger") == 2 and "MatMulInteger" not in _ops(engine), _ops(engine)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_allclose(got[0], ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("layers", [1, 3])
def test_scaled_matmul_integer_lowers_for_portable(tmp_path, layers):
    """`minfer optimize --portable` writes each ScaledMatMulInteger back as standard nodes (DynamicQuantizeLinear and
    the scales' Mul when it took them), which onnxruntime runs to the original model's outputs exactly."""
    from minfer_core.cli import main

    model = dynamic_layers(layers=layers)
    src, dst = tmp_path / "q.onnx", tmp_path / "portable.onnx"
    onnx.save(model, src)
    assert main(["optimize", str(src), str(dst), "--portable"]) == 0
    portable = onnx.load(str(dst))
    portable.ir_version = model.ir_version
    assert {n.domain for n in portable.graph.node} == {""}
    assert "MatMulInteger" in {n.op_type for n in portable.graph.node}
    x = RNG.standard_normal((1, 5, 16)).astype(np.float32)
    for got, want in zip(ort_run(portable, {"x": x}), ort_run(model, {"x": x})):
        np.testing.assert_array_equal(got, want)


def test_rounding_past_the_zero_points_range_is_clipped_as_dynamic_quantize_linear_does():
    """An input whose max quantizes one step beyond 255 - zero point (min -5.365264, max 0.81145114: rint(max / scale)
    is 34, 255 - 222 = 33) is clipped as DynamicQuantizeLinear clips it: bit for bit the unfused graph."""
    model = dynamic_layers()
    x = np.clip(RNG.standard_normal((1, 5, 16)), -1, 0.5).astype(np.float32)
    x[0, 1, 2], x[0, 3, 4] = np.float32(-5.365264), np.float32(0.81145114)
    _, got, want = _both(model, x)
    np.testing.assert_array_equal(got[0], want[0])
