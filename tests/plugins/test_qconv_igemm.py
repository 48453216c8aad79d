"""minfer-ops-numba's FloatQLinearConv on the 8-bit GEMM: minfer-ops-conv's outputs bit for bit, where it applies."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_ops_numba import igemm  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin", "every_shape")  # numba_plugin: tests/plugins/conftest.py

OP = "FloatQLinearConv"


@pytest.fixture
def every_shape(monkeypatch):
    """igemm's kernels on every shape they compute, small 1x1 convs too: the rule leaving those to qconv_blas.py's
    micro-kernel (qconv.MICRO_CHANNELS, MICRO_OUTPUTS) is not what these tests check: the last test of this file
    checks it."""
    from minfer_ops_numba import qconv

    monkeypatch.setattr(qconv, "MICRO_CHANNELS", 0)
    monkeypatch.setattr(qconv, "MICRO_OUTPUTS", 0)


def _random(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


def _node(rng, *, n=1, c=5, m=7, hw=(6, 7), k=(3, 3), xt=np.uint8, wt=np.int8, per_channel=False, float_input=1,
          bias=True, affine=False, residual=False, **attrs):
    """(inputs, input types, constants, attributes) of one FloatQLinearConv node with random operands."""
    x = rng.standard_normal((n, c) + hw).astype(np.float32) * 2 if float_input else _random(rng, xt, (n, c) + hw)
    xs, xz = np.array(0.03, np.float32), _random(rng, xt, ())
    w = _random(rng, wt, (m, c) + k)
    ws = rng.uniform(0.001, 0.01, m).astype(np.float32) if per_channel else np.array(0.004, np.float32)
    wz = _random(rng, wt, (m,)) // 4 if per_channel else np.array(3, wt)
    # y's scale and zero point such that most outputs fall inside the 8-bit range (not saturated)
    ys, yz = np.array(0.15, np.float32), np.array((128 if xt == np.uint8 else 0) + rng.integers(-10, 10), xt)
    b = rng.integers(-3000, 3000, m).astype(np.int32) if bias else None
    s, a = (rng.standard_normal(m).astype(np.float32), rng.standard_normal(m).astype(np.float32)) if affine else \
        (None, None)
    inputs = [x, xs, xz, w, ws, wz, ys, yz, b, s, a]
    attrs = dict(float_input=float_input, float_output=1, **attrs)
    if residual:
        attrs.update(output_rounding=[0.05, -128.0, 127.0], residual_rounding=[0.1, -128.0, 127.0])
        inputs.append(None)  # Z: made below, of the output's shape
    while inputs[-1] is None and len(inputs) > 8 and not residual:
        inputs.pop()
    return inputs, attrs


def _out_shape(inputs, attrs):
    from minfer_ops_numba.window import window

    x, w = inputs[0], inputs[3]
    win = window(x.shape[2:], w.shape[2:], attrs.get("strides") or (1, 1), attrs.get("dilations") or (1, 1),
                 attrs.get("pads"), attrs.get("auto_pad", "NOTSET"), clamp_same=True)
    return (x.shape[0], w.shape[0]) + win.out_shape


def _ctx(inputs, out_shape):
    from minfer_core import KernelContext, TensorType

    types = tuple(None if v is None else TensorType(v.dtype, v.shape) for v in inputs)
    consts = tuple(None if i in (0, 11) else v for i, v in enumerate(inputs))
    return KernelContext("n", OP, 1, types, (TensorType(np.float32, out_shape),), consts, 1)


def _both(inputs, attrs):
    """(numba run, numpy run) for the node; the numba kernel must apply."""
    from minfer_ops_conv import quant
    from minfer_ops_numba import qconv

    if not igemm.vnni():
        pytest.skip("the kernel applies only on AVX-512 VNNI")
    shape = _out_shape(inputs, attrs)
    assert qconv.float_qlinear_conv.applies(_ctx(inputs, shape), attrs)
    return (qconv.float_qlinear_conv.fn(_ctx(inputs, shape), **attrs),
            quant.float_qlinear_conv.fn(_ctx(inputs, shape), **attrs))


def _run_args(inputs, attrs, rng):
    """The run's arguments: None for the packed weight and its zero point (the engine passes None there), a random
    residual Z where the node takes one."""
    args = [None if i in (3, 5) else v for i, v in enumerate(inputs)]
    if len(args) == 12:
        args[11] = rng.standard_normal(_out_shape(inputs, attrs)).astype(np.float32)
    return args


def _check(inputs, attrs, rng):
    mine, numpy_run = _both(inputs, attrs)
    args = _run_args(inputs, attrs, rng)
    got, want = mine(*args), numpy_run(*args)
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))  # bits: -0.0 and NaN too


SHAPES = {  # name: (node keywords)
    "1x1": dict(k=(1, 1), c=19, m=70, hw=(9, 10)),
    "1x1-stride2": dict(k=(1, 1), c=13, m=33, hw=(9, 10), strides=[2, 2]),
    "3x3-pad": dict(k=(3, 3), c=6, m=17, hw=(11, 9), pads=[1, 1, 1, 1]),
    "3x3-stride2-pad": dict(k=(3, 3), c=21, m=65, hw=(13, 14), strides=[2, 2], pads=[1, 1, 1, 1]),
    "3x3-nopad": dict(k=(3, 3), c=3, m=5, hw=(7, 8)),
    "7x7-stride2": dict(k=(7, 7), c=3, m=9, hw=(17, 16), strides=[2, 2], pads=[3, 3, 3, 3]),
    "3x3-asym-same": dict(k=(3, 3), c=4, m=6, hw=(8, 9), auto_pad="SAME_UPPER", strides=[2, 2]),
    "1x3-dilated": dict(k=(1, 3), c=5, m=4, hw=(6, 12), dilations=[1, 2], pads=[0, 2, 0, 1]),
    "batch2": dict(k=(3, 3), c=7, m=20, hw=(5, 6), n=2, pads=[1, 1, 1, 1]),
}


@pytest.mark.parametrize("shape", list(SHAPES), ids=str)
@pytest.mark.parametrize("kinds", [(np.uint8, np.int8, False), (np.int8, np.int8, True), (np.uint8, np.uint8, True)],
                         ids=lambda k: f"{np.dtype(k[0])}x{np.dtype(k[1])}{'-pc' if k[2] else ''}")
def test_bit_for_bit_as_the_numpy_kernel(shape, kinds):
    """Quantized float input, per-tensor and per-channel scales and zero points, uint8/int8 operands, 1x1 (the
    image as B) and windowed (im2col) convs, strides, pads, dilations, batch 2: minfer-ops-conv's bits."""
    rng = np.random.default_rng(len(shape) * 7 + kinds[2])
    xt, wt, per_channel = kinds
    inputs, attrs = _node(rng, xt=xt, wt=wt, per_channel=per_channel, **SHAPES[shape])
    _check(inputs, attrs, rng)


@pytest.mark.parametrize("epilogue", ["none", "relu-quantize", "clip-affine", "rounding-residual", "no-bias"])
def test_epilogues_bit_for_bit(epilogue):
    """Each epilogue the integer fusion makes (activation, ChannelAffine S/B, the next conv's quantization, the
    QuantizeDequantize rounding plus a residual and its rounding) ends as the numpy kernel's does."""
    rng = np.random.default_rng(21)
    extra = {"none": {}, "no-bias": dict(bias=False),
             "relu-quantize": dict(activation="Relu", activation_params=[], output_quantization=[0.07, -3.0, 252.0]),
             "clip-affine": dict(activation="Clip", activation_params=[0.0, 6.0], affine=True),
             "rounding-residual": dict(residual=True)}[epilogue]
    inputs, attrs = _node(rng, c=24, m=40, hw=(10, 10), pads=[1, 1, 1, 1], **extra)
    _check(inputs, attrs, rng)


@pytest.mark.parametrize("epilogue", ["relu", "clip-affine-rounding", "residual-pc"])
def test_epilogue_in_the_write_out_on_a_native_team(epilogue):
    """igemm applies the compiled epilogue to each tile as it writes it (`igemm.Chain`, no sums written and read
    back), on one thread and on a native team sharing the columns: the numpy kernel's bits either way."""
    from minfer_core.parallel import using_threads
    from minfer_ops_numba import team

    rng = np.random.default_rng(5)
    extra = {"relu": dict(activation="Relu", activation_params=[]),
             "clip-affine-rounding": dict(activation="Clip", activation_params=[0.0, 6.0], affine=True,
                                          output_rounding=[0.05, -128.0, 127.0]),
             "residual-pc": dict(residual=True, per_channel=True)}[epilogue]
    inputs, attrs = _node(rng, c=40, m=96, hw=(28, 30), k=(1, 1), **extra)
    mine, numpy_run = _both(inputs, attrs)
    assert isinstance(mine.chain, igemm.Chain)
    args = _run_args(inputs, attrs, rng)
    want = numpy_run(*args)
    assert np.unique(want).size > 20  # not all saturated or zero
    np.testing.assert_array_equal(mine(*args).view(np.int32), want.view(np.int32))
    if not team.available():
        return  # no native team here (numba's threading layer, or MINFER_NUMBA_TEAM=0): the one thread's path only
    with using_threads(2):
        assert team.size() == 2
        got = mine(*args)
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_eight_bit_input_and_two_threads():
    """An int8 input taken as it is (QOperator's convs after an int8 producer), and the output channels split over
    two intra-op threads: the numpy kernel's bits still."""
    from minfer_core.parallel import using_threads

    rng = np.random.default_rng(8)
    inputs, attrs = _node(rng, float_input=0, xt=np.int8, c=64, m=150, hw=(28, 28), k=(3, 3), pads=[1, 1, 1, 1])
    mine, numpy_run = _both(inputs, attrs)
    args = [None if i in (3, 5) else v for i, v in enumerate(inputs)]
    with using_threads(2):
        got = mine(*args)
    np.testing.assert_array_equal(got, numpy_run(*args))


def test_nan_input_gives_nan_where_the_float_conv_does():
    """A NaN in the float input makes NaN every output whose window holds it, as the numpy kernel's float conv."""
    rng = np.random.default_rng(9)
    inputs, attrs = _node(rng, c=4, m=6, hw=(8, 8), pads=[1, 1, 1, 1])
    inputs[0][0, 2, 3, 4] = np.nan
    _check(inputs, attrs, rng)


def test_kernel_is_a_candidate_for_the_node():
    """The registry lists this kernel above minfer-ops-conv's for a FloatQLinearConv it applies to."""
    from minfer_core import get_registry

    rng = np.random.default_rng(4)
    inputs, attrs = _node(rng)
    if not igemm.vnni():
        pytest.skip("the kernel applies only on AVX-512 VNNI")
    found = get_registry().select_kernel("ai.minfer", OP, 1, "numpy", _ctx(inputs, _out_shape(inputs, attrs)), attrs)
    assert found.fn.__module__ == "minfer_ops_numba.qconv"


def test_centered_input_bit_for_bit():
    """A float32 input already centered (float_input 2: the previous conv's output grid, integers from -x_zp): the
    numpy kernel's bits, -0.0 inputs included."""
    rng = np.random.default_rng(12)
    inputs, attrs = _node(rng, c=16, m=24, hw=(9, 9), pads=[1, 1, 1, 1], float_input=2)
    info = np.iinfo(inputs[2].dtype)
    low, high = info.min - float(inputs[2]), info.max - float(inputs[2])
    inputs[0] = np.clip(np.rint(rng.standard_normal(inputs[0].shape) * 40), low, high).astype(np.float32)
    inputs[0][0, 0, 0, :3] = -0.0
    _check(inputs, attrs, rng)


@pytest.mark.parametrize("epilogue", ["plain", "relu-quantize-affine", "rounding-residual"])
def test_sums_beyond_float32_bit_for_bit(epilogue):
    """Sums float32 does not hold (the numpy kernel's chunked float64 path and its numpy epilogue steps): its bits."""
    rng = np.random.default_rng(13)
    extra = {"plain": {}, "relu-quantize-affine": dict(activation="Relu", activation_params=[], affine=True,
                                                        output_quantization=[0.07, -3.0, 252.0]),
             "rounding-residual": dict(residual=True)}[epilogue]
    inputs, attrs = _node(rng, c=300, m=20, hw=(6, 6), pads=[1, 1, 1, 1], per_channel=True, **extra)
    inputs[6] = np.array(2.0, np.float32)  # y's scale for these larger sums
    from minfer_ops_numba import qconv

    assert qconv._bound(inputs[3], inputs[5], inputs[8]) >= qconv.EXACT
    _check(inputs, attrs, rng)


@pytest.mark.parametrize("case", ["depthwise", "computed-weight", "computed-scale", "integer-output", "int32-overflow"])
def test_declines_what_it_does_not_compute(case):
    """Depthwise convs, weights or scales computed at run, an 8-bit output, and sums int32 would not hold stay with
    minfer-ops-conv."""
    from minfer_ops_numba import qconv

    rng = np.random.default_rng(5)
    kw = dict(c=8000, m=2, k=(3, 3), hw=(3, 3)) if case == "int32-overflow" else {}
    inputs, attrs = _node(rng, **kw)
    if case == "int32-overflow":
        inputs[3] = np.full(inputs[3].shape, -128, np.int8)  # 255 * 128 * 72000 > 2**31
        inputs[5] = np.array(0, np.int8)
    ctx = _ctx(inputs, _out_shape(inputs, attrs))
    assert case == "int32-overflow" or qconv.float_qlinear_conv.applies(ctx, attrs) == igemm.vnni()
    if case == "depthwise":
        attrs["group"] = 5
    elif case in ("computed-weight", "computed-scale"):
        dropped = 3 if case == "computed-weight" else 1
        ctx = ctx.__class__(ctx.node_name, OP, 1, ctx.input_types, ctx.output_types,
                            tuple(None if i == dropped else v for i, v in enumerate(ctx.constants)), 1)
    elif case == "integer-output":
        attrs["float_output"] = 0
    assert not qconv.float_qlinear_conv.applies(ctx, attrs)


SCALED = "ScaledConvInteger"


def _scaled_node(rng, *, dynamic=True, n=1, c=9, m=20, hw=(8, 9), k=(3, 3), xt=np.uint8, wt=np.int8, per_channel=False,
                 affine=False, **attrs):
    """(inputs, attributes) of one ScaledConvInteger node with random operands."""
    x = rng.standard_normal((n, c) + hw).astype(np.float32) * 3 if dynamic else _random(rng, xt, (n, c) + hw)
    xz = None if dynamic else _random(rng, xt, ())
    w = _random(rng, wt, (m, c) + k)
    wz = _random(rng, wt, (m,)) // 4 if per_channel else np.array(-2 if wt == np.int8 else 130, wt)
    scale = np.array([0.0007], np.float32)
    s, a = (rng.standard_normal(m).astype(np.float32), rng.standard_normal(m).astype(np.float32)) if affine else \
        (None, None)
    inputs = [x, w, xz, wz, scale, s, a]
    while inputs[-1] is None:
        inputs.pop()
    return inputs, dict(dynamic_input=int(dynamic), **attrs)


def _scaled_both(inputs, attrs, constant=(1, 3)):
    from minfer_core import KernelContext, TensorType
    from minfer_ops_conv import quant
    from minfer_ops_numba import qconv

    if not igemm.vnni():
        pytest.skip("the kernel applies only on AVX-512 VNNI")
    shape = _out_shape([inputs[0], None, None, inputs[1]], attrs)
    types = tuple(None if v is None else TensorType(v.dtype, v.shape) for v in inputs)
    consts = tuple(v if i in constant else None for i, v in enumerate(inputs))

    def ctx():
        return KernelContext("n", SCALED, 1, types, (TensorType(np.float32, shape),), consts, 1)

    assert qconv.scaled_conv_integer.applies(ctx(), attrs)
    return qconv.scaled_conv_integer.fn(ctx(), **attrs), quant.scaled_conv_integer.fn(ctx(), **attrs)


@pytest.mark.parametrize("case", ["dynamic-3x3-pad", "dynamic-1x1-relu", "dynamic-clip-affine-pc", "dynamic-stride2",
                                  "dynamic-batch2", "dynamic-nan", "uint8-1x1", "uint8-3x3-pc", "int8-uint8w"])
def test_scaled_conv_integer_bit_for_bit(case):
    """ScaledConvInteger (DynamicQuantizeLinear inside, or an 8-bit input with a zero point given at run; per-tensor
    and per-channel weight zero points; activations and ChannelAffine S/A; a NaN input): the numpy kernel's bits."""
    rng = np.random.default_rng(sum(map(ord, case)))
    kw = {"dynamic-3x3-pad": dict(pads=[1, 1, 1, 1]),
          "dynamic-1x1-relu": dict(k=(1, 1), c=70, activation="Relu", activation_params=[]),
          "dynamic-clip-affine-pc": dict(activation="Clip", activation_params=[0.0, 6.0], affine=True,
                                         per_channel=True, pads=[1, 1, 1, 1]),
          "dynamic-stride2": dict(strides=[2, 2], k=(1, 1), c=33),
          "dynamic-batch2": dict(n=2, pads=[0, 1, 2, 1]),
          "dynamic-nan": dict(pads=[1, 1, 1, 1]),
          "uint8-1x1": dict(dynamic=False, k=(1, 1), c=65, m=70),
          "uint8-3x3-pc": dict(dynamic=False, per_channel=True, pads=[1, 1, 1, 1], strides=[2, 2]),
          "int8-uint8w": dict(dynamic=False, xt=np.int8, wt=np.uint8, pads=[1, 1, 1, 1])}[case]
    inputs, attrs = _scaled_node(rng, **kw)
    if case == "dynamic-nan":
        inputs[0][0, 1, 2, 3] = np.nan
    mine, numpy_run = _scaled_both(inputs, attrs)
    args = [None if i in (1, 3) else v for i, v in enumerate(inputs)]
    with np.errstate(invalid="ignore"):
        got, want = mine(*args), numpy_run(*args)
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    assert np.unique(want).size > 20  # the outputs are not all saturated or zero
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("case", ["3x3-clip-affine-pc", "1x1-relu", "stem-affine"])
def test_scaled_conv_integer_with_constant_scales_bit_for_bit(case):
    """With the weight's scale and ChannelAffine's S and A constant (as the quantizer writes them), the chain's arrays
    are made at build and each run puts only its dynamic factor in: the numpy kernel's bits, run after run on inputs
    of other ranges (a factor kept from an earlier run, or the template changed by a run, would show)."""
    rng = np.random.default_rng(sum(map(ord, case)))
    kw = {"3x3-clip-affine-pc": dict(activation="Clip", activation_params=[0.0, 6.0], affine=True, per_channel=True,
                                     pads=[1, 1, 1, 1]),
          "1x1-relu": dict(k=(1, 1), c=70, activation="Relu", activation_params=[], affine=True),
          "stem-affine": dict(c=3, m=16, strides=[2, 2], pads=[1, 1, 1, 1], hw=(17, 18), affine=True)}[case]
    inputs, attrs = _scaled_node(rng, **kw)
    mine, numpy_run = _scaled_both(inputs, attrs, constant=(1, 3, 4, 5, 6))
    assert mine.fixed is not None  # the constant chain, made at build
    for spread in (3.0, 0.05, 40.0):
        x = rng.standard_normal(inputs[0].shape).astype(np.float32) * np.float32(spread)
        args = [x] + [None if i in (1, 3) else v for i, v in enumerate(inputs)][1:]
        got, want = mine(*args), numpy_run(*args)
        assert np.unique(want).size > 20  # the outputs are not all saturated or zero
        np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", ["stride2-team", "relu-affine-pc", "nan"])
def test_dynamic_stem_by_the_direct_loop_bit_for_bit(case, threads):
    """A dynamic stem (DynamicQuantizeLinear inside, at most 4 input channels, 3x3) runs qstem.py's direct loop on
    the input quantized and centered on the range it finds, the chain band by band, one thread or a team: the numpy
    kernel's bits; an input holding NaN goes to igemm's path (its own quantization of a NaN range)."""
    from minfer_core.parallel import using_threads
    from minfer_ops_numba import qstem

    rng = np.random.default_rng(len(case) + threads)
    kw = {"stride2-team": dict(c=3, m=32, hw=(80, 84), strides=[2, 2], pads=[1, 1, 1, 1]),
          "relu-affine-pc": dict(c=3, m=16, hw=(20, 21), strides=[2, 2], pads=[1, 1, 1, 1], activation="Relu",
                                 activation_params=[], affine=True, per_channel=True),
          "nan": dict(c=2, m=9, hw=(11, 19), pads=[1, 1, 1, 1])}[case]
    inputs, attrs = _scaled_node(rng, **kw)
    if case == "nan":
        inputs[0][0, 1, 2, 3] = np.nan
    mine, numpy_run = _scaled_both(inputs, attrs)
    assert isinstance(mine.stem, qstem.QStem)
    args = [None if i in (1, 3) else v for i, v in enumerate(inputs)]
    calls = []
    real = qstem.QStem.into
    with pytest.MonkeyPatch.context() as patch, np.errstate(invalid="ignore"):
        patch.setattr(qstem.QStem, "into", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
        with using_threads(threads):
            got = mine(*args)
        want = numpy_run(*args)
    assert bool(calls) == (case != "nan")  # a range with NaN is not finite: igemm's path, not the stem
    assert np.unique(want).size > 10
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


def test_scaled_conv_integer_declines_depthwise_and_float_input_without_dynamic():
    """A depthwise ScaledConvInteger, or a float32 input without dynamic_input, stays with minfer-ops-conv."""
    from minfer_core import KernelContext, TensorType
    from minfer_ops_numba import qconv

    rng = np.random.default_rng(3)
    inputs, attrs = _scaled_node(rng)
    types = tuple(None if v is None else TensorType(v.dtype, v.shape) for v in inputs)
    ctx = KernelContext("n", SCALED, 1, types, (TensorType(np.float32, (1, 20, 6, 7)),),
                        tuple(v if i in (1, 3) else None for i, v in enumerate(inputs)), 1)
    assert qconv.scaled_conv_integer.applies(ctx, attrs) == igemm.vnni()
    assert not qconv.scaled_conv_integer.applies(ctx, dict(attrs, group=9))
    assert not qconv.scaled_conv_integer.applies(ctx, dict(attrs, dynamic_input=0))


STEMS = {  # name: (node keywords): a network's stem, which qstem.py's direct loop takes
    "stride2-team": dict(k=(3, 3), c=3, m=32, hw=(80, 84), strides=[2, 2], pads=[1, 1, 1, 1]),  # 1.45M: a team
    "batch2-stride1": dict(k=(3, 3), c=2, m=9, hw=(11, 19), n=2, pads=[1, 1, 1, 1]),
    "one-channel-same": dict(k=(3, 3), c=1, m=5, hw=(9, 13), strides=[2, 2], auto_pad="SAME_UPPER"),
    "eight-bit-input": dict(k=(3, 3), c=3, m=16, hw=(20, 21), strides=[2, 2], pads=[1, 1, 1, 1], float_input=0),
    "relu-quantize": dict(k=(3, 3), c=3, m=16, hw=(20, 21), strides=[2, 2], pads=[1, 1, 1, 1], activation="Relu",
                          activation_params=[], output_quantization=[0.07, -3.0, 252.0]),
    "rounding-residual-pc": dict(k=(3, 3), c=4, m=12, hw=(16, 16), pads=[1, 1, 1, 1], residual=True,
                                 per_channel=True),
}


@pytest.mark.parametrize("stem", list(STEMS))
@pytest.mark.parametrize("threads", [1, 2])
def test_stem_by_the_direct_loop_bit_for_bit(stem, threads):
    """A stem (at most 4 input channels, 3x3, strides 1 or 2) runs qstem.py's direct loop on centered float32
    operands, on one thread and on a native team: its sums are exact, so the numpy kernel's bits. Where the epilogue
    is a chain with nothing after it (no residual) the stem applies it band by band (`QStem.into`)."""
    from minfer_core.parallel import using_threads
    from minfer_ops_numba import fewchannels, qstem, team

    rng = np.random.default_rng(len(stem))
    inputs, attrs = _node(rng, **STEMS[stem])
    mine, numpy_run = _both(inputs, attrs)
    assert isinstance(mine.stem, qstem.QStem)
    assert mine.banded == (stem != "rounding-residual-pc")
    args = _run_args(inputs, attrs, rng)
    want = numpy_run(*args)
    assert np.unique(want).size > 10  # not all saturated or zero
    calls, shared = [], []
    entry = "into" if mine.banded else "__call__"
    real = getattr(qstem.QStem, entry)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(qstem.QStem, entry, lambda self, *a: calls.append(1) or real(self, *a))
        for module, name in ((fewchannels, "drive_direct"), (qstem, "_drive"), (qstem, "_drive_bands")):
            patch.setattr(module, name, lambda *a, _real=getattr(module, name): shared.append(1) or _real(*a))
        with using_threads(threads):
            got = mine(*args)
    assert calls
    assert bool(shared) == (threads == 2 and stem == "stride2-team" and team.available())
    np.testing.assert_array_equal(got.view(np.int32), want.view(np.int32))


@pytest.mark.parametrize("scaled", [False, True], ids=["FloatQLinearConv", "ScaledConvInteger"])
def test_igemm_leaves_small_1x1_convs_to_the_micro_kernel(monkeypatch, scaled):
    """A 1x1 stride-1 conv of at most MICRO_CHANNELS input channels or MICRO_OUTPUTS output channels, which
    qconv_blas.py's product takes on pointwise.py's micro-kernel, is not igemm's (in a run the micro-kernel was
    faster there, which the first run's timing did not always see); one more channel of each, a stride, a pad or a
    3x3 window, and igemm is a candidate again."""
    from minfer_core import KernelContext, TensorType
    from minfer_ops_numba import pointwise, qconv, qconv_blas, team

    if not igemm.vnni() or not pointwise.available() or not team.gemm_address():
        pytest.skip("igemm needs VNNI, the micro-kernel AVX-512F, qconv_blas.py numpy's BLAS from compiled code")
    monkeypatch.setattr(qconv, "MICRO_CHANNELS", 64)  # this module's fixture sets both to 0
    monkeypatch.setattr(qconv, "MICRO_OUTPUTS", 32)
    rng = np.random.default_rng(31)

    def applies(c, m=96, k=(1, 1), **attrs):
        if scaled:
            inputs, attrs = _scaled_node(rng, c=c, m=m, k=k, hw=(10, 12), **attrs)
            types = tuple(None if v is None else TensorType(v.dtype, v.shape) for v in inputs)
            consts = tuple(v if i in (1, 3, 4) else None for i, v in enumerate(inputs))
            shape = _out_shape([inputs[0], None, None, inputs[1]], attrs)
            ctx = KernelContext("n", SCALED, 1, types, (TensorType(np.float32, shape),), consts, 1)
            blas = qconv_blas.scaled_conv_integer_blas
            return qconv.scaled_conv_integer.applies(ctx, attrs), blas.applies(ctx, attrs)
        inputs, attrs = _node(rng, c=c, m=m, k=k, hw=(10, 12), **attrs)
        ctx = _ctx(inputs, _out_shape(inputs, attrs))
        return qconv.float_qlinear_conv.applies(ctx, attrs), qconv_blas.float_qlinear_conv_blas.applies(ctx, attrs)

    assert applies(64) == (False, True)
    assert applies(16) == (False, True)
    assert applies(65) == (True, True)
    assert applies(192, m=32) == (False, True)
    assert applies(192, m=33) == (True, True)
    assert applies(32, m=24, strides=[2, 2])[0]
    assert applies(32, m=24, pads=[1, 1, 1, 1])[0]
    assert applies(32, m=24, k=(3, 3), pads=[1, 1, 1, 1]) == (True, True)
