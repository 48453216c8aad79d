"""minfer-ops-numba's Conv of a 1x1 kernel on a 1x1 map (linear.py's `pixel_conv`): a squeeze-excite layer as Gemm.

Per image y = x @ W^T (+ b): the kernel must match numpy's Conv within float32 rounding whatever the batch, bias
and fused epilogue, give the same bits on one thread and on two (its blocks come from the shape alone), take
only the nodes it computes, and be the first candidate the core times for them.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import InferenceSession, KernelContext, TensorType, get_registry  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_ops_numba import activation, linear, team  # noqa: E402
from modelkit import fused_epilogue, make_model, ort_run, tensor  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py

NUMBA = "minfer-ops-numba"


def context(x, w, b, bias="constant", spatial=None) -> KernelContext:
    shape = x.shape if spatial is None else x.shape[:2] + spatial
    types = (TensorType(x.dtype, shape), TensorType(w.dtype, w.shape)) + \
        ((TensorType(b.dtype, b.shape),) if bias != "none" else ())
    consts = (None, w) + ((b,) if bias == "constant" else (None,) if bias == "input" else ())
    return KernelContext("node", "Conv", 22, types, (None,), consts, 1)


def case(n, k, m, seed=0):
    rng = np.random.default_rng(seed + m)
    return (rng.standard_normal((n, k, 1, 1), dtype=np.float32), rng.standard_normal((m, k, 1, 1), dtype=np.float32),
            rng.standard_normal(m, dtype=np.float32))


def numpy_conv(ctx, attrs):
    kern = get_registry().select_kernel("", "Conv", 22)
    assert kern.plugin != NUMBA
    return kern.prepared(ctx, attrs)


def epilogue(name, shape, residual):
    """FusedConv's epilogue: the residual (when asked), then the registered in-place activation."""
    kern = {"Relu": activation.relu, "HardSigmoid": activation.hard_sigmoid}[name]
    params = {"HardSigmoid": {"alpha": 1 / 6, "beta": 0.5}}.get(name, {})
    act_ctx = KernelContext("act", name, 22, (TensorType(np.dtype(np.float32), shape),), (None,), (None,), 1)
    z = np.random.default_rng(3).standard_normal(shape, dtype=np.float32) if residual else None
    return fused_epilogue(name, tuple(params.values()), z, kern.prepared(act_ctx, params))


@pytest.mark.parametrize("n, k, m", [(1, 960, 240), (1, 240, 960), (3, 72, 24), (2, 16, 1000), (1, 1, 1)])
@pytest.mark.parametrize("bias", ["constant", "none"])
def test_pixel_conv_matches_numpys_conv(n, k, m, bias):
    x, w, b = case(n, k, m)
    ctx = context(x, w, b, bias)
    attrs = {"kernel_shape": [1, 1]}
    assert linear.pixel_conv.applies(ctx, attrs)
    inputs = (x, w, b) if bias != "none" else (x, w)
    want = numpy_conv(ctx, attrs)(*inputs)
    out = np.full(want.shape, np.nan, np.float32)
    got = linear.pixel_conv.prepared(ctx, attrs)(*inputs, out=out)
    assert got is out
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * np.sqrt(k))


@pytest.mark.parametrize("act, residual", [("Relu", False), ("HardSigmoid", False), ("Relu", True)])
def test_pixel_conv_applies_fused_epilogues_with_the_same_bits_on_one_thread_and_two(act, residual):
    """The epilogue in each block's write-out (a native team's where one runs) gives the bits of the product
    followed by the epilogue's own numpy code, on one thread and two."""
    x, w, b = case(2, 960, 240, seed=1)
    ctx, attrs = context(x, w, b), {}
    run = linear.pixel_conv.prepared(ctx, attrs)
    plain = run(x, w, b)
    want = plain.copy()
    epilogue(act, want.shape, residual)(want, (slice(None),) * 4)
    for threads in (1, 2):
        with using_threads(threads):
            np.testing.assert_array_equal(run(x, w, b, epilogue=epilogue(act, want.shape, residual)), want)


@pytest.mark.parametrize("change", ["kernel 3x3", "map 2x2", "map unknown", "pads", "group 2", "bias input"])
def test_pixel_conv_leaves_other_convs(change):
    x, w, b = case(1, 8, 8)
    attrs, bias, spatial = {}, "constant", None
    if change == "kernel 3x3":
        w = np.zeros((8, 8, 3, 3), np.float32)
    elif change == "map 2x2":
        x = np.zeros((1, 8, 2, 2), np.float32)
    elif change == "map unknown":
        spatial = ("h", "w")
    elif change == "pads":
        attrs = {"pads": [1, 1, 1, 1]}
    elif change == "group 2":
        attrs, w = {"group": 2}, np.zeros((8, 4, 1, 1), np.float32)
    else:
        bias = "input"
    assert not linear.pixel_conv.applies(context(x, w, b, bias, spatial), attrs)


def test_pixel_conv_is_the_first_candidate_for_its_nodes():
    """Above the conv kernels that also take a 1x1 map (the core still times them all), under its own name."""
    x, w, b = case(1, 240, 960)
    found = get_registry().kernel_candidates("", "Conv", 22, "numpy", context(x, w, b), {})
    assert found[0].fn is linear.pixel_conv.fn and len(found) > 2 and found[-1].plugin != NUMBA
    assert len({f"{k.fn.__module__}.{k.fn.__qualname__}" for k in found}) == len(found)


def test_a_squeeze_excite_block_runs_it_and_matches_onnxruntime(monkeypatch):
    """GlobalAveragePool -> Conv + Relu -> Conv + HardSigmoid -> Mul, not fused into one SqueezeExcite node: both
    convs run this kernel (over a native team where one runs), and the block matches onnxruntime."""
    rng = np.random.default_rng(5)
    w1, b1 = rng.standard_normal((24, 96, 1, 1), dtype=np.float32) * 0.1, rng.standard_normal(24, dtype=np.float32)
    w2, b2 = rng.standard_normal((96, 24, 1, 1), dtype=np.float32) * 0.1, rng.standard_normal(96, dtype=np.float32)
    nodes = [helper.make_node("GlobalAveragePool", ["x"], ["p"]),
             helper.make_node("Conv", ["p", "w1", "b1"], ["c1"]), helper.make_node("Relu", ["c1"], ["r"]),
             helper.make_node("Conv", ["r", "w2", "b2"], ["c2"]), helper.make_node("HardSigmoid", ["c2"], ["s"]),
             helper.make_node("Mul", ["x", "s"], ["y"])]
    inits = [numpy_helper.from_array(a, name) for a, name in ((w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"))]
    model = make_model(nodes, [tensor("x", [2, 96, 14, 14])], [tensor("y", None)], inits, opset=17)
    monkeypatch.setenv("MINFER_TUNE", "0")  # the first candidate, untimed: this one
    session = InferenceSession(model, threads=2, disabled_passes=["squeeze_excite_fusion"])
    calls = []
    for serial, driver in (("_blocks", "_on_team"), ("_tiled", "_tiled_team")):  # BLAS's, the micro-kernel's
        blocks, on_team = getattr(linear, serial), getattr(linear, driver)  # after the build, which compiled them
        monkeypatch.setattr(linear, serial, lambda *a, fn=blocks: calls.append(1) or fn(*a))
        monkeypatch.setattr(linear, driver, lambda *a, fn=on_team: calls.append(2) or fn(*a))
    feeds = {"x": rng.standard_normal((2, 96, 14, 14), dtype=np.float32)}
    got = session.run(None, feeds)[0]
    assert len(calls) == 2
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-5, atol=1e-5)
    assert team.available() or 2 not in calls
