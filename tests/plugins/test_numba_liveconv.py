"""minfer-ops-numba's Conv for weights given each run (liveconv.py, the base kernel of minfer-passes' DequantConv):
against onnxruntime, its team path against its parallel_for path, its epilogue, and in a quantized model."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from minfer_core import Engine, KernelContext, TensorType  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_ops_numba import liveconv, team  # noqa: E402
from minfer_ops_numba.quant import Chains  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from modelkit import make_model, onnx_conv, ort_run, tensor  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py

CASES = [  # (N, C, H, W), (M, kh, kw), attributes, bias: resnet50's 1x1 and strided projections, a 3x3, a batch
    ((1, 64, 28, 28), (128, 1, 1), {}, True),
    ((1, 256, 14, 14), (512, 1, 1), {"strides": [2, 2]}, False),
    ((2, 16, 9, 11), (24, 3, 3), {"pads": [1, 0, 2, 1]}, True),
]


def case(xs, ms, bias, seed=0):
    rng = np.random.default_rng(seed + sum(xs))
    x = rng.standard_normal(xs, dtype=np.float32)
    w = (rng.standard_normal((ms[0], xs[1]) + ms[1:]) / np.sqrt(xs[1] * ms[1] * ms[2])).astype(np.float32)
    return x, w, rng.standard_normal(ms[0], dtype=np.float32) if bias else None


def prepared(x, w, b, attrs):
    if not team.gemm_address():
        pytest.skip("numpy's BLAS has no cblas_sgemm callable from compiled code here")
    types = (TensorType(x.dtype, x.shape), TensorType(w.dtype, w.shape)) + (
        () if b is None else (TensorType(b.dtype, b.shape),))
    ctx = KernelContext("node", "Conv", 22, types, (None,), (None,) * len(types), 1)
    assert liveconv.applies(ctx, attrs)
    return liveconv.conv.prepared(ctx, attrs)


@pytest.mark.parametrize("xs, ms, attrs, bias", CASES)
def test_matches_the_reference_conv_with_the_run_s_weights(xs, ms, attrs, bias):
    """On one thread and two, the conv of the weight given with the run matches onnx's reference Conv; a second
    weight of the same shape in the next run is used, not the first one."""
    x, w, b = case(xs, ms, bias)
    run = prepared(x, w, b, attrs)
    for threads in (1, 2):
        with using_threads(threads):
            np.testing.assert_allclose(run(x, w, b), onnx_conv(x, w, b, attrs), rtol=1e-4, atol=1e-4)
            np.testing.assert_allclose(run(x, -w, b), onnx_conv(x, -w, b, attrs), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("xs, ms, attrs, bias", CASES)
def test_team_path_gives_the_parallel_for_bits_and_an_epilogue_runs_once(monkeypatch, xs, ms, attrs, bias):
    """Over a native team it gives the bits of its parallel_for path; an epilogue without a compiled form sees every
    output element once, after its sum (it negates what it gets)."""
    if not team.available():
        pytest.skip("no native team here: numba's threading layer is not OpenMP or TBB, or MINFER_NUMBA_TEAM=0")
    x, w, b = case(xs, ms, bias)
    run = prepared(x, w, b, attrs)
    want = onnx_conv(x, w, b, attrs)
    seen = np.zeros(want.shape, int)

    def epilogue(y, region):
        seen[region] += 1
        np.negative(y[region], out=y[region])

    with using_threads(2):
        got = run(x, w, b, out=np.full(want.shape, np.nan, np.float32), epilogue=epilogue)
        monkeypatch.setattr(team, "size", lambda: 1)
        alone = run(x, w, b, out=np.full(want.shape, np.nan, np.float32), epilogue=epilogue)
    assert (seen == 2).all()
    np.testing.assert_array_equal(got, alone)
    np.testing.assert_allclose(-got, want, rtol=1e-4, atol=1e-4)


def test_applies_only_to_group_1_convs_of_a_run_time_weight():
    """Constant weights are smallconv's; grouped convs, unknown weight shapes and float64 go to other kernels."""
    x, w, b = case((1, 8, 6, 6), (4, 3, 3), True)
    f32 = TensorType(np.dtype(np.float32), None)
    live = KernelContext("n", "Conv", 22, (TensorType(x.dtype, x.shape), TensorType(w.dtype, w.shape)), (None,),
                         (None, None), 1)
    if team.gemm_address():
        assert liveconv.applies(live, {})
    refused = [
        (KernelContext("n", "Conv", 22, live.input_types, (None,), (None, w), 1), {}),  # constant weight
        (live, {"group": 2}),
        (KernelContext("n", "Conv", 22, (live.input_types[0], f32), (None,), (None, None), 1), {}),
        (KernelContext("n", "Conv", 22, (TensorType(np.dtype(np.float64), x.shape), TensorType(np.dtype(np.float64),
                                          w.shape)), (None,), (None, None), 1), {}),
    ]
    for ctx, attrs in refused:
        assert not liveconv.applies(ctx, attrs)


def test_a_conv_of_a_weight_input_runs_it_and_matches_onnxruntime(monkeypatch):
    """A model whose Conv weight is a graph input (a run-time weight of static shape) runs this kernel and gives
    onnxruntime's output."""
    monkeypatch.setenv("MINFER_TUNE", "0")
    x, w, b = case((1, 32, 10, 10), (48, 1, 1), True)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"])]
    model = make_model(nodes, [tensor("x", list(x.shape)), tensor("w", list(w.shape))], [tensor("y", None)],
                       [numpy_helper.from_array(b, "b")])
    engine = Engine(model)
    assert engine.program.specs[0].kernel.fn is liveconv.conv.fn
    np.testing.assert_allclose(engine.run(None, {"x": x, "w": w})[0], ort_run(model, {"x": x, "w": w})[0],
                               rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("bounds", [(-128.0, 127.0), (0.0, 255.0), (-3.0, 40.0)], ids=["int8", "uint8", "narrowed"])
@pytest.mark.parametrize("threads", [1, 2])
def test_a_dequant_conv_s_rounding_runs_in_the_units(bounds, threads):
    """minfer-passes' DequantConv rounding epilogue describes itself (``spec``: QuantizeDequantize, [scale, low,
    high]): the units apply it in compiled code (team.finish's ROUND) instead of calling it on the whole output
    after; its values are the registered rounding kernel's (ties, saturation both ways, a Relu-narrowed grid)."""
    from minfer_core import TensorType
    from minfer_passes.qdq_ops import _rounding

    xs, ms, attrs, bias = CASES[0]
    x, w, b = case(xs, ms, bias)
    x[0, 0, :2, :2] = 40.0  # sums far past the grid: saturated
    run = prepared(x, w, b, attrs)
    shape = onnx_conv(x, w, b, attrs).shape
    scale = 0.0125  # sums on many .5 ties of the grid: rint to even
    epilogue = _rounding(TensorType(np.dtype(np.float32), shape), [scale, *bounds], None, None, None)
    assert epilogue.spec[0] == "QuantizeDequantize" and team.native(epilogue)[0] == team.ROUND
    calls = []

    def called(y, region):  # the same rounding, without a description: the kernel must call it
        calls.append(region)
        epilogue(y, region)

    with using_threads(threads):
        got = run(x, w, b, out=np.full(shape, np.nan, np.float32), epilogue=epilogue)
        want = run(x, w, b, out=np.full(shape, np.nan, np.float32), epilogue=called)
    assert calls  # the description-less one was called; the described one ran in the units
    np.testing.assert_array_equal(got, want)
    k = np.round(got / np.float32(scale))
    assert k.min() == bounds[0] or k.max() == bounds[1]  # the bounds were reached


def test_roundings_without_a_compiled_form_are_called():
    """Bounds that are not integers in [-2048, 2048) (ROUND packs them in one float32) or a scale <= 0 have no
    compiled form: the kernel calls the epilogue."""
    assert team.activation_form("QuantizeDequantize", (0.1, -2048.0, 2047.0))[0] == team.ROUND
    for params in [(0.1, -3000.0, 5.0), (0.1, 0.5, 3.0), (0.0, -128.0, 127.0), (0.1, 5.0, 4.0), (0.1, 1.0)]:
        assert team.activation_form("QuantizeDequantize", params) is None, params


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("chain", ["mul-add-post", "add", "scalar-mul-post"])
def test_a_dequant_conv_s_whole_rounding_chain_runs_in_the_units(chain, threads):
    """The rounding, BatchNormalization's * M + A (per channel, or one value) and the next rounding (a QDQ model's
    conv -> BN between Q/DQ pairs) described by ``epilogue.rounding``: applied on each unit by quant.py's compiled
    loop, with the values of the epilogue called (the registered rounding kernel on the whole output)."""
    from minfer_core import TensorType
    from minfer_passes.qdq_ops import _rounding

    xs, ms, attrs, bias = CASES[0]
    x, w, b = case(xs, ms, bias)
    run = prepared(x, w, b, attrs)
    shape = onnx_conv(x, w, b, attrs).shape
    rng = np.random.default_rng(9)
    m = (1 + 0.3 * rng.standard_normal((1, shape[1], 1, 1))).astype(np.float32)
    a = (0.2 * rng.standard_normal((shape[1], 1, 1))).astype(np.float32)
    mul, add, post = {"mul-add-post": (m, a, [0.03, 0.0, 255.0]), "add": (None, a, None),
                      "scalar-mul-post": (np.full((1, 1, 1, 1), 1.7, np.float32), None, [0.05, -128.0, 127.0])}[chain]
    epilogue = _rounding(TensorType(np.dtype(np.float32), shape), [0.0125, -128.0, 127.0], mul, add, post)
    assert Chains(shape[1], 4).of(epilogue) is not None
    calls = []

    def called(y, region):
        calls.append(region)
        epilogue(y, region)

    with using_threads(threads):
        got = run(x, w, b, out=np.full(shape, np.nan, np.float32), epilogue=epilogue)
        want = run(x, w, b, out=np.full(shape, np.nan, np.float32), epilogue=called)
    assert calls
    np.testing.assert_array_equal(got, want)
    spatial = _rounding(TensorType(np.dtype(np.float32), shape), [0.0125, -128.0, 127.0], None,
                        np.ones((1, 1) + shape[2:], np.float32), None)
    assert Chains(shape[1], 4).of(spatial) is None  # an A along other axes than the channels: called
