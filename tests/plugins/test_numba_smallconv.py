"""minfer-ops-numba's small Conv (smallconv.py) against onnx's reference Conv and onnxruntime, and where it applies."""

from __future__ import annotations


import numpy as np
import onnx
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import Engine, KernelContext, TensorType, get_registry  # noqa: E402
from minfer_core.testing.conformance import _array, load_cases  # noqa: E402
from minfer_ops_numba import smallconv  # noqa: E402
from modelkit import assert_epilogue_once, conv_context as context, fused_epilogue, make_model, onnx_conv as reference, ort_run, tensor  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


def case(xs, ws, bias: bool = True, seed: int = 0):
    """Random (x, w, b) for input shape ``xs`` and weight shape ``ws`` (b None without ``bias``)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(xs, dtype=np.float32)
    w = (rng.standard_normal(ws) / np.sqrt(np.prod(ws[1:]))).astype(np.float32)
    return x, w, rng.standard_normal(ws[0], dtype=np.float32) if bias else None


CASES = [  # (N, C, H, W), (M, C/group, kh, kw), attributes, bias
    ((1, 16, 16, 16), (32, 16, 3, 3), dict(pads=[1, 1, 1, 1]), True),
    ((2, 8, 9, 11), (12, 8, 3, 3), dict(strides=[2, 2], pads=[1, 0, 2, 1]), True),  # asymmetric pads
    ((1, 6, 10, 10), (5, 6, 5, 5), dict(dilations=[2, 2], pads=[2, 2, 2, 2]), False),
    ((1, 6, 10, 9), (8, 3, 3, 3), dict(group=2, auto_pad="SAME_UPPER", strides=[2, 2]), True),
    ((1, 4, 13, 12), (7, 4, 7, 7), dict(auto_pad="SAME_LOWER"), True),
    ((1, 5, 12, 12), (6, 5, 4, 4), dict(auto_pad="SAME_LOWER", strides=[3, 2]), False),  # even kernel: pads differ
    ((3, 16, 8, 8), (32, 16, 1, 1), {}, True),  # 1x1, stride 1, no pads: the GEMM reads x in place
    ((2, 8, 5, 5), (6, 4, 1, 1), dict(group=2), True),
    ((1, 16, 9, 9), (24, 16, 1, 1), dict(strides=[2, 2]), False),
    ((1, 3, 64, 64), (8, 3, 3, 3), dict(strides=[2, 2], pads=[1, 1, 1, 1]), True),
    ((2, 8, 7, 7), (4, 8, 5, 3), dict(pads=[2, 1, 2, 1], dilations=[1, 2], auto_pad="NOTSET"), True),
    ((1, 12, 6, 6), (12, 4, 3, 3), dict(group=3, pads=[1, 1, 1, 1]), False),
    ((1, 2, 9, 8), (3, 2, 7, 7), dict(auto_pad="VALID"), True),
]


@pytest.mark.parametrize("xs,ws,attrs,bias", CASES)
def test_small_conv_matches_onnx_reference(xs, ws, attrs, bias):
    """The compiled im2col + GEMM gives onnx's reference Conv within float32 rounding, at any stride, pads
    (auto_pad too), dilation, kernel size and group, with or without a bias."""
    x, w, b = case(xs, ws, bias)
    ctx = context(x, w, b)
    assert smallconv.applies(ctx, attrs)
    run = smallconv.conv.prepared(ctx, attrs)
    want = reference(x, w, b, attrs)
    got = run(x, None, None)
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    y = np.full(want.shape, np.nan, np.float32)
    assert run(x, None, None, out=y) is y  # the engine's output buffer, written whole
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("xs", [(1, 32, 32, 32), (3, 32, 24, 24), (32, 32, 6, 6), (1, 32, 1, 40)])
@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("k", [3, 1])
def test_epilogue_runs_once_per_element_on_one_or_two_threads(xs, threads, k):
    """Split between two threads (in bands of one image's rows, or in runs of images) or not, every output
    element is finished by the epilogue exactly once, after its sum is complete."""
    x, w, b = case(xs, (32 * 9 // k**2, 32, k, k), seed=3)
    attrs = dict(pads=[k // 2] * 4)
    ctx = context(x, w, b)
    run = smallconv.conv.prepared(ctx, attrs)
    want = reference(x, w, b, attrs)
    assert_epilogue_once(run, x, want, threads)


def test_units_split_only_work_that_pays_for_the_hand_over():
    """One thread's worth of work stays whole; above MIN_SPLIT_MACS one image is cut in a band of rows per
    thread, a batch in runs of images, one per thread at least; a unit's im2col stays under UNIT_BYTES."""
    split, row = smallconv.MIN_SPLIT_MACS, smallconv.UNIT_BYTES // 64  # 64 rows fill a unit
    assert smallconv.units(1, 16, row, split - 1, 2) == ([(0, 1, 0, 16)], 1)
    assert smallconv.units(1, 16, row, split, 2) == ([(0, 1, 0, 8), (0, 1, 8, 16)], 2)
    assert smallconv.units(8, 16, row, split, 2) == ([(0, 4, 0, 16), (4, 8, 0, 16)], 2)
    assert smallconv.units(8, 32, row, split, 2) == ([(i, i + 2, 0, 32) for i in range(0, 8, 2)], 2)
    assert smallconv.units(8, 16, row, 1, 2) == ([(0, 4, 0, 16), (4, 8, 0, 16)], 1)
    assert smallconv.units(1, 100, row, 1, 2) == ([(0, 1, 0, 64), (0, 1, 64, 100)], 1)
    assert smallconv.units(1, 1, row, split, 2) == ([(0, 1, 0, 1)], 1)
    # split, an image's bands are a multiple of the threads, equal: not 18, 18, 18 and 2 rows (36 and 20 a thread)
    assert smallconv.units(1, 56, smallconv.UNIT_BYTES // 18, split, 2) == ([(0, 1, r, r + 14) for r in range(0, 56, 14)], 2)


def _compiled_plan(xs, ws, attrs):
    x, w = np.zeros(xs, np.float32), np.zeros(ws, np.float32)
    node = smallconv.Node(context(x, w, None), "NOTSET", None, 1, attrs.get("pads"), attrs.get("strides"))
    found, _, size, direct, shape = node.compiled_plan(x)
    channels = sorted({(int(m0), int(m1)) for m0, m1 in found[:, 4:6]})
    rows = sorted({(int(r0), int(r1)) for r0, r1 in found[:, 2:4]})
    return channels, rows, size, direct, shape


def test_a_small_maps_units_share_channels_only_where_no_thread_would_copy_the_whole_im2col():
    """On a map of at most SMALL_MAP cells the units split the output channels (each thread reads its share of the
    weights) where the conv reads its input as it lies or has at least as many channels as cells; else its rows,
    so that each thread copies only its rows' im2col (resnet50's 128-channel 3x3 stride 2 at 56 -> 28)."""
    stride2 = dict(pads=[1, 1, 1, 1], strides=[2, 2])
    channels, rows, *_ = _compiled_plan((1, 128, 56, 56), (128, 128, 3, 3), stride2)  # 784 cells > 128 channels
    assert channels == [(0, 128)] and len(rows) == 2
    channels, rows, *_ = _compiled_plan((1, 256, 28, 28), (256, 256, 3, 3), stride2)  # 196 cells < 256 channels
    assert len(channels) == 2 and rows == [(0, 14)]
    channels, rows, _, direct, _ = _compiled_plan((1, 64, 28, 28), (32, 64, 1, 1), {})  # 1x1: no im2col to copy
    assert direct and len(channels) == 2 and rows == [(0, 28)]


def test_small_weights_take_im2col_bands_an_l2_holds_larger_ones_one_wide_unit_a_thread():
    """A conv whose packed weights are at most SMALL_WEIGHT_BYTES (a 7x7 stem's 3 -> 64) cuts its im2col into bands
    of L2_UNIT_BYTES (re-packing such weights per band costs little); larger weights keep COMPILED_UNIT_BYTES."""
    stem = dict(pads=[3, 3, 3, 3], strides=[2, 2])
    _, rows, size, _, shape = _compiled_plan((1, 3, 224, 224), (64, 3, 7, 7), stem)
    assert 64 * (3 * 49 + 1) * 4 <= smallconv.SMALL_WEIGHT_BYTES
    assert size * 4 <= smallconv.L2_UNIT_BYTES and len(rows) > 2 and rows[-1][1] == shape[2]
    _, rows, size, _, _ = _compiled_plan((1, 64, 112, 112), (64, 64, 3, 3), dict(pads=[1, 1, 1, 1]))
    assert 64 * (64 * 9 + 1) * 4 > smallconv.SMALL_WEIGHT_BYTES
    assert smallconv.L2_UNIT_BYTES < size * 4 <= smallconv.COMPILED_UNIT_BYTES  # 29 MB of im2col: 8 bands of 14 rows


def test_applies_only_to_float32_non_depthwise_convs_with_constant_weights():
    """The conv takes 2-D float32 convs with constant weights, group 1 or grouped (a large one only at group 1,
    which runs compiled end to end); it refuses depthwise convs, other dtypes, weights computed at run time,
    unknown spatial sizes, 1-D convs and grouped convs above MAX_MACS, which the registry then gives to another
    kernel."""
    from minfer_ops_numba import team

    x, w, b = case((1, 8, 16, 16), (16, 8, 3, 3))
    assert smallconv.applies(context(x, w, b), {})
    assert smallconv.applies(context(x, w[:, :2], b), {"group": 4})
    large = context(*case((1, 64, 64, 64), (64, 64, 3, 3))), {"pads": [1, 1, 1, 1]}  # 151M multiply-adds
    assert smallconv.applies(*large) == bool(team.gemm_address())
    refused = [
        (context(x, w[:8, :1], b[:8]), {"group": 8}),  # depthwise
        (context(x.astype(np.float64), w.astype(np.float64), b.astype(np.float64)), {}),
        (context(x, w, b, constant=False), {}),
        (context(x[0], w[:, :, 0], b), {}),  # 1-D
        (context(*case((1, 64, 64, 64), (64, 16, 3, 3))), {"pads": [1, 1, 1, 1], "group": 4}),  # 38M, grouped
    ]
    types = (TensorType(np.float32, (1, 8, "h", "w")), TensorType(w.dtype, w.shape))
    unknown = KernelContext("node", "Conv", 22, types, (None,), (None, w), 1)
    refused.append((unknown, {}))
    for ctx, attrs in refused:
        assert not smallconv.applies(ctx, attrs)
        chosen = get_registry().select_kernel("", "Conv", 22, ctx=ctx, attrs=attrs)
        assert chosen is not None and chosen.fn is not smallconv.conv.fn


def _spy(monkeypatch) -> list[int]:
    """Record the images of every compiled im2col call the small conv makes (the calls still run), on its
    Python path (a group-1 conv otherwise runs compiled end to end: tests/plugins/test_team.py)."""
    from minfer_ops_numba import team

    monkeypatch.setattr(team, "gemm_address", lambda: 0)  # no BLAS from compiled code: the Python path
    smallconv.conv.prepared(context(*case((1, 1, 1, 1), (1, 1, 1, 1))), {})  # compiles: numba's dispatcher
    calls: list[int] = []  # then replaces the module's im2col, so the spy goes in after it
    real = smallconv.im2col
    monkeypatch.setattr(smallconv, "im2col", lambda x, cf, images, *rest: calls.extend(
        range(rest[-1][0], rest[-1][0] + images)) or real(x, cf, images, *rest))
    return calls


@pytest.mark.parametrize("residual", [False, True])
def test_fused_conv_block_runs_the_small_conv_and_matches_onnxruntime(monkeypatch, residual):
    """A Conv + Relu block, and a Conv + residual Add + Relu block, fused into FusedConv, run the small conv
    inside it (the epilogue applied on its output) and give onnxruntime's outputs."""
    monkeypatch.setenv("MINFER_TUNE", "0")  # the highest priority that applies, not a timed choice
    calls = _spy(monkeypatch)
    x, w, b = case((2, 16, 12, 12), (16, 16, 3, 3), seed=5)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["conv"], kernel_shape=[3, 3], pads=[1, 1, 1, 1])]
    if residual:
        nodes.append(helper.make_node("Add", ["conv", "x"], ["sum"]))
    nodes.append(helper.make_node("Relu", ["sum" if residual else "conv"], ["y"]))
    model = make_model(nodes, [tensor("x", list(x.shape))], [tensor("y", list(x.shape))], inits)
    engine = Engine(model)
    assert [spec.kernel.op_type for spec in engine.program.specs] == ["FusedConv"]
    calls.clear()  # the call compiling it at build
    got = engine.run(None, {"x": x})[0]
    assert sorted(calls) == [0, 1]  # each image once
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-5, atol=1e-5)


def test_nodes_outside_applies_still_run_on_numpys_conv(monkeypatch):
    """A model whose convs the small conv refuses (one too large, one with run-time weights) runs them on
    another kernel and gives onnxruntime's outputs."""
    monkeypatch.setenv("MINFER_TUNE", "0")
    calls = _spy(monkeypatch)
    x, w, b = case((1, 64, 48, 48), (64, 64, 3, 3), seed=7)
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["big"], pads=[1, 1, 1, 1]),
             helper.make_node("Conv", ["big", "wr"], ["y"], pads=[1, 1, 1, 1])]
    model = make_model(nodes, [tensor("x", list(x.shape)), tensor("wr", [8, 64, 3, 3])], [tensor("y", None)], inits)
    wr = case((1, 1, 1, 1), (8, 64, 3, 3), seed=8)[1]
    engine = Engine(model)
    assert all(spec.kernel.fn is not smallconv.conv.fn for spec in engine.program.specs)
    calls.clear()
    got = engine.run(None, {"x": x, "wr": wr})[0]
    assert not calls
    np.testing.assert_allclose(got, ort_run(model, {"x": x, "wr": wr})[0], rtol=1e-4, atol=1e-4)


def _with_constant_weights(case) -> tuple[onnx.ModelProto, list[np.ndarray], np.ndarray] | None:
    """A Conv node case as a model whose weights (and bias) are initializers: (model, feeds, expected)."""
    model = case.proto
    node, graph = model.graph.node[0], model.graph
    inputs, expected = [_array(a) for a in case.data_sets[0][0]], _array(case.data_sets[0][1][0])
    if inputs[0].dtype != np.float32 or inputs[0].ndim != 4:
        return None
    consts = dict(zip(node.input[1:], inputs[1:]))
    graph.initializer.extend(numpy_helper.from_array(a, n) for n, a in consts.items())
    kept = [v for v in graph.input if v.name not in consts]
    del graph.input[:]
    graph.input.extend(kept)
    return model, inputs[0], expected


def test_onnx_conv_node_cases_with_constant_weights_pass_through_the_small_conv(monkeypatch):
    """onnx's 2-D float32 Conv node cases, their weights made initializers, give the cases' outputs with the
    small conv taken first (no timing), and it runs in every one of them."""
    monkeypatch.setenv("MINFER_TUNE", "0")
    calls = _spy(monkeypatch)
    ran = 0
    for case in load_cases():
        if case.op_type != ("", "Conv"):
            continue
        found = _with_constant_weights(case)
        if found is None:
            continue
        model, x, expected = found
        engine = Engine(model)
        calls.clear()
        got = engine.run(None, {model.graph.input[0].name: x})[0]
        assert calls, case.name
        np.testing.assert_allclose(got, expected, rtol=case.rtol, atol=case.atol, err_msg=case.name)
        ran += 1
    assert ran >= 5


def test_serial_calls_into_the_same_output_skip_the_planning_with_the_same_bits(monkeypatch):
    """On one thread, a node's later calls with the same input shape, epilogue (a fused activation) and output
    buffer (the engine's planned one) go straight to the compiled units, with a first call's bits; another
    output buffer, or a residual, is planned again."""
    if not smallconv.team.gemm_address():
        pytest.skip("numpy's BLAS has no cblas_sgemm64_: no compiled path")
    rng = np.random.default_rng(6)
    x = rng.standard_normal((1, 12, 7, 9), dtype=np.float32)
    w = rng.standard_normal((20, 12, 3, 3), dtype=np.float32)
    b = rng.standard_normal(20, dtype=np.float32)
    z = rng.standard_normal((1, 20, 7, 9), dtype=np.float32)
    attrs = dict(kernel_shape=[3, 3], pads=[1, 1, 1, 1])

    relu = fused_epilogue("Relu", (), None, lambda v, out: np.maximum(v, 0, out=out))
    residual = fused_epilogue("", (), z, None)
    planned = []
    real = smallconv.team.fits
    monkeypatch.setattr(smallconv.team, "fits", lambda *a: planned.append(a) or real(*a))
    for epilogue in (relu, residual):
        ctx = context(x, w, b)
        run, first = smallconv.conv.prepared(ctx, attrs), smallconv.conv.prepared(ctx, attrs)
        want = first(x, None, None, out=np.empty_like(z), epilogue=epilogue)
        out = np.empty_like(z)
        planned.clear()
        for _ in range(3):
            np.testing.assert_array_equal(run(x, None, None, out=out, epilogue=epilogue), want)
        assert len(planned) == (1 if epilogue is relu else 3)
        run(x, None, None, out=np.empty_like(z), epilogue=epilogue)  # another buffer: planned
        assert len(planned) == (2 if epilogue is relu else 4)
