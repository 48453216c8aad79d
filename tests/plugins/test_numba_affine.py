"""minfer-ops-numba's ai.minfer::ChannelAffine gives minfer-passes' numpy kernel's bits, and competes with it per node."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import KernelContext, TensorType, get_registry  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_ops_numba import affine as numba_affine  # noqa: E402
from minfer_passes import affine as numpy_affine  # noqa: E402

ACTIVATIONS = [("", []), ("Relu", []), ("Clip", [0.0, 6.0]), ("Clip", []), ("LeakyRelu", [0.1]), ("LeakyRelu", [])]


pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


def _ctx(shape, dtype=np.float32):
    t = TensorType(dtype, shape)
    return KernelContext("ca", "ChannelAffine", 1, (t, None, None), (t,), (None, None, None), 1)


def _both(shape, activation, params):
    attrs = {"activation": activation, "activation_params": params}
    return (numba_affine.channel_affine.prepared(_ctx(shape), attrs),
            numpy_affine.channel_affine.prepared(_ctx(shape), attrs))


@pytest.mark.parametrize("shape", [(1, 3, 5, 7), (2, 16, 1, 1), (8, 32, 14, 14), (4, 10), (1, 8, 300, 300)])
@pytest.mark.parametrize("activation, params", ACTIVATIONS)
@pytest.mark.parametrize("scaled", [True, False])
def test_same_bits_as_numpy_into_out_and_in_place(shape, activation, params, scaled):
    """act(X * S + B) (X + B without S) equals the numpy kernel bit for bit, NaN, -0.0 and inf included, whether
    written into a fresh array or over X."""
    rng = np.random.default_rng(sum(shape))
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    x.reshape(-1)[:4] = [np.nan, -0.0, np.inf, -np.inf]
    s = rng.standard_normal(shape[1]).astype(np.float32) if scaled else None
    b = rng.standard_normal(shape[1]).astype(np.float32)
    compiled, numpy_kernel = _both(shape, activation, params)
    want = numpy_kernel(x, s, b).view(np.int32)
    np.testing.assert_array_equal(compiled(x, s, b).view(np.int32), want)
    inplace = x.copy()
    np.testing.assert_array_equal(compiled(inplace, s, b, out=inplace).view(np.int32), want)


def test_two_threads_give_the_one_thread_bits():
    """Rows split over the intra-op threads (large X) give the one-thread result."""
    shape = (2, 64, 128, 128)
    x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    s, b = np.linspace(-1, 1, 64, dtype=np.float32), np.linspace(1, -1, 64, dtype=np.float32)
    compiled, _ = _both(shape, "Relu", [])
    one = compiled(x, s, b)
    with using_threads(2):
        np.testing.assert_array_equal(compiled(x, s, b), one)


def test_applies_takes_float32_and_its_activations_only():
    """Other activations (HardSwish, Sigmoid...), float64 and rank-1 X stay with the numpy kernel."""
    applies = numba_affine.channel_affine.applies
    assert applies(_ctx((1, 4, 2, 2)), {"activation": "Relu"})
    assert not applies(_ctx((1, 4, 2, 2)), {"activation": "HardSwish"})
    assert not applies(_ctx((1, 4, 2, 2), np.float64), {})
    assert not applies(_ctx((4,)), {})


def test_the_core_times_it_against_numpy():
    """A float32 ChannelAffine node offers the compiled kernel and numpy's, with the same declarations, so the core
    times both (MINFER_TUNE=0 would take the compiled one, its priority being higher)."""
    found = get_registry().kernel_candidates("ai.minfer", "ChannelAffine", 1, "numpy", _ctx((1, 4, 2, 2)),
                                             {"activation": "Relu"})
    assert len(found) == 2 and found[0].fn is numba_affine.channel_affine.fn  # by record: in-code plugins have no dist name
    assert {(k.out, k.inplace, k.views, k.epilogue) for k in found} == {(True, (0,), False, False)}


def test_constant_scale_and_bias_laid_out_at_build_give_the_same_bits():
    """S and B given as the node's constants are laid out once at build; other arrays at run time: same results."""
    shape = (2, 6, 5, 5)
    rng = np.random.default_rng(9)
    x = rng.standard_normal(shape).astype(np.float32)
    s, b = rng.standard_normal(6).astype(np.float32), rng.standard_normal(6).astype(np.float32)
    t = TensorType(np.float32, shape)
    ctx = KernelContext("ca", "ChannelAffine", 1, (t, None, None), (t,), (None, s, b), 1)
    run = numba_affine.channel_affine.prepared(ctx, {"activation": "Relu"})
    want = numpy_affine.channel_affine.prepared(_ctx(shape), {"activation": "Relu"})(x, s, b)
    np.testing.assert_array_equal(run(x, s, b), want)
    np.testing.assert_array_equal(run(x, s * 2, b), numpy_affine.channel_affine.prepared(
        _ctx(shape), {"activation": "Relu"})(x, s * 2, b))
