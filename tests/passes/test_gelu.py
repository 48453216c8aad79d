"""gelu_fusion and ai.minfer::Gelu: which spellings fuse, how close the kernel is to the exact GELU.

The kernel's polynomial was fitted with this (float64, then rounded to float32)::

    t = np.linspace(1e-4, 4 * sqrt(2), 60000); ec = erfc(t / sqrt(2))
    target = -log(ec) / t;  w = 0.5 * t * t * ec     # d gelu / d P
    repeat 150 times: c = lstsq(vander(t, 6) * w, target * w)
                      err = 0.5 * t * (exp(-t * poly(c, t)) - ec); w *= sqrt(max(|err| / max|err|, 1e-3))
    P = -c
"""

from __future__ import annotations

import math

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import minfer_core
from minfer_passes.gelu import gelu32

_erfc = np.vectorize(math.erfc, otypes=[np.float64])


def _exact(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return 0.5 * x * _erfc(-x / math.sqrt(2))


def test_kernel_is_within_3e_7_of_the_exact_gelu_everywhere():
    x = np.concatenate([np.linspace(-12, 12, 400_001), np.geomspace(1e-30, 1e4, 2000), -np.geomspace(1e-30, 1e4, 2000),
                        [0.0, -0.0, 3.4e38, -3.4e38]]).astype(np.float32)
    err = np.abs(gelu32(x).astype(np.float64) - _exact(x))
    assert err.max() <= 3.2e-7, (x[err.argmax()], err.max())
    small = (np.abs(x) < 1e-3) & (x != 0)  # near 0 (gelu(x) ~ x / 2): relative accuracy too
    assert np.allclose(gelu32(x[small]), _exact(x[small]), rtol=1e-6, atol=0)


def test_kernel_special_values_and_in_place():
    x = np.array([np.nan, np.inf, -np.inf, 0.0, 1.0, -1.0], np.float32)
    y = gelu32(x)
    assert np.isnan(y[0]) and y[1] == np.inf
    assert abs(y[2]) < 1e-7  # the limit (the Erf spelling gives -inf * 0 = nan there)
    assert y[3] == 0
    big = np.random.default_rng(0).standard_normal(100_000).astype(np.float32) * 3  # several blocks
    expected = gelu32(big)
    gelu32(big, big)  # out may be x
    assert np.array_equal(big, expected)


@pytest.mark.parametrize("in_place", [False, True])
def test_kernel_split_over_two_threads_gives_the_same_bits(in_place):
    """Past 2 x SPLIT elements the ranges go to the intra-op threads (an odd size leaves a short last range)."""
    from minfer_core.parallel import using_threads
    from minfer_passes import gelu as gelu_module

    n = 2 * gelu_module.SPLIT + 12_345
    x = (np.random.default_rng(1).standard_normal(n) * 3).astype(np.float32).reshape(1, -1)
    expected = np.concatenate([gelu32(part) for part in np.array_split(x.reshape(-1), 7)]).reshape(x.shape)
    with using_threads(2):
        y = x.copy() if in_place else np.empty_like(x)
        got = gelu32(y if in_place else x, y)
    assert got is y and np.array_equal(y, expected)


def _block(spelling: str, dtype: int = TensorProto.FLOAT, shape: tuple[int, ...] = (2, 8, 16)) -> onnx.ModelProto:
    np_dtype = helper.tensor_dtype_to_np_dtype(dtype)
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np_dtype), name)  # noqa: E731
    inits = [c("r2", math.sqrt(2)), c("inv_r2", math.sqrt(0.5)), c("one", 1.0), c("half", 0.5)]
    n = helper.make_node
    if spelling == "torch":  # torch.onnx's nn.GELU(): Div, Erf, Add, Mul(x, .), Mul(., 0.5)
        nodes = [n("Div", ["x", "r2"], ["s"]), n("Erf", ["s"], ["e"]), n("Add", ["e", "one"], ["a"]),
                 n("Mul", ["x", "a"], ["m"]), n("Mul", ["m", "half"], ["y"])]
    elif spelling == "half_first":  # (x * 0.5) * (1 + erf(x * (1/sqrt 2)))
        nodes = [n("Mul", ["x", "half"], ["h"]), n("Mul", ["inv_r2", "x"], ["s"]), n("Erf", ["s"], ["e"]),
                 n("Add", ["one", "e"], ["a"]), n("Mul", ["a", "h"], ["y"])]
    else:  # x * ((1 + erf) * 0.5)
        nodes = [n("Div", ["x", "r2"], ["s"]), n("Erf", ["s"], ["e"]), n("Add", ["e", "one"], ["a"]),
                 n("Mul", ["a", "half"], ["m"]), n("Mul", ["x", "m"], ["y"])]
    graph = helper.make_graph(nodes, "gelu", [helper.make_tensor_value_info("x", dtype, list(shape))],
                              [helper.make_tensor_value_info("y", dtype, list(shape))], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


@pytest.mark.parametrize("spelling", ["torch", "half_first", "inner_half"])
def test_each_exporter_spelling_fuses_to_one_node_and_matches(spelling):
    model = _block(spelling)
    x = (np.random.default_rng(1).standard_normal((2, 8, 16)) * 4).astype(np.float32)
    sess = minfer_core.InferenceSession(model.SerializeToString(), passes="all")
    assert [(n.domain, n.op_type) for n in sess.graph.nodes] == [("ai.minfer", "Gelu")]
    plain = minfer_core.InferenceSession(model.SerializeToString(), passes="none")
    (y,), (ref,) = sess.run(None, {"x": x}), plain.run(None, {"x": x})
    assert np.allclose(y, ref, rtol=1e-5, atol=1e-6)
    assert np.abs(y.astype(np.float64) - _exact(x)).max() <= 3.2e-7


def test_float64_and_off_constants_keep_their_erf():
    f64 = minfer_core.InferenceSession(_block("torch", TensorProto.DOUBLE).SerializeToString(), passes="all")
    # elementwise_fusion may take the chain: its Erf step runs the precise registered Erf kernel
    ops = {n.op_type for n in f64.graph.nodes} | {s for n in f64.graph.nodes if n.op_type == "FusedElementwise"
                                                  for s in n.attrs["ops"]}
    assert "Erf" in ops and "Gelu" not in ops
    off = _block("torch")
    off.graph.initializer[0].CopyFrom(numpy_helper.from_array(np.asarray(1.5, np.float32), "r2"))
    sess = minfer_core.InferenceSession(off.SerializeToString(), passes="all")
    assert "Gelu" not in {n.op_type for n in sess.graph.nodes}


def test_an_intermediate_read_elsewhere_stops_the_fusion():
    model = _block("torch")
    model.graph.output.append(helper.make_tensor_value_info("e", TensorProto.FLOAT, [2, 8, 16]))
    sess = minfer_core.InferenceSession(model.SerializeToString(), passes="all")
    assert "Gelu" not in {n.op_type for n in sess.graph.nodes}


def test_the_benchmark_transformer_block_fuses_its_gelu_and_matches_onnxruntime():
    ort = pytest.importorskip("onnxruntime")
    from bench.models import transformer_block

    model = transformer_block(2, seq=16)
    x = np.random.default_rng(2).standard_normal((2, 16, 256)).astype(np.float32)
    sess = minfer_core.InferenceSession(model, passes="all")
    ops = [n.op_type for n in sess.graph.nodes]
    # matmul_bias_fusion then takes the Gelu into the MLP's first linear layer as its activation
    activations = [n.attrs.get("activation") for n in sess.graph.nodes if n.op_type == "FusedMatMulBias"]
    assert ("Gelu" in ops or "Gelu" in activations) and "Erf" not in ops
    (y,) = sess.run(None, {"x": x})
    (ref,) = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.allclose(y, ref, rtol=1e-3, atol=1e-4)


def test_portable_lowering_runs_in_onnxruntime(tmp_path):
    ort = pytest.importorskip("onnxruntime")
    from minfer_core.cli import main

    src, dst = tmp_path / "gelu.onnx", tmp_path / "portable.onnx"
    onnx.save(_block("half_first"), str(src))
    assert main(["optimize", str(src), str(tmp_path / "fused.onnx")]) == 0
    assert "Gelu" in {n.op_type for n in onnx.load(str(tmp_path / "fused.onnx")).graph.node}
    assert main(["optimize", str(src), str(dst), "--portable"]) == 0
    portable = onnx.load(str(dst))
    assert {n.domain for n in portable.graph.node} == {""}
    portable.ir_version = 10
    x = (np.random.default_rng(3).standard_normal((2, 8, 16)) * 4).astype(np.float32)
    (y,) = ort.InferenceSession(portable.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"x": x})
    assert np.allclose(y, _exact(x), rtol=1e-5, atol=1e-6)
