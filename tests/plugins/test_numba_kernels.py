"""minfer-ops-numba's compiled kernels against the numpy kernels they override, and onnx's node cases through them."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import Engine, KernelContext, TensorType, get_registry  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_core.testing.conformance import load_cases, run_case  # noqa: E402
from minfer_ops_numba import _jit, activation, depthwise, plugin, pool, resize, team  # noqa: E402
from modelkit import fused_epilogue, make_model, ort_run, tensor  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

NUMBA = "minfer-ops-numba"
COVERED = ("Conv", "MaxPool", "AveragePool", "HardSigmoid", "HardSwish", "Relu", "Clip", "LeakyRelu", "Resize",
           "Sigmoid")


pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


def numpy_kernel(op_type: str, opset: int, domain: str = ""):
    """The kernel the registry picks without a node to judge by: the numpy one (``applies`` kernels need one)."""
    kern = get_registry().select_kernel(domain, op_type, opset)
    assert kern is not None and kern.plugin != NUMBA and kern.applies is None
    return kern


def context(op_type: str, inputs, constants=(), outputs: int = 1, opset: int = 22) -> KernelContext:
    types = tuple(None if x is None else TensorType(x.dtype, x.shape) for x in inputs)
    consts = tuple(constants) + (None,) * (len(inputs) - len(constants))
    return KernelContext("node", op_type, opset, types, (None,) * outputs, consts, outputs)


def both(kern, op_type: str, opset: int, inputs, attrs, constants=(), outputs: int = 1):
    """(numba run callable, numpy run callable) prepared for the same node, after checking numba's applies."""
    ctx = context(op_type, inputs, constants, outputs, opset)
    assert kern.applies(ctx, attrs)
    assert get_registry().select_kernel("", op_type, opset, ctx=ctx, attrs=attrs).fn is kern.fn
    return kern.prepared(ctx, attrs), numpy_kernel(op_type, opset).prepared(ctx, attrs)


# ---- depthwise Conv -------------------------------------------------------------------------------------------

DEPTHWISE = [  # (N, C, H, W), kernel, strides, pads, dilations
    ((1, 32, 40, 40), 3, 1, [1, 1, 1, 1], 1),
    ((1, 24, 28, 28), 3, 2, [1, 1, 1, 1], 1),
    ((8, 16, 14, 14), 3, 1, [1, 1, 1, 1], 1),
    ((2, 7, 9, 11), 5, 2, [2, 2, 2, 2], 1),
    ((3, 5, 13, 6), 5, 1, [0, 1, 2, 3], 1),  # asymmetric pads, narrower than the kernel's reach
    ((1, 6, 7, 9), 3, 2, [0, 0, 0, 0], 1),
    ((2, 4, 11, 10), 3, 1, [2, 2, 2, 2], 2),
    ((1, 3, 2, 3), 5, 2, [2, 2, 2, 2], 1),  # every window mostly padding
    ((1, 8, 56, 56), 5, 2, [2, 2, 2, 2], 1),  # MobileNetV3's 5x5 stride-2 layers
    ((1, 6, 15, 16), 3, 3, [1, 0, 2, 1], 2),  # stride 3, dilated, asymmetric pads: nine phase planes
    ((2, 5, 12, 13), 4, 2, [3, 1, 0, 2], 1),  # an even kernel, a pad above the kernel's reach
]


@pytest.mark.parametrize("shape, k, s, pads, d", DEPTHWISE)
@pytest.mark.parametrize("bias", ["constant", "input", "none"])
def test_depthwise_matches_numpy(shape, k, s, pads, d, bias):
    """A depthwise Conv computes what the numpy Conv does, within float32 rounding, for pads, strides, dilations
    and bias as a constant, an input or absent."""
    rng = np.random.default_rng(sum(shape) + k)
    n, c, h, wd = shape
    x = rng.standard_normal(shape, dtype=np.float32)
    w = rng.standard_normal((c, 1, k, k), dtype=np.float32)
    b = rng.standard_normal(c, dtype=np.float32) if bias != "none" else None
    attrs = dict(group=c, kernel_shape=[k, k], strides=[s, s], pads=pads, dilations=[d, d])
    inputs = [x, w] + ([b] if b is not None else [])
    consts = [None, w] + ([b] if bias == "constant" else [])
    fast, ref = both(depthwise.conv, "Conv", 22, inputs, attrs, consts)
    want = ref(*inputs)
    out = np.full(want.shape, np.nan, np.float32)
    got = fast(*inputs, out=out)
    assert got is out
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * k * k)


@pytest.mark.parametrize("shape, k, s, pads, d", DEPTHWISE)
def test_depthwise_row_loops_give_the_phase_planes_bits(shape, k, s, pads, d):
    """The two depthwise kernels the core times against each other (phase planes, row loops) give the same bits,
    whatever the stride, dilation and pads: they add the bias, then the taps in the same order."""
    rng = np.random.default_rng(sum(shape) + 3 * k)
    x = rng.standard_normal(shape, dtype=np.float32)
    w = rng.standard_normal((shape[1], 1, k, k), dtype=np.float32)
    b = rng.standard_normal(shape[1], dtype=np.float32)
    attrs = dict(group=shape[1], kernel_shape=[k, k], strides=[s, s], pads=pads, dilations=[d, d])
    ctx = context("Conv", [x, w, b], [None, w, b])
    assert depthwise.conv_rows.applies(ctx, attrs)
    phase, rows = depthwise.conv.prepared(ctx, attrs), depthwise.conv_rows.prepared(ctx, attrs)
    np.testing.assert_array_equal(phase(x, w, b), rows(x, w, b))


@pytest.mark.parametrize("shape, k, strides, pads", [
    ((1, 4, 9, 13), 3, [2, 1], [1, 1, 1, 1]),  # phase planes by rows only
    ((1, 4, 13, 9), 5, [1, 2], [2, 2, 2, 2]),  # by columns only: one pass splits each row's two phases
    ((2, 3, 8, 15), 3, [2, 2], [0, 1, 1, 0]),  # odd rows: one column phase a cell longer than the other
    ((1, 3, 6, 6), 7, [2, 2], [3, 3, 3, 3]),  # neither 3x3 nor 5x5: taps three a pass
])
def test_depthwise_phase_planes_give_the_row_loops_bits_for_unequal_strides(shape, k, strides, pads):
    """The phase-plane kernel gives the row loops' bits with unequal strides, odd rows and other kernel sizes."""
    rng = np.random.default_rng(sum(shape) + k)
    x = rng.standard_normal(shape, dtype=np.float32)
    w = rng.standard_normal((shape[1], 1, k, k), dtype=np.float32)
    b = rng.standard_normal(shape[1], dtype=np.float32)
    attrs = dict(group=shape[1], kernel_shape=[k, k], strides=strides, pads=pads)
    ctx = context("Conv", [x, w, b], [None, w, b])
    phase, rows = depthwise.conv.prepared(ctx, attrs), depthwise.conv_rows.prepared(ctx, attrs)
    np.testing.assert_array_equal(phase(x, w, b), rows(x, w, b))


def test_depthwise_node_has_three_candidates_for_the_core_to_time():
    """A depthwise float32 node offers the phase-plane kernel, the row-loop kernel (just below it) and numpy's,
    so the core's timed choice sees all three; MINFER_TUNE=0 takes the phase planes."""
    x, w = np.zeros((1, 8, 14, 14), np.float32), np.zeros((8, 1, 3, 3), np.float32)
    ctx, attrs = context("Conv", [x, w], [None, w]), {"group": 8, "kernel_shape": [3, 3]}
    found = get_registry().kernel_candidates("", "Conv", 22, "numpy", ctx, attrs)
    assert [k.fn for k in found[:2]] == [depthwise.conv.fn, depthwise.conv_rows.fn]
    # and channels.py's, depthwise_blocked.py's and the vector rows below them (test_depthwise_channels.py,
    # test_numba_vector_rows.py)
    assert found[-1].plugin != NUMBA and len(found) == 6
    # the core stores the winner by module and qualified name: the two must not share one
    assert depthwise.conv.fn.__qualname__ != depthwise.conv_rows.fn.__qualname__


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_depthwise_auto_pad(auto_pad):
    """auto_pad resolves to the numpy Conv's pads and output size."""
    rng = np.random.default_rng(1)
    x = rng.standard_normal((2, 6, 10, 7), dtype=np.float32)
    w = rng.standard_normal((6, 1, 4, 3), dtype=np.float32)
    attrs = dict(group=6, kernel_shape=[4, 3], strides=[2, 3], auto_pad=auto_pad)
    fast, ref = both(depthwise.conv, "Conv", 22, [x, w], attrs, [None, w])
    np.testing.assert_allclose(fast(x, w), ref(x, w), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("threads", [1, 2])
def test_depthwise_epilogue_finishes_each_region_once(threads):
    """The epilogue sees regions of the output covering it exactly once, finished, also split over two threads."""
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 64, 56, 56), dtype=np.float32)  # enough work to split
    w = rng.standard_normal((64, 1, 3, 3), dtype=np.float32)
    b = rng.standard_normal(64, dtype=np.float32)
    attrs = dict(group=64, kernel_shape=[3, 3], strides=[1, 1], pads=[1, 1, 1, 1])
    fast, ref = both(depthwise.conv, "Conv", 22, [x, w, b], attrs, [None, w, b])
    want = ref(x, w, b)
    seen = np.zeros(want.shape, int)
    lock = threading.Lock()
    y = np.empty_like(want)

    def epilogue(out, region):
        assert out is y
        with lock:
            seen[region] += 1
        np.negative(out[region], out=out[region])  # once-only and visible

    with using_threads(threads):
        fast(x, w, b, out=y, epilogue=epilogue)
    assert (seen == 1).all()
    np.testing.assert_allclose(-y, want, rtol=1e-5, atol=1e-4)


def test_depthwise_serial_calls_after_the_first_skip_the_planning_with_the_same_bits(monkeypatch):
    """On one thread, a node's later calls with the same input shape and epilogue (a fused activation, no residual)
    go straight to the compiled units: no planning (`path` not asked), and the bits of a first call's; a residual
    epilogue (new each call) is planned every call."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((1, 24, 9, 11), dtype=np.float32)
    w = rng.standard_normal((24, 1, 3, 3), dtype=np.float32)
    b = rng.standard_normal(24, dtype=np.float32)
    attrs = dict(group=24, kernel_shape=[3, 3], strides=[2, 1], pads=[1, 0, 1, 2])
    z = rng.standard_normal((1, 24, 5, 11), dtype=np.float32)

    relu = fused_epilogue("Relu", (), None, lambda v, out: np.maximum(v, 0, out=out))
    residual = fused_epilogue("", (), z, None)
    planned = []
    real_path = depthwise.path
    monkeypatch.setattr(depthwise, "path", lambda *a: planned.append(a) or real_path(*a))
    for epilogue in (relu, residual):
        run, first = (depthwise.conv.prepared(context("Conv", [x, w, b], [None, w, b]), attrs) for _ in range(2))
        want = first(x, w, b, out=np.empty_like(z), epilogue=epilogue)
        planned.clear()
        for _ in range(3):
            got = run(x, w, b, out=np.empty_like(z), epilogue=epilogue)
            np.testing.assert_array_equal(got, want)
        assert len(planned) == (1 if epilogue is relu else 3)


def test_depthwise_applies_only_to_depthwise_float32():
    """The numba Conv takes depthwise float32 nodes with constant weights; numpy's keeps the rest."""
    x = np.zeros((1, 8, 5, 5), np.float32)
    dw, full = np.zeros((8, 1, 3, 3), np.float32), np.zeros((8, 8, 3, 3), np.float32)
    grouped = np.zeros((8, 2, 3, 3), np.float32)
    assert depthwise.applies(context("Conv", [x, dw], [None, dw]), {"group": 8})
    for w, group, consts in [(full, 1, [None, full]), (grouped, 4, [None, grouped]), (dw, 8, [])]:
        assert not depthwise.applies(context("Conv", [x, w], consts), {"group": group})
        assert get_registry().select_kernel("", "Conv", 22, ctx=context("Conv", [x, w], consts),
                                            attrs={"group": group}).fn not in (depthwise.conv.fn, depthwise.conv_rows.fn)
    x64, dw64 = x.astype(np.float64), dw.astype(np.float64)
    assert not depthwise.applies(context("Conv", [x64, dw64], [None, dw64]), {"group": 8})


def test_fused_depthwise_block_runs_the_numba_conv_and_matches_onnxruntime(monkeypatch):
    """A depthwise Conv + residual + Clip block, fused into FusedConv, runs the numba conv inside it (its epilogue
    applied per unit in the same compiled call) and gives onnxruntime's outputs."""
    monkeypatch.setenv("MINFER_TUNE", "0")
    calls = []
    units = depthwise.units_of
    monkeypatch.setattr(depthwise, "units_of", lambda *a: calls.append(a[14:16]) or units(*a))  # (z, op) per call
    rng = np.random.default_rng(8)
    c = 24
    w = numpy_helper.from_array(rng.standard_normal((c, 1, 3, 3), dtype=np.float32) * 0.3, "w")
    b = numpy_helper.from_array(rng.standard_normal(c, dtype=np.float32), "b")
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv"], group=c, kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["conv", "x"], ["sum"]),
             helper.make_node("Clip", ["sum", "lo", "hi"], ["y"])]
    lo, hi = numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")
    model = make_model(nodes, [tensor("x", [2, c, 17, 19])], [tensor("y", [2, c, 17, 19])], [w, b, lo, hi])
    x = rng.standard_normal((2, c, 17, 19), dtype=np.float32)
    engine = Engine(model)
    assert [spec.kernel.op_type for spec in engine.program.specs] == ["FusedConv"]
    calls.clear()  # the call compiling it at build
    got = engine.run(None, {"x": x})[0]
    assert calls and all(z.size and op != team.NONE for z, op in calls)  # this plugin's Conv, the epilogue in it
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


# ---- pools ------------------------------------------------------------------------------------------------------

POOLS = [  # shape, attributes (strides of 2 or more: stride 1 stays with numpy)
    ((1, 16, 28, 28), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((8, 8, 15, 15), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[0, 0, 0, 0], ceil_mode=1)),
    ((2, 5, 9, 11), dict(kernel_shape=[3, 2], strides=[2, 3], pads=[1, 0, 1, 1], ceil_mode=1)),
    ((2, 5, 9, 11), dict(kernel_shape=[3, 2], strides=[2, 2], auto_pad="SAME_LOWER", dilations=[2, 1])),
    ((2, 5, 9, 11), dict(kernel_shape=[2, 2], strides=[3, 3], auto_pad="SAME_UPPER")),  # negative SAME pads
    ((1, 3, 7, 7), dict(kernel_shape=[7, 7], strides=[7, 7])),  # one window over the plane
    ((3, 4, 6, 5), dict(kernel_shape=[5, 5], strides=[2, 2], pads=[2, 2, 2, 2])),  # windows mostly padding
    ((2, 3, 8, 8), dict(kernel_shape=[2, 2], strides=[2, 2])),
    # rows of 20 outputs and more at stride 2: taps from the row's even and odd cells
    ((1, 4, 23, 67), dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])),
    ((2, 3, 12, 54), dict(kernel_shape=[3, 3], strides=[2, 2], ceil_mode=1)),  # squeezenet's, ceil_mode
    ((1, 2, 9, 48), dict(kernel_shape=[2, 4], strides=[2, 2], pads=[0, 3, 1, 2], dilations=[1, 2])),
]


@pytest.mark.parametrize("shape, attrs", POOLS)
def test_max_pool_matches_numpy(shape, attrs):
    """MaxPool gives the numpy kernel's values exactly (a max rounds nothing), NaN included."""
    x = np.random.default_rng(3).standard_normal(shape, dtype=np.float32)
    x.reshape(-1)[::17] = np.nan
    fast, ref = both(pool.max_pool_10, "MaxPool", 22, [x], attrs)
    np.testing.assert_array_equal(fast(x, out=np.empty_like(ref(x))), ref(x))


@pytest.mark.parametrize("shape, attrs", POOLS)
@pytest.mark.parametrize("include_pad", [0, 1])
def test_average_pool_matches_numpy(shape, attrs, include_pad):
    """AveragePool gives the numpy kernel's values within float32 rounding, with and without pads counted."""
    x = np.random.default_rng(4).standard_normal(shape, dtype=np.float32)
    attrs = dict(attrs, count_include_pad=include_pad)
    fast, ref = both(pool.average_pool_19, "AveragePool", 22, [x], attrs)
    np.testing.assert_allclose(fast(x), ref(x), rtol=1e-6, atol=1e-6)


def test_pool_split_over_threads_matches_serial():
    """Split over two threads, a pool computes the same values as on one."""
    x = np.random.default_rng(5).standard_normal((4, 64, 56, 56), dtype=np.float32)
    attrs = dict(kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    fast, ref = both(pool.max_pool_10, "MaxPool", 22, [x], attrs)
    with using_threads(2):
        split = fast(x)
    np.testing.assert_array_equal(split, ref(x))


def test_pools_left_to_numpy():
    """MaxPool with its Indices output, stride-1, float64 and 1-D pools are left to the numpy kernels."""
    x = np.zeros((1, 2, 4, 4), np.float32)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    assert pool.max_pool_10.applies(context("MaxPool", [x]), attrs)
    assert not pool.max_pool_10.applies(context("MaxPool", [x], outputs=2), attrs)
    assert not pool.max_pool_10.applies(context("MaxPool", [x]), {"kernel_shape": [2, 2]})
    assert not pool.average_pool_19.applies(context("AveragePool", [x]), dict(attrs, strides=[2, 1]))
    assert not pool.max_pool_10.applies(context("MaxPool", [x.astype(np.float64)]), attrs)
    assert not pool.max_pool_10.applies(context("MaxPool", [x[0]]), {"kernel_shape": [2], "strides": [2]})


# ---- activations ---------------------------------------------------------------------------


@pytest.mark.parametrize("shape", [(7,), (1, 96, 56, 56), (3, 1, 1000), (1, 64, 128, 128)])  # the last: blocks
@pytest.mark.parametrize("kern, attrs", [(activation.hard_swish, {}), (activation.hard_sigmoid, {}),
                                         (activation.hard_sigmoid, {"alpha": 0.3, "beta": 0.4})])
def test_hard_activations_same_bits_as_numpy(shape, kern, attrs):
    """HardSwish and HardSigmoid give the numpy kernels' very bits (same float32 formula), inf and NaN included."""
    x = np.random.default_rng(6).standard_normal(shape, dtype=np.float32) * 4
    x.reshape(-1)[:3] = [np.nan, np.inf, -np.inf]
    fast, ref = both(kern, kern.op_type, 22, [x], attrs)
    np.testing.assert_array_equal(fast(x), ref(x))
    y = x.copy()
    assert fast(y, out=y) is y  # in place, as declared
    np.testing.assert_array_equal(y, ref(x))


# ---- Resize ------------------------------------------------------------------------------------------------------

RESIZES = [  # shape, coordinate_transformation_mode, scales, sizes
    ((1, 16, 20, 20), "asymmetric", [1, 1, 2, 2], None),
    ((2, 8, 14, 14), "half_pixel", [1, 1, 2, 2], None),
    ((2, 3, 7, 9), "align_corners", None, [2, 3, 15, 4]),
    ((2, 3, 7, 9), "half_pixel", [1, 1, 0.5, 1.7], None),  # down one axis, up the other
    ((2, 3, 7, 9), "pytorch_half_pixel", [1, 1, 1, 2.5], None),  # H left as it is
    ((1, 2, 1, 5), "pytorch_half_pixel", None, [1, 2, 1, 1]),  # a length-1 output
]


@pytest.mark.parametrize("shape, coordinates, scales, sizes", RESIZES)
@pytest.mark.parametrize("kern, opset", [(resize.resize_11, 13), (resize.resize_18, 19)])
def test_linear_resize_same_bits_as_numpy(shape, coordinates, scales, sizes, kern, opset):
    """Linear Resize of H and W gives the numpy kernel's very bits (same tables, same arithmetic, same order)."""
    x = np.random.default_rng(9).standard_normal(shape, dtype=np.float32)
    sc = np.array(scales or [], np.float32)
    inputs = [x, None, sc] + ([] if sizes is None else [np.array(sizes, np.int64)])
    attrs = dict(mode="linear", coordinate_transformation_mode=coordinates)
    fast, ref = both(kern, "Resize", opset, inputs, attrs, [None] + inputs[1:])
    want = ref(*inputs)
    np.testing.assert_array_equal(fast(*inputs, out=np.empty_like(want)), want)


needs_loaded = pytest.mark.skipif(
    NUMBA not in get_registry().plugins, reason="minfer-ops-numba is left out of this session (MINFER_PLUGINS): its "
    "kernels cannot be bound; the kernel tests above still call them directly")


@needs_loaded
def test_upsampling_model_runs_the_numba_resize_and_matches_onnxruntime(monkeypatch):
    """A 2x linear upsampling (constant scales, as exporters write it) binds the numba Resize and gives
    onnxruntime's outputs."""
    monkeypatch.setenv("MINFER_TUNE", "0")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    node = helper.make_node("Resize", ["x", "", "scales"], ["y"], mode="linear")
    model = make_model([node], [tensor("x", [2, 8, 13, 10])], [tensor("y", [2, 8, 26, 20])], [scales], opset=19)
    x = np.random.default_rng(10).standard_normal((2, 8, 13, 10), dtype=np.float32)
    engine = Engine(model)
    assert [spec.kernel.plugin for spec in engine.program.specs] == [NUMBA]
    np.testing.assert_allclose(engine.run(None, {"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-6)


def test_resize_left_to_numpy():
    """Large nearest, antialiased, cropping and runtime-scaled Resizes, and ones changing N or C, stay with numpy."""
    x = np.zeros((1, 2, 4, 4), np.float32)
    sc = np.array([1, 1, 2, 2], np.float32)
    linear = {"mode": "linear"}
    assert resize.applies(context("Resize", [x, None, sc], [None, None, sc]), linear)
    large = np.zeros((1, 256, 20, 20), np.float32)
    assert not resize.applies(context("Resize", [large, None, sc], [None, None, sc]), {"mode": "nearest"})
    for attrs in (dict(linear, antialias=1),
                  dict(linear, coordinate_transformation_mode="tf_crop_and_resize"), dict(linear, axes=[2, 3])):
        assert not resize.applies(context("Resize", [x, None, sc], [None, None, sc]), attrs)
    assert not resize.applies(context("Resize", [x, None, sc]), linear)
    wider = np.array([1, 2, 2, 2], np.float32)
    assert not resize.applies(context("Resize", [x, None, wider], [None, None, wider]), linear)


# ---- onnx's node cases, the compile cache ----------------------------------------------------------------------


CASES = [c for c in load_cases() if c.op_type[0] == "" and c.op_type[1] in COVERED]


@needs_loaded
def test_node_cases_of_covered_ops_pass_through_numba(monkeypatch):
    """onnx's node cases of the covered ops pass with the numba kernels taken first (no timing), and some cases of
    every covered op but Conv and Resize run them (their cases feed weights and scales as inputs, not constants:
    the model tests are the ones for those)."""
    monkeypatch.setenv("MINFER_TUNE", "0")  # the highest priority that applies, not a timed choice
    ran = set()
    for case in CASES:
        run_case(case)
        ran |= {spec.kernel.op_type for spec in Engine(case.proto).program.specs if spec.kernel.plugin == NUMBA}
    # the cases' chains are fused by minfer-passes and may run other compiled kernels too (FusedElementwise, Lookup)
    assert set(COVERED) - {"Conv", "Resize"} <= ran


def test_cache_folder_follows_the_environment(monkeypatch, tmp_path):
    """Compiled code is cached in NUMBA_CACHE_DIR when set, else $MINFER_CACHE/numba, else ~/.cache/minfer/numba,
    in a subfolder named for the plugin's sources."""
    sub = f"minfer-ops-numba-{_jit.sources_key()}"
    monkeypatch.delenv("NUMBA_CACHE_DIR", raising=False)
    monkeypatch.delenv("MINFER_CACHE", raising=False)
    assert _jit.cache_dir() == Path.home() / ".cache" / "minfer" / "numba" / sub
    monkeypatch.setenv("MINFER_CACHE", str(tmp_path))
    assert _jit.cache_dir() == tmp_path / "numba" / sub
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path / "mine"))
    assert _jit.cache_dir() == tmp_path / "mine" / sub


def test_the_cache_subfolder_changes_with_any_source_of_the_plugin(monkeypatch, tmp_path):
    """The subfolder's key hashes every module of the plugin: a change in one a compiled caller inlines (team.py's
    finish) makes every kernel compile afresh rather than load code built on the old one."""
    import shutil

    copy = tmp_path / "pkg"
    shutil.copytree(Path(_jit.__file__).parent, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(_jit, "__file__", str(copy / "_jit.py"))
    _jit.sources_key.cache_clear()
    try:
        before = _jit.sources_key()
        (copy / "team.py").write_text((copy / "team.py").read_text() + "\n# changed\n")
        _jit.sources_key.cache_clear()
        assert _jit.sources_key() != before
    finally:
        monkeypatch.undo()
        _jit.sources_key.cache_clear()


def test_the_cache_serves_another_install_of_the_same_sources(tmp_path):
    """The same sources installed elsewhere (a new clone, a reinstall: another path, new modification times) load
    what an earlier install compiled: numba's own locator would file it under the first path and check each file's
    time, and a model's first build would compile every kernel again (`_jit._install_locator`)."""
    import shutil
    import subprocess
    import sys

    script = """if True:
        import sys
        sys.path.insert(0, sys.argv[1])
        import numpy as np
        import minfer_ops_numba
        from minfer_ops_numba import dequantize
        from minfer_ops_numba._jit import readonly
        assert minfer_ops_numba.__file__.startswith(sys.argv[1]), minfer_ops_numba.__file__
        one = readonly(np.zeros(1, np.float32))
        dequantize._dequantize(readonly(np.zeros((1, 1, 1), np.int8)), one, one, np.zeros((1, 1, 1), np.float32))
        stats = dequantize._dequantize.stats
        print(sum(stats.cache_hits.values()), sum(stats.cache_misses.values()))
    """
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "cache")}
    counts = []
    for name in ("first", "second"):
        shutil.copytree(Path(_jit.__file__).parent, tmp_path / name / "minfer_ops_numba",
                        ignore=shutil.ignore_patterns("__pycache__"))  # new paths, new times
        done = subprocess.run([sys.executable, "-c", script, str(tmp_path / name)], env=env, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr
        counts.append(tuple(int(v) for v in done.stdout.split()))
    assert counts == [(0, 1), (1, 0)]  # compiled once, then loaded


def test_other_sources_folders_are_pruned(tmp_path):
    """Beside this sources' folder, other minfer-ops-numba folders go when unused for STALE_DAYS or beyond the
    KEEP_FOLDERS most recently used; other folders and files stay."""
    now = 2_000_000_000.0
    own = tmp_path / f"{_jit.PREFIX}own"
    own.mkdir()
    ages = {"a": 1, "b": 2, "c": 3, "d": 4, "e": 5, "stale": _jit.STALE_DAYS + 1}
    for name, days in ages.items():
        folder = tmp_path / f"{_jit.PREFIX}{name}"
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "f.nbc").write_bytes(b"x")
        os.utime(folder, (now - days * 86400, now - days * 86400))
    (tmp_path / "another-tool").mkdir()
    (tmp_path / f"{_jit.PREFIX}a-file").write_text("not a folder")
    removed = _jit.prune(own, now)
    assert sorted(p.name for p in removed) == [f"{_jit.PREFIX}e", f"{_jit.PREFIX}stale"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["another-tool", f"{_jit.PREFIX}a-file", f"{_jit.PREFIX}own"] + [f"{_jit.PREFIX}{n}" for n in "abcd"])


def test_compiled_code_lands_in_the_cache_folder_and_numba_settings_are_restored(tmp_path):
    """In a fresh process with MINFER_CACHE set, preparing a kernel imports numba, compiles into $MINFER_CACHE/numba
    and leaves numba's own CACHE_DIR as it was; importing the plugin alone does not import numba. The first compile
    prunes a stale folder of other sources there."""
    script = """if True:
        import sys
        import numpy as np
        from minfer_core import KernelContext, TensorType
        from minfer_ops_numba import activation
        assert "numba" not in sys.modules
        x = np.zeros(4, np.float32)
        ctx = KernelContext("n", "HardSwish", 14, (TensorType(x.dtype, x.shape),), (None,), (None,), 1)
        activation.hard_swish.prepared(ctx, {})(x)
        import numba
        assert numba.config.CACHE_DIR == "", numba.config.CACHE_DIR
        """
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_CACHE_DIR"}
    stale = tmp_path / "numba" / f"{_jit.PREFIX}older-sources"
    stale.mkdir(parents=True)
    os.utime(stale, (0, 0))  # last used in 1970: pruned at the first compile
    subprocess.run([sys.executable, "-c", script], env=dict(env, MINFER_CACHE=str(tmp_path)), check=True)
    assert list((tmp_path / "numba").rglob("*.nbc"))
    assert not stale.exists()


def test_every_kernel_outranks_numpy_and_declares_applies():
    """Each numba kernel has a numpy kernel of the same op and version below it, and says which nodes it takes."""
    for kern in plugin.KERNELS:
        assert kern.priority > 0 and kern.applies is not None
        assert numpy_kernel(kern.op_type, kern.since, kern.domain).since == kern.since
