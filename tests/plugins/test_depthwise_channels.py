"""minfer-ops-numba's depthwise Conv vectorized across channels (channels.py) against its two loop kernels and numpy's.

The kernel computes sixteen channels at once in channels-last planes; each output cell still sums its taps in
onnxruntime's order (loops.py's docstring), so it must give the loop kernels' bits exactly, whatever the
channel count (blocks cut short at C), map size, stride, pads, kernel and bias, and be one more candidate the
core times for the node.
"""

from __future__ import annotations

import threading

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import KernelContext, TensorType, get_registry  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_ops_numba import channels, depthwise  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py

NUMBA = "minfer-ops-numba"

GRID = [  # (N, C, H, W), kernel, stride, pads: channels not a multiple of 16, maps of 1 to 28 cells a side
    ((1, 24, 14, 14), 3, 1, [1, 1, 1, 1]),
    ((2, 40, 14, 14), 3, 2, [1, 1, 1, 1]),
    ((1, 16, 7, 7), 3, 1, [1, 1, 1, 1]),
    ((2, 50, 7, 7), 5, 1, [2, 2, 2, 2]),
    ((1, 72, 28, 28), 5, 2, [2, 2, 2, 2]),
    ((1, 33, 28, 28), 3, 2, [0, 0, 1, 1]),  # TensorFlow-style SAME pads: only after
    ((2, 5, 1, 1), 3, 1, [1, 1, 1, 1]),  # one cell, fewer channels than a block
    ((1, 17, 1, 1), 5, 2, [2, 2, 2, 2]),
    ((2, 48, 14, 14), 5, 2, [2, 2, 2, 2]),
    ((1, 20, 9, 12), 3, 1, [0, 2, 1, 0]),  # asymmetric pads, a map not square
]

ODD = [  # (N, C, H, W), kernel, strides, pads, dilations: geometries past MobileNets'
    ((1, 18, 15, 16), (3, 3), (1, 1), [1, 0, 2, 1], (2, 2)),
    ((2, 21, 12, 13), (4, 4), (2, 2), [3, 1, 0, 2], (1, 1)),
    ((1, 8, 12, 12), (7, 7), (1, 1), [3, 3, 3, 3], (1, 1)),
    ((1, 19, 9, 13), (3, 3), (2, 1), [1, 1, 1, 1], (1, 1)),
    ((1, 35, 6, 6), (2, 3), (3, 3), [0, 1, 1, 0], (1, 2)),  # an input column no output reads
]


def context(inputs, constants) -> KernelContext:
    types = tuple(TensorType(a.dtype, a.shape) for a in inputs)
    consts = tuple(constants) + (None,) * (len(inputs) - len(constants))
    return KernelContext("node", "Conv", 22, types, (None,), consts, 1)


def case(shape, k, s, pads, d=(1, 1), bias="constant", seed=0):
    """(inputs, constants, attributes) of a random depthwise Conv; bias as a constant, an input, or none."""
    rng = np.random.default_rng(seed + sum(shape))
    k, s = (k, k) if isinstance(k, int) else k, (s, s) if isinstance(s, int) else s
    x = rng.standard_normal(shape, dtype=np.float32)
    w = rng.standard_normal((shape[1], 1) + k, dtype=np.float32)
    b = rng.standard_normal(shape[1], dtype=np.float32)
    attrs = dict(group=shape[1], kernel_shape=list(k), strides=list(s), pads=pads, dilations=list(d))
    inputs = [x, w] + ([b] if bias != "none" else [])
    consts = [None, w] + ([b] if bias == "constant" else [])
    return inputs, consts, attrs


def prepared(kern, inputs, consts, attrs):
    ctx = context(inputs, consts)
    assert kern.applies(ctx, attrs)
    return kern.prepared(ctx, attrs)


@pytest.mark.parametrize("shape, k, s, pads", GRID)
@pytest.mark.parametrize("bias", ["constant", "input", "none"])
def test_channel_blocks_give_the_loop_kernels_bits(shape, k, s, pads, bias):
    """The kernel gives the phase-plane and row-loop kernels' bits, bias a constant, an input or absent, into out."""
    inputs, consts, attrs = case(shape, k, s, pads, bias=bias)
    want = prepared(depthwise.conv, inputs, consts, attrs)(*inputs)
    np.testing.assert_array_equal(prepared(depthwise.conv_rows, inputs, consts, attrs)(*inputs), want)
    out = np.full(want.shape, np.nan, np.float32)
    got = prepared(channels.conv_channels, inputs, consts, attrs)(*inputs, out=out)
    assert got is out
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("shape, k, s, pads, d", ODD)
def test_channel_blocks_give_the_row_loops_bits_for_any_geometry(shape, k, s, pads, d):
    """Dilations, unequal strides, even and 7x7 kernels: still the row loops' bits."""
    inputs, consts, attrs = case(shape, k, s, pads, d, seed=3)
    want = prepared(depthwise.conv_rows, inputs, consts, attrs)(*inputs)
    np.testing.assert_array_equal(prepared(channels.conv_channels, inputs, consts, attrs)(*inputs), want)


@pytest.mark.parametrize("auto_pad", ["SAME_UPPER", "SAME_LOWER", "VALID"])
def test_channel_blocks_resolve_auto_pad_as_the_row_loops(auto_pad):
    """auto_pad gives the row loops' pads, output size and bits."""
    inputs, consts, attrs = case((2, 37, 11, 10), (4, 3), (2, 3), None, seed=4)
    attrs = {**attrs, "auto_pad": auto_pad}
    del attrs["pads"]
    want = prepared(depthwise.conv_rows, inputs, consts, attrs)(*inputs)
    np.testing.assert_array_equal(prepared(channels.conv_channels, inputs, consts, attrs)(*inputs), want)


@pytest.mark.parametrize("shape, k, s, pads", GRID[:5])
def test_channel_blocks_match_numpy(shape, k, s, pads):
    """The kernel computes what the numpy Conv does, within float32 rounding."""
    inputs, consts, attrs = case(shape, k, s, pads, seed=5)
    numpy_conv = get_registry().select_kernel("", "Conv", 22)  # without a node: the numpy kernel
    assert numpy_conv.plugin != NUMBA
    want = numpy_conv.prepared(context(inputs, consts), attrs)(*inputs)
    got = prepared(channels.conv_channels, inputs, consts, attrs)(*inputs)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5 * k * k)


@pytest.mark.parametrize("threads", [1, 2])
def test_channel_blocks_epilogue_finishes_each_region_once(threads):
    """The epilogue sees regions covering the output exactly once, finished, also split over two threads."""
    inputs, consts, attrs = case((2, 200, 28, 28), 3, 1, [1, 1, 1, 1], seed=2)  # enough work to split
    want = prepared(depthwise.conv, inputs, consts, attrs)(*inputs)
    fast = prepared(channels.conv_channels, inputs, consts, attrs)
    seen, lock, y = np.zeros(want.shape, int), threading.Lock(), np.empty_like(want)

    def epilogue(out, region):
        assert out is y
        with lock:
            seen[region] += 1
        np.negative(out[region], out=out[region])  # once-only and visible

    with using_threads(threads):
        fast(*inputs, out=y, epilogue=epilogue)
    assert (seen == 1).all()
    np.testing.assert_array_equal(-y, want)


def test_channel_blocks_are_a_timed_candidate_under_their_own_name():
    """A depthwise float32 node offers this kernel besides the two loop kernels and numpy's, below the loop kernels
    (MINFER_TUNE=0 keeps taking the phase planes), under a name of its own (the key of stored choices)."""
    x, w = np.zeros((1, 40, 14, 14), np.float32), np.zeros((40, 1, 3, 3), np.float32)
    ctx, attrs = context([x, w], [None, w]), {"group": 40, "kernel_shape": [3, 3]}
    found = get_registry().kernel_candidates("", "Conv", 22, "numpy", ctx, attrs)
    fns = [k.fn for k in found]
    assert fns[:3] == [depthwise.conv.fn, depthwise.conv_rows.fn, channels.conv_channels.fn]
    assert found[-1].plugin != NUMBA
    mine, theirs = channels.conv_channels, depthwise.conv
    assert (mine.out, mine.epilogue) == (theirs.out, theirs.epilogue)
    assert mine.packed == theirs.packed
    names = {f"{k.fn.__module__}.{k.fn.__qualname__}" for k in found}
    assert len(names) == len(found)
