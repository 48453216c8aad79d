"""qdq_integer_conv: a QDQ conv group runs on exact integers, as onnxruntime's default level (ORT_ENABLE_ALL) runs it."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from minfer_core import Engine
from modelkit import make_model, onnxruntime_levels, tensor

pytest.importorskip("onnxruntime")


def _tie_model(m: int = 8) -> tuple:
    """x -> Q/DQ -> Conv(1x1, one input channel: no summation order; DQ'd int8 W, DQ'd int32 bias) -> Q/DQ, with
    y_scale = 2 * x_scale * w_scale: each odd integer sum lies on a half step, which the integer path rounds to even
    and the float path (products of rounded dequantized values) to whichever side its rounding errors fall."""
    xs, ws = np.float32(0.0173), np.float32(0.00611)
    ys = np.float32(2) * (xs * ws)  # the integer path's multiplier is 0.5 exactly
    rng = np.random.default_rng(0)
    consts = {"xs": xs, "xz": np.int8(-3), "wq": rng.integers(-127, 128, (m, 1, 1, 1)).astype(np.int8), "ws": ws,
              "wz": np.int8(0), "bq": rng.integers(-50, 50, m).astype(np.int32), "bs": xs * ws, "bz": np.int32(0),
              "ys": ys, "yz": np.int8(5)}
    node = helper.make_node
    nodes = [node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]), node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"]),
             node("DequantizeLinear", ["wq", "ws", "wz"], ["w"]), node("DequantizeLinear", ["bq", "bs", "bz"], ["b"]),
             node("Conv", ["xd", "w", "b"], ["y"]), node("QuantizeLinear", ["y", "ys", "yz"], ["yq"]),
             node("DequantizeLinear", ["yq", "ys", "yz"], ["out"])]
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
    model = make_model(nodes, [tensor("x", [1, 1, 16, 16])], [tensor("out", [1, m, 16, 16])], inits, opset=13)
    # every int8 input value once, as the float its DequantizeLinear gives (QuantizeLinear recovers it exactly)
    x = ((np.arange(-128, 128, dtype=np.float32) - np.float32(-3)) * xs).reshape(1, 1, 16, 16)
    return model, {"x": x}


def test_qdq_conv_group_gives_onnxruntime_default_levels_bits():
    """DequantizeLinear -> Conv (int8 weight, int32 bias) -> QuantizeLinear builds to an integer conv whose output
    equals onnxruntime's ORT_ENABLE_ALL (QLinearConv) bit for bit where ORT_DISABLE_ALL (a float conv) differs."""
    model, feeds = _tie_model()
    disabled, default = onnxruntime_levels(model, feeds)
    assert (disabled != default).sum() > 10  # the case separates the two ways of computing the group
    engine = Engine(model)
    assert [n.op_type for n in engine.graph.nodes] == ["FloatQLinearConv"]
    np.testing.assert_array_equal(engine.run(None, feeds)[0], default)


def test_qdq_conv_group_with_shared_input_stays_float():
    """A group whose input DequantizeLinear another node reads too (a residual) is left to the float path, as
    onnxruntime leaves it: its output then equals ORT_DISABLE_ALL's."""
    model, feeds = _tie_model()
    model.graph.node.append(helper.make_node("Identity", ["xd"], ["xd_copy"]))
    model.graph.output.append(tensor("xd_copy", [1, 1, 16, 16]))
    engine = Engine(model)
    assert "FloatQLinearConv" not in [n.op_type for n in engine.graph.nodes]
    disabled, _ = onnxruntime_levels(model, feeds)
    np.testing.assert_array_equal(engine.run(None, feeds)[0], disabled)


def _shared_model(dtype: type, shared_output: bool = False) -> tuple:
    """x -> Q -> one DequantizeLinear read by two tie-making 1x1 convs (each -> Q/DQ) and by a residual Add, in
    ``dtype`` activations; with ``shared_output``, conv a's output DequantizeLinear is read twice (by the Add too)."""
    m, xs, ws = 8, np.float32(0.0173), np.float32(0.00611)
    xz, yz = (np.asarray(v, dtype) for v in ((125, 7) if dtype == np.uint8 else (-3, 5)))
    rng = np.random.default_rng(1)
    consts = {"xs": xs, "xz": xz, "ws": ws, "wz": np.int8(0), "bs": xs * ws, "bz": np.int32(0),
              "ys": np.float32(2) * (xs * ws), "yz": yz}
    node = helper.make_node
    nodes = [node("QuantizeLinear", ["x", "xs", "xz"], ["xq"]), node("DequantizeLinear", ["xq", "xs", "xz"], ["xd"])]
    for k in "ab":
        consts[f"w{k}"] = rng.integers(-127, 128, (m, 1, 1, 1)).astype(np.int8)
        consts[f"b{k}"] = rng.integers(-50, 50, m).astype(np.int32)
        nodes += [node("DequantizeLinear", [f"w{k}", "ws", "wz"], [f"w{k}d"]),
                  node("DequantizeLinear", [f"b{k}", "bs", "bz"], [f"b{k}d"]),
                  node("Conv", ["xd", f"w{k}d", f"b{k}d"], [f"y{k}"]),
                  node("QuantizeLinear", [f"y{k}", "ys", "yz"], [f"y{k}q"]),
                  node("DequantizeLinear", [f"y{k}q", "ys", "yz"], [f"o{k}"])]
    nodes.append(node("Add", ["ob" if not shared_output else "oa", "xd"], ["s"]))
    inits = [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()]
    outs = [tensor(name, [1, m, 16, 16]) for name in ["oa", "ob", "s"]]
    model = make_model(nodes, [tensor("x", [1, 1, 16, 16])], outs, inits, opset=13)
    info = np.iinfo(dtype)  # every input integer once, as the float its DequantizeLinear gives
    x = ((np.arange(info.min, info.max + 1, dtype=np.float32) - np.float32(xz)) * xs).reshape(1, 1, 16, 16)
    return model, {"x": x}


def _ort_all_outputs(model, feeds: dict) -> list[list[np.ndarray]]:
    """Every output of onnxruntime at ORT_DISABLE_ALL, then at ORT_ENABLE_ALL."""
    import onnxruntime as ort

    outs = []
    for level in [ort.GraphOptimizationLevel.ORT_DISABLE_ALL, ort.GraphOptimizationLevel.ORT_ENABLE_ALL]:
        opts = ort.SessionOptions()
        opts.graph_optimization_level, opts.log_severity_level = level, 3
        outs.append(ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
                    .run(None, feeds))
    return outs


def _assert_as_default_level(model, feeds: dict, integer_convs: int) -> None:
    """minfer builds ``integer_convs`` FloatQLinearConvs and gives every output of onnxruntime's default level."""
    engine = Engine(model)
    assert [n.op_type for n in engine.graph.nodes].count("FloatQLinearConv") == integer_convs
    disabled, default = _ort_all_outputs(model, feeds)
    for got, want in zip(engine.run(None, feeds), default):
        np.testing.assert_array_equal(got, want)


def test_uint8_dequantize_shared_by_two_convs_and_an_add_gives_each_conv_an_integer_conv():
    """A uint8 DequantizeLinear read by two convs and an Add: onnxruntime gives each reader its own copy and fuses
    both convs; minfer makes both FloatQLinearConv, every output equal to ORT_ENABLE_ALL's bit for bit."""
    model, feeds = _shared_model(np.uint8)
    disabled, default = _ort_all_outputs(model, feeds)
    assert all((d != e).sum() > 10 for d, e in zip(disabled[:2], default[:2]))  # both convs fused in onnxruntime
    _assert_as_default_level(model, feeds, integer_convs=2)


def test_int8_dequantize_shared_by_two_convs_stays_float_as_in_onnxruntime():
    """The same graph in int8: on x86 onnxruntime rewrites an int8 Q/DQ pair to uint8 only where the Q feeds one DQ
    read once, so X stays int8 against a uint8 Y and neither conv fuses; minfer keeps both float, equal bit for bit."""
    model, feeds = _shared_model(np.int8)
    disabled, default = _ort_all_outputs(model, feeds)
    assert all(np.array_equal(d, e) for d, e in zip(disabled, default))  # onnxruntime fuses nothing here
    _assert_as_default_level(model, feeds, integer_convs=0)


def test_int8_conv_whose_output_dequantize_is_shared_stays_float():
    """An int8 conv whose output Q feeds a DequantizeLinear two nodes read (squeezenet's squeeze convs) is not fused
    by onnxruntime (its Y stays int8); minfer keeps it float too, every output equal to ORT_ENABLE_ALL's."""
    model, feeds = _tie_model()
    model.graph.node.append(helper.make_node("Identity", ["out"], ["out_copy"]))
    model.graph.node.append(helper.make_node("Neg", ["out"], ["out_neg"]))
    model.graph.output.extend([tensor("out_copy", [1, 8, 16, 16]), tensor("out_neg", [1, 8, 16, 16])])
    _assert_as_default_level(model, feeds, integer_convs=0)
