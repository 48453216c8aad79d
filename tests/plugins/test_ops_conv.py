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
    """Call a kernel as the engine does: the factory once (weights as constants), then the callable.

    With constant weights, inputs the kernel declares ``packed`` reach the callable as None.
    """
    k = pick_kernel(op_type, opset)
    if not k.prepare:
        return k.fn(*inputs, **attrs)
    consts = tuple(a if (i > 0 and constant_weights) else None for i, a in enumerate(inputs))
    types = tuple(None if a is None else TensorType(a.dtype, a.shape) for a in inputs)
    ctx = KernelContext("n", op_type, opset, types, (None,) * num_outputs, consts, num_outputs)
    # inputs the kernel declares packed are dropped by the engine once packed: pass None, as it does
    args = [None if (i in k.packed and consts[i] is not None) else a for i, a in enumerate(inputs)]
    return k.fn(ctx, **attrs)(*args)


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
    dtype = np.float32  # onnxruntime's CPU Conv is float32 only; see test_conv_keeps_float_dtypes
    rng = np.random.default_rng(draw(st.integers(0, 2**31)))
    x = rng.standard_normal([batch, cg * group] + spatial).astype(dtype)
    w = rng.standard_normal([mg * group, cg] + kernel).astype(dtype)
    inputs = [x, w]
    if draw(st.booleans()):
        inputs.append(rng.standard_normal(mg * group).astype(dtype))
    return inputs, attrs


@SETTINGS
@given(conv_cases(), st.booleans())
def test_conv_matches_onnxruntime(case, constant_weights):
    """Conv equals onnxruntime for any rank, group, stride, dilation, pad and auto_pad, weights constant or not."""
    inputs, attrs = case
    got = run_kernel("Conv", 11, inputs, attrs, constant_weights=constant_weights)
    want = run_ort("Conv", 11, inputs, attrs)[0]
    assert got.dtype == inputs[0].dtype and got.shape == want.shape
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
@given(pool_cases(), st.sampled_from([0, 1]))
def test_max_pool_matches_onnxruntime(case, storage_order):
    """MaxPool values and Indices (either storage_order) equal onnxruntime's for random windows and pads."""
    x, attrs = case
    if x.ndim == 4 and all(d == 1 for d in attrs["dilations"]):
        attrs["storage_order"] = storage_order  # onnxruntime's column-major indices: 2-D, undilated
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
    mode = draw(st.sampled_from(["nearest", "linear", "cubic"]))
    # nearest picks an index by rounding, so coordinates exactly on a tie would round differently
    # in onnxruntime's float32 and our float64; power-of-two sizes keep every coordinate exact
    lengths = st.sampled_from([1, 2, 4, 8]) if mode == "nearest" else st.integers(1, 9)
    shape = [1, draw(st.integers(1, 2))] + [draw(lengths) for _ in range(rank - 2)]
    sizes = shape[:2] + [draw(lengths) for _ in range(rank - 2)]
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


# -- fast paths: Winograd, im2col slabs, out= -----------------------------------------


def _conv_reference(x, w, pads):
    """Direct float64 convolution (stride 1) by summing shifted taps."""
    kh, kw = w.shape[2:]
    xp = np.pad(x.astype(np.float64), [(0, 0), (0, 0), (pads[0], pads[2]), (pads[1], pads[3])])
    oh, ow = xp.shape[2] - kh + 1, xp.shape[3] - kw + 1
    y = np.zeros((x.shape[0], w.shape[0], oh, ow))
    for i in range(kh):
        for j in range(kw):
            y += np.einsum("mc,nchw->nmhw", w[:, :, i, j].astype(np.float64), xp[:, :, i : i + oh, j : j + ow])
    return y


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("shape,pads", [((2, 16, 13, 11), [1, 1, 1, 1]), ((1, 24, 12, 12), [0, 2, 1, 0]),
                                        ((1, 32, 20, 9), [0, 0, 0, 0])])
def test_winograd_matches_float64_reference(monkeypatch, shape, pads, last):
    """Winograd F(2x2,3x3) (odd sizes, asymmetric pads, several row blocks, channels first or last) is within
    rtol 1e-3 of float64."""
    from minfer_ops_conv import conv, winograd

    monkeypatch.setattr(winograd, "channels_last", lambda channels, tile_columns: last)
    monkeypatch.setattr(winograd, "MIN_TILES", 1)
    monkeypatch.setattr(winograd, "MIN_CHANNELS", 1)
    monkeypatch.setattr(winograd, "MIN_OUT_CHANNELS", 1)
    monkeypatch.setattr(winograd, "BLOCK_BYTES", 16 * (shape[1] + 8) * 8 * 4 * 2)  # about two tile rows a block
    rng = np.random.default_rng(0)
    x = rng.standard_normal(shape).astype(np.float32)
    w = rng.standard_normal((8, shape[1], 3, 3)).astype(np.float32)
    want = _conv_reference(x, w, pads)
    np.testing.assert_allclose(run_kernel("Conv", 11, [x, w], {"pads": pads}), want, rtol=1e-3, atol=1e-3)
    win = conv.geo.window(shape[2:], (3, 3), pads=pads)
    (plan, *_) = [c for c in conv.candidates(win, conv.pack(w, 1, build_time=True), shape[1])
                  if c.__qualname__.startswith("plan")]  # Winograd is a candidate for this shape: test it directly
    got = np.empty_like(want, dtype=np.float32)
    plan(x, conv.pack(w, 1, build_time=True), got, None, None)
    np.testing.assert_allclose(got, want, rtol=1e-3, atol=1e-3)


def test_im2col_slabs_match_onnxruntime(monkeypatch):
    """Copying im2col in many small row slabs gives the same conv as onnxruntime (grouped, strided, dilated)."""
    from minfer_ops_conv import conv

    monkeypatch.setattr(conv, "TILE_BYTES", 1)  # one output row per slab
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 11, 9)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 2)).astype(np.float32)
    attrs = {"group": 2, "strides": [2, 1], "dilations": [1, 2], "pads": [1, 0, 2, 1]}
    np.testing.assert_allclose(run_kernel("Conv", 11, [x, w], attrs), run_ort("Conv", 11, [x, w], attrs)[0],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-5), (np.float16, 2e-2)])
def test_conv_keeps_float_dtypes(dtype, tol):
    """Conv on float64 and float16 returns that dtype and agrees with the float32 result."""
    rng = np.random.default_rng(10)
    x = rng.standard_normal((1, 4, 9, 9)).astype(np.float32)
    w = (rng.standard_normal((6, 2, 3, 3)) * 0.3).astype(np.float32)
    attrs = {"pads": [1, 1, 1, 1], "group": 2, "strides": [2, 1]}
    want = run_kernel("Conv", 11, [x, w], attrs)
    got = run_kernel("Conv", 11, [x.astype(dtype), w.astype(dtype)], attrs)
    assert got.dtype == dtype
    np.testing.assert_allclose(got.astype(np.float32), want, rtol=tol, atol=tol)


def test_conv_writes_into_out_buffer():
    """Given out=, Conv writes its result there (bias included) and returns that very array."""
    k = pick_kernel("Conv", 11)
    rng = np.random.default_rng(2)
    x = rng.standard_normal((1, 4, 8, 8)).astype(np.float32)
    w = rng.standard_normal((5, 4, 3, 3)).astype(np.float32)
    b = rng.standard_normal(5).astype(np.float32)
    ctx = KernelContext("n", "Conv", 11, (None,) * 3, (None,), (None, w, b), 1)
    fn = k.fn(ctx, pads=[1, 1, 1, 1])
    out = np.full((1, 5, 8, 8), np.nan, np.float32)
    assert fn(x, w, b, out=out) is out
    np.testing.assert_allclose(out, run_ort("Conv", 11, [x, w, b], {"pads": [1, 1, 1, 1]})[0], rtol=1e-4, atol=1e-4)


# -- normalization ops against onnxruntime (onnx's reference is wrong for old BN and LRN) -----


@pytest.mark.parametrize("opset,attrs", [(7, {"spatial": 1}), (9, {}), (14, {"training_mode": 0}), (15, {})])
def test_batch_norm_matches_onnxruntime(opset, attrs):
    """Inference BatchNormalization equals onnxruntime for the opset 7, 9, 14 and 15 attribute sets."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 5, 4, 3)).astype(np.float32)
    params = [rng.standard_normal(5).astype(np.float32) for _ in range(3)] + [rng.random(5).astype(np.float32) + 0.1]
    attrs = dict(attrs, epsilon=1e-3)
    got = run_kernel("BatchNormalization", opset, [x, *params], attrs)
    np.testing.assert_allclose(got, run_ort("BatchNormalization", opset, [x, *params], attrs)[0], rtol=1e-5, atol=1e-5)


def test_lrn_even_size_matches_onnx_node_rule():
    """LRN with an even size sums channels [c - (size-1)//2, c + ceil((size-1)/2)], per the ONNX spec."""
    x = np.random.default_rng(8).standard_normal((1, 6, 2, 2)).astype(np.float32)
    sq = np.square(x.astype(np.float64))
    window = np.stack([sq[:, max(0, c - 1) : c + 3].sum(axis=1) for c in range(6)], axis=1)  # size 4: c-1 .. c+2
    want = x / (1.0 + 0.01 / 4 * window) ** 0.75
    np.testing.assert_allclose(run_kernel("LRN", 13, [x], {"size": 4, "alpha": 0.01}), want, rtol=1e-5)


def test_batch_norm_6_ignores_is_test():
    """BatchNormalization-6 always uses the running statistics, whatever is_test says."""
    rng = np.random.default_rng(9)
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    s, b, m = (rng.standard_normal(3).astype(np.float32) for _ in range(3))
    v = rng.random(3).astype(np.float32) + 0.5
    want = (x - m[:, None]) / np.sqrt(v[:, None] + 1e-5) * s[:, None] + b[:, None]
    for is_test in (0, 1):
        got = run_kernel("BatchNormalization", 6, [x, s, b, m, v], {"is_test": is_test})
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)


def test_batch_norm_spatial_0_uses_per_activation_params():
    """BatchNormalization-7 with spatial=0 normalizes each (c, h, w) with its own statistics."""
    rng = np.random.default_rng(4)
    x = rng.standard_normal((2, 3, 4, 2)).astype(np.float32)
    scale, bias, mean = (rng.standard_normal((3, 4, 2)).astype(np.float32) for _ in range(3))
    var = rng.random((3, 4, 2)).astype(np.float32) + 0.5
    got = run_kernel("BatchNormalization", 7, [x, scale, bias, mean, var], {"spatial": 0})
    np.testing.assert_allclose(got, (x - mean) / np.sqrt(var + 1e-5) * scale + bias, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("size", [1, 3, 5])
def test_lrn_matches_onnxruntime(size):
    """LRN equals onnxruntime for window sizes 1, 3 and 5 (onnxruntime refuses even sizes)."""
    x = np.random.default_rng(5).standard_normal((2, 7, 3, 4)).astype(np.float32)
    attrs = {"size": size, "alpha": 0.01, "beta": 0.6, "bias": 1.5}
    np.testing.assert_allclose(run_kernel("LRN", 13, [x], attrs), run_ort("LRN", 13, [x], attrs)[0], rtol=1e-5, atol=1e-6)


def test_instance_norm_matches_onnxruntime():
    """InstanceNormalization equals onnxruntime on a 3-D (N, C, L) input."""
    rng = np.random.default_rng(6)
    x, s, b = rng.standard_normal((2, 3, 10)).astype(np.float32), *(rng.standard_normal(3).astype(np.float32) for _ in range(2))
    got = run_kernel("InstanceNormalization", 6, [x, s, b], {"epsilon": 1e-4})
    np.testing.assert_allclose(got, run_ort("InstanceNormalization", 6, [x, s, b], {"epsilon": 1e-4})[0], rtol=1e-4, atol=1e-5)


def test_max_roi_pool_matches_onnxruntime():
    """MaxRoiPool equals onnxruntime, rounding roi corners half away from zero."""
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 3, 10, 12)).astype(np.float32)
    rois = np.array([[0, 1, 1, 6, 8], [1, 0.5, 2.5, 11, 9], [0, 3, 3, 3, 3]], np.float32)
    attrs = {"pooled_shape": [3, 2], "spatial_scale": 1.0}
    np.testing.assert_allclose(run_kernel("MaxRoiPool", 1, [x, rois], attrs), run_ort("MaxRoiPool", 1, [x, rois], attrs)[0])


# -- onnx's node cases, with every input but X known at build time ----------------------------


def _conv_plugin_cases():
    from minfer_core.testing.conformance import load_cases

    ops = {k.op_type for k in KERNELS}
    return [c for c in load_cases() if len(c.proto.graph.node) == 1 and c.op_type == ("", c.proto.graph.node[0].op_type)
            and c.op_type[1] in ops]


def _attributes(node):
    out = {}
    for a in node.attribute:
        v = helper.get_attribute_value(a)
        if a.type == onnx.AttributeProto.TENSOR:
            v = onnx.numpy_helper.to_array(v)
        out[a.name] = v.decode() if isinstance(v, bytes) else v
    return out


@pytest.mark.parametrize("case", _conv_plugin_cases(), ids=lambda c: c.name)
def test_node_case_with_constant_inputs(case):
    """Each node case of this plugin's ops passes with inputs 1.. given to the factory as constants (pre-packed)."""
    model = case.proto
    node = model.graph.node[0]
    opset = next(o.version for o in model.opset_import if o.domain in ("", "ai.onnx"))
    for inputs, expected in case.data_sets:
        feed = dict(zip([i.name for i in model.graph.input], inputs))
        names = list(node.input)
        while names and not names[-1]:
            names.pop()
        args = [feed[n] if n else None for n in names]
        n_out = len([o for o in node.output if o])
        got = run_kernel(node.op_type, opset, args, _attributes(node), num_outputs=n_out)
        got = got if isinstance(got, tuple) else (got,)
        for g, e in zip(got, expected):
            assert g.dtype == e.dtype and g.shape == e.shape
            np.testing.assert_allclose(g, e, rtol=case.rtol, atol=case.atol)
