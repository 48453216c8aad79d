"""minfer-ops-numba's depthwise Convs over a native team (team.py): the parallel_for path's bits, epilogue included.

With two intra-op threads and an epilogue that has a compiled form (FusedConv's Relu, Clip, HardSwish, residual
add), the three depthwise kernels (depthwise.py's `conv` and `conv_rows`, channels.py's `conv_channels`) run
their units and the epilogue in a compiled driver over numba's threads instead of parallel_for: the same loops
and the same epilogue formulas, so every output bit must be the parallel_for path's.
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import Engine, KernelContext, TensorType  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_ops_numba import activation, channels, depthwise, team  # noqa: E402
from modelkit import fused_epilogue as modelkit_epilogue  # noqa: E402
from modelkit import make_model, tensor  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py

KERNELS = {"conv": depthwise.conv, "conv_rows": depthwise.conv_rows, "conv_channels": channels.conv_channels}
MODULES = {"conv": depthwise, "conv_rows": depthwise, "conv_channels": channels}

SHAPES = [  # (N, C, H, W), kernel, stride: MobileNets' layers, channels not a multiple of 16, batch 1 and 2
    ((1, 144, 56, 56), 3, 1),
    ((1, 144, 56, 56), 3, 2),
    ((2, 40, 28, 28), 5, 2),
    ((1, 72, 28, 28), 5, 1),
    ((2, 200, 14, 14), 3, 1),
    ((1, 576, 14, 14), 3, 2),
    ((1, 960, 7, 7), 3, 1),
    ((2, 33, 7, 7), 5, 1),
]

EPILOGUES = {  # FusedConv's (activation, activation_params, with a residual)
    "Relu": ("Relu", (), False),
    "Clip-0-6": ("Clip", (0.0, 6.0), False),
    "HardSwish": ("HardSwish", (), False),
    "residual": ("", (), True),
    "residual-Relu": ("Relu", (), True),
    "residual-HardSwish": ("HardSwish", (), True),
}


@pytest.fixture(autouse=True)
def native_team():
    """Skip where numba has no OpenMP or TBB threading layer (or MINFER_NUMBA_TEAM=0): no native team runs."""
    if not team.available():
        pytest.skip("no native team here: numba's threading layer is not OpenMP or TBB, or MINFER_NUMBA_TEAM=0")


def case(shape, k, s, seed=0):
    """(x, w, b, attributes) of a random depthwise Conv with 'same' pads."""
    rng = np.random.default_rng(seed + sum(shape))
    x = rng.standard_normal(shape, dtype=np.float32) * 2
    w = rng.standard_normal((shape[1], 1, k, k), dtype=np.float32)
    b = rng.standard_normal(shape[1], dtype=np.float32)
    p = k // 2
    return x, w, b, dict(group=shape[1], kernel_shape=[k, k], strides=[s, s], pads=[p] * 4)


def prepared(name, x, w, b, attrs):
    types = tuple(TensorType(a.dtype, a.shape) for a in (x, w, b))
    ctx = KernelContext("node", "Conv", 22, types, (None,), (None, w, b), 1)
    kern = KERNELS[name]
    assert kern.applies(ctx, attrs)
    return kern.prepared(ctx, attrs)


def fused_epilogue(activation_name, params, z, shape):
    """An epilogue as minfer-passes' FusedConv makes it: numpy's add of the residual, then the registered in-place
    activation kernel on the tile, and its ``spec`` (docs/kernel-contract.md) saying so."""
    act = None
    if activation_name:
        kern = {"Relu": activation.relu, "Clip": activation.clip_6, "HardSwish": activation.hard_swish}[activation_name]
        attrs = {"min": params[0], "max": params[1]} if activation_name == "Clip" else {}
        ctx = KernelContext("act", activation_name, 22, (TensorType(np.dtype(np.float32), shape),), (None,), (None,), 1)
        act = kern.prepared(ctx, attrs)
    return modelkit_epilogue(activation_name, params, z, act)


def spy_drive(monkeypatch, module):
    """Count the calls of ``module``'s team driver (the calls still run)."""
    calls: list[int] = []
    real = module.drive

    def spy(*args):
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(module, "drive", spy)
    return calls


def both_paths(monkeypatch, name, x, w, b, attrs, epilogue_of):
    """The kernel's output on two threads through parallel_for (native team off), then through the native team,
    and how many times its driver ran; ``epilogue_of(out_shape)`` makes the epilogue."""
    run = prepared(name, x, w, b, attrs)
    shape = run(x, w, b).shape
    with using_threads(2), monkeypatch.context() as m:
        m.setattr(team, "size", lambda: 1)
        want = run(x, w, b, out=np.full(shape, np.nan, np.float32), epilogue=epilogue_of(shape))
    calls = spy_drive(monkeypatch, MODULES[name])
    with using_threads(2):
        out = np.full(shape, np.nan, np.float32)
        got = run(x, w, b, out=out, epilogue=epilogue_of(shape))
    assert got is out
    return want, got, len(calls)


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("shape, k, s", SHAPES)
@pytest.mark.parametrize("epilogue", EPILOGUES)
def test_team_path_gives_the_parallel_for_bits(monkeypatch, name, shape, k, s, epilogue):
    """Over a native team each depthwise kernel gives the parallel_for path's bits, FusedConv's epilogue included."""
    monkeypatch.setattr(depthwise, "MIN_TEAM_MACS", 0)  # every shape splits: the driver runs on each
    x, w, b, attrs = case(shape, k, s)
    act, params, residual = EPILOGUES[epilogue]
    rng = np.random.default_rng(1)
    zs: dict[tuple[int, ...], np.ndarray] = {}

    def epilogue_of(out_shape):
        z = zs.setdefault(out_shape, rng.standard_normal(out_shape, dtype=np.float32) * 3) if residual else None
        return fused_epilogue(act, params, z, out_shape)

    want, got, calls = both_paths(monkeypatch, name, x, w, b, attrs, epilogue_of)
    assert calls == 1
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


ODD = [  # (N, C, H, W), kernel, strides, pads, dilations: geometries past MobileNets'
    ((1, 18, 15, 16), (3, 3), (1, 1), [1, 0, 2, 1], (2, 2)),
    ((2, 21, 12, 13), (4, 4), (2, 2), [3, 1, 0, 2], (1, 1)),
    ((1, 19, 9, 13), (3, 3), (2, 1), [1, 1, 1, 1], (1, 1)),
]


@pytest.mark.parametrize("name", KERNELS)
@pytest.mark.parametrize("shape, k, s, pads, d", ODD)
def test_team_path_gives_the_parallel_for_bits_for_any_geometry(monkeypatch, name, shape, k, s, pads, d):
    """Dilations, unequal strides, asymmetric pads, even kernels: the team path still gives parallel_for's bits."""
    monkeypatch.setattr(depthwise, "MIN_TEAM_MACS", 0)
    x, w, b, _ = case(shape, k[0], s[0], seed=3)
    w = np.random.default_rng(4).standard_normal((shape[1], 1) + k, dtype=np.float32)
    attrs = dict(group=shape[1], kernel_shape=list(k), strides=list(s), pads=pads, dilations=list(d))
    z = {}

    def epilogue_of(out_shape):
        z.setdefault(out_shape, np.random.default_rng(5).standard_normal(out_shape, dtype=np.float32))
        return fused_epilogue("Relu", (), z[out_shape], out_shape)

    want, got, calls = both_paths(monkeypatch, name, x, w, b, attrs, epilogue_of)
    assert calls == 1
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("name", KERNELS)
def test_team_path_without_an_epilogue(monkeypatch, name):
    """A plain depthwise Conv (no epilogue) over a native team: the parallel_for path's bits."""
    x, w, b, attrs = case((1, 144, 56, 56), 3, 1)
    want, got, calls = both_paths(monkeypatch, name, x, w, b, attrs, lambda shape: None)
    assert calls == 1
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("name", KERNELS)
def test_epilogues_without_a_compiled_form_run_once_after_the_team(monkeypatch, name):
    """An epilogue without a spec (a quantized conv's requantization), or with a residual that is not C-contiguous,
    runs once on the whole output after the team's driver computed the sums: the parallel_for path's bits."""
    x, w, b, attrs = case((1, 144, 56, 56), 3, 1)
    spec_less = lambda shape: lambda y, region: np.maximum(y[region], 0, out=y[region])  # noqa: E731
    want, got, calls = both_paths(monkeypatch, name, x, w, b, attrs, spec_less)
    assert calls == 1
    np.testing.assert_array_equal(got, want)
    wide = np.random.default_rng(2).standard_normal((1, 144, 56, 112), dtype=np.float32)
    strided = lambda shape: fused_epilogue("Relu", (), wide[..., ::2], shape)  # noqa: E731
    want, got, calls = both_paths(monkeypatch, name, x, w, b, attrs, strided)
    assert calls == 1
    np.testing.assert_array_equal(got, want)


def test_small_convs_split_over_a_native_team_only():
    """MobileNetV2's smallest depthwise layers (576x14x14 stride 2: 254k multiply-adds) split over a native team,
    not over parallel_for; a conv too small for either runs as one part."""
    plane = (14 * 14 + 7 * 7) * 4
    assert depthwise.units(1, 576, plane, 254_016, 2, native=True)[1] == 2
    assert depthwise.units(1, 576, plane, 254_016, 2)[1] == 1
    assert depthwise.units(1, 32, 7 * 7 * 8, 14_112, 2, native=True)[1] == 1


@pytest.mark.parametrize("n, c, plane", [(1, 60, 6272), (1, 24, 25088), (1, 144, 25088), (3, 50, 25088)])
def test_a_native_teams_parts_get_as_many_channels(n, c, plane):
    """Split over a native team, the parts (contiguous shares of the units, as the driver takes them) hold about
    as many channels each, in units within UNIT_BYTES: 960x7x7 went 41 and 19 blocks of 16 channels without it."""
    found, parts = depthwise.units(n, c, plane, 10**9, 2, native=True)
    assert parts == 2
    shares = [sum(c1 - c0 for _, c0, c1 in found[len(found) * t // parts:len(found) * (t + 1) // parts])
              for t in range(parts)]
    assert max(shares) <= 1.1 * n * c / parts
    assert all((c1 - c0) * plane <= depthwise.UNIT_BYTES for _, c0, c1 in found)
    assert [(i, c0) for i, c0, _ in found] == [(i, c0) for i in range(n) for c0 in range(0, c, found[0][2])]


def _block(c: int = 96, h: int = 28):
    """x -> depthwise 3x3 Conv -> + x -> Clip(0, 6): one FusedConv with a residual and an activation."""
    rng = np.random.default_rng(7)
    inits = [numpy_helper.from_array(rng.standard_normal((c, 1, 3, 3), dtype=np.float32), "w"),
             numpy_helper.from_array(rng.standard_normal(c, dtype=np.float32), "b"),
             numpy_helper.from_array(np.float32(0), "lo"), numpy_helper.from_array(np.float32(6), "hi")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], group=c, pads=[1, 1, 1, 1]),
             helper.make_node("Add", ["c", "x"], ["s"]), helper.make_node("Clip", ["s", "lo", "hi"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, c, h, h])], [tensor("y", [1, c, h, h])], inits)
    return model, rng.standard_normal((1, c, h, h), dtype=np.float32) * 2


def test_fused_conv_session_runs_the_team_driver(monkeypatch):
    """A two-thread session's FusedConv (depthwise Conv + residual + Clip) runs depthwise.py's driver and gives
    the bits of the same session with native teams off."""
    monkeypatch.setenv("MINFER_TUNE", "0")  # the highest-priority kernel, depthwise.py's `conv`, untimed
    model, x = _block()
    engine = Engine(model, threads=2)
    assert [s.kernel.op_type for s in engine.program.specs] == ["FusedConv"]
    calls = spy_drive(monkeypatch, depthwise)
    got = engine.run(None, {"x": x})[0]
    assert calls
    monkeypatch.setattr(team, "size", lambda: 1)
    want = Engine(model, threads=2).run(None, {"x": x})[0]
    np.testing.assert_array_equal(got, want)
