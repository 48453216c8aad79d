"""minfer-ops-numba's SqueezeExcite (squeeze.py): one compiled call per block, within float32 rounding of
minfer-passes' numpy kernel, the registry's choice where it applies, in place and out of place."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import KernelContext, TensorType, get_registry  # noqa: E402
from minfer_ops_numba import squeeze  # noqa: E402
from minfer_passes import squeeze_excite  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py

ACTS = {  # name: (activation, params)
    "none": ("", []), "Relu": ("Relu", []), "HardSigmoid": ("HardSigmoid", [1 / 6, 0.5]), "HardSwish": ("HardSwish", []),
    "Clip": ("Clip", [0.0, 6.0]), "Swish": ("Swish", [1.0]), "LeakyRelu": ("LeakyRelu", [0.1]),
}


def block(shape, hidden, bias=True, seed=0):
    rng = np.random.default_rng(seed)
    c = shape[1]
    x = (rng.standard_normal(shape) * 3).astype(np.float32)
    w1 = (rng.standard_normal((hidden, c, 1, 1)) / np.sqrt(c)).astype(np.float32)
    w2 = (rng.standard_normal((c, hidden, 1, 1)) / np.sqrt(hidden)).astype(np.float32)
    b1 = rng.standard_normal(hidden).astype(np.float32) if bias else None
    b2 = rng.standard_normal(c).astype(np.float32) if bias else None
    return x, w1, b1, w2, b2


def context(x, w1, b1, w2, b2):
    arrays = (x, w1, b1, w2, b2)
    types = tuple(None if a is None else TensorType(a.dtype, a.shape) for a in arrays)
    return KernelContext("se", "SqueezeExcite", 1, types, (None,), (None, w1, b1, w2, b2), 1)


def attrs_of(inner, outer):
    (a1, p1), (a2, p2) = ACTS[inner], ACTS[outer]
    return {"inner_activation": a1, "inner_activation_params": p1, "activation": a2, "activation_params": p2}


@pytest.mark.parametrize("shape, hidden", [((1, 16, 7, 7), 8), ((2, 24, 3, 5), 6), ((1, 5, 1, 1), 3),
                                           ((3, 40, 14, 14), 10), ((1, 96, 2, 3), 24), ((1, 576, 7, 7), 144)])
@pytest.mark.parametrize("inner, outer", [("Relu", "HardSigmoid"), ("none", "none"), ("HardSwish", "Swish"),
                                          ("LeakyRelu", "Clip")])
@pytest.mark.parametrize("bias", [True, False])
def test_compiled_block_close_to_the_numpy_kernel(shape, hidden, inner, outer, bias):
    """Maps below, at and past the eight-accumulator step, a batch, every compiled activation, with and without
    biases: within float32 rounding of minfer-passes' kernel, out of place and in place (X's memory as out)."""
    x, w1, b1, w2, b2 = block(shape, hidden, bias)
    ctx, attrs = context(x, w1, b1, w2, b2), attrs_of(inner, outer)
    assert squeeze.squeeze_excite.applies(ctx, attrs)
    chosen = get_registry().select_kernel("ai.minfer", "SqueezeExcite", 1, ctx=ctx, attrs=attrs)
    assert chosen is not None and chosen.fn is squeeze.squeeze_excite.fn  # above the numpy kernel
    want = squeeze_excite.squeeze_excite.prepared(ctx, attrs)(x, w1, b1, w2, b2)
    run = squeeze.squeeze_excite.prepared(ctx, attrs)
    # the products sum up to 576 terms in another order than BLAS: a gate near zero (terms cancelling) differs by
    # float32 rounding of the terms, not of the result, so the bound is relative to the output's scale too
    tol = dict(rtol=2e-5, atol=1e-5 * float(np.abs(want).max()))
    np.testing.assert_allclose(run(x, w1, b1, w2, b2), want, **tol)
    y = x.copy()
    assert run(y, w1, b1, w2, b2, out=y) is y
    np.testing.assert_allclose(y, want, **tol)
    strided = np.asfortranarray(x)  # not C-contiguous: read through a copy
    np.testing.assert_allclose(run(strided, w1, b1, w2, b2, out=np.empty_like(x)), want, **tol)


def test_activations_without_a_compiled_form_stay_with_numpy():
    """Sigmoid or Tanh (numpy's vector exp and tanh), float64, or a computed weight: the numpy kernel's node."""
    x, w1, b1, w2, b2 = block((1, 8, 4, 4), 2)
    ctx = context(x, w1, b1, w2, b2)
    assert not squeeze.squeeze_excite.applies(ctx, {**attrs_of("Relu", "none"), "activation": "Sigmoid"})
    assert not squeeze.squeeze_excite.applies(ctx, {**attrs_of("none", "none"), "inner_activation": "Tanh"})
    x64 = x.astype(np.float64)
    assert not squeeze.squeeze_excite.applies(context(x64, w1, b1, w2, b2), attrs_of("Relu", "HardSigmoid"))
    computed = KernelContext("se", "SqueezeExcite", 1, ctx.input_types, (None,), (None, None, b1, w2, b2), 1)
    assert not squeeze.squeeze_excite.applies(computed, attrs_of("Relu", "HardSigmoid"))


def test_nan_in_a_channel_gives_nan_in_every_gated_value_it_reaches():
    """A NaN in X makes its channel's mean NaN, so every hidden value and the whole gate NaN, as numpy's."""
    x, w1, b1, w2, b2 = block((1, 8, 4, 4), 4)
    x[0, 3, 1, 2] = np.nan
    ctx, attrs = context(x, w1, b1, w2, b2), attrs_of("none", "none")
    want = squeeze_excite.squeeze_excite.prepared(ctx, attrs)(x, w1, b1, w2, b2)
    got = squeeze.squeeze_excite.prepared(ctx, attrs)(x, w1, b1, w2, b2)
    assert np.isnan(want).all()
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
