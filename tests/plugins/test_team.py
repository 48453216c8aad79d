"""minfer-ops-numba's native teams (team.py), the pool's claim, and the kernels that split on teams first.

Every team path is checked against the same kernel with MINFER_NUMBA_TEAM=0 (its pool or serial path), bit for
bit, inside a two-thread context, with a counter on the team driver so that a test fails when the team never ran.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

import minfer_core
from minfer_core import claim_threads, intra_op_threads, parallel_for
from minfer_core.parallel import using_threads

pytest.importorskip("numba")
from minfer_ops_numba import linear, smallconv, team  # noqa: E402

from modelkit import make_model, ort_run, tensor  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")


def _needs_team() -> None:
    if not team.available() or not team.gemm_address():
        pytest.skip("no native team here: numba's threading layer is not OpenMP/TBB, or numpy's BLAS has no "
                    "cblas_sgemm64_ (the kernels then split with parallel_for, tested elsewhere)")


@pytest.fixture
def team_off(monkeypatch):
    """A function switching native teams off (MINFER_NUMBA_TEAM=0) or back on, re-deciding at once."""

    def switch(on: bool) -> None:
        monkeypatch.setenv(team.ENV, "1" if on else "0")
        team._state.pop("ok", None)

    yield switch
    monkeypatch.delenv(team.ENV, raising=False)
    team._state.pop("ok", None)


def _counted(monkeypatch, module, name: str) -> list[int]:
    """Count the calls of a module's compiled driver (the calls still run)."""
    calls: list[int] = []
    real = getattr(module, name)
    monkeypatch.setattr(module, name, lambda *a: calls.append(1) or real(*a))
    return calls


def _linear_drivers(monkeypatch) -> list[int]:
    """Count the calls of linear.py's two team drivers (BLAS blocks, or the micro-kernel's tiles where it builds)."""
    calls = _counted(monkeypatch, linear, "_on_team")
    real = linear._tiled_team
    monkeypatch.setattr(linear, "_tiled_team", lambda *a: calls.append(1) or real(*a))
    return calls


def _both_threads_run() -> bool:
    """Whether a two-range parallel_for runs its ranges on two threads at once (each range waits for the other)."""
    import threading

    meet = threading.Barrier(2, timeout=10)
    met: list[bool] = []

    def part(lo: int, hi: int) -> None:
        try:
            meet.wait()
            met.append(True)
        except threading.BrokenBarrierError:
            met.append(False)

    parallel_for(2, part, parts=2)
    return all(met) and len(met) == 2


def test_a_claimed_pool_runs_parallel_for_serially_until_the_run_ends():
    """claim_threads returns the thread count; after it, until the using_threads block ends, parallel_for runs its
    ranges on the calling thread; a new block has the pool's threads again. Outside a parallel block it is 1."""
    import threading

    assert claim_threads() == 1
    with using_threads(2):
        assert _both_threads_run()
        assert claim_threads() == 2 and intra_op_threads() == 2
        seen: set[int] = set()
        parallel_for(64, lambda lo, hi: seen.add(threading.get_ident()), parts=8)
        assert seen == {threading.get_ident()}
    with using_threads(2):  # a new block: the claim is gone
        assert _both_threads_run()


@pytest.mark.parametrize("activation,params", [("", ()), ("Relu", ()), ("Clip", (0.0, 6.0)), ("HardSwish", ()),
                                               ("HardSigmoid", (0.2, 0.5)), ("LeakyRelu", (0.1,))])
@pytest.mark.parametrize("residual", [False, True])
def test_finish_equals_the_fused_ops_python_epilogue(activation, params, residual):
    """team.finish (bias, residual, activation in compiled code) gives the bits of minfer-passes' epilogue: numpy's
    add and the registered activation kernel."""
    rng = np.random.default_rng(3)
    y = rng.standard_normal((5, 37)).astype(np.float32) * 4
    z = rng.standard_normal((5, 37)).astype(np.float32) if residual else None
    bias = rng.standard_normal(5).astype(np.float32)
    op, a, b, _ = team.native(_Spec(activation, params, None))
    want = y + bias[:, None]
    if residual:
        want = want + z
    want = _activation_reference(activation, params, want)
    got = y.copy()
    team.finish(got.reshape(-1), team.NOTHING if z is None else z.reshape(-1), 0, 5, 37, 37, bias, 0, op, a, b)
    np.testing.assert_array_equal(got, want)


class _Spec:
    """An epilogue stand-in carrying only its description."""

    def __init__(self, activation, params, residual):
        self.spec = (activation, tuple(params), residual)


def _activation_reference(activation, params, v):
    """numpy's forms of the activations (minfer-ops-basic's), as the fused op's numpy epilogue computes them."""
    f32 = np.float32
    if activation == "Relu":
        return np.minimum(np.maximum(v, f32(0)), f32(np.inf))
    if activation == "Clip":
        return np.minimum(np.maximum(v, f32(params[0])), f32(params[1]))
    if activation == "LeakyRelu":
        return np.where(v < 0, v * f32(params[0]), v)
    if activation in ("HardSigmoid", "HardSwish"):
        alpha, beta = (params if activation == "HardSigmoid" else (1 / 6, 0.5))
        t = np.minimum(np.maximum(f32(alpha) * v + f32(beta), f32(0)), f32(1))
        return v * t if activation == "HardSwish" else t
    return v


def test_native_declines_what_it_cannot_compile():
    """An epilogue without a spec, an unknown activation and LeakyRelu with alpha <= 0 stay Python epilogues."""
    assert team.native(lambda y, region: None) is None
    assert team.native(_Spec("Selu", (), None)) is None
    assert team.native(_Spec("LeakyRelu", (0.0,), None)) is None
    assert team.native(_Spec("Relu", (), np.zeros(3, np.float64))) is None
    assert team.native(_Spec("Relu", (), None))[0] == team.CLIP


def test_gemm_from_compiled_code_is_numpys_product():
    """team.gemm (numpy's cblas_sgemm called from compiled code) gives np.matmul's bits on the same operands as
    they are held, B plain or transposed (a Gemm's transB: numpy's kernel multiplies by the held (N, K) array's
    transposed view). Not the product of a transposed copy: OpenBLAS's small-matrix kernels for B transposed and not
    sum in different orders on some CPUs (seen on an AMD EPYC family 25, model 17: 115 of 135 values an ulp off)."""
    _needs_team()
    rng = np.random.default_rng(0)
    a = rng.standard_normal((3, 70)).astype(np.float32)
    w = rng.standard_normal((70, 45)).astype(np.float32)
    for transposed, held in ((False, w), (True, np.ascontiguousarray(w.T))):
        run = linear._product(held, transposed, team.NOTHING)
        np.testing.assert_array_equal(run(a), np.matmul(a, held.T if transposed else held))


def _gemm_model(m, k, n, trans_b, activation, bias):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((n, k) if trans_b else (k, n)) * 0.05).astype(np.float32)
    inits, names = [numpy_helper.from_array(w, "w")], ["x", "w"]
    if bias:
        inits.append(numpy_helper.from_array(rng.standard_normal(n).astype(np.float32), "c"))
        names.append("c")
    nodes = [helper.make_node("Gemm", names, ["g"], transB=trans_b)]
    if activation:
        nodes.append(helper.make_node(activation, ["g"], ["y"]))
    return make_model(nodes, [tensor("x", [m, k])], [tensor("y" if activation else "g", [m, n])], inits)


@pytest.mark.parametrize("m,k,n,trans_b,activation,bias", [(1, 1280, 1000, 1, None, True), (8, 512, 300, 1, "Relu", True),
                                                           (64, 96, 200, 0, "Relu", False), (40, 96, 48, 0, None, True)])
def test_gemm_on_a_team_equals_it_without_and_matches_onnxruntime(monkeypatch, team_off, m, k, n, trans_b,
                                                                  activation, bias):
    """A Gemm (+ activation, fused) with a constant B runs on a two-thread team (its driver ran), gives the bits of
    the same kernel without a team and on one thread (its blocks come from the shape alone), and matches
    onnxruntime."""
    _needs_team()
    monkeypatch.setenv("MINFER_TUNE", "0")  # the highest priority kernel: linear.py's
    model = _gemm_model(m, k, n, trans_b, activation, bias)
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    session = minfer_core.InferenceSession(model, threads=2)  # compiles: numba's dispatchers replace the names
    calls = _linear_drivers(monkeypatch)
    got = session.run(None, {"x": x})[0]
    assert calls, "the team driver never ran"
    team_off(False)
    calls.clear()
    alone = minfer_core.InferenceSession(model, threads=2).run(None, {"x": x})[0]
    assert not calls
    np.testing.assert_array_equal(got, alone)
    np.testing.assert_array_equal(got, minfer_core.InferenceSession(model, threads=1).run(None, {"x": x})[0])
    np.testing.assert_allclose(got, ort_run(model, {"x": x})[0], rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("m,k,n,trans_b", [(1, 1280, 1000, 1), (8, 512, 300, 0)])
def test_gemm_of_a_run_time_b_is_the_held_b_kernels_product(monkeypatch, m, k, n, trans_b):
    """Gemm whose B comes with each run (DequantGemm's dequantized weight) runs linear.py's blocks on it
    (`gemm_live`, its team driver too): the bits of the kernel for the same B held as a constant, whatever B the
    run brings (a second B is used, not the first)."""
    _needs_team()
    monkeypatch.setenv("MINFER_TUNE", "0")  # the highest priority kernel: linear.py's
    held = _gemm_model(m, k, n, trans_b, None, True)
    w = numpy_helper.to_array(held.graph.initializer[0])
    live = _gemm_model(m, k, n, trans_b, None, True)
    del live.graph.initializer[0]
    live.graph.input.append(tensor("w", list(w.shape)))
    x = np.random.default_rng(1).standard_normal((m, k)).astype(np.float32)
    session = minfer_core.InferenceSession(live, threads=2)
    step = next(s for s in session.program.specs if "Gemm" in str(getattr(s.kernel, "op_type", "")))
    assert step.kernel.fn is linear.gemm_live.fn
    calls = _linear_drivers(monkeypatch)
    got = session.run(None, {"x": x, "w": w})[0]
    assert calls, "the team driver never ran"
    np.testing.assert_array_equal(got, minfer_core.InferenceSession(held, threads=2).run(None, {"x": x})[0])
    negated = _gemm_model(m, k, n, trans_b, None, True)
    negated.graph.initializer[0].CopyFrom(numpy_helper.from_array(-w, "w"))
    np.testing.assert_array_equal(session.run(None, {"x": x, "w": -w})[0],
                                  minfer_core.InferenceSession(negated, threads=2).run(None, {"x": x})[0])


def _conv_model(c, m, hw, k, stride, activation, residual):
    rng = np.random.default_rng(0)
    w = (rng.standard_normal((m, c, k, k)) * 0.1).astype(np.float32)
    b = rng.standard_normal(m).astype(np.float32)
    out = (hw + 2 * (k // 2) - k) // stride + 1
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[k, k], pads=[k // 2] * 4,
                              strides=[stride] * 2)]
    last = "c"
    if residual:
        nodes.append(helper.make_node("Add", ["c", "r"], ["s"]))
        last = "s"
    if activation:
        nodes.append(helper.make_node(activation, [last], ["y"]))
        last = "y"
    inputs = [tensor("x", [1, c, hw, hw])] + ([tensor("r", [1, m, out, out])] if residual else [])
    return make_model(nodes, inputs, [tensor(last, [1, m, out, out])],
                      [numpy_helper.from_array(w, "w"), numpy_helper.from_array(b, "b")])


@pytest.mark.parametrize("case", [(320, 1280, 7, 1, 1, "Relu", False), (24, 144, 20, 1, 1, None, True),
                                  (16, 32, 28, 3, 1, "Relu", False), (16, 32, 40, 3, 2, "HardSwish", True),
                                  (64, 64, 56, 3, 1, "Relu", True)])
def test_small_conv_on_a_team_equals_it_without_and_matches_onnxruntime(monkeypatch, team_off, case):
    """smallconv.py's conv (pointwise, 3x3, strided, large: 115M multiply-adds; fused activation and residual) on a
    two-thread team gives the bits of its parallel_for path and of one thread (its units come from the shape
    alone) and matches onnxruntime; a small map splits its output channels."""
    _needs_team()
    monkeypatch.setenv("MINFER_TUNE", "0")  # the highest priority kernel that applies: smallconv's
    model = _conv_model(*case)
    rng = np.random.default_rng(1)
    feeds = {i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim]).astype(np.float32)
             for i in model.graph.input}
    session = minfer_core.InferenceSession(model, threads=2)  # compiles: numba's dispatchers replace the names
    calls = _counted(monkeypatch, smallconv, "team_units")
    got = session.run(None, feeds)[0]
    assert calls, "the team driver never ran"
    team_off(False)
    calls.clear()
    alone = minfer_core.InferenceSession(model, threads=2).run(None, feeds)[0]
    assert not calls
    np.testing.assert_array_equal(got, alone)
    np.testing.assert_array_equal(got, minfer_core.InferenceSession(model, threads=1).run(None, feeds)[0])
    np.testing.assert_allclose(got, ort_run(model, feeds)[0], rtol=1e-4, atol=1e-4)


def test_a_refused_claim_leaves_the_pool_as_it_was():
    """When the executor says no (claimable False), claim_threads answers 1 and parallel_for still splits."""
    from minfer_parallel.pool import acquire_pool, entered, release_pool

    pool = acquire_pool(2)
    try:
        pool.claimable = False
        with entered(pool):
            assert claim_threads() == 1
            assert _both_threads_run()
    finally:
        pool.claimable = True
        release_pool(pool)


def test_the_executor_decides_per_shape_whether_kernels_may_claim(monkeypatch, tmp_path):
    """A model whose kernel claims the threads: its shape's first run times runs of the plan with and without
    claims (and on one thread alone: a short run) and keeps one mode; later runs agree with the first (last bits:
    BLAS call shapes)."""
    from minfer_core import tuning
    from minfer_parallel import executors, procs

    _needs_team()
    monkeypatch.setenv("MINFER_CACHE", str(tmp_path))
    monkeypatch.delenv("MINFER_TUNE", raising=False)
    monkeypatch.setattr(tuning, "CALM", 0.0)
    modes = []
    real = executors.ThreadsExecutor._run_in
    monkeypatch.setattr(executors.ThreadsExecutor, "_run_in",
                        lambda self, *a: modes.append(a[-1]) or real(self, *a))
    model = _gemm_model(8, 512, 300, 1, "Relu", True)
    x = np.random.default_rng(2).standard_normal((8, 512)).astype(np.float32)
    session = minfer_core.InferenceSession(model, threads=2)
    first = session.run(None, {"x": x})[0]
    (choice,) = session.executor.teams.values()
    assert procs.TEAM in modes and procs.THREADS in modes and choice in modes
    for _ in range(3):
        np.testing.assert_allclose(session.run(None, {"x": x})[0], first, rtol=1e-6, atol=1e-7)
    assert modes[-3:] == [choice] * 3


@pytest.mark.parametrize("given", [{}, {"OMP_WAIT_POLICY": "passive"}, {"GOMP_SPINCOUNT": "5"}])
def test_the_team_spins_briefly_unless_the_user_said(given):
    """A process whose environment names neither GOMP_SPINCOUNT nor OMP_WAIT_POLICY starts its team with
    team.SPINCOUNT (libgomp reads it once, when numba loads it); a user's setting is left as it is."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")} | given
    code = "import os; from minfer_ops_numba import team; ok = team.available(); print(ok, os.environ.get('GOMP_SPINCOUNT'))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    ok, spin = out.stdout.split()
    if ok != "True":
        pytest.skip("no native team in this process (numba's threading layer)")
    assert spin == given.get("GOMP_SPINCOUNT", "None" if given else team.SPINCOUNT)


def test_a_process_forked_after_the_team_started_runs_without_it():
    """numba's OpenMP layer is not fork-safe: a child forked after a team ran has no team (available() is False)
    and computes the same model with parallel_for."""
    import os
    import subprocess
    import sys

    _needs_team()
    code = """
import os, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
os.environ["MINFER_TUNE"] = "0"
import minfer_core
from test_team import _gemm_model
from minfer_ops_numba import team
model = _gemm_model(8, 512, 300, 1, "Relu", True)
x = np.ones((8, 512), np.float32)
session = minfer_core.InferenceSession(model, threads=2)
want = session.run(None, {"x": x})[0]
assert team.available()
pid = os.fork()
if pid == 0:
    got = session.run(None, {"x": x})[0]
    os._exit(0 if np.allclose(got, want, rtol=1e-6) and not team.available() else 3)
_, status = os.waitpid(pid, 0)
print(os.waitstatus_to_exitcode(status))
"""
    here = os.path.dirname(__file__)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([here, os.path.dirname(here), os.environ.get("PYTHONPATH", "")]))
    out = subprocess.run([sys.executable, "-c", code, here], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-1] == "0"


def test_a_sessions_no_to_claims_ends_with_its_run(monkeypatch):
    """The pool is shared: a session whose shape settled on no claims says so for its own runs only; kernels in a
    later using_threads block may claim again."""
    from minfer_parallel.procs import THREADS

    _needs_team()
    monkeypatch.setenv("MINFER_TUNE", "0")
    model = _gemm_model(8, 512, 300, 1, "Relu", True)
    x = np.ones((8, 512), np.float32)
    session = minfer_core.InferenceSession(model, threads=2)
    session.run(None, {"x": x})
    session.run(None, {"x": x})
    (sig,) = session.executor.teams
    session.executor.teams[sig] = THREADS
    seen = []
    real = team.size
    monkeypatch.setattr(team, "size", lambda: seen.append(real()) or seen[-1])
    session.run(None, {"x": x})
    assert seen == [1]  # refused inside the run
    with using_threads(2):
        assert claim_threads() == 2
