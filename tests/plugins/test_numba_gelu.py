"""minfer-ops-numba's ai.minfer::Gelu against minfer-passes' numpy kernel and the exact GELU, alone and in a linear layer."""

from __future__ import annotations

import math

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import KernelContext, TensorType  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_ops_numba import gelu as numba_gelu  # noqa: E402
from minfer_passes import gelu as numpy_gelu  # noqa: E402
from minfer_passes import linear  # noqa: E402



pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


def _prepared(shape):
    t = TensorType(np.float32, shape)
    return numba_gelu.gelu.prepared(KernelContext("g", "Gelu", 1, (t,), (t,), (None,), 1), {})


def test_coefficients_are_minfer_passes():
    """The polynomial is minfer-passes' own (written out again: plugins import only minfer_core)."""
    np.testing.assert_array_equal(numba_gelu.P, numpy_gelu._P)


@pytest.mark.parametrize("in_place", [False, True])
def test_within_the_numpy_kernels_bound_of_the_exact_gelu(in_place):
    """On a dense grid the compiled kernel is within 3.2e-7 of the exact GELU (the numpy kernel's bound), in place
    too; NaN and the infinities come out as the numpy kernel's."""
    grid = np.linspace(-12, 12, 480_001, dtype=np.float32)
    edges = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-38, -1e-38, 5.656, -5.657], np.float32)
    x = np.concatenate([grid, edges])
    run = _prepared(x.shape)
    y = run(x, out=x) if in_place else run(x)
    x = np.concatenate([grid, edges])
    exact = np.array([0.5 * v * math.erfc(-v / math.sqrt(2)) for v in grid.astype(np.float64)])
    assert np.abs(y[: grid.size] - exact).max() <= 3.2e-7
    np.testing.assert_array_equal(y[grid.size :], numpy_gelu.gelu(edges))


def test_two_threads_give_the_one_thread_bits():
    """Split over the intra-op threads, each element is computed as in one range."""
    x = np.random.default_rng(0).standard_normal(3 * numba_gelu.SPLIT_ELEMENTS + 17).astype(np.float32)
    run = _prepared(x.shape)
    one = run(x)
    with using_threads(2):
        two = run(x)
    np.testing.assert_array_equal(one, two)


def test_a_linear_layer_applies_the_registered_gelu():
    """FusedMatMulBias's GELU is the registered compiled kernel when one writes in place, else minfer-passes' own."""
    t = TensorType(np.float32, (2, 8, 16))
    ctx = KernelContext("fc", "FusedMatMulBias", 1, (t,), (t,), (None,), 1)
    ranges = linear._gelu_ranges(ctx)
    assert ranges is not numpy_gelu.gelu_range
    x = np.random.default_rng(1).standard_normal(256).astype(np.float32)
    got = x.copy()
    ranges(got, got)
    assert np.abs(got - numpy_gelu.gelu(x)).max() <= 5e-7
    unknown = KernelContext("fc", "FusedMatMulBias", 1, (t,), (None,), (None,), 1)
    assert linear._gelu_ranges(unknown) is numpy_gelu.gelu_range
