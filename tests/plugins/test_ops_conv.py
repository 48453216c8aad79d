"""minfer-ops-conv kernels against onnxruntime (random shapes/attributes) and onnx's node cases."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from minfer_core import KernelContext, TensorType
from minfer_ops_conv.plugin import KERNELS

ort = pytest.importorskip("onnxruntime")

SETTINGS = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def pick_kernel(op_type: str, opset: int):
    """The kernel the engine would select: largest since not above the opset."""
    cands = [k for k in KERNELS if k.op_type == op_type and k.since <= opset]
    return max(cands, key=lambda k: k.since)


def run_kernel(op_type, opset, inputs, attrs, *, constant_weights=True, num_outputs=1):
    """Call a kernel as the engine does: the factory once (weights as constants), then the callable."""
    k = pick_kernel(op_type, opset)
    if not k.prepare:
        return k.fn(*inputs, **attrs)
    consts = tuple(a if (i > 0 and constant_weights) else None for i, a in enumerate(inputs))
    types = tuple(None if a is None else TensorType(a.dtype, a.shape) for a in inputs)
    ctx = KernelContext("n", op_type, opset, types, (None,) * num_outputs, consts, num_outputs)
    return k.fn(ctx, **attrs)(*inputs)


def run_ort(op_type, opset, inputs, attrs, num_outputs=1, out_types=()):
    """The same single node run by onnxruntime with 2 threads; None inputs are left out (empty names)."""
    names = ["" if a is None else f"i{i}" for i, a in enumerate(inputs)]
    feeds = {n: a for n, a in zip(names, inputs) if a is not None}
    outs = [f"o{i}" for i in range(num_outputs)]
    dtype = helper.np_dtype_to_tensor_dtype(inputs[0].dtype)
    out_types = list(out_types) + [dtype] * (num_outputs - len(out_types))
    node = helper.make_node(op_type, names, outs, **attrs)
    graph = helper.make_graph(
        [node],
        "g",
        [helper.make_tensor_value_info(n, helper.np_dtype_to_tensor_dtype(a.dtype), a.shape) for n, a in feeds.items()],
        [helper.make_tensor_value_info(o, t, None) for o, t in zip(outs, out_types)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 10  # onnxruntime refuses the IR version onnx 1.23 stamps
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    return sess.run(None, feeds)


@st.composite
def conv_cases(draw):
    """A random valid Conv: rank 1-3, groups (depthwise included), strides, dilations, pads or auto_pad."""
    rank = draw(st.sampled_from([1, 2, 2, 2, 3]))
    group = draw(st.sampled_from([1, 1, 2, 3]))
    depthwise = draw(st.booleans()) and rank == 2
    cg = 1 if depthwise else draw(st.integers(1, 3))
    mg = 1 if depthwise else draw(st.integers(1, 3))
    if depthwise:
        group = draw(st.integers(2, 6))
    kernel = [draw(st.integers(1, 3)) for _ in range(rank)]
    dil = [draw(st.sampled_from([1, 1, 2])) for _ in range(rank)]
    strides = [draw(st.sampled_from([1, 1, 2, 3])) for _ in range(rank)]
    spatial = [draw(st.integers((k - 1) * d + 1, (k - 1) * d + 7)) for k, d in zip(kernel, dil)]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto_pad.startswith("SAME"):
        dil = [1] * rank  # onnxruntime refuses dilated SAME convs
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dil, "group": group}
    if auto_pad == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel * 2]
    else:
        attrs["auto_pad"] = auto_pad
    batch = draw(st.integers(1, 2))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    x = rng.standard_normal([batch, cg * group] + spatial).astype(np.float32)
    w = rng.standard_normal([mg * group, cg] + kernel).astype(np.float32)
    inputs = [x, w]
    if draw(st.booleans()):
        inputs.append(rng.standard_normal(mg * group).astype(np.float32))
    return inputs, attrs


@SETTINGS
@given(conv_cases(), st.booleans())
def test_conv_matches_onnxruntime(case, constant_weights):
    """Conv equals onnxruntime for any rank, group, stride, dilation, pad and auto_pad, weights constant or not."""
    inputs, attrs = case
    got = run_kernel("Conv", 11, inputs, attrs, constant_weights=constant_weights)
    want = run_ort("Conv", 11, inputs, attrs)[0]
    assert got.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@st.composite
def pool_cases(draw):
    """A random valid pool: rank 1-3, strides, dilations, pads or auto_pad, ceil_mode."""
    rank = draw(st.sampled_from([1, 2, 2, 3]))
    kernel = [draw(st.integers(1, 3)) for _ in range(rank)]
    dil = [draw(st.sampled_from([1, 1, 2])) for _ in range(rank)]
    strides = [draw(st.sampled_from([1, 2, 3])) for _ in range(rank)]
    spatial = [draw(st.integers((k - 1) * d + 1, (k - 1) * d + 6)) for k, d in zip(kernel, dil)]
    auto_pad = draw(st.sampled_from(["NOTSET", "NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID"]))
    if auto_pad.startswith("SAME"):
        dil = [1] * rank  # onnxruntime pads dilated SAME pools against the spec's output size
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dil}
    if auto_pad == "NOTSET":
        attrs["pads"] = [draw(st.integers(0, k // 2)) for k in kernel * 2]
        attrs["ceil_mode"] = draw(st.sampled_from([0, 1]))
    else:
        attrs["auto_pad"] = auto_pad
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    x = rng.standard_normal([draw(st.integers(1, 2)), draw(st.integers(1, 3))] + spatial).astype(np.float32)
    return x, attrs


@SETTINGS
@given(pool_cases())
def test_max_pool_matches_onnxruntime(case):
    """MaxPool values and Indices equal onnxruntime's for random windows, pads, dilations and ceil_mode."""
    x, attrs = case
    if any(d > 1 for d in attrs["dilations"]):
        attrs["storage_order"] = 0
    got = run_kernel("MaxPool", 12, [x], attrs, num_outputs=2)
    want = run_ort("MaxPool", 12, [x], attrs, num_outputs=2, out_types=[TensorProto.FLOAT, TensorProto.INT64])
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])


@SETTINGS
@given(pool_cases(), st.sampled_from([0, 1]))
def test_average_pool_matches_onnxruntime(case, count_include_pad):
    """AveragePool equals onnxruntime for random windows, pads, ceil_mode and count_include_pad."""
    x, attrs = case
    attrs["count_include_pad"] = count_include_pad
    got = run_kernel("AveragePool", 19, [x], attrs)
    want = run_ort("AveragePool", 19, [x], attrs)[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


@st.composite
def conv_transpose_cases(draw):
    """A random valid ConvTranspose: rank 1-3, groups, strides, dilations, pads, output_padding or output_shape."""
    rank = draw(st.sampled_from([1, 2, 2, 3]))
    group = draw(st.sampled_from([1, 1, 2]))
    cg, mg = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    kernel = [draw(st.integers(1, 3)) for _ in range(rank)]
    dil = [draw(st.sampled_from([1, 1, 2])) for _ in range(rank)]
    strides = [draw(st.sampled_from([1, 2, 3])) for _ in range(rank)]
    spatial = [draw(st.integers(1, 5)) for _ in range(rank)]
    attrs = {"kernel_shape": kernel, "strides": strides, "dilations": dil, "group": group}
    mode = draw(st.sampled_from(["pads", "pads", "output_shape", "SAME_UPPER", "SAME_LOWER"]))
    if mode == "pads":
        attrs["pads"] = [draw(st.integers(0, k - 1)) for k in kernel * 2]
        attrs["output_padding"] = [draw(st.integers(0, s - 1)) for s in strides]
        full = [s * (i - 1) + (k - 1) * d + 1 for s, i, k, d in zip(strides, spatial, kernel, dil)]
        assume(all(f - attrs["pads"][j] - attrs["pads"][j + rank] > 0 for j, f in enumerate(full)))
    elif mode == "output_shape":
        full = [s * (i - 1) + (k - 1) * d + 1 for s, i, k, d in zip(strides, spatial, kernel, dil)]
        attrs["output_shape"] = [f - draw(st.integers(0, min(f - 1, 2))) for f in full]
    else:
        attrs["auto_pad"] = mode
        attrs["dilations"] = [1] * rank
        # stride > kernel: onnxruntime clamps the negative total pad, the spec (kept here) gives in*stride
        attrs["strides"] = [min(s, k) for s, k in zip(strides, kernel)]
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    x = rng.standard_normal([draw(st.integers(1, 2)), cg * group] + spatial).astype(np.float32)
    w = rng.standard_normal([cg * group, mg] + kernel).astype(np.float32)
    inputs = [x, w]
    if draw(st.booleans()):
        inputs.append(rng.standard_normal(mg * group).astype(np.float32))
    return inputs, attrs


@SETTINGS
@given(conv_transpose_cases(), st.booleans())
def test_conv_transpose_matches_onnxruntime(case, constant_weights):
    """ConvTranspose equals onnxruntime for any rank, group, stride, dilation, pads, output_padding/shape, SAME."""
    inputs, attrs = case
    got = run_kernel("ConvTranspose", 11, inputs, attrs, constant_weights=constant_weights)
    want = run_ort("ConvTranspose", 11, inputs, attrs)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@st.composite
def resize_cases(draw):
    """A random 4-D Resize-19 driven by sizes: every mode, coordinate mode and nearest_mode."""
    rank = 4  # onnxruntime's cubic and linear kernels want NCHW
    shape = [1, draw(st.integers(1, 2))] + [draw(st.integers(1, 6)) for _ in range(rank - 2)]
    sizes = shape[:2] + [draw(st.integers(1, 9)) for _ in range(rank - 2)]
    mode = draw(st.sampled_from(["nearest", "linear", "cubic"]))
    attrs = {
        "mode": mode,
        "coordinate_transformation_mode": draw(st.sampled_from(
            ["half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "half_pixel_symmetric"])),
    }
    if mode == "nearest":
        attrs["nearest_mode"] = draw(st.sampled_from(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"]))
    else:
        # no antialias: at the borders onnxruntime clips the filter window to the image while
        # onnx's reference (and the node cases we follow) clamps the taps' indices
        if mode == "cubic":
            attrs["exclude_outside"] = draw(st.sampled_from([0, 1]))
            attrs["cubic_coeff_a"] = draw(st.sampled_from([-0.75, -0.5]))
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    x = rng.standard_normal(shape).astype(np.float32)
    return [x, None, None, np.array(sizes, np.int64)], attrs


@SETTINGS
@given(resize_cases())
def test_resize_matches_onnxruntime(case):
    """Resize-19 with sizes equals onnxruntime for every mode and coordinate transformation."""
    inputs, attrs = case
    got = run_kernel("Resize", 19, inputs, attrs)
    want = run_ort("Resize", 19, inputs, attrs)[0]
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)
