"""minfer-ops-basic's elementwise kernels split large outputs over the intra-op threads, with the serial result."""

from __future__ import annotations

import numpy as np
import pytest

from minfer_core import get_registry
from minfer_core.parallel import using_threads
from minfer_ops_basic import elementwise
from minfer_ops_basic.elementwise import SPLIT_CHEAP, SPLIT_COSTLY, split_flat
from modelkit import spy_parallel_for

RNG = np.random.default_rng(0)


@pytest.fixture
def splits(monkeypatch):
    """Records every parallel_for the elementwise kernels make (how many parts of what)."""
    return spy_parallel_for(monkeypatch, elementwise)


def _kernel(op: str, opset: int = 18):
    return get_registry().select_kernel("", op, opset).fn


def _both(run, *args, inplace: bool = False):
    """run(*args, out=...) serially and with two threads (into a fresh buffer, and into args[0] when inplace)."""
    serial = run(*args, out=np.empty_like(args[0]))
    with using_threads(2):
        out = np.empty_like(args[0])
        assert run(*args, out=out) is out
        np.testing.assert_array_equal(out, serial)
        if inplace:
            own = args[0].copy()
            assert run(own, *args[1:], out=own) is own
            np.testing.assert_array_equal(own, serial)
    return serial


CHEAP_SHAPE = (3, SPLIT_CHEAP // 3 + 5)
COSTLY_SHAPE = (2, 3, SPLIT_COSTLY // 6 + 7)


@pytest.mark.parametrize("op,shape,attrs", [
    ("Relu", CHEAP_SHAPE, {}), ("Abs", CHEAP_SHAPE, {}), ("Neg", CHEAP_SHAPE, {}),
    ("LeakyRelu", CHEAP_SHAPE, {"alpha": 0.1}), ("Sigmoid", COSTLY_SHAPE, {}), ("Tanh", COSTLY_SHAPE, {}),
    ("Exp", COSTLY_SHAPE, {}), ("Erf", COSTLY_SHAPE, {}), ("Gelu", COSTLY_SHAPE, {}),
])
def test_unary_ops_split_large_outputs(splits, op, shape, attrs):
    x = RNG.standard_normal(shape).astype(np.float32)
    fn = _kernel(op, 20)
    _both(lambda v, out: fn(v, out=out, **attrs), x, inplace=True)
    assert splits and all(n == x.size for n in splits)


def test_clip_splits_with_its_bounds():
    x = RNG.standard_normal(CHEAP_SHAPE).astype(np.float32)
    clip = _kernel("Clip")
    lo, hi = np.float32(-0.5), np.float32(0.3)
    got = _both(lambda v, out: clip(v, lo, hi, out=out), x, inplace=True)
    np.testing.assert_array_equal(got, np.clip(x, lo, hi))


@pytest.mark.parametrize("op", ["Add", "Sub", "Mul", "Div"])
@pytest.mark.parametrize("other", ["same", "scalar", "leading", "channel"])
def test_binary_ops_split_when_broadcasting_is_simple(splits, op, other):
    """Same shapes and one-element operands split flat; [N, ...] against [1, ...] splits along N."""
    shape = (4, 8, 256, 257)
    a = RNG.standard_normal(shape).astype(np.float32)
    b = {"same": lambda: RNG.standard_normal(shape),
         "scalar": lambda: np.array([1.5]),
         "leading": lambda: RNG.standard_normal((1,) + shape[1:]),
         "channel": lambda: RNG.uniform(0.5, 1.5, (4, 8, 1, 1))}[other]().astype(np.float32)
    fn = _kernel(op)
    got = _both(lambda x, y, out: fn(x, y, out=out), a, b, inplace=True)
    want = {"Add": np.add, "Sub": np.subtract, "Mul": np.multiply, "Div": np.divide}[op](a, b)
    np.testing.assert_array_equal(got, want)
    assert splits == [a.size] * len(splits) if other in ("same", "scalar") else splits == [4] * len(splits)


def test_broadcasting_that_is_not_simple_runs_whole(splits):
    """A trailing-axis operand (rank below out's) is not split, and the result is still numpy's."""
    a = RNG.standard_normal((1, 3, 800, 900)).astype(np.float32)
    b = RNG.standard_normal(900).astype(np.float32)
    got = _both(lambda x, y, out: _kernel("Add")(x, y, out=out), a, b)
    np.testing.assert_array_equal(got, a + b)
    assert splits == []


def test_small_outputs_and_one_thread_do_not_split(splits):
    x = RNG.standard_normal((2, 3, 5)).astype(np.float32)
    with using_threads(2):
        _kernel("Relu")(x, out=np.empty_like(x))
        _kernel("Add")(x, x, out=np.empty_like(x))
    big = RNG.standard_normal(CHEAP_SHAPE).astype(np.float32)
    _kernel("Add")(big, big, out=np.empty_like(big))  # outside a parallel run: one thread
    assert splits == []


def test_sum_and_max_split_same_shape_inputs(splits):
    xs = [RNG.standard_normal(CHEAP_SHAPE).astype(np.float32) for _ in range(3)]
    for op, ref in (("Sum", lambda: xs[0] + xs[1] + xs[2]), ("Max", lambda: np.maximum(np.maximum(xs[0], xs[1]), xs[2]))):
        fn = _kernel(op)
        with using_threads(2):
            out = np.empty_like(xs[0])
            assert fn(*xs, out=out) is out
        np.testing.assert_array_equal(out, ref())
    assert len(splits) == 2


def test_split_flat_parts_cover_the_output_once():
    """Every element of out is written by exactly one part, for each branch (flat, scalar, leading axis)."""
    out = np.zeros((5, 7, 3), np.int64)

    def count(*args, out):
        out += 1

    with using_threads(2):
        assert split_flat(count, (out,), out, 1)
        assert split_flat(count, (np.ones((1, 7, 3)),), out, 1)
        assert not split_flat(count, (np.ones(3),), out, 1)  # lower rank: not simple
    np.testing.assert_array_equal(out, 2)


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
def test_sigmoid_is_exact_at_the_edges(dtype):
    """inf -> 1, -inf -> 0, nan -> nan, -0 -> 0.5, and e/(1+e) keeps tiny negatives' relative accuracy."""
    x = np.array([np.inf, -np.inf, np.nan, -0.0, 0.0, 30.0, -30.0, -80.0, 1e-3], dtype=dtype)
    got = _kernel("Sigmoid")(x)
    want = (1 / (1 + np.exp(-x.astype(np.float64)))).astype(dtype).astype(np.float64)  # representable values
    assert got.dtype == dtype
    np.testing.assert_allclose(got.astype(np.float64), want, rtol=2e-3 if dtype == np.float16 else 1e-6, atol=0)
    big = RNG.standard_normal(3 * (1 << 16) + 5).astype(dtype) * 10  # several blocks and a ragged last one
    half = dtype == np.float16  # float16 arithmetic: subnormal results lose their relative digits
    np.testing.assert_allclose(_kernel("Sigmoid")(big), 1 / (1 + np.exp(-big.astype(np.float64))),
                               rtol=2e-3 if half else 1e-6, atol=1e-4 if half else 0)


def test_relu_keeps_ints_0d_and_strided_inputs():
    relu = _kernel("Relu")
    assert relu(np.array(-3, np.int32)).dtype == np.int32 and relu(np.array(-3, np.int32)) == 0
    x = RNG.standard_normal((300, 400)).astype(np.float32)
    np.testing.assert_array_equal(relu(x.T), np.maximum(x.T, 0))
    out = np.empty((400, 300), np.float32)
    np.testing.assert_array_equal(relu(x.T, out=out), np.maximum(x.T, 0))
    assert relu(np.float32(-2.0).reshape(())).shape == ()


@pytest.mark.parametrize("dtype", [np.float16, np.float32, np.float64])
@pytest.mark.parametrize("lo,hi", [(-0.5, 0.3), (0.5, -0.5), (None, 0.2), (-0.1, None), (-np.inf, np.nan)])
def test_clip_in_blocks_keeps_max_then_min(dtype, lo, hi):
    """Large float Clip runs against bound blocks: lo > hi gives hi, nan propagates, one bound alone works."""
    x = RNG.standard_normal(3 * (1 << 16) + 11).astype(dtype)
    x[::97] = np.nan
    args = [None if b is None else np.asarray(b, dtype) for b in (lo, hi)]
    want = x
    if lo is not None:
        want = np.maximum(want, args[0])
    if hi is not None:
        want = np.minimum(want, args[1])
    got = _kernel("Clip")(x, *args)
    np.testing.assert_array_equal(got, want)
    own = x.copy()
    assert _kernel("Clip")(own, *args, out=own) is own
    np.testing.assert_array_equal(own, want)
    np.testing.assert_array_equal(_kernel("Clip", 6)(x, out=np.empty_like(x)), x)  # FLT_MAX defaults


def test_hard_sigmoid_and_hard_swish_on_large_inputs():
    x = RNG.standard_normal(5000).astype(np.float32) * 4
    hs = np.clip(np.float32(0.2) * x + np.float32(0.5), 0, 1)
    np.testing.assert_array_equal(_kernel("HardSigmoid")(x), hs)
    np.testing.assert_allclose(_kernel("HardSwish")(x), x * np.clip(x / 6 + 0.5, 0, 1), rtol=1e-6, atol=1e-7)
