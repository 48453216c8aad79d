"""minfer-ops-numba's compiled ai.minfer::FusedElementwise against minfer-passes' numpy kernel and onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import Engine, KernelContext, TensorType, get_registry, load_model  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_ops_numba import _jit, elementwise  # noqa: E402
from modelkit import make_model, ort_run, tensor  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

passes_kernel = pytest.importorskip("minfer_passes.elementwise_kernel")
F32 = np.dtype(np.float32)
EXACT = ("Add", "Sub", "Mul", "Div", "Max", "Min", "Neg", "Abs", "Sqrt", "Reciprocal", "Relu", "HardSwish",
         "HardSigmoid", "LeakyRelu", "Clip", "Pow", "Where")  # the numpy kernel's bits
ULPS = ("Exp", "Sigmoid", "Log", "Tanh", "Erf")  # own exp; libm (refused by applies)


pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


def context(inputs) -> KernelContext:
    types = tuple(TensorType(x.dtype, x.shape) for x in inputs)
    return KernelContext("node", "FusedElementwise", 1, types, (None,), (None,) * len(inputs), 1)


class Program:
    """A random step program in the node attributes' format, over float32 inputs that broadcast to ``shape``."""

    def __init__(self, rng: np.random.Generator, names: tuple[str, ...], shape: tuple[int, ...]) -> None:
        self.rng, self.shape, self.steps, self.consts = rng, shape, [], []
        self.inputs = [rng.standard_normal(shape).astype(np.float32)]
        for _ in range(rng.integers(0, 3)):  # a full, bias-like, per-channel or scalar operand
            self.inputs.append(rng.standard_normal(tuple(d if rng.random() < 0.5 else 1 for d in shape)[
                rng.integers(0, len(shape) + 1):]).astype(np.float32))
        self.cond = None
        v = 0
        for _ in range(rng.integers(1, 7)):
            v = self.step(rng.choice(names), v)

    def const(self, value: float) -> int:
        self.consts.append(value)
        return -len(self.consts)  # resolved by `attrs` once the input count is known

    def emit(self, name: str, *refs: int) -> int:
        self.steps.append((name, refs))
        return 1000 + len(self.steps) - 1

    def operand(self) -> int:
        return self.const(float(self.rng.choice([0.5, -1.5, 2.0]))) if self.rng.random() < 0.3 else \
            int(self.rng.choice([i for i in range(len(self.inputs)) if i != self.cond]))

    def step(self, name: str, v: int) -> int:
        positive = lambda: self.emit("Add", self.emit("Abs", v), self.const(0.5))  # noqa: E731
        if name in ("Sqrt", "Log", "Reciprocal"):
            return self.emit(name, positive())
        if name == "Div":
            return self.emit("Div", self.operand(), positive())
        if name in ("Add", "Sub", "Mul", "Max", "Min"):
            pair = (v, self.operand())
            return self.emit(name, *(pair if self.rng.random() < 0.5 else pair[::-1]))
        if name == "Pow":
            return self.emit(name, v, self.const(float(self.rng.choice([2.0, 3.0]))))
        if name == "LeakyRelu":
            return self.emit(name, v, self.const(float(self.rng.choice([0.01, 1.5]))))
        if name in ("HardSigmoid", "Clip"):
            return self.emit(name, v, self.const(-0.5 if name == "Clip" else 0.2), self.const(0.5))
        if name == "Where":
            if self.cond is None:
                self.cond = len(self.inputs)
                self.inputs.append(self.rng.random(self.shape[self.rng.integers(0, len(self.shape) + 1):]) < 0.5)
            return self.emit(name, self.cond, v, self.operand())
        return self.emit(name, v)

    def attrs(self) -> dict:
        n, c = len(self.inputs), len(self.consts)
        ref = lambda r: n + (-r - 1) if r < 0 else (n + c + r - 1000 if r >= 1000 else r)  # noqa: E731
        args = []
        for _, refs in self.steps:
            args += [ref(r) for r in refs] + [-1] * (3 - len(refs))
        return {"ops": [s for s, _ in self.steps], "args": args, "constants": np.asarray(self.consts, np.float32)}


def run_both(inputs, attrs, out_is_input: bool = False):
    ctx = context(inputs)
    mine = elementwise.fused_elementwise.prepared(ctx, attrs)
    theirs = passes_kernel.fused_elementwise.prepared(ctx, attrs)
    want = theirs(*inputs)
    if out_is_input:
        inputs = [x.copy() for x in inputs]
        return mine(*inputs, out=inputs[0]), want
    return mine(*inputs, out=np.empty_like(want)), want


SHAPES = [(), (7,), (3, 5), (2, 3, 4, 5), (1, 6, 9, 9), (2, 1, 70000)]


@pytest.mark.parametrize("seed", range(12))
@pytest.mark.parametrize("shape", SHAPES)
def test_programs_numba_takes_give_the_numpy_kernels_bits(seed, shape):
    """Random programs of the steps `applies` accepts, with scalar, bias and per-channel operands broadcasting and
    bool Where conditions, give the numpy kernel's exact bits (same float32 formulas, same order)."""
    p = Program(np.random.default_rng(seed * 31 + len(shape)), EXACT, shape)
    attrs = p.attrs()
    assert elementwise.fused_elementwise.applies(context(p.inputs), attrs)
    got, want = run_both(p.inputs, attrs, out_is_input=p.inputs[0].shape == want_shape(p.inputs))
    np.testing.assert_array_equal(got, want)


def want_shape(inputs):
    return np.broadcast_shapes(*(x.shape for x in inputs))


@pytest.mark.parametrize("seed", range(10))
def test_transcendental_steps_compute_within_a_few_ulps(seed):
    """Programs with Exp and Sigmoid (the kernel's own exp) and Log, Tanh, Erf steps (libm; refused by `applies`,
    still computed when called) agree with the numpy kernel within float32 rounding."""
    p = Program(np.random.default_rng(seed), EXACT + ULPS * 3, (2, 3, 40))
    got, want = run_both(p.inputs, p.attrs())
    np.testing.assert_allclose(got, want, rtol=2e-5, atol=2e-6)


def test_exp_within_three_ulps_of_numpy_with_its_overflow_underflow_and_nan():
    """The compiled exp (no libm, so the loop vectorizes) is within 3 ulps of np.exp over float32's whole exp range,
    inf beyond 88.73, 0 below -104, NaN kept (a NaN must not index the 2^n table)."""
    x = np.concatenate([np.linspace(-104.5, 89, 1 << 18, dtype=np.float32),
                        np.asarray([np.inf, -np.inf, np.nan, 88.7228, 1e30, -1e30, 0.0], np.float32)])
    got, want = run_both([x], {"ops": ["Exp"], "args": [0, -1, -1], "constants": np.zeros(0, np.float32)})
    with np.errstate(all="ignore"):
        assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))
    ok = ~np.isnan(want)
    assert np.abs(got[ok].view(np.int32).astype(np.int64) - want[ok].view(np.int32)).max() <= 3


def test_applies_refuses_what_numpy_keeps():
    """Other dtypes, libm steps, Pow by other exponents, a bool input used as a number and malformed programs go
    to the numpy kernel."""
    x, m = np.zeros((2, 3), np.float32), np.zeros((2, 3), bool)
    take = elementwise.fused_elementwise.applies
    hswish = {"ops": ["Add", "HardSwish"], "args": [0, 1, -1, 2, -1, -1], "constants": np.zeros(0, np.float32)}
    assert take(context([x, x]), hswish)
    assert not take(context([x.astype(np.float64)] * 2), hswish)
    assert not take(context([x, m]), hswish)  # bool as Add's operand
    assert take(context([m, x]), {"ops": ["Where", "Relu"], "args": [0, 1, 1, 2, -1, -1],
                                  "constants": np.zeros(0, np.float32)})
    assert not take(context([x, x]), {**hswish, "ops": ["Add", "Erf"]})
    assert take(context([x, x]), {**hswish, "ops": ["Add", "Sigmoid"]})
    for e, ok in ((2.0, True), (3.0, True), (0.5, False)):
        pow_ = {"ops": ["Pow", "Relu"], "args": [0, 1, -1, 2, -1, -1], "constants": np.asarray([e], np.float32)}
        assert bool(take(context([x]), pow_)) is ok
    assert not take(context([x, x]), {**hswish, "args": [0, 1, -1, 3, -1, -1]})  # a step reading itself
    assert not take(context([x, x]), {**hswish, "ops": ["Add", "Softmax"]})


def test_core_times_numba_against_numpy_for_programs_it_takes():
    """A float32 HardSwish chain offers both kernels, with the same out/epilogue declarations (so the core times
    them); a GELU (Erf) program only the numpy one."""
    x = np.zeros((1, 8, 4, 4), np.float32)
    registry = get_registry()
    hswish = {"ops": ["Add", "HardSwish"], "args": [0, 1, -1, 2, -1, -1], "constants": np.zeros(0, np.float32)}
    found = registry.kernel_candidates("ai.minfer", "FusedElementwise", 1, "numpy", context([x, x]), hswish)
    assert [k.fn is elementwise.fused_elementwise.fn for k in found] == [True, False]  # by record, not dist name
    assert (found[0].out, found[0].epilogue, found[0].inplace) == (found[1].out, found[1].epilogue, found[1].inplace)
    gelu = {"ops": ["Mul", "Erf", "Add", "Mul", "Mul"], "args": [0, 1, -1, 4, -1, -1, 5, 2, -1, 0, 6, -1, 7, 3, -1],
            "constants": np.asarray([0.70710677, 1.0, 0.5], np.float32)}
    found = registry.kernel_candidates("ai.minfer", "FusedElementwise", 1, "numpy", context([x]), gelu)
    assert [k.fn is elementwise.fused_elementwise.fn for k in found] == [False]


def test_split_over_two_threads_gives_the_same_bits(monkeypatch):
    """Rows, or one long inner axis, handed to two intra-op threads give the one-thread result."""
    monkeypatch.setattr(elementwise, "SPLIT", 1 << 10)
    monkeypatch.setattr(elementwise, "CHUNK", 1 << 8)
    for shapes in (((4, 64, 33), (64, 1)), ((1 << 14,), ())):
        inputs = [np.random.default_rng(1).standard_normal(s).astype(np.float32) for s in shapes]
        attrs = {"ops": ["Mul", "HardSwish"], "args": [0, 1, -1, 2, -1, -1], "constants": np.zeros(0, np.float32)}
        run = elementwise.fused_elementwise.prepared(context(inputs), attrs)
        with using_threads(2):
            two = run(*inputs)
        np.testing.assert_array_equal(two, run(*inputs))


def test_hardswish_model_runs_the_numba_kernel_and_matches_onnxruntime(monkeypatch):
    """A bias + HardSwish + Clip + scale chain, fused by minfer-passes into one node, runs the compiled kernel
    (MINFER_TUNE=0 takes the higher priority) and matches onnxruntime."""
    monkeypatch.setenv("MINFER_TUNE", "0")
    sources = []
    real = elementwise.compiled
    monkeypatch.setattr(elementwise, "compiled", lambda src: sources.append(src) or real(src))
    c = lambda name, v: numpy_helper.from_array(np.asarray(v, np.float32), name)  # noqa: E731
    n = helper.make_node
    nodes = [n("Add", ["x", "bias"], ["a"]), n("HardSwish", ["a"], ["h"]), n("Clip", ["h", "lo", "hi"], ["cl"]),
             n("Mul", ["cl", "half"], ["y"])]
    inits = [c("bias", np.linspace(-1, 1, 16).reshape(16, 1, 1)), c("lo", -0.25), c("hi", 2.0), c("half", 0.5)]
    model = make_model(nodes, [tensor("x", [2, 16, 9, 9])], [tensor("y", [2, 16, 9, 9])], inits)
    feeds = {"x": (3 * np.random.default_rng(2).standard_normal((2, 16, 9, 9))).astype(np.float32)}
    engine = Engine(load_model(model), passes="all")
    assert [node.op_type for node in engine.graph.nodes] == ["FusedElementwise"]
    got = engine.run(None, feeds)[0]
    assert sources and "HardSwish" not in sources[0]  # compiled: the generated loop, not a step call
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-6, atol=1e-6)


def test_generated_source_and_compiled_code_land_in_the_cache_folder(monkeypatch, tmp_path):
    """The program's source is written under the cache folder and numba caches its machine code there."""
    monkeypatch.setenv("NUMBA_CACHE_DIR", str(tmp_path))
    x = np.ones((3, 4), np.float32)
    attrs = {"ops": ["Min", "Max", "Neg", "Abs"], "args": [0, 1, -1, 2, 1, -1, 3, -1, -1, 4, -1, -1],
             "constants": np.asarray([0.25], np.float32)}  # a program no other test compiles
    run = elementwise.fused_elementwise.prepared(context([x]), attrs)
    np.testing.assert_array_equal(run(x), np.full((3, 4), 0.25, np.float32))
    assert list((tmp_path / f"minfer-ops-numba-{_jit.sources_key()}" / "fused_elementwise").glob("minfer_fused_*.py"))
    assert list(tmp_path.rglob("*.nbi"))
