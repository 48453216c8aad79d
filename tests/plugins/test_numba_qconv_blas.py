"""minfer-ops-numba's FloatQLinearConv on sgemm from compiled code (qconv_blas.py): minfer-ops-conv's values."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from test_qconv_igemm import SHAPES, _ctx, _node, _out_shape  # noqa: E402 (the igemm kernel's cases, same node)

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


@pytest.fixture
def uncapped(monkeypatch):
    """The weight cap lifted: it is the weight budget's, not a limit of what the kernel computes, and igemm's cases
    below have weights of up to 12k values."""
    from minfer_ops_numba import qconv_blas

    monkeypatch.setattr(qconv_blas, "MAX_WEIGHTS", 1 << 30)


def _check(inputs, attrs, threads=1):
    from minfer_ops_numba import qconv_blas, team

    from test_numba_qdepthwise import _check as check  # the depthwise kernel's check, for this kernel

    if not team.gemm_address():
        pytest.skip("the kernel applies only where numpy's BLAS is callable from compiled code")
    check(inputs, attrs, threads, qconv_blas.float_qlinear_conv_blas)


@pytest.mark.parametrize("shape", list(SHAPES), ids=str)
@pytest.mark.parametrize("kinds", [(np.uint8, np.int8, False), (np.int8, np.int8, True)],
                         ids=lambda k: f"{np.dtype(k[0])}x{np.dtype(k[1])}{'-pc' if k[2] else ''}")
@pytest.mark.parametrize("float_input", [0, 1])
@pytest.mark.usefixtures("uncapped")
def test_values_as_the_numpy_kernel(shape, kinds, float_input):
    """1x1 (the input as the GEMM's operand) and windowed (im2col) convs, strides, pads, dilations, batch 2,
    per-tensor and per-channel weights, an 8-bit input or a float32 one to quantize: minfer-ops-conv's values."""
    rng = np.random.default_rng(len(shape) * 3 + kinds[2] + float_input)
    xt, wt, per_channel = kinds
    inputs, attrs = _node(rng, xt=xt, wt=wt, per_channel=per_channel, float_input=float_input, **SHAPES[shape])
    _check(inputs, attrs)


@pytest.mark.parametrize("epilogue", ["none", "relu-quantize", "clip-affine", "rounding", "no-bias"])
def test_epilogues_and_centered_input(epilogue):
    """Each epilogue the integer fusion makes, on an input centered already (``float_input`` 2, as a producer's
    output_quantization writes it), as the numpy kernel's."""
    rng = np.random.default_rng(8)
    extra = {"none": {}, "no-bias": dict(bias=False),
             "relu-quantize": dict(activation="Relu", activation_params=[], output_quantization=[0.07, -3.0, 252.0]),
             "clip-affine": dict(activation="Clip", activation_params=[0.0, 6.0], affine=True),
             "rounding": dict(output_rounding=[0.05, -128.0, 127.0])}[epilogue]
    inputs, attrs = _node(rng, c=24, m=40, hw=(10, 10), k=(1, 1), **extra)
    inputs[0] = (rng.integers(0, 256, inputs[0].shape) - 128).astype(np.float32)  # centered uint8 values
    inputs[2] = np.array(128, np.uint8)
    attrs["float_input"] = 2
    _check(inputs, attrs)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("shape", [dict(hw=(28, 28), k=(1, 1)), dict(hw=(9, 10), k=(3, 3), pads=[1, 1, 1, 1])],
                         ids=["1x1", "3x3"])
def test_residual_and_its_rounding(shape, threads):
    """A residual block's tail (the output's rounding, + Z, Z's rounding: a projection conv's in MobileNetV2) on each
    unit, one thread or two, per-channel weights, NaN in Z: minfer-ops-conv's values."""
    rng = np.random.default_rng(12)
    inputs, attrs = _node(rng, c=48, m=32, residual=True, per_channel=True, **shape)
    z = rng.standard_normal(_out_shape(inputs, attrs)).astype(np.float32) * 3
    z.reshape(-1)[::97] = np.nan
    inputs[11] = z
    _check(inputs, attrs, threads=threads)


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("micro", [True, False], ids=["micro-kernel", "blas"])
def test_1x1_by_the_micro_kernel_or_blas(monkeypatch, micro, threads):
    """A 1x1 stride-1 conv's GEMM by pointwise.py's micro-kernel where it can be built (tiles of 1-4 output
    channels, a last block of pixels short of 64), else by BLAS on the input as it lies: minfer-ops-conv's values
    either way (the sums are exact integers), with a residual block's tail, one thread or a team."""
    from minfer_ops_numba import pointwise, qconv_blas

    if micro and not pointwise.available():
        pytest.skip("pointwise.py's micro-kernel needs AVX-512 and numba's LLVM 17 or later")
    if not micro:
        monkeypatch.setattr(pointwise, "available", lambda: False)
    plans = []
    real = qconv_blas.Product._plan
    monkeypatch.setattr(qconv_blas.Product, "_plan", lambda self, x: plans.append(real(self, x)) or plans[-1])
    rng = np.random.default_rng(21)
    inputs, attrs = _node(rng, c=40, m=38, hw=(9, 11), k=(1, 1), residual=True, per_channel=True)
    inputs[11] = rng.standard_normal(_out_shape(inputs, attrs)).astype(np.float32) * 3
    _check(inputs, attrs, threads=threads)
    assert plans and all(plan[3] == (qconv_blas.MICRO if micro else 1) for plan in plans)


def test_residual_of_another_shape_is_refused():
    from minfer_ops_numba import qconv_blas

    rng = np.random.default_rng(13)
    inputs, attrs = _node(rng, c=8, m=16, hw=(6, 6), k=(1, 1), residual=True)
    ctx = _ctx(inputs, _out_shape(inputs, attrs))
    run = qconv_blas.float_qlinear_conv_blas.fn(ctx, **attrs)
    args = [None if i in (3, 5) else v for i, v in enumerate(inputs)]
    args[11] = np.zeros((1, 16, 6, 5), np.float32)
    with pytest.raises(ValueError, match="residual"):
        run(*args)


def test_split_over_threads():
    """A conv big enough to split over two threads (bands of rows, or blocks of channels on a small map) gives the
    serial values."""
    rng = np.random.default_rng(4)
    for hw, k, m in (((40, 40), (1, 1), 128), ((7, 7), (1, 1), 128), ((20, 20), (3, 3), 12)):
        inputs, attrs = _node(rng, c=32, m=m, hw=hw, k=k, pads=[1, 1, 1, 1] if k == (3, 3) else None,
                              output_quantization=[0.07, -3.0, 252.0])
        _check(inputs, attrs, threads=2)


def test_holds_8_bit_weights_and_declines_past_its_cap():
    """The sgemm reads the centered weights as float32, written into scratch each run: the kernel holds the 8-bit
    ones (a quantized model's weights stay 8-bit), so it takes weights up to MAX_WEIGHTS, past which the centering
    would cost more than it saves (igemm's or numpy's kernel takes the node)."""
    from bench.quantized import held_array_bytes
    from minfer_ops_numba import qconv_blas

    rng = np.random.default_rng(6)
    small, attrs = _node(rng, c=64, m=1024, hw=(7, 7), k=(1, 1))
    big, _ = _node(rng, c=64, m=1025, hw=(7, 7), k=(1, 1))
    assert small[3].size == qconv_blas.MAX_WEIGHTS < big[3].size
    ctx = _ctx(small, _out_shape(small, attrs))
    assert qconv_blas.float_qlinear_conv_blas.applies(ctx, attrs)
    assert not qconv_blas.float_qlinear_conv_blas.applies(_ctx(big, _out_shape(big, attrs)), attrs)
    run = qconv_blas.float_qlinear_conv_blas.prepared(ctx, attrs)
    held = held_array_bytes(run)
    # the 8-bit weights (64 KB) and per-channel operands (4 KB each); float32 weights alone would be 256 KB
    assert small[3].nbytes <= held < 2 * small[3].nbytes, held


def _scaled(rng, *, dynamic, c=12, m=20, hw=(9, 11), k=(1, 1), xt=np.uint8, affine=False, **attrs):
    """(inputs, attributes) of one group-1 ScaledConvInteger (a dynamic model's DynamicQuantizeLinear -> ConvInteger
    -> Cast -> Mul, or a ConvInteger -> Cast -> Mul of an 8-bit x)."""
    info = np.iinfo(xt)
    x = rng.standard_normal((1, c) + hw).astype(np.float32) * 3 if dynamic else \
        rng.integers(info.min, int(info.max) + 1, (1, c) + hw).astype(xt)
    xz = None if dynamic else np.array(7, xt)
    w = rng.integers(-128, 128, (m, c) + k).astype(np.int8)
    inputs = [x, w, xz, np.array(2, np.int8), np.array(0.0007, np.float32)]
    if affine:
        inputs += [rng.standard_normal(m).astype(np.float32), rng.standard_normal(m).astype(np.float32)]
    return inputs, dict(dynamic_input=int(dynamic), group=1, **attrs)


def _check_scaled(inputs, attrs, threads=1):
    from minfer_ops_numba import qconv_blas, team

    from test_numba_qdepthwise import _check_scaled as check  # the depthwise kernel's check, for this kernel

    if not team.gemm_address():
        pytest.skip("the kernel applies only where numpy's BLAS is callable from compiled code")
    check(inputs, attrs, threads, qconv_blas.scaled_conv_integer_blas)


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "8-bit"])
@pytest.mark.parametrize("case", ["1x1", "3x3-stride2", "relu-affine", "int8"])
def test_scaled_conv_integer_as_the_numpy_kernel(dynamic, case):
    """ScaledConvInteger of group 1, its input 8-bit or quantized dynamically (DynamicQuantizeLinear's scale and zero
    point from the input's range), with an activation and ChannelAffine's S/B: minfer-ops-conv's values."""
    rng = np.random.default_rng(21 + dynamic)
    extra = {"1x1": {}, "3x3-stride2": dict(k=(3, 3), strides=[2, 2], pads=[1, 1, 1, 1]),
             "relu-affine": dict(activation="Relu", affine=True),
             "int8": dict(xt=np.int8, k=(3, 3), pads=[0, 1, 1, 0])}[case]
    if dynamic and case == "int8":
        extra.pop("xt")
    inputs, attrs = _scaled(rng, dynamic=dynamic, **extra)
    _check_scaled(inputs, attrs)


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the DynamicQuantizeLinear kernel's, on NaN
def test_scaled_conv_integer_dynamic_nan_and_threads():
    """A dynamic input holding NaN goes through the DynamicQuantizeLinear kernel itself, as minfer-ops-conv's does;
    a big map split over two threads gives the serial values."""
    rng = np.random.default_rng(3)
    inputs, attrs = _scaled(rng, dynamic=True, c=16, m=96, hw=(40, 40))
    _check_scaled(inputs, attrs, threads=2)
    inputs[0][0, 2, 5, 5] = np.nan
    _check_scaled(inputs, attrs)
