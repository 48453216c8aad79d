"""minfer-ops-numba's quantized depthwise convs (qdepthwise.py): minfer-ops-conv's values."""

from __future__ import annotations

import attrs as attrs_
import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from test_qconv_igemm import _ctx, _out_shape, _random  # noqa: E402 (the FloatQLinearConv node's helpers)

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


def _node(rng, *, n=1, c=20, hw=(9, 11), k=(3, 3), xt=np.uint8, wt=np.int8, per_channel=False, float_input=1,
          bias=True, affine=False, **attrs):
    """(inputs, attributes) of one depthwise FloatQLinearConv node (group == C == M) with random operands."""
    if float_input == 1:
        x = rng.standard_normal((n, c) + hw).astype(np.float32) * 2
    elif float_input == 2:  # centered 8-bit values, as a producer's output_quantization writes them
        x = (rng.integers(0, 256, (n, c) + hw) - 128).astype(np.float32)
    else:
        x = _random(rng, xt, (n, c) + hw)
    xs, xz = np.array(0.03, np.float32), _random(rng, xt, ())
    if float_input == 2:
        xz = np.array(128 if xt == np.uint8 else 0, xt)
    w = _random(rng, wt, (c, 1) + k)
    ws = rng.uniform(0.002, 0.02, c).astype(np.float32) if per_channel else np.array(0.01, np.float32)
    wz = _random(rng, wt, (c,)) // 4 if per_channel else np.array(3, wt)
    ys, yz = np.array(0.15, np.float32), np.array((128 if xt == np.uint8 else 0) + rng.integers(-10, 10), xt)
    b = rng.integers(-3000, 3000, c).astype(np.int32) if bias else None
    s, a = (rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)) if affine else \
        (None, None)
    inputs = [x, xs, xz, w, ws, wz, ys, yz, b, s, a]
    while inputs[-1] is None and len(inputs) > 8:
        inputs.pop()
    return inputs, dict(float_input=float_input, float_output=1, group=c, **attrs)


def _check(inputs, attrs, threads=1, record=None):
    """``record`` (default: qdepthwise's FloatQLinearConv kernel) applies to the node and gives minfer-ops-conv's
    values, at ``threads`` threads."""
    from minfer_core.parallel import using_threads
    from minfer_ops_conv import quant
    from minfer_ops_numba import qdepthwise

    record = record or qdepthwise.float_qlinear_conv_depthwise
    ctx = _ctx(inputs, _out_shape(inputs, attrs))
    assert record.applies(ctx, attrs)
    mine = record.fn(ctx, **attrs)
    numpy_run = quant.float_qlinear_conv.fn(ctx, **attrs)
    args = [None if i in (3, 5) else v for i, v in enumerate(inputs)]  # packed: the engine passes None there
    want = numpy_run(*args)
    with using_threads(threads):
        got = mine(*args)
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    # the same values, NaN where the numpy kernel has NaN (a zero sum's sign follows the float Conv kernel minfer-ops-conv
    # finds, which the float32 exact sums leave to each kernel's order: -0.0 == 0.0 here)
    np.testing.assert_array_equal(got, want)
    return got


SHAPES = {  # name: (node keywords)
    "3x3-pad": dict(pads=[1, 1, 1, 1]),
    "3x3-stride2-pad": dict(strides=[2, 2], pads=[1, 1, 1, 1], hw=(13, 14)),
    "3x3-nopad": dict(hw=(7, 8)),
    "5x5-stride2": dict(k=(5, 5), strides=[2, 2], pads=[2, 2, 2, 2], hw=(15, 12)),
    "5x5-asym-same": dict(k=(5, 5), auto_pad="SAME_UPPER", strides=[2, 2], hw=(8, 9)),
    "3x1-dilated": dict(k=(3, 1), dilations=[2, 1], pads=[2, 0, 1, 0], hw=(10, 6)),
    "stride3-uneven": dict(strides=[3, 2], pads=[0, 1, 2, 0], hw=(11, 13)),
    "batch2": dict(n=2, c=7, pads=[1, 1, 1, 1], hw=(5, 6)),
}


@pytest.mark.parametrize("shape", list(SHAPES), ids=str)
@pytest.mark.parametrize("kinds", [(np.uint8, np.int8, False), (np.int8, np.int8, True), (np.uint8, np.uint8, True)],
                         ids=lambda k: f"{np.dtype(k[0])}x{np.dtype(k[1])}{'-pc' if k[2] else ''}")
def test_values_as_the_numpy_kernel(shape, kinds):
    """Quantized float input, per-tensor and per-channel weights, uint8/int8 operands, kernels 3x3, 5x5 and 3x1,
    strides 1-3, pads (asymmetric, SAME), dilation, batch 2: minfer-ops-conv's values."""
    rng = np.random.default_rng(len(shape) * 7 + kinds[2])
    xt, wt, per_channel = kinds
    inputs, attrs = _node(rng, xt=xt, wt=wt, per_channel=per_channel, **SHAPES[shape])
    _check(inputs, attrs)


@pytest.mark.parametrize("float_input", [0, 1, 2])
@pytest.mark.parametrize("epilogue", ["none", "relu-quantize", "clip-affine", "rounding", "no-bias"])
def test_inputs_and_epilogues_as_the_numpy_kernel(float_input, epilogue):
    """Each input form (8-bit, float32 to quantize, centered) and each epilogue the integer fusion makes
    (activation, ChannelAffine S/B, the next conv's quantization, a QuantizeDequantize rounding) as the numpy
    kernel's."""
    rng = np.random.default_rng(31 + float_input)
    extra = {"none": {}, "no-bias": dict(bias=False),
             "relu-quantize": dict(activation="Relu", activation_params=[], output_quantization=[0.07, -3.0, 252.0]),
             "clip-affine": dict(activation="Clip", activation_params=[0.0, 6.0], affine=True),
             "rounding": dict(activation="Clip", activation_params=[0.0, 6.0], output_rounding=[0.05, -128.0, 127.0])}
    inputs, attrs = _node(rng, float_input=float_input, pads=[1, 1, 1, 1], **extra[epilogue])
    _check(inputs, attrs)


def test_split_over_threads_and_nan():
    """A map big enough to split gives the serial values over two threads; a NaN input is NaN wherever a window
    holds it and nowhere else."""
    rng = np.random.default_rng(5)
    inputs, attrs = _node(rng, c=48, hw=(40, 40), pads=[1, 1, 1, 1], output_quantization=[0.07, -3.0, 252.0])
    inputs[0][0, 3, 10, 10] = np.nan
    got = _check(inputs, attrs, threads=2)
    nan = np.argwhere(np.isnan(got))
    assert {tuple(p[2:]) for p in nan} == {(r, c) for r in (9, 10, 11) for c in (9, 10, 11)}
    assert set(nan[:, 1]) == {3}


def test_declines_what_it_does_not_compute():
    """Not depthwise (group 1, or group below C), a residual, a non-constant weight: the kernel does not apply."""
    from minfer_ops_numba import qdepthwise

    rng = np.random.default_rng(2)
    inputs, attrs = _node(rng, c=6, pads=[1, 1, 1, 1])
    fits = qdepthwise.float_qlinear_conv_depthwise.applies
    shape = _out_shape(inputs, attrs)
    assert fits(_ctx(inputs, shape), attrs)
    assert not fits(_ctx(inputs, shape), {**attrs, "group": 3})
    assert not fits(_ctx(inputs, shape), {**attrs, "residual_rounding": [0.1, -128.0, 127.0],
                                          "output_rounding": [0.05, -128.0, 127.0]})
    ctx = _ctx(inputs, shape)
    live = attrs_.evolve(ctx, constants=tuple(None if i == 3 else v for i, v in enumerate(ctx.constants)))
    assert not fits(live, attrs)


def _scaled_node(rng, *, dynamic, c=20, hw=(9, 11), k=(3, 3), xt=np.uint8, wt=np.int8, affine=False, **attrs):
    """(inputs, attributes) of one depthwise ScaledConvInteger node (what the integer fusion makes of a dynamic
    model's DynamicQuantizeLinear -> ConvInteger -> Cast -> Mul, or of a ConvInteger -> Cast -> Mul)."""
    x = rng.standard_normal((1, c) + hw).astype(np.float32) * 3 if dynamic else _random(rng, xt, (1, c) + hw)
    xz = None if dynamic else _random(rng, xt, ())
    w, wz = _random(rng, wt, (c, 1) + k), np.array(2, wt)
    scale = np.array(0.0007, np.float32)
    s, a = (rng.standard_normal(c).astype(np.float32), rng.standard_normal(c).astype(np.float32)) if affine else \
        (None, None)
    inputs = [x, w, xz, wz, scale, s, a]
    while inputs[-1] is None:
        inputs.pop()
    return inputs, dict(dynamic_input=int(dynamic), group=c, **attrs)


def _check_scaled(inputs, attrs, threads=1, record=None):
    """``record`` (default: qdepthwise's ScaledConvInteger kernel) applies to the node and gives minfer-ops-conv's
    values, at ``threads`` threads."""
    from minfer_core import KernelContext, TensorType
    from minfer_core.parallel import using_threads
    from minfer_ops_conv import quant
    from minfer_ops_numba import qdepthwise
    from minfer_ops_numba.window import window

    record = record or qdepthwise.scaled_conv_integer_depthwise

    x, w = inputs[0], inputs[1]
    win = window(x.shape[2:], w.shape[2:], attrs.get("strides") or (1, 1), attrs.get("dilations") or (1, 1),
                 attrs.get("pads"), attrs.get("auto_pad", "NOTSET"), clamp_same=True)
    out = TensorType(np.float32, (x.shape[0], w.shape[0]) + win.out_shape)
    types = tuple(None if v is None else TensorType(v.dtype, v.shape) for v in inputs)
    ctx = KernelContext("n", "ScaledConvInteger", 1, types, (out,), (None, *inputs[1:]), 1)
    assert record.applies(ctx, attrs)
    mine = record.fn(ctx, **attrs)
    numpy_run = quant.scaled_conv_integer.fn(ctx, **attrs)
    args = [None if i in (1, 3) else v for i, v in enumerate(inputs)]  # packed: the engine passes None there
    want = numpy_run(*args)
    with using_threads(threads):
        got = mine(*args)
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "8-bit"])
@pytest.mark.parametrize("case", ["3x3-pad", "5x5-stride2", "relu-affine", "int8"])
def test_scaled_conv_integer_as_the_numpy_kernel(dynamic, case):
    """ScaledConvInteger when depthwise, its input 8-bit or quantized dynamically (DynamicQuantizeLinear's scale
    and zero point from the input's range), with an activation and ChannelAffine's S/B: minfer-ops-conv's values."""
    rng = np.random.default_rng(11 + dynamic)
    extra = {"3x3-pad": dict(pads=[1, 1, 1, 1]), "5x5-stride2": dict(k=(5, 5), strides=[2, 2], pads=[2, 2, 2, 2]),
             "relu-affine": dict(pads=[1, 1, 1, 1], activation="Relu", affine=True),
             "int8": dict(xt=np.int8, pads=[0, 1, 1, 0])}[case]
    if dynamic and case == "int8":
        extra.pop("xt")
    inputs, attrs = _scaled_node(rng, dynamic=dynamic, **extra)
    _check_scaled(inputs, attrs)


@pytest.mark.filterwarnings("ignore:invalid value encountered")  # the DynamicQuantizeLinear kernel's, on NaN
def test_scaled_conv_integer_dynamic_nan_and_threads():
    """A dynamic input holding NaN goes through the DynamicQuantizeLinear kernel itself, as minfer-ops-conv's does;
    a big map split over two threads gives the serial values."""
    rng = np.random.default_rng(3)
    inputs, attrs = _scaled_node(rng, dynamic=True, c=40, hw=(30, 30), pads=[1, 1, 1, 1])
    _check_scaled(inputs, attrs, threads=2)
    inputs[0][0, 2, 5, 5] = np.nan
    _check_scaled(inputs, attrs)


def _sums(rng, c, cells):
    """Exact integer sums as a unit holds them, with -0.0, values past the bounds and a NaN (a NaN input's)."""
    y = np.rint(rng.standard_normal((c, cells)) * 60000).astype(np.float32)
    y[:, :4] = [-0.0, 1e7, -1e7, np.nan]
    return y.reshape(-1)


@pytest.mark.parametrize("act", [(-np.inf, np.inf), (0.0, np.inf), (0.0, 6.0)])
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("post_factor", ["integers", "dequantized"])
def test_fitted_chain_is_the_chains_bits(act, affine, post_factor):
    """`fitted` replaces a chain ending on a post grid by rint(clip(k * r + t)) with each channel's r and t where
    that gives the chain's bits for every integer k its first clip lets through; `requantize_channels` then gives the
    chain's bits for every sum (-0.0, past the bounds, NaN)."""
    from minfer_ops_numba import qdepthwise

    rng = np.random.default_rng(int(affine) * 7 + len(post_factor) + int(act[0] == 0) + int(np.isfinite(act[1])))
    c, cells = 24, 300
    post = 0.0235294122248888 if act[1] == 6.0 else 0.0437
    chain = np.array([-127, 128, 0.0531955, *act, post, 0, 255, 1.0 if post_factor == "integers" else post, 1],
                     np.float32)
    m = rng.uniform(1e-4, 1e-3, c).astype(np.float32)
    cc = np.rint(rng.standard_normal(c) * 50).astype(np.float32)
    s = rng.uniform(0.5, 1.5, c).astype(np.float32) if affine else qdepthwise.EMPTY
    b = (rng.standard_normal(c) * 0.3).astype(np.float32) if affine else qdepthwise.EMPTY
    operands = tuple(qdepthwise._operand(v) if v.size else v for v in (m, cc, s, b))
    params, fitted_operands = qdepthwise.fitted(qdepthwise.readonly(chain), operands, c)
    assert params[9] == qdepthwise.FITTED and fitted_operands[2].size == c == fitted_operands[3].size
    want, got = _sums(rng, c, cells), None
    got = want.copy()
    qdepthwise.requantize_channels(want, 0, 0, c, cells, cells, *operands, qdepthwise.readonly(chain))
    qdepthwise.requantize_channels(got, 0, 0, c, cells, cells, *fitted_operands, params)
    np.testing.assert_array_equal(got.view(np.int32)[~np.isnan(want)], want.view(np.int32)[~np.isnan(want)])
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.unique(want).size > 100


def test_fitted_chain_keeps_a_chain_with_exact_ties():
    """A grid ratio that puts k * out_scale / post_scale on exact halves (0.05 / (6 / 255) = 2.125: every k = 4
    mod 8), where the chain's two roundings and one rounding part: the chain is kept as given."""
    from minfer_ops_numba import qdepthwise

    c = 4
    chain = qdepthwise.readonly(np.array([-128, 127, 0.05, 0.0, 6.0, 6 / 255, 0, 255, 1.0, 1], np.float32))
    operands = (qdepthwise._operand(np.full(c, 1e-3, np.float32)), qdepthwise.EMPTY, qdepthwise.EMPTY,
                qdepthwise.EMPTY)
    params, kept = qdepthwise.fitted(chain, operands, c)
    assert params is chain and kept is operands


def _row_map() -> tuple[int, int]:
    """A map whose stride-1 output has at least qdepthwise.ROW_CELLS cells: the row loops' path."""
    from minfer_ops_numba import qdepthwise

    side = int(np.ceil(np.sqrt(qdepthwise.ROW_CELLS)))
    return side + 1, side + 2


def _row_path(inputs, attrs) -> bool | None:
    """Which loop a Depthwise for this node sums the input's map in: True vector_rows.py's, False loops.py's wide
    rows, None the blocks of channels."""
    from minfer_ops_numba import qdepthwise

    conv = qdepthwise.Depthwise(inputs[3], inputs[5], attrs, qdepthwise.EMPTY)
    tables = conv.locate(inputs[0].shape[1:])[1]
    return bool(tables[-1]) if len(tables) == len(qdepthwise.GEO) else None


ROW_GEOMETRIES = {  # name: (node keywords, the loop `_row_path` names); each map's output has ROW_CELLS cells or more
    "3x3-vector": (dict(pads=[1, 0, 1, 2]), True),
    "3x3-stride2-vector": (dict(strides=[2, 2], pads=[1, 1, 0, 1], hw=(113, 114)), True),
    "5x5-stride2-vector": (dict(k=(5, 5), strides=[2, 2], pads=[2, 1, 2, 2], hw=(115, 112)), True),
    "3x1-wide": (dict(k=(3, 1), pads=[1, 0, 1, 0]), False),
    "7x7-wide": (dict(k=(7, 7), pads=[3, 2, 3, 3]), False),
}


@pytest.mark.parametrize("geometry", list(ROW_GEOMETRIES))
@pytest.mark.parametrize("float_input", [0, 1, 2])
@pytest.mark.parametrize("per_channel", [False, True], ids=["tensor", "channel"])
@pytest.mark.parametrize("threads", [1, 2])
def test_large_maps_in_rows_as_the_numpy_kernel(geometry, float_input, per_channel, threads):
    """From ROW_CELLS output cells a conv sums in rows, not in blocks of channels: vector_rows.py's vectors where
    they fit (3x3, 5x5, strides 1 and 2), loops.py's wide rows at stride 1 otherwise; each input form, per-tensor
    and per-channel weights, asymmetric pads, over one and two threads: minfer-ops-conv's values; and a NaN input
    is NaN where a window holds it."""
    from minfer_ops_numba import qdepthwise

    keywords, vector = ROW_GEOMETRIES[geometry]
    rng = np.random.default_rng(41 + float_input + 3 * per_channel + 7 * len(geometry))
    inputs, attrs = _node(rng, **{"c": 19, "hw": _row_map(), **keywords}, per_channel=per_channel,
                          float_input=float_input, activation="Clip", activation_params=[0.0, 6.0],
                          output_quantization=[0.07, -3.0, 252.0])
    assert _row_path(inputs, attrs) is (vector and qdepthwise.vector_fits((3, 3), (1, 1), (1, 1)))
    got = _check(inputs, attrs, threads=threads)
    assert got.shape[2] * got.shape[3] >= qdepthwise.ROW_CELLS
    if float_input == 1 and geometry == "3x3-vector":
        inputs[0][0, 4, 20, 30] = np.nan
        got = _check(inputs, attrs, threads=threads)
        nan = {tuple(v) for v in np.argwhere(np.isnan(got))}
        assert {(0, 4, r, q) for r in range(19, 22) for q in range(28, 31)} <= nan  # pads: top 1, left 0
        assert all(ch == 4 for _, ch, _, _ in nan)


@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "8-bit"])
def test_scaled_conv_integer_on_a_large_map_in_rows(dynamic):
    """ScaledConvInteger's depthwise conv on a map of ROW_CELLS cells or more takes the row loops: the numpy
    kernel's values, over two threads."""
    rng = np.random.default_rng(17 + dynamic)
    inputs, attrs = _scaled_node(rng, dynamic=dynamic, c=18, hw=_row_map(), pads=[1, 1, 1, 1], activation="Relu")
    _check_scaled(inputs, attrs, threads=2)


def test_blocks_below_row_cells():
    """Below ROW_CELLS output cells (a stride-2 conv of a 56x56 map) the blocks of channels sum, as measured faster
    there."""
    inputs, attrs = _node(np.random.default_rng(8), c=5, hw=(56, 56), strides=[2, 2], pads=[1, 1, 1, 1])
    assert _row_path(inputs, attrs) is None
    _check(inputs, attrs)
