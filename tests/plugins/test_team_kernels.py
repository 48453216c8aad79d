"""minfer-ops-numba's kernels over a native team (team.py): the parallel_for path's bits, and the driver ran.

With two intra-op threads, each kernel below splits its work over numba's OpenMP threads by a compiled driver
(`drive`, `_drive`, ...) instead of minfer_core.parallel_for: the same compiled loop on each share (the stem conv:
the same im2col, BLAS GEMM and epilogue), so every output bit must be the parallel_for path's. The reference
runs with MINFER_NUMBA_TEAM=0 (no native team: parallel_for's path) inside the same two-thread block.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import KernelContext, TensorType  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_ops_numba import (activation, affine, elementwise, fewchannels, gelu, lookup, pool, resize,  # noqa: E402
                              rows, team)
from modelkit import fused_epilogue as modelkit_epilogue  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


@pytest.fixture(autouse=True)
def native_team(monkeypatch):
    """Skip where numba has no OpenMP or TBB threading layer (or MINFER_NUMBA_TEAM=0): no native team runs."""
    if not team.available():
        pytest.skip("no native team here: numba's threading layer is not OpenMP or TBB, or MINFER_NUMBA_TEAM=0")
    yield
    team._state.pop("ok", None)  # decided again, with the environment as it was


def context(op, arrays, constants=None, opset=22):
    """A KernelContext of one node whose inputs are ``arrays`` (``constants``: the ones known at build)."""
    types = tuple(TensorType(a.dtype, a.shape) if a is not None else None for a in arrays)
    return KernelContext("node", op, opset, types, (None,), constants or (None,) * len(arrays), 1)


def spy(monkeypatch, module, name):
    """Count the calls of ``module.name`` (a team driver; the calls still run)."""
    calls: list[int] = []
    real = getattr(module, name)

    def counted(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(module, name, counted)
    return calls


def both_paths(monkeypatch, call):
    """``call()``'s result on two threads without a native team (MINFER_NUMBA_TEAM=0: parallel_for's path), then
    with one."""
    with monkeypatch.context() as m:
        m.setenv(team.ENV, "0")
        team._state.pop("ok", None)
        with using_threads(2):
            want = call()
    team._state.pop("ok", None)
    assert team.available()
    with using_threads(2):
        got = call()
    return want, got


def run_on(run, x, in_place, *rest):
    """``run(x, *rest)``, or in place on a copy of x (``out=`` the input, as the engine calls it then)."""
    if not in_place:
        return run(x, *rest)
    y = x.copy()
    return run(y, *rest, out=y)


def same_bits(got, want):
    """Every output bit equal (NaN payloads and signed zeros included)."""
    for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
        assert g.shape == w.shape
        np.testing.assert_array_equal(np.ascontiguousarray(g).view(np.uint32), np.ascontiguousarray(w).view(np.uint32))


def with_specials(x):
    """x with a NaN, infinities and signed zeros in it (the activations' edge cases)."""
    flat = x.reshape(-1)
    if flat.size >= 5:
        flat[:5] = [np.nan, np.inf, -np.inf, 0.0, -0.0]
    return x


# ---- the stem conv (fewchannels.py) ------------------------------------------------------------------------------

ACTIVATIONS = {"Relu": activation.relu, "Clip": activation.clip_6, "HardSwish": activation.hard_swish}


def fused_epilogue(name, params, z, shape):
    """An epilogue as minfer-passes' FusedConv makes it (numpy's add of the residual ``z``, then the registered
    in-place activation kernel), with its ``spec`` (docs/kernel-contract.md) saying so."""
    act = None
    if name:
        attrs = {"min": params[0], "max": params[1]} if name == "Clip" else {}
        act = ACTIVATIONS[name].prepared(context(name, [np.zeros(shape, np.float32)]), attrs)
    return modelkit_epilogue(name, params, z, act)


STEMS = [  # (N, C, H, W), output channels, stride: MobileNetV2's, MobileNetV3's, the OCR detector's stems, smaller
    ((1, 3, 224, 224), 32, 2),
    ((1, 3, 224, 224), 16, 2),
    ((1, 3, 320, 320), 8, 2),
    ((2, 3, 56, 60), 24, 1),
    ((1, 1, 33, 47), 5, 2),
]
STEM_EPILOGUES = {"none": None, "Clip-0-6": ("Clip", (0.0, 6.0), False), "HardSwish": ("HardSwish", (), False),
                  "residual-Relu": ("Relu", (), True)}


@pytest.mark.parametrize("shape, m, s", STEMS)
@pytest.mark.parametrize("epilogue", STEM_EPILOGUES)
@pytest.mark.parametrize("method", ["direct", "gemm"])
def test_stem_conv_team_path_gives_the_parallel_for_bits(monkeypatch, shape, m, s, epilogue, method):
    """The stem conv over a native team (the direct loop, or the im2col and BLAS GEMM where it cannot be built;
    the activation in the loop's registers or by the compiled epilogue) gives parallel_for's path's bits."""
    monkeypatch.setattr(fewchannels, "TEAM_SPLIT_MACS", 0)  # every shape splits over the team
    if method == "gemm":
        monkeypatch.setattr(fewchannels.direct, "fits", lambda *a: False)
    rng = np.random.default_rng(sum(shape) + m)
    x = rng.standard_normal(shape, dtype=np.float32)
    w = rng.standard_normal((m, shape[1], 3, 3), dtype=np.float32)
    b = rng.standard_normal(m, dtype=np.float32)
    attrs = dict(kernel_shape=[3, 3], strides=[s, s], pads=[1, 1, 1, 1])
    run = fewchannels.conv.prepared(context("Conv", [x, w, b], (None, w, b)), attrs)
    out_shape = run(x, w, b).shape
    found = STEM_EPILOGUES[epilogue]
    z = rng.standard_normal(out_shape, dtype=np.float32) * 3 if found and found[2] else None
    ep = fused_epilogue(found[0], found[1], z, out_shape) if found else None
    calls = spy(monkeypatch, fewchannels, "drive_direct" if method == "direct" else "drive")
    want, got = both_paths(monkeypatch, lambda: run(x, w, b, out=np.full(out_shape, np.nan, np.float32), epilogue=ep))
    assert len(calls) == 1
    same_bits(got, want)


def test_stem_conv_without_a_compiled_epilogue_keeps_parallel_for(monkeypatch):
    """An epilogue without a spec runs on the parallel_for path (the driver cannot run it), with its bits."""
    x = np.random.default_rng(3).standard_normal((1, 3, 224, 224), dtype=np.float32)
    w = np.random.default_rng(4).standard_normal((32, 3, 3, 3), dtype=np.float32)
    run = fewchannels.conv.prepared(context("Conv", [x, w], (None, w)), dict(kernel_shape=[3, 3], strides=[2, 2],
                                                                             pads=[1, 1, 1, 1]))
    relu = lambda y, region: np.maximum(y[region], 0, out=y[region])  # noqa: E731
    calls, direct_calls = spy(monkeypatch, fewchannels, "drive"), spy(monkeypatch, fewchannels, "drive_direct")
    want, got = both_paths(monkeypatch, lambda: run(x, w, epilogue=relu))
    assert not calls and not direct_calls
    same_bits(got, want)


def test_stem_bands_for_a_team_come_in_a_multiple_of_its_threads():
    """A team's contiguous shares of the bands are as large: MobileNetV2's stem in 4 bands, the detector's in 8."""
    assert len(fewchannels.bands_of(1, 112, 112, 28, 2, even=True)) % 2 == 0
    assert len(fewchannels.bands_of(1, 160, 160, 28, 2, even=True)) == 8
    assert len(fewchannels.bands_of(1, 160, 160, 28, 2)) == 7


# ---- pools, activations, rows, resize, fused elementwise ---------------------------------------------------------

POOLS = {"MaxPool": pool.max_pool_10, "AveragePool": pool.average_pool_19}


@pytest.mark.parametrize("op", POOLS)
@pytest.mark.parametrize("shape, k, s, p", [((1, 64, 112, 112), 3, 2, 1), ((1, 24, 20, 20), 2, 2, 0),
                                            ((2, 33, 15, 17), 3, 2, 1)])
def test_pools_team_path_gives_the_parallel_for_bits(monkeypatch, op, shape, k, s, p):
    """MaxPool and AveragePool over a native team give the parallel_for path's bits."""
    monkeypatch.setattr(pool, "TEAM_SPLIT_CELLS", 0)
    x = with_specials(np.random.default_rng(5).standard_normal(shape, dtype=np.float32))
    run = POOLS[op].prepared(context(op, [x]), dict(kernel_shape=[k, k], strides=[s, s], pads=[p] * 4))
    calls = spy(monkeypatch, pool, "drive")
    want, got = both_paths(monkeypatch, lambda: run(x))
    assert len(calls) == 1
    same_bits(got, want)


ACTS = {"Relu": (activation.relu, {}), "Clip": (activation.clip_6, {"min": -1.0, "max": 2.0}),
        "LeakyRelu": (activation.leaky_relu, {"alpha": 0.1}), "HardSigmoid": (activation.hard_sigmoid, {}),
        "HardSwish": (activation.hard_swish, {})}


@pytest.mark.parametrize("op", ACTS)
@pytest.mark.parametrize("in_place", [False, True])
def test_activations_team_path_gives_the_parallel_for_bits(monkeypatch, op, in_place):
    """Each activation over a native team gives the parallel_for path's bits, in place or not (the size is not a
    multiple of the team's cache-line shares)."""
    monkeypatch.setattr(activation, "TEAM_SPLIT_ELEMENTS", 0)
    monkeypatch.setattr(activation, "SPLIT_ELEMENTS", 0)  # in place: the team's bound (and parallel_for's block path)
    kern, attrs = ACTS[op]
    x = with_specials(np.random.default_rng(6).standard_normal((1, 96, 57, 61), dtype=np.float32) * 4)
    run = kern.prepared(context(op, [x]), attrs)
    calls = spy(monkeypatch, activation, "_drive")

    want, got = both_paths(monkeypatch, lambda: run_on(run, x, in_place))
    assert len(calls) == 1
    same_bits(got, want)


def test_activations_ask_for_a_team_only_where_they_split(monkeypatch):
    """An activation asks for a team (which claims the run's threads) from TEAM_SPLIT_ELEMENTS elements, in place
    (a fused op's tile) only from SPLIT_ELEMENTS: below, it stays one compiled call."""
    x = np.ones((1, 32, 64, 64), np.float32)
    assert activation.TEAM_SPLIT_ELEMENTS <= x.size < activation.SPLIT_ELEMENTS
    run = activation.relu.prepared(context("Relu", [x]), {})
    asked = spy(monkeypatch, team, "size")
    with using_threads(2):
        run(x, out=x)
        run(x[:, :, :8], out=np.empty((1, 32, 8, 64), np.float32))
    assert not asked
    with using_threads(2):
        run(x)
    assert len(asked) == 1


@pytest.mark.parametrize("shape", [(4, 77, 128), (2, 300, 7), (1, 5, 8192)])
@pytest.mark.parametrize("log", [False, True])
def test_softmax_team_path_gives_the_parallel_for_bits(monkeypatch, shape, log):
    """Softmax and LogSoftmax rows over a native team give the parallel_for path's bits (short rows too)."""
    monkeypatch.setattr(rows, "TEAM_SPLIT_ELEMENTS", 0)
    x = np.random.default_rng(7).standard_normal(shape, dtype=np.float32) * 5
    kern = rows.log_softmax_13 if log else rows.softmax_13
    run = kern.prepared(context("LogSoftmax" if log else "Softmax", [x], opset=13), {})
    calls = spy(monkeypatch, rows, "_drive")
    want, got = both_paths(monkeypatch, lambda: run(x))
    assert len(calls) == 1
    same_bits(got, want)


@pytest.mark.parametrize("bias", [False, True])
def test_layer_normalization_team_path_gives_the_parallel_for_bits(monkeypatch, bias):
    """LayerNormalization over a native team gives the parallel_for path's bits, Mean and InvStdDev included."""
    monkeypatch.setattr(rows, "TEAM_SPLIT_NORM", 0)
    rng = np.random.default_rng(8)
    x = rng.standard_normal((3, 197, 192), dtype=np.float32)
    g = rng.standard_normal(192, dtype=np.float32)
    c = rng.standard_normal(192, dtype=np.float32) if bias else None
    inputs = [x, g, c] if bias else [x, g]
    run = rows.layer_normalization.prepared(context("LayerNormalization", inputs, (None, g, c)[:len(inputs)],
                                                    opset=17), {})
    calls = spy(monkeypatch, rows, "_drive_norm")
    want, got = both_paths(monkeypatch, lambda: run(*inputs))
    assert len(calls) == 1
    same_bits(got, want)


@pytest.mark.parametrize("mode", ["half_pixel", "align_corners", "asymmetric"])
def test_resize_team_path_gives_the_parallel_for_bits(monkeypatch, mode):
    """Linear Resize over a native team gives the parallel_for path's bits."""
    monkeypatch.setattr(resize, "TEAM_SPLIT_ELEMENTS", 0)
    x = np.random.default_rng(9).standard_normal((1, 33, 20, 23), dtype=np.float32)
    scales = np.array([1, 1, 2, 2], np.float32)
    roi = np.zeros(0, np.float32)
    run = resize.resize_11.prepared(context("Resize", [x, roi, scales], (None, None, scales), opset=13),
                                    dict(mode="linear", coordinate_transformation_mode=mode))
    calls = spy(monkeypatch, resize, "_drive")
    want, got = both_paths(monkeypatch, lambda: run(x, roi, scales))
    assert len(calls) == 1
    same_bits(got, want)


@pytest.mark.parametrize("shapes", [[(1, 64, 40, 40), (1, 64, 1, 1)], [(1, 100000), (1, 1)], [(3, 50000), (3, 1)]])
def test_fused_elementwise_team_path_gives_the_parallel_for_bits(monkeypatch, shapes):
    """A fused Mul + HardSwish program over a native team gives the parallel_for path's bits: split by rows, or
    along the inner axis when there are fewer rows than threads."""
    monkeypatch.setattr(elementwise, "TEAM_SPLIT", 0)
    drivers: list[int] = []
    real = elementwise.compiled

    def counted(src):
        fused, fused_team = real(src)
        return fused, lambda *args: drivers.append(1) or fused_team(*args)

    monkeypatch.setattr(elementwise, "compiled", counted)
    rng = np.random.default_rng(10)
    inputs = [with_specials(rng.standard_normal(s, dtype=np.float32) * 4) for s in shapes]
    attrs = {"ops": ["Mul", "HardSwish"], "args": [0, 1, -1, 2, -1, -1], "constants": np.zeros(0, np.float32)}
    ctx = KernelContext("node", "FusedElementwise", 1, tuple(TensorType(a.dtype, a.shape) for a in inputs),
                        (TensorType(np.dtype(np.float32), None),), (None,) * len(inputs), 1)
    run = elementwise.fused_elementwise.prepared(ctx, attrs)
    drivers.clear()  # the driver's compile at build
    want, got = both_paths(monkeypatch, lambda: run(*inputs))
    assert len(drivers) == 1
    same_bits(got, want)


@pytest.mark.parametrize("act, params", [("", []), ("Relu", []), ("Clip", [0.0, 6.0]), ("LeakyRelu", [0.1])])
@pytest.mark.parametrize("in_place", [False, True])
def test_channel_affine_team_path_gives_the_parallel_for_bits(monkeypatch, act, params, in_place):
    """ChannelAffine over a native team gives the parallel_for path's bits, in place or not."""
    monkeypatch.setattr(affine, "TEAM_SPLIT", 0)
    rng = np.random.default_rng(11)
    x = with_specials(rng.standard_normal((2, 24, 30, 31), dtype=np.float32) * 4)
    sv, bv = rng.standard_normal(24, dtype=np.float32), rng.standard_normal(24, dtype=np.float32)
    ctx = KernelContext("ca", "ChannelAffine", 1, (TensorType(x.dtype, x.shape), None, None), (None,), (None,) * 3, 1)
    run = affine.channel_affine.prepared(ctx, {"activation": act, "activation_params": params})
    calls = spy(monkeypatch, affine, "_drive")

    want, got = both_paths(monkeypatch, lambda: run_on(run, x, in_place, sv, bv))
    assert len(calls) == 1
    same_bits(got, want)


@pytest.mark.parametrize("in_place", [False, True])
def test_gelu_team_path_gives_the_parallel_for_bits(monkeypatch, in_place):
    """ai.minfer::Gelu over a native team gives the parallel_for path's bits, in place (through scratch) or not."""
    monkeypatch.setattr(gelu, "TEAM_SPLIT_ELEMENTS", 0)
    x = with_specials(np.random.default_rng(12).standard_normal((3, 70_001), dtype=np.float32) * 3)
    run = gelu.gelu.prepared(context("Gelu", [x], opset=1), {})
    calls = spy(monkeypatch, gelu, "_drive")

    want, got = both_paths(monkeypatch, lambda: run_on(run, x, in_place))
    assert len(calls) == 1
    same_bits(got, want)


@pytest.mark.parametrize("dtype", [np.float32, np.int8, np.uint8])
def test_lookup_team_path_gives_the_parallel_for_bits(monkeypatch, dtype):
    """ai.minfer::Lookup over a native team, float32 or 8-bit X, gives the parallel_for path's bits."""
    monkeypatch.setattr(lookup, "TEAM_SPLIT_ELEMENTS", 0)
    rng = np.random.default_rng(13)
    if dtype == np.float32:
        x, attrs = with_specials(rng.standard_normal((3, 70_001), dtype=np.float32) * 3), {"scale": 0.0371,
                                                                                           "low": -100.0, "high": 120.0}
        table = rng.standard_normal(222).astype(np.float32)
    else:
        info = np.iinfo(dtype)
        x = rng.integers(info.min, info.max + 1, (3, 70_001)).astype(dtype)
        attrs, table = {"scale": 0.0, "low": float(info.min), "high": float(info.max)}, rng.standard_normal(256)
        table = table.astype(np.float32)
    run = lookup.lookup.prepared(context("Lookup", [x, table], opset=1), attrs)
    calls = spy(monkeypatch, lookup, "_drive_grid" if dtype == np.float32 else "_drive_value")
    want, got = both_paths(monkeypatch, lambda: run(x, table))
    assert len(calls) == 1
    same_bits(got, want)

