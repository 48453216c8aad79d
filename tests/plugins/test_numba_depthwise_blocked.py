"""minfer-ops-numba's depthwise Conv with a cell's 16 channels one vector (depthwise_blocked.py).

Each output cell sums its taps in onnxruntime's order (loops.py's docstring) in registers, sixteen channels at
once: the kernel must give depthwise.py's `conv` bits exactly, whatever the channel count (a block cut short at
C), map, kernel, stride, pads, batch, bias and fused epilogue, be close to onnxruntime, and be one more candidate
the core can take for the node.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import InferenceSession, KernelContext, TensorType, get_registry  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_ops_numba import activation, channels, depthwise, depthwise_blocked, team  # noqa: E402
from modelkit import fused_epilogue, make_model, ort_run, tensor  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py

NUMBA = "minfer-ops-numba"

GRID = [  # (N, C, H, W), kernel, stride, pads
    ((1, 2, 7, 7), (3, 3), 1, [1, 1, 1, 1]),  # one channel is group 1: a plain Conv, not depthwise (`applies`)
    ((3, 15, 14, 14), (3, 3), 2, [1, 1, 1, 1]),
    ((1, 16, 7, 7), (5, 5), 1, [2, 2, 2, 2]),
    ((1, 17, 14, 14), (5, 5), 2, [2, 2, 2, 2]),
    ((3, 40, 5, 10), (3, 3), 1, [1, 1, 1, 1]),
    ((1, 40, 17, 19), (3, 5), 1, [1, 2, 1, 2]),
    ((1, 576, 7, 7), (5, 5), 1, [2, 2, 2, 2]),
    ((1, 576, 14, 14), (3, 3), 2, [0, 0, 1, 1]),  # TensorFlow-style SAME pads: only after
    ((3, 17, 1, 1), (3, 3), 1, [1, 1, 1, 1]),  # one cell
    ((1, 16, 1, 1), (5, 5), 2, [2, 2, 2, 2]),
    ((1, 15, 17, 19), (5, 5), 2, [0, 2, 1, 0]),  # asymmetric pads, a map neither square nor even
    ((3, 33, 17, 19), (3, 5), 2, [2, 0, 0, 1]),
]

ODD = [  # (N, C, H, W), kernel, strides, pads, dilations: geometries past MobileNets'
    ((1, 18, 15, 16), (3, 3), (1, 1), [1, 0, 2, 1], (2, 2)),
    ((2, 21, 12, 13), (4, 4), (2, 2), [3, 1, 0, 2], (1, 1)),
    ((1, 8, 12, 12), (7, 7), (1, 1), [3, 3, 3, 3], (1, 1)),
    ((1, 19, 9, 13), (3, 3), (2, 1), [1, 1, 1, 1], (1, 1)),
    ((1, 35, 6, 6), (2, 3), (3, 3), [0, 1, 1, 0], (1, 2)),  # an input column no output reads
]

EPILOGUES = {  # FusedConv's (activation, activation_params, with a residual)
    "Relu": ("Relu", (), False),
    "Clip-0-6": ("Clip", (0.0, 6.0), False),
    "HardSwish": ("HardSwish", (), False),
    "LeakyRelu": ("LeakyRelu", (0.1,), False),
    "HardSigmoid": ("HardSigmoid", (0.25, 0.375), False),
    "residual-Relu": ("Relu", (), True),
    "residual-HardSwish": ("HardSwish", (), True),
    "Swish": ("Swish", (1.702,), False),  # no code in `taps16`: `block_sums` applies it to each block's sums
    "residual-Swish": ("Swish", (1.0,), True),
    # a DequantConv's rounding (minfer-passes' epilogue, ROUND): no code in `taps16`, which then stored nothing
    "rounding": ("QuantizeDequantize", (0.05, -128.0, 127.0), False),
}


def context(inputs, constants) -> KernelContext:
    types = tuple(TensorType(a.dtype, a.shape) for a in inputs)
    consts = tuple(constants) + (None,) * (len(inputs) - len(constants))
    return KernelContext("node", "Conv", 22, types, (None,), consts, 1)


def case(shape, k, s, pads, d=(1, 1), bias="constant", seed=0):
    """(inputs, constants, attributes) of a random depthwise Conv; bias as a constant, an input, or none."""
    rng = np.random.default_rng(seed + sum(shape))
    s = (s, s) if isinstance(s, int) else s
    x = rng.standard_normal(shape, dtype=np.float32) * 2
    w = rng.standard_normal((shape[1], 1) + tuple(k), dtype=np.float32)
    b = rng.standard_normal(shape[1], dtype=np.float32)
    attrs = dict(group=shape[1], kernel_shape=list(k), strides=list(s), pads=pads, dilations=list(d))
    inputs = [x, w] + ([b] if bias != "none" else [])
    consts = [None, w] + ([b] if bias == "constant" else [])
    return inputs, consts, attrs


def prepared(kern, inputs, consts, attrs):
    ctx = context(inputs, consts)
    assert kern.applies(ctx, attrs)
    return kern.prepared(ctx, attrs)


def epilogue_for(name, shape, seed=1):
    """A FusedConv epilogue (`EPILOGUES`) for an output of ``shape``: the registered activation kernel in place,
    after the residual when there is one."""
    act_name, params, residual = EPILOGUES[name]
    if act_name == "QuantizeDequantize":  # as DequantConv makes it: the registered rounding kernel, its spec
        from minfer_passes.qdq_ops import _rounding

        made = _rounding(TensorType(np.dtype(np.float32), shape), list(params), None, None, None)
        assert team.native(made) is not None  # a compiled form: the blocks apply it themselves
        return made
    kern = {"Relu": activation.relu, "Clip": activation.clip_6, "HardSwish": activation.hard_swish,
            "LeakyRelu": activation.leaky_relu, "HardSigmoid": activation.hard_sigmoid, "Swish": activation.swish}[act_name]
    names = {"Clip": ("min", "max"), "LeakyRelu": ("alpha",), "HardSigmoid": ("alpha", "beta"),
             "Swish": ("alpha",)}.get(act_name, ())
    attrs = dict(zip(names, params))
    ctx = KernelContext("act", act_name, 22, (TensorType(np.dtype(np.float32), shape),), (None,), (None,), 1)
    z = np.random.default_rng(seed).standard_normal(shape, dtype=np.float32) * 3 if residual else None
    return fused_epilogue(act_name, params, z, kern.prepared(ctx, attrs))


@pytest.mark.parametrize("shape, k, s, pads", GRID)
@pytest.mark.parametrize("bias", ["constant", "input", "none"])
def test_blocks_give_the_phase_planes_bits(shape, k, s, pads, bias):
    """The kernel gives depthwise.py's `conv` bits, bias a constant, an input or absent, into out."""
    inputs, consts, attrs = case(shape, k, s, pads, bias=bias)
    want = prepared(depthwise.conv, inputs, consts, attrs)(*inputs)
    out = np.full(want.shape, np.nan, np.float32)
    got = prepared(depthwise_blocked.conv_blocked, inputs, consts, attrs)(*inputs, out=out)
    assert got is out
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape, k, s, pads, d", ODD)
def test_blocks_give_the_row_loops_bits_for_any_geometry(shape, k, s, pads, d):
    """Dilations, unequal strides, even and 7x7 kernels: still the row loops' bits."""
    inputs, consts, attrs = case(shape, k, s, pads, d, seed=3)
    want = prepared(depthwise.conv_rows, inputs, consts, attrs)(*inputs)
    np.testing.assert_array_equal(prepared(depthwise_blocked.conv_blocked, inputs, consts, attrs)(*inputs), want)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_blocks_resolve_auto_pad_as_the_row_loops(auto_pad):
    """auto_pad gives the row loops' pads, output size and bits."""
    inputs, consts, attrs = case((2, 37, 11, 10), (4, 3), (2, 3), None, seed=4)
    attrs = {**attrs, "auto_pad": auto_pad}
    del attrs["pads"]
    want = prepared(depthwise.conv_rows, inputs, consts, attrs)(*inputs)
    np.testing.assert_array_equal(prepared(depthwise_blocked.conv_blocked, inputs, consts, attrs)(*inputs), want)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape, k, s, pads", [GRID[1], GRID[3], GRID[6], GRID[11]])
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_blocks_apply_fused_epilogues_as_the_phase_planes(shape, k, s, pads, epilogue, threads):
    """With FusedConv's residual and Relu, Clip, HardSwish or Swish, on one or two threads: the phase planes'
    bits."""
    inputs, consts, attrs = case(shape, k, s, pads, seed=6)
    plain = prepared(depthwise.conv, inputs, consts, attrs)(*inputs)
    with using_threads(threads):
        want = prepared(depthwise.conv, inputs, consts, attrs)(*inputs, epilogue=epilogue_for(epilogue, plain.shape))
        got = prepared(depthwise_blocked.conv_blocked, inputs, consts, attrs)(
            *inputs, out=np.full(plain.shape, np.nan, np.float32), epilogue=epilogue_for(epilogue, plain.shape))
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("bias", ["constant", "input"])
@pytest.mark.parametrize("epilogue", [None, "HardSwish", "residual-Relu"])
def test_repeated_calls_give_each_calls_bits(bias, epilogue):
    """Calls after the first (one thread, into out, the same epilogue object: the planning skipped) compute each
    call's own input, bias input and residual, also after a call on two threads."""
    inputs, consts, attrs = case((1, 40, 14, 14), (3, 3), 1, [1, 1, 1, 1], bias=bias, seed=10)
    mine, theirs = (prepared(k, inputs, consts, attrs) for k in (depthwise_blocked.conv_blocked, depthwise.conv))
    shape = theirs(*inputs).shape
    fused = None if epilogue is None else epilogue_for(epilogue, shape)
    rng = np.random.default_rng(11)
    for threads in (1, 1, 2, 1):
        step = [rng.standard_normal(a.shape, dtype=np.float32) for a in inputs[:1]] + inputs[1:2] + \
            [rng.standard_normal(a.shape, dtype=np.float32) for a in inputs[2:]]
        with using_threads(threads):
            got = mine(*step, out=np.full(shape, np.nan, np.float32), epilogue=fused)
        np.testing.assert_array_equal(got, theirs(*step, epilogue=fused))


@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_blocks_carry_nan_and_infinities_through_epilogues_as_the_phase_planes(epilogue):
    """NaN and infinite inputs (numpy's maximum and minimum keep a NaN): the activation on the sums in registers
    gives the phase planes' and their epilogue's bits."""
    inputs, consts, attrs = case((1, 40, 7, 7), (5, 5), 1, [2, 2, 2, 2], seed=13)
    inputs[0][0, 3, 1, 1], inputs[0][0, 20, 4, 4], inputs[0][0, 33, 6, 0] = np.nan, np.inf, -np.inf
    plain = prepared(depthwise.conv, inputs, consts, attrs)(*inputs)
    want = prepared(depthwise.conv, inputs, consts, attrs)(*inputs, epilogue=epilogue_for(epilogue, plain.shape))
    got = prepared(depthwise_blocked.conv_blocked, inputs, consts, attrs)(
        *inputs, epilogue=epilogue_for(epilogue, plain.shape))
    assert np.isnan(want).any() and np.isinf(plain).any()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("epilogue", ["HardSwish", "residual-Relu"])
def test_blocks_over_a_native_team_give_the_same_bits(monkeypatch, epilogue):
    """Split over two threads (a native team's driver where one runs, else parallel_for), epilogue included."""
    monkeypatch.setattr(depthwise, "MIN_TEAM_MACS", 0)
    monkeypatch.setattr(depthwise, "MIN_SPLIT_MACS", 0)
    inputs, consts, attrs = case((2, 200, 14, 14), (5, 5), 1, [2, 2, 2, 2], seed=7)
    shape = (2, 200, 14, 14)
    want = prepared(depthwise.conv, inputs, consts, attrs)(*inputs, epilogue=epilogue_for(epilogue, shape))
    run = prepared(depthwise_blocked.conv_blocked, inputs, consts, attrs)
    calls, real = [], depthwise_blocked.drive  # after preparing, which compiled it (numba rebinds the name then)
    monkeypatch.setattr(depthwise_blocked, "drive", lambda *a: calls.append(1) or real(*a))
    with using_threads(2):
        got = run(*inputs, epilogue=epilogue_for(epilogue, shape))
    np.testing.assert_array_equal(got, want)
    assert len(calls) == (1 if team.available() else 0)


def test_blocks_run_an_epilogue_without_a_compiled_form_once():
    """An epilogue without a spec (a quantized conv's requantization) sees every output once, after its sums."""
    inputs, consts, attrs = case((1, 40, 14, 14), (3, 3), 1, [1, 1, 1, 1], seed=8)
    want = prepared(depthwise.conv, inputs, consts, attrs)(*inputs)
    seen = np.zeros(want.shape, int)

    def epilogue(out, region):
        seen[region] += 1
        np.negative(out[region], out=out[region])  # once-only and visible

    got = prepared(depthwise_blocked.conv_blocked, inputs, consts, attrs)(*inputs, epilogue=epilogue)
    assert (seen == 1).all()
    np.testing.assert_array_equal(-got, want)


def one_conv_model(shape, k, s, pads, act):
    """A depthwise Conv with constant weights and bias, then ``act``, and its feeds."""
    (x, w, b), _, attrs = case(shape, k, s, pads, seed=9)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node(act, ["c"], ["y"])]
    model = make_model(nodes, [tensor("x", list(shape))], [tensor("y", None)],
                       [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")], opset=17)
    return model, {"x": x}


@pytest.mark.parametrize("shape, k, s, pads", [GRID[1], GRID[4], GRID[6], GRID[10]])
def test_blocks_match_onnxruntime_in_a_session_that_takes_them(monkeypatch, shape, k, s, pads):
    """A session whose only depthwise kernel is this one runs it (its driver called) and gives onnxruntime's output
    within float32 rounding."""
    registry = get_registry()
    others = {depthwise.conv.fn, depthwise.conv_rows.fn, channels.conv_channels.fn}
    real = registry.kernel_candidates

    def without_the_others(*args, **kwargs):
        found = real(*args, **kwargs)
        mine = [k for k in found if k.fn is depthwise_blocked.conv_blocked.fn]
        return mine or [k for k in found if k.fn not in others]

    monkeypatch.setattr(registry, "kernel_candidates", without_the_others)
    model, feeds = one_conv_model(shape, k, s, pads, "HardSwish")
    session = InferenceSession(model, threads=1)
    calls = []
    units = depthwise_blocked.units_of  # after the build, which compiled it (numba rebinds the name then)
    monkeypatch.setattr(depthwise_blocked, "units_of", lambda *a: calls.append(1) or units(*a))
    got = session.run(None, feeds)[0]
    assert calls
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("shape, k, s, pads, d", [(*c, (1, 1)) for c in GRID[1:4] + GRID[10:]] + ODD)
def test_blocks_give_onnxruntimes_bits(shape, k, s, pads, d):
    """onnxruntime's bits (its MLAS Conv, every graph optimization off), bias included."""
    (x, w, b), consts, attrs = case(shape, k, s, pads, d, seed=12)
    want = mlas_conv(x, w, b, attrs)
    np.testing.assert_array_equal(prepared(depthwise_blocked.conv_blocked, [x, w, b], consts, attrs)(x, w, b), want)


def mlas_conv(x, w, b, attrs):
    """onnxruntime's output for the Conv (its MLAS Conv: every graph optimization off, so no NCHWc kernel)."""
    ort = pytest.importorskip("onnxruntime")
    node = helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)
    model = make_model([node], [tensor("x", list(x.shape))], [tensor("y", None)],
                       [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")], opset=13)
    opts = ort.SessionOptions()
    opts.graph_optimization_level, opts.log_severity_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL, 3
    session = ort.InferenceSession(model.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def test_blocks_are_a_timed_candidate_under_their_own_name():
    """A depthwise float32 node offers this kernel after depthwise.py's and channels.py's (MINFER_TUNE=0 keeps
    taking the phase planes) and before numpy's, declared as they are, under a name of its own."""
    x, w = np.zeros((1, 40, 14, 14), np.float32), np.zeros((40, 1, 3, 3), np.float32)
    ctx, attrs = context([x, w], [None, w]), {"group": 40, "kernel_shape": [3, 3]}
    found = get_registry().kernel_candidates("", "Conv", 22, "numpy", ctx, attrs)
    fns = [k.fn for k in found]
    assert fns[:4] == [depthwise.conv.fn, depthwise.conv_rows.fn, channels.conv_channels.fn,
                       depthwise_blocked.conv_blocked.fn]
    assert found[-1].plugin != NUMBA
    mine, theirs = depthwise_blocked.conv_blocked, depthwise.conv
    assert (mine.out, mine.epilogue, mine.packed) == (theirs.out, theirs.epilogue, theirs.packed)
    assert len({f"{k.fn.__module__}.{k.fn.__qualname__}" for k in found}) == len(found)
