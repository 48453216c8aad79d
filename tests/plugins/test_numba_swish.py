"""minfer-ops-numba's Swish (x * sigmoid(alpha * x)): the Swish-24 kernel and the fused convs' compiled epilogue.

Its exp is a float32 polynomial scaled by 2^n made from the exponent bits (activation.py's docstring): within a
few ulps of the exact value, not numpy's bits, NaN where numpy has NaN, and the same values whichever conv kernel
(and so whichever epilogue loop) the core picks.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import Engine, KernelContext, TensorType, get_registry  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_ops_numba import activation, team  # noqa: E402
from modelkit import make_model, tensor  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py

SPECIAL = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-45, -1e-45, 88.0, -88.0, 104.0, -104.0, 200.0, -200.0,
                    3.4e38, -3.4e38, 0.5, -0.5], np.float32)


def exact(x: np.ndarray, alpha: float) -> np.ndarray:
    """x * sigmoid(alpha * x) in float64 from the float32 alpha * x, as the kernel's first step rounds it."""
    with np.errstate(over="ignore", invalid="ignore"):
        t = (np.float32(alpha) * x).astype(np.float64)
        s = np.where(t >= 0, 1 / (1 + np.exp(-np.abs(t))), np.exp(-np.abs(t)) / (1 + np.exp(-np.abs(t))))
        return x.astype(np.float64) * np.where(np.isnan(t), np.nan, s)


def assert_close(got: np.ndarray, x: np.ndarray, alpha: float) -> None:
    """NaN exactly where the exact value is NaN (-inf * 0 too), within 1e-6 relative where it is a normal float32;
    below, where float32's own sigmoid underflows (x = -104: exp(-104) is no float32), within the smallest normal."""
    want = exact(x, alpha)
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    ok = ~np.isnan(want)
    np.testing.assert_array_equal(np.isinf(got[ok]), np.isinf(want[ok]))
    fin = ok & np.isfinite(want)
    np.testing.assert_allclose(got[fin], want[fin], rtol=1e-6, atol=float(np.finfo(np.float32).tiny))


def values(n: int, seed: int = 0, scale: float = 8.0) -> np.ndarray:
    x = (np.random.default_rng(seed).standard_normal(n) * scale).astype(np.float32)
    x[: min(n, SPECIAL.size)] = SPECIAL[: min(n, SPECIAL.size)]
    return x


def prepared(x: np.ndarray, alpha: float):
    ctx = KernelContext("node", "Swish", 24, (TensorType(x.dtype, x.shape),), (None,), (None,), 1)
    attrs = {"alpha": alpha}
    chosen = get_registry().select_kernel("", "Swish", 24, ctx=ctx, attrs=attrs)
    assert chosen is not None and chosen.fn is activation.swish.fn  # above minfer-ops-basic's numpy Swish
    return activation.swish.prepared(ctx, attrs)


@pytest.mark.parametrize("alpha", [1.0, 1.702, 0.25, -1.5])
@pytest.mark.parametrize("n", [1, 17, 4099, 1 << 17, (1 << 20) + 5])  # tiles, blocks, a team's split, the pool's
def test_swish_kernel_is_close_to_the_exact_value(n, alpha):
    """Out of place and in place, on one and two threads: close to the exact value everywhere, specials included."""
    x = values(n, seed=n)
    for threads in (1, 2):
        with using_threads(threads):
            run = prepared(x, alpha)
            assert_close(run(x), x, alpha)
            y = x.copy()
            assert run(y, out=y) is y
            assert_close(y, x, alpha)


def test_swish_on_a_strided_tile_in_place():
    """A tile of contiguous rows that is not C-contiguous (a pointwise conv's rows of some channels) is written in
    place, the rest of the array untouched."""
    x = values(6 * 40, seed=3).reshape(6, 40)
    y = x.copy()
    tile = y[1:5, 8:32]
    run = prepared(x, 1.702)
    assert run.strided
    run(tile, out=tile)
    assert_close(y[1:5, 8:32], x[1:5, 8:32], 1.702)
    keep = np.ones(x.shape, bool)
    keep[1:5, 8:32] = False
    np.testing.assert_array_equal(y[keep].view(np.uint32), x[keep].view(np.uint32))


@pytest.mark.parametrize("alpha", [1.0, 1.702])
def test_compiled_epilogue_applies_swish(alpha):
    """team.py's `finish` (every compiled conv epilogue) with Swish: the bias, then Swish, close to exact."""
    op, a, b = team.activation_form("Swish", (alpha,))
    assert op == activation.SWISH and a == np.float32(alpha)
    x = values(3 * 500, seed=5)
    bias = np.array([0.5, -2.0, 0.0], np.float32)
    y = x.copy()
    team.finish(y, team.NOTHING, 0, 3, 500, 500, bias, 0, op, a, b)
    want = x.reshape(3, 500) + bias[:, None]
    assert_close(y.reshape(3, 500), want, alpha)


CONVS = {  # name: input shape, weight shape, attributes: each a kind of conv the core has candidates for
    "stem 3->16 3x3 s2": ((1, 3, 32, 32), (16, 3, 3, 3), dict(pads=[1, 1, 1, 1], strides=[2, 2])),
    "pointwise 32->48": ((2, 32, 14, 14), (48, 32, 1, 1), {}),
    "3x3 16->16": ((1, 16, 16, 16), (16, 16, 3, 3), dict(pads=[1, 1, 1, 1])),
    "depthwise 3x3": ((1, 40, 14, 14), (40, 1, 3, 3), dict(pads=[1, 1, 1, 1], group=40)),
    "depthwise 5x5 s2": ((2, 24, 15, 15), (24, 1, 5, 5), dict(pads=[2, 2, 2, 2], strides=[2, 2], group=24)),
}


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", CONVS)
def test_conv_sigmoid_mul_runs_fused_with_the_unfused_values(name, threads):
    """Conv -> Mul(alpha) -> Sigmoid -> Mul becomes FusedConv(Swish) and gives the unfused graph's values (numpy's
    Sigmoid and Mul: rtol 1e-5) with whichever kernel the core picks for the conv."""
    shape, wshape, attrs = CONVS[name]
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array((rng.standard_normal(wshape) * 0.3).astype(np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(wshape[0]).astype(np.float32), "b"),
             numpy_helper.from_array(np.array(1.702, np.float32), "alpha")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], **attrs), helper.make_node("Mul", ["c", "alpha"], ["t"]),
             helper.make_node("Sigmoid", ["t"], ["s"]), helper.make_node("Mul", ["c", "s"], ["y"])]
    model = make_model(nodes, [tensor("x", list(shape))], [tensor("y", None)], inits)
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    fused = Engine(model, threads=threads)
    assert [(n.op_type, n.attrs.get("activation")) for n in fused.graph.nodes] == [("FusedConv", "Swish")]
    want = Engine(model, threads=threads, passes="none").run(None, {"x": x})[0]
    for _ in range(3):  # the first run (the core times candidates) and the planned ones
        np.testing.assert_allclose(fused.run(None, {"x": x})[0], want, rtol=1e-5, atol=1e-6)
