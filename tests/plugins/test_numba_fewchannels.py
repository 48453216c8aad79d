"""minfer-ops-numba's Conv for few input channels (fewchannels.py: a network's stem) against onnx's reference Conv
and onnxruntime, where it applies, and that the core times it against the other Conv kernels on a stem node."""

from __future__ import annotations


import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import Engine, get_registry  # noqa: E402
from minfer_ops_numba import fewchannels  # noqa: E402
from modelkit import assert_epilogue_once, conv_context as context, make_model, onnx_conv as reference, ort_run, tensor  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


def case(xs, m: int, bias: bool = True, seed: int = 0):
    """Random (x, w, b): input shape ``xs``, ``m`` 3x3 filters (b None without ``bias``)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs, dtype=np.float32)
    w = (rng.standard_normal((m, xs[1], 3, 3)) / np.sqrt(9 * xs[1])).astype(np.float32)
    return x, w, rng.standard_normal(m, dtype=np.float32) if bias else None


CASES = [  # (N, C, H, W), output channels, attributes, bias
    ((1, 3, 32, 32), 16, dict(strides=[2, 2], pads=[1, 1, 1, 1]), True),  # a stem
    ((2, 3, 17, 23), 8, dict(strides=[2, 2], pads=[1, 1, 1, 1]), True),  # batch 2, odd sizes
    ((1, 1, 12, 9), 5, dict(pads=[1, 1, 1, 1]), False),  # one channel, stride 1, M not a multiple of 4
    ((2, 2, 10, 11), 6, dict(strides=[1, 2], pads=[0, 1, 2, 0]), True),  # mixed strides, asymmetric pads
    ((1, 4, 15, 14), 12, dict(strides=[2, 1], auto_pad="SAME_UPPER"), True),
    ((1, 3, 16, 16), 7, dict(strides=[2, 2], auto_pad="SAME_LOWER"), False),
    ((1, 4, 9, 9), 4, dict(auto_pad="VALID"), True),
    ((2, 3, 8, 8), 3, dict(strides=[2, 2]), True),  # no pads
    ((1, 2, 3, 3), 9, dict(strides=[2, 2], pads=[2, 2, 2, 2]), True),  # pads wider than the kernel's reach
]


@pytest.fixture(params=["direct", "gemm"])
def method(request, monkeypatch):
    """Each test on the direct loop (stem_rows.py; the GEMM still takes mixed strides) and on the im2col + GEMM
    alone (as where the direct loop's intrinsic cannot be built)."""
    if request.param == "gemm":
        monkeypatch.setattr(fewchannels.direct, "fits", lambda *a: False)
    return request.param


@pytest.mark.parametrize("xs,m,attrs,bias", CASES)
def test_few_channel_conv_matches_onnx_reference(xs, m, attrs, bias, method):
    """The direct loop and the compiled im2col + GEMM give onnx's reference Conv within float32 rounding for 1-4
    input channels, strides 1 and 2 (mixed too), explicit, asymmetric and automatic pads, batch 2, with or without
    a bias, into a fresh array or the engine's buffer."""
    x, w, b = case(xs, m, bias)
    ctx = context(x, w, b)
    assert fewchannels.applies(ctx, attrs)
    run = fewchannels.conv.prepared(ctx, attrs)
    want = reference(x, w, b, attrs)
    got = run(x, None, None)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    y = np.full(want.shape, np.nan, np.float32)
    assert run(x, None, None, out=y) is y  # written whole
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("xs", [(1, 3, 40, 40), (2, 3, 40, 40), (1, 3, 2, 40)])
@pytest.mark.parametrize("threads", [1, 2])
def test_epilogue_runs_once_per_element_on_one_or_two_threads(monkeypatch, xs, threads, method):
    """Cut in bands (several an image: small units, and split between two threads) or not, every output
    element is finished by the epilogue exactly once, after its sum is complete."""
    monkeypatch.setattr(fewchannels, "UNIT_BYTES", 28 * 4 * 64)  # bands of 3 rows of 20 outputs
    monkeypatch.setattr(fewchannels, "MIN_SPLIT_MACS", 1)  # worth splitting
    x, w, b = case(xs, 8, seed=3)
    attrs = dict(strides=[2, 2], pads=[1, 1, 1, 1])
    run = fewchannels.conv.prepared(context(x, w, b), attrs)
    want = reference(x, w, b, attrs)
    assert_epilogue_once(run, x, want, threads)


def test_bands_cover_each_image_with_im2cols_of_at_most_unit_bytes_and_one_per_thread_at_least():
    """An image's output rows are cut in equal bands whose im2col takes at most UNIT_BYTES (a row at least),
    and in as many as the threads sharing them when one image is all there is."""
    cap = fewchannels.UNIT_BYTES
    for n, rows, columns, k, parts in [(1, 112, 112, 28, 1), (1, 112, 112, 28, 2), (2, 160, 160, 28, 2),
                                       (1, 7, 7, 10, 2), (1, 1, cap, 37, 1), (3, 2, 10, 19, 2)]:
        bands = fewchannels.bands_of(n, rows, columns, k, parts)
        for i in range(n):
            mine = [(r0, r1) for j, r0, r1 in bands if j == i]
            assert [r for r0, r1 in mine for r in range(r0, r1)] == list(range(rows))
        assert all((r1 - r0) * columns * k * 4 <= cap or r1 - r0 == 1 for _, r0, r1 in bands)
        assert len(bands) >= min(parts, n * rows)
    assert fewchannels.bands_of(1, 112, 112, 28, 1) == [(0, r, r + 28) for r in range(0, 112, 28)]


def test_applies_only_to_3x3_convs_of_few_channels_with_constant_weights():
    """The kernel takes a float32 3x3 conv of one group, 1-4 input channels, stride 1 or 2 and no dilation with
    constant weights (a stem); others go to another Conv kernel."""
    x, w, b = case((1, 3, 224, 224), 32)
    stem = dict(strides=[2, 2], pads=[1, 1, 1, 1])
    assert fewchannels.applies(context(x, w, b), stem)
    assert fewchannels.applies(context(x, w, None), {})
    five = case((1, 5, 16, 16), 8)
    refused = [
        (context(*five), stem),  # 5 input channels
        (context(x, np.ascontiguousarray(w[:, :, :2]), b), {}),  # 2x3 kernel
        (context(x, w, b), {"strides": [3, 3]}),
        (context(x, w, b), {"dilations": [2, 2]}),
        (context(x[:, :2], w[:8, :1], b[:8]), {"group": 2}),
        (context(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)), {}),
        (context(x, w, b, constant=False), {}),
    ]
    for ctx, attrs in refused:
        assert not fewchannels.applies(ctx, attrs)
        chosen = get_registry().select_kernel("", "Conv", 22, ctx=ctx, attrs=attrs)
        assert chosen is not None and chosen.fn is not fewchannels.conv.fn


def test_a_stem_node_is_timed_against_numpys_conv():
    """On a MobileNet stem node (1x3x224x224 -> 32, 3x3 stride 2) the registry offers this kernel and
    minfer-ops-conv's numpy Conv both, so the core times them and keeps the faster."""
    x, w, b = case((1, 3, 224, 224), 32)
    found = get_registry().kernel_candidates("", "Conv", 22, "numpy", context(x, w, b),
                                             dict(strides=[2, 2], pads=[1, 1, 1, 1]))
    assert fewchannels.conv in found
    assert any(k.plugin == "minfer-ops-conv" for k in found)


@pytest.mark.parametrize("method", ["direct", "gemm"])
@pytest.mark.parametrize("activation", ["HardSwish", "Clip", "Sigmoid"])
def test_fused_stem_runs_the_kernel_and_matches_onnxruntime(monkeypatch, activation, method):
    """A stem Conv + HardSwish (MobileNetV3), Conv + Clip(0, 6) (MobileNetV2) or Conv + Sigmoid (no form in the
    direct loop's registers: the epilogue applies it) block, fused into FusedConv, runs this kernel inside it when
    taken first (no timing; above smallconv's bound), by the direct loop or, where that cannot be built, the im2col
    and GEMM, and gives onnxruntime's outputs at batch 2. (Its parallel_for path, whose calls the spy sees: on a
    native team they happen in compiled code, tests/plugins/test_team_kernels.py.)"""
    from minfer_ops_numba import team

    monkeypatch.setenv("MINFER_TUNE", "0")
    monkeypatch.setenv(team.ENV, "0")
    monkeypatch.setattr(team, "_state", {})
    monkeypatch.setattr(team, "gemm_address", lambda: 0)  # smallconv's Python path only: its 4M bound holds
    if method == "gemm":
        monkeypatch.setattr(fewchannels.direct, "fits", lambda *a: False)
    x, w, b = case((2, 3, 224, 224), 32, seed=5)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv"], kernel_shape=[3, 3], pads=[1, 1, 1, 1],
                              strides=[2, 2])]
    if activation == "Clip":
        inits += [numpy_helper.from_array(np.array(v, np.float32), n) for n, v in (("lo", 0.0), ("hi", 6.0))]
        nodes.append(helper.make_node("Clip", ["conv", "lo", "hi"], ["y"]))
    else:
        nodes.append(helper.make_node(activation, ["conv"], ["y"]))
    model = make_model(nodes, [tensor("x", list(x.shape))], [tensor("y", [2, 32, 112, 112])], inits)
    engine = Engine(model)
    assert [spec.kernel.op_type for spec in engine.program.specs] == ["FusedConv"]
    # spied after the build, which compiled the module (compiling puts its functions back in its namespace)
    calls: list[int] = []
    if method == "direct":
        real = fewchannels.stem_rows
        monkeypatch.setattr(fewchannels, "stem_rows", lambda x, n, *rest: calls.append(int(n)) or real(x, n, *rest))
    else:
        real = fewchannels.im2col
        monkeypatch.setattr(fewchannels, "im2col", lambda x, work, cols, geo: calls.append(int(geo[0]))
                            or real(x, work, cols, geo))
    got = engine.run(None, {"x": x})[0]
    assert sorted(set(calls)) == [0, 1]  # both images, through this kernel
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation, params", [("Relu", ()), ("Clip", (0.0, 6.0)), ("LeakyRelu", (0.1,)),
                                                ("HardSigmoid", (0.2, 0.5)), ("HardSwish", ()), ("Swish", (1.0,))])
@pytest.mark.parametrize("residual", [False, True])
def test_direct_loop_applies_the_fused_activation_as_the_epilogue_does(activation, params, residual):
    """The direct loop's activation in registers (or, for one it has no code for, and after a residual, the
    epilogue's) gives the numpy epilogue's values: every activation with a compiled form, with and without a
    residual, an output width that leaves a partial vector (19 columns)."""
    from minfer_passes import ops as fused_ops

    x, w, b = case((1, 3, 37, 38), 12, seed=7)
    attrs = dict(strides=[2, 2], pads=[1, 1, 1, 1])
    run = fewchannels.conv.prepared(context(x, w, b), attrs)
    base = reference(x, w, b, attrs)
    z = np.random.default_rng(8).standard_normal(base.shape, dtype=np.float32) if residual else None
    want = base + z if residual else base.copy()
    fused_ops.ACTIVATIONS[activation](want, list(params))

    def epilogue(y, region):
        part = y[region]
        if z is not None:
            np.add(part, z[region], out=part)
        fused_ops.ACTIVATIONS[activation](part, list(params))

    epilogue.spec = (activation, tuple(params), z)
    got = run(x, None, None, out=np.full(base.shape, np.nan, np.float32), epilogue=epilogue)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
