"""minfer-ops-numba's depthwise Conv by 16-column vectors read in place (vector_rows.py, depthwise.py's `conv_vector`).

Each output sums its taps in onnxruntime's order in registers, a padded tap multiplying a zero: the kernel must
give depthwise.py's phase planes' bits exactly, on runs of columns inside the plane (plain loads) and at its
edges (masked loads, a masked store for a row's last run), for 3x3 and 5x5 kernels at strides 1 and 2, any
pads, batch, bias and fused epilogue; leave other geometries to the other kernels; and be one more candidate
the core times for the node.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import get_registry  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_ops_numba import depthwise, depthwise_blocked, vector_rows  # noqa: E402
from test_numba_depthwise_blocked import EPILOGUES, case, context, epilogue_for, mlas_conv, prepared  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py

NUMBA = "minfer-ops-numba"

GRID = [  # (N, C, H, W), kernel, stride, pads
    ((1, 3, 40, 70), (3, 3), 1, [1, 1, 1, 1]),  # runs inside the plane, edge runs, a last run of 6 columns
    ((2, 4, 33, 64), (3, 3), 1, [1, 1, 1, 1]),  # whole runs only: the last one still reads past the right edge
    ((1, 5, 34, 66), (3, 3), 1, [0, 0, 0, 0]),  # no pads: every whole run inside the plane
    ((1, 6, 57, 57), (3, 3), 2, [1, 1, 1, 1]),  # stride 2: pairs of loads split into even and odd columns
    ((1, 3, 40, 97), (3, 3), 2, [0, 0, 1, 1]),  # TensorFlow-style SAME pads: only after
    ((3, 4, 21, 45), (5, 5), 1, [2, 2, 2, 2]),
    ((1, 7, 29, 75), (5, 5), 2, [2, 2, 2, 2]),  # stride 2, 5x5: three pairs a row, the last pair's odd half unused
    ((1, 2, 9, 11), (5, 5), 2, [0, 2, 1, 0]),  # asymmetric pads, narrower than a vector
    ((2, 3, 1, 1), (3, 3), 1, [1, 1, 1, 1]),  # one cell: every tap but the centre padding
    ((1, 2, 6, 3), (5, 5), 1, [2, 2, 2, 2]),  # a plane narrower than the kernel
    ((1, 3, 12, 40), (3, 3), 1, [2, 0, 0, 2]),  # pads above the reach of some rows
]


@pytest.mark.parametrize("shape, k, s, pads", GRID)
@pytest.mark.parametrize("bias", ["constant", "input", "none"])
def test_vector_rows_give_the_phase_planes_bits(shape, k, s, pads, bias):
    """The phase planes' bits, whatever the plane, pads, stride, batch and bias."""
    inputs, consts, attrs = case(shape, k, s, pads, bias=bias, seed=3)
    want = prepared(depthwise.conv, inputs, consts, attrs)(*inputs)
    out = np.full(want.shape, np.nan, np.float32)
    got = prepared(depthwise.conv_vector, inputs, consts, attrs)(*inputs, out=out)
    assert got is out
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape, k, s, pads", [GRID[0], GRID[3], GRID[6]])
@pytest.mark.parametrize("epilogue", sorted(EPILOGUES))
@pytest.mark.parametrize("threads", [1, 2])
def test_vector_rows_apply_fused_epilogues_as_the_phase_planes(monkeypatch, shape, k, s, pads, epilogue, threads):
    """Fused activations and residuals give the phase planes' bits, on one thread and split over two (units over
    a native team's driver where one runs)."""
    monkeypatch.setattr(depthwise, "MIN_TEAM_MACS", 0)
    monkeypatch.setattr(depthwise, "MIN_SPLIT_MACS", 0)
    inputs, consts, attrs = case(shape, k, s, pads, seed=5)
    out_shape = _out(shape, k, s, pads)
    want = prepared(depthwise.conv, inputs, consts, attrs)(*inputs, epilogue=epilogue_for(epilogue, out_shape))
    run = prepared(depthwise.conv_vector, inputs, consts, attrs)
    with using_threads(threads):
        got = run(*inputs, epilogue=epilogue_for(epilogue, out_shape))
    np.testing.assert_array_equal(got, want)


def _out(shape, k, s, pads):
    """The output shape of a depthwise conv of input ``shape`` (dilation 1)."""
    oh = (shape[2] + pads[0] + pads[2] - k[0]) // s + 1
    return (shape[0], shape[1], oh, (shape[3] + pads[1] + pads[3] - k[1]) // s + 1)


def test_vector_rows_carry_nan_and_infinities_as_the_phase_planes():
    """A NaN or an infinity in the input reaches the outputs whose taps read it, as in the phase planes (a padded
    tap multiplies a zero, never a NaN from beyond the plane)."""
    inputs, consts, attrs = case((1, 3, 20, 50), (3, 3), 1, [1, 1, 1, 1], seed=6)
    inputs[0][0, 0, 0, 0], inputs[0][0, 1, 5, 49], inputs[0][0, 2, 19, 17] = np.nan, np.inf, -np.inf
    want = prepared(depthwise.conv, inputs, consts, attrs)(*inputs)
    got = prepared(depthwise.conv_vector, inputs, consts, attrs)(*inputs)
    assert np.isnan(want).any() and np.isinf(want).any()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape, k, s, pads", [GRID[0], GRID[4], GRID[6], GRID[7]])
def test_vector_rows_give_onnxruntimes_bits(shape, k, s, pads):
    """onnxruntime's bits (its MLAS Conv, every graph optimization off), bias included."""
    (x, w, b), consts, attrs = case(shape, k, s, pads, seed=12)
    want = mlas_conv(x, w, b, attrs)
    np.testing.assert_array_equal(prepared(depthwise.conv_vector, [x, w, b], consts, attrs)(x, w, b), want)


@pytest.mark.parametrize("k, s, d", [((7, 7), 1, 1), ((3, 5), 1, 1), ((3, 3), 3, 1), ((3, 3), 1, 2), ((4, 4), 2, 1)])
def test_vector_rows_leave_other_geometries_to_the_other_kernels(k, s, d):
    """Kernels other than 3x3 and 5x5, strides past 2, dilations: the others' (which still take the node)."""
    inputs, consts, attrs = case((1, 4, 12, 12), k, s, [1, 1, 1, 1], d=(d, d))
    ctx = context(inputs, consts)
    assert depthwise.conv.applies(ctx, attrs) and not depthwise.conv_vector.applies(ctx, attrs)
    assert not vector_rows.fits(k, (s, s), (d, d))


def test_vector_rows_are_a_timed_candidate_under_their_own_name():
    """A depthwise 3x3 float32 node offers this kernel after depthwise_blocked.py's (MINFER_TUNE=0 keeps taking the
    phase planes) and before numpy's, declared as the others are, under a name of its own."""
    inputs, consts, attrs = case((1, 40, 28, 28), (3, 3), 2, [1, 1, 1, 1])
    found = get_registry().kernel_candidates("", "Conv", 22, "numpy", context(inputs, consts), attrs)
    fns = [k.fn for k in found]
    assert fns[0] is depthwise.conv.fn
    assert fns.index(depthwise.conv_vector.fn) == fns.index(depthwise_blocked.conv_blocked.fn) + 1
    assert found[-1].plugin != NUMBA
    mine, theirs = depthwise.conv_vector, depthwise.conv
    assert (mine.out, mine.epilogue, mine.packed) == (theirs.out, theirs.epilogue, theirs.packed)
    assert len({f"{k.fn.__module__}.{k.fn.__qualname__}" for k in found}) == len(found)


def test_callers_compile_under_an_llvm_before_17(monkeypatch):
    """Under an LLVM before 17 (older numba: the masked intrinsics are spelled otherwise) `fits` declines every
    geometry, and code calling `row_cells` still compiles (depthwise.py's and qdepthwise.py's loops name it beside
    the others): a call raises instead of building invalid IR."""
    import numba

    vector_rows.install()
    monkeypatch.setattr(vector_rows, "buildable", lambda: False)
    assert not vector_rows.fits((3, 3), (1, 1), (1, 1))
    row_cells = vector_rows.row_cells

    @numba.njit
    def call(xf, w, yf):
        row_cells(xf, 0, 4, 4, w, np.float32(0), yf, 0, 4, 4, 1, 1, 1, (0, 1, 2))

    with pytest.raises(RuntimeError, match="LLVM 17"):
        call(np.zeros(16, np.float32), np.zeros(9, np.float32), np.zeros(16, np.float32))
