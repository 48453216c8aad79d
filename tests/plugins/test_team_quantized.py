"""minfer-ops-numba's exact 8-bit GEMM and the quantized kernels on it, split over a native team (team.py).

Each team path is checked against the same kernel with MINFER_NUMBA_TEAM=0 (its parallel_for or serial path) bit
for bit inside a two-thread context: the team runs the same compiled calls on the same kind of ranges, exact integer
sums and fixed float epilogues, so nothing may differ. A counter on igemm's driver fails a test whose team never ran.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import minfer_core
from minfer_core.parallel import using_threads

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")
from minfer_ops_numba import igemm, team  # noqa: E402

from modelkit import make_model, ort_run, tensor  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


def _needs_team_and_vnni() -> None:
    if not team.available():
        pytest.skip("no native team here (MINFER_NUMBA_TEAM=0, or numba's threading layer is not OpenMP/TBB): "
                    "igemm splits with parallel_for")
    if not igemm.vnni():
        pytest.skip("the quantized kernels apply only on AVX-512 VNNI (else numpy's kernels compute)")


def _team_off(monkeypatch) -> None:
    """MINFER_NUMBA_TEAM=0, decided afresh (monkeypatch restores team's state after the test)."""
    monkeypatch.setenv(team.ENV, "0")
    monkeypatch.setattr(team, "_state", {})


def _counted(monkeypatch, module=igemm, name="_on_team") -> list[int]:
    """Record each call of a module's team driver: igemm's ``by`` argument (2 matrices, 1 columns, 0 rows), else 1.
    Patch only after the module compiled (numba puts its dispatchers in the module's namespace then)."""
    calls: list[int] = []
    real = getattr(module, name)
    note = (lambda a: int(a[11])) if module is igemm else (lambda a: 1)
    monkeypatch.setattr(module, name, lambda *a: calls.append(note(a)) or real(*a))
    return calls


def _random(rng, dtype, shape):
    info = np.iinfo(dtype)
    return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)


# (batch, M, K, N, A's type, B's type, B one for the batch, output), the split the team takes
GEMMS = {
    "columns-float": ((0, 9, 37, 300, np.uint8, np.int8, True, "float"), 1),
    "columns-few-rows-int8": ((0, 3, 130, 200, np.int8, np.uint8, True, "int8"), 1),
    "rows-one-panel-int32": ((0, 70, 41, 60, np.uint8, np.uint8, True, "int32"), 0),
    "rows-k-below-4": ((0, 23, 3, 50, np.int8, np.int8, True, "float"), 0),
    "matrices-own-b-uint8": ((5, 17, 64, 70, np.uint8, np.int8, False, "uint8"), 2),
    "matrices-shared-b": ((3, 10, 19, 130, np.int8, np.int8, True, "int32"), 2),
}


def _gemm_call(case, rng):
    """A function running igemm on the case's random operands into a new output."""
    batch, m, k, n, at, bt, shared, kind = case
    lead = (batch,) if batch else ()
    a = _random(rng, at, lead + (m, k))
    b = _random(rng, bt, (k, n) if shared or not batch else (batch, k, n))
    packed = igemm.pack_b(b)
    za = _random(rng, at, (m,)) if not batch else _random(rng, at, ())
    zb = _random(rng, bt, (n,)) // 2
    shape = lead + (m, n)
    if kind == "float":
        extra = dict(scale=np.float32(0.003), bias=rng.standard_normal(n).astype(np.float32))
    elif kind in ("int8", "uint8"):
        extra = dict(requantize=(rng.uniform(1e-5, 1e-4, n), np.array(3, kind)))
    else:
        extra = {}
    dtype = {"float": np.float32, "int32": np.int32}.get(kind, kind)
    return lambda: igemm.igemm(a, packed, np.empty(shape, dtype), za, zb, **extra)


@pytest.mark.parametrize("name", list(GEMMS), ids=str)
def test_igemm_on_a_team_is_its_parallel_for_result_bit_for_bit(monkeypatch, name):
    """igemm's team driver (columns, rows or matrices of a batch; int32, scaled float32 and requantized 8-bit
    outputs) gives the bits of the parallel_for split and the serial product."""
    _needs_team_and_vnni()
    case, split = GEMMS[name]
    run = _gemm_call(case, np.random.default_rng(len(name)))
    alone = run()  # compiles igemm: its driver is numba's from now on
    monkeypatch.setattr(igemm, "TEAM_SPLIT_MACS", 0)  # small shapes split too
    monkeypatch.setattr(igemm, "SPLIT_MACS", 0)
    calls = _counted(monkeypatch)
    with using_threads(2):
        got = run()
    assert calls == [split], "the team driver did not run, or split otherwise"
    _team_off(monkeypatch)
    with using_threads(2):
        pooled = run()
    assert calls == [split]
    assert got.dtype == pooled.dtype and got.tobytes() == pooled.tobytes() == alone.tobytes()


def test_igemm_leaves_a_small_product_to_the_calling_thread(monkeypatch):
    """Below TEAM_SPLIT_MACS multiply-adds the product runs on the calling thread: no team is claimed for it."""
    _needs_team_and_vnni()
    run = _gemm_call((0, 8, 16, 64, np.uint8, np.int8, True, "int32"), np.random.default_rng(0))
    run()
    calls = _counted(monkeypatch)
    with using_threads(2):
        run()
    assert 8 * 16 * 64 < igemm.TEAM_SPLIT_MACS and not calls


def _qconv_node(rng, *, c, m, hw, residual):
    """(inputs, attributes) of a FloatQLinearConv (3x3, pads 1, per-channel weight; with ``residual`` its rounding
    and a residual input) as the integer fusion makes it."""
    x = rng.standard_normal((1, c) + hw).astype(np.float32) * 2
    w = _random(rng, np.int8, (m, c, 3, 3))
    inputs = [x, np.array(0.03, np.float32), np.array(131, np.uint8), w,
              rng.uniform(0.001, 0.01, m).astype(np.float32), np.zeros(m, np.int8), np.array(0.15, np.float32),
              np.array(125, np.uint8), rng.integers(-3000, 3000, m).astype(np.int32)]
    attrs = dict(float_input=1, float_output=1, pads=[1, 1, 1, 1], activation="Relu", activation_params=[])
    if residual:
        attrs.update(output_rounding=[0.05, -128.0, 127.0], residual_rounding=[0.1, -128.0, 127.0])
        inputs += [None, None, rng.standard_normal((1, m) + hw).astype(np.float32)]
    return inputs, attrs


def _qconv_run(inputs, attrs):
    from minfer_core import KernelContext, TensorType
    from minfer_ops_numba import qconv

    shape = (1, inputs[3].shape[0]) + inputs[0].shape[2:]
    types = tuple(None if v is None else TensorType(v.dtype, v.shape) for v in inputs)
    consts = tuple(None if i in (0, 11) else v for i, v in enumerate(inputs))
    ctx = KernelContext("n", "FloatQLinearConv", 1, types, (TensorType(np.float32, shape),), consts, 1)
    assert qconv.float_qlinear_conv.applies(ctx, attrs)
    run = qconv.float_qlinear_conv.fn(ctx, **attrs)
    args = [None if i in (3, 5) else v for i, v in enumerate(inputs)]  # packed: the engine passes None there
    return lambda: run(*args)


@pytest.mark.parametrize("residual", [False, True], ids=["relu", "residual-rounding"])
def test_quantized_conv_on_a_team_is_its_parallel_for_result_bit_for_bit(monkeypatch, residual):
    """FloatQLinearConv's product on a team (its columns: the output pixels), its compiled epilogue applied in
    igemm's write-out of each tile, gives the bits of the output channels split over parallel_for and of one
    thread."""
    _needs_team_and_vnni()
    inputs, attrs = _qconv_node(np.random.default_rng(3), c=32, m=48, hw=(28, 28), residual=residual)
    run = _qconv_run(inputs, attrs)
    alone = run()
    assert 48 * 32 * 9 * 28 * 28 >= igemm.TEAM_SPLIT_MACS
    calls = _counted(monkeypatch)
    with using_threads(2):
        got = run()
    assert calls == [1]
    _team_off(monkeypatch)
    monkeypatch.setattr(igemm, "SPLIT_MACS", 0)  # the output channels split over parallel_for, as on larger convs
    with using_threads(2):
        pooled = run()
    assert calls == [1] and np.unique(got).size > 20
    assert got.tobytes() == pooled.tobytes() == alone.tobytes()


@pytest.mark.parametrize("per_channel", [False, True], ids=["scale", "affine-per-channel"])
def test_scaled_conv_integer_on_a_team_is_its_parallel_for_result_bit_for_bit(monkeypatch, per_channel):
    """ScaledConvInteger (DynamicQuantizeLinear inside; ChannelAffine's S and A per channel, Clip) on a team: the
    bits of its parallel_for split."""
    from minfer_core import KernelContext, TensorType
    from minfer_ops_numba import qconv

    _needs_team_and_vnni()
    monkeypatch.setattr(qconv, "MICRO_CHANNELS", 0)  # igemm's on this 1x1 conv (else qconv_blas.py's alone)
    rng = np.random.default_rng(4)
    m, c, hw = 40, 32, (30, 30)  # 1.15M multiply-adds: igemm splits from TEAM_SPLIT_MACS
    inputs = [rng.standard_normal((1, c) + hw).astype(np.float32) * 3, _random(rng, np.int8, (m, c, 1, 1)), None,
              np.array(-2, np.int8), np.array([0.0007], np.float32)]
    if per_channel:
        inputs += [rng.standard_normal(m).astype(np.float32), rng.standard_normal(m).astype(np.float32)]
    attrs = dict(dynamic_input=1, activation="Clip", activation_params=[0.0, 6.0])
    types = tuple(None if v is None else TensorType(v.dtype, v.shape) for v in inputs)
    consts = tuple(v if i in (1, 3) else None for i, v in enumerate(inputs))
    ctx = KernelContext("n", "ScaledConvInteger", 1, types, (TensorType(np.float32, (1, m) + hw),), consts, 1)
    assert qconv.scaled_conv_integer.applies(ctx, attrs)
    kernel_run = qconv.scaled_conv_integer.fn(ctx, **attrs)
    args = [None if i in (1, 3) else v for i, v in enumerate(inputs)]
    alone = kernel_run(*args)
    calls = _counted(monkeypatch)
    with using_threads(2):
        got = kernel_run(*args)
    assert calls == [1]
    _team_off(monkeypatch)
    monkeypatch.setattr(igemm, "SPLIT_MACS", 0)
    with using_threads(2):
        pooled = kernel_run(*args)
    assert np.unique(got).size > 20 and got.tobytes() == pooled.tobytes() == alone.tobytes()


def _matmul_integer_model(m, k, n):
    rng = np.random.default_rng(5)
    w = _random(rng, np.int8, (k, n))
    node = helper.make_node("MatMulInteger", ["a", "w", "za"], ["y"])
    inits = [numpy_helper.from_array(w, "w"), numpy_helper.from_array(np.array(7, np.uint8), "za")]
    return make_model([node], [tensor("a", [m, k], TensorProto.UINT8)], [tensor("y", [m, n], TensorProto.INT32)],
                      inits)


def test_a_quantized_model_runs_its_products_on_the_team(monkeypatch):
    """A session of two threads runs MatMulInteger on the team: onnxruntime's exact integers, the same as with
    MINFER_NUMBA_TEAM=0."""
    _needs_team_and_vnni()
    monkeypatch.setenv("MINFER_TUNE", "0")  # the highest priority kernel: qmatmul's
    model = _matmul_integer_model(64, 200, 300)
    a = _random(np.random.default_rng(6), np.uint8, (64, 200))
    session = minfer_core.InferenceSession(model, threads=2)  # compiles igemm: its driver is numba's from now on
    calls = _counted(monkeypatch)
    got = session.run(None, {"a": a})[0]
    assert calls == [1]
    _team_off(monkeypatch)
    alone = minfer_core.InferenceSession(model, threads=2).run(None, {"a": a})[0]
    assert calls == [1]
    np.testing.assert_array_equal(got, alone)
    np.testing.assert_array_equal(got, ort_run(model, {"a": a})[0])


@pytest.mark.parametrize("per_channel", [False, True], ids=["inner-runs", "channels"])
def test_requantize_of_a_whole_output_on_a_team_is_one_threads_result_bit_for_bit(monkeypatch, per_channel):
    """The compiled Requantize on a whole output (a depthwise conv's epilogue, run after its loops) shares its
    channels, or one channel's run, over a native team: the values of one thread, bit for bit."""
    from minfer_core import TensorType
    from minfer_ops_conv import requantize
    from minfer_ops_numba import quant

    if not team.available():
        pytest.skip("no native team here (MINFER_NUMBA_TEAM=0, or numba's threading layer is not OpenMP/TBB)")
    rng = np.random.default_rng(12)
    shape = (1, 48, 40, 41)
    assert np.prod(shape) >= quant.TEAM_VALUES
    attrs = dict(low=-3.0, high=252.0, out_scale=0.2, activation="Relu", post_scale=0.05, post_low=0.0,
                 post_high=255.0)
    found = requantize.Compiled.find("rq", TensorType(np.float32, shape), (True, per_channel, True), **attrs)
    assert found is not None and found.fn.__module__ == quant.__name__
    n = shape[1] if per_channel else 1
    x = rng.integers(-3000, 3000, shape).astype(np.float32)
    x.reshape(-1)[:4] = [np.nan, np.inf, 0.5, -2.5]
    m, c = rng.uniform(0.01, 0.05, n).astype(np.float32), rng.integers(-50, 50, n).astype(np.float32)
    s, b = rng.uniform(0.2, 0.5, n).astype(np.float32), rng.uniform(-1, 1, n).astype(np.float32)
    alone = found.fn(x, m, c, s, b, out=np.empty(shape, np.float32))
    calls = _counted(monkeypatch, quant, "_rq_team")
    with using_threads(2):
        got = found.fn(x, m, c, s, b, out=np.empty(shape, np.float32))
    assert calls == [1] and np.unique(alone).size > 20
    assert got.tobytes() == alone.tobytes()


def test_the_team_driver_compiles_at_build_not_in_a_timed_run():
    """Building a quantized model compiles igemm's team driver for its output types (a fresh process, an input
    shape known only at run: nothing ran it): compiled in the first run instead, it lost the core's timing to
    numpy's kernel (attention's QLinearMatMul ran 176 us where igemm takes 103)."""
    import subprocess
    import sys

    _needs_team_and_vnni()
    script = """
import numpy as np
from onnx import TensorProto, helper, numpy_helper
import minfer_core
from minfer_ops_numba import igemm
inits = [numpy_helper.from_array(np.array(v, t), n) for n, v, t in (("sa", 0.02, np.float32), ("za", 128, np.uint8),
         ("sb", 0.03, np.float32), ("zb", 120, np.uint8), ("sy", 0.5, np.float32), ("zy", 100, np.uint8))]
node = helper.make_node("QLinearMatMul", ["a", "sa", "za", "b", "sb", "zb", "sy", "zy"], ["y"])
graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.UINT8, ["n", 128, 64]),
                          helper.make_tensor_value_info("b", TensorProto.UINT8, ["n", 64, 128])],
                          [helper.make_tensor_value_info("y", TensorProto.UINT8, None)], inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
model.ir_version = 8
minfer_core.InferenceSession(model, threads=2)
print(sorted(str(sig[9].dtype) for sig in igemm._on_team.signatures))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "uint8" in done.stdout.strip().splitlines()[-1], done.stdout


@pytest.mark.parametrize("per_channel", [False, True], ids=["inner-runs", "channels"])
def test_rounding_of_a_whole_output_on_a_team_is_one_threads_result_bit_for_bit(monkeypatch, per_channel):
    """The compiled QuantizeDequantize on a whole output (DequantConv's rounding, * M, + A and the second rounding
    after its units), in place as the epilogue calls it, shares its channels or its one run over a native team:
    the values of one thread, bit for bit."""
    from minfer_core import KernelContext, TensorType
    from minfer_ops_numba import quant

    if not team.available():
        pytest.skip("no native team here (MINFER_NUMBA_TEAM=0, or numba's threading layer is not OpenMP/TBB)")
    rng = np.random.default_rng(13)
    shape = (1, 48, 40, 41)
    assert np.prod(shape) >= quant.TEAM_VALUES
    operand = (1, shape[1], 1, 1) if per_channel else (1,)
    types = (TensorType(np.float32, shape), TensorType(np.float32, operand), TensorType(np.float32, operand))
    ctx = KernelContext("q", "QuantizeDequantize", 1, types, types[:1], (None,) * 3, 1)
    attrs = {"scale": 0.0401, "low": -128.0, "high": 127.0, "post_scale": 0.0365, "post_low": 0.0,
             "post_high": 255.0}
    fn = quant.quantize_dequantize.prepared(ctx, attrs)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    x.reshape(-1)[:3] = [np.nan, -0.0, 1e9]
    m, a = rng.uniform(0.5, 2, operand).astype(np.float32), rng.uniform(-1, 1, operand).astype(np.float32)
    alone = x.copy()
    fn(alone, m, a, out=alone)
    calls = _counted(monkeypatch, quant, "_qdq_team")
    got = x.copy()
    with using_threads(2):
        fn(got, m, a, out=got)
    assert calls == [1] and np.unique(alone).size > 20
    assert got.tobytes() == alone.tobytes()


@pytest.mark.parametrize("per_axis", [False, True], ids=["per-tensor", "per-channel"])
def test_dequantizing_a_large_weight_on_a_team_is_one_threads_result_bit_for_bit(monkeypatch, per_axis):
    """The compiled DequantizeLinear of a large weight (what DequantGemm and DequantConv run each run) shares its
    channels, or its one run, over a native team: one thread's values, bit for bit."""
    from minfer_core import KernelContext, TensorType
    from minfer_ops_numba import dequantize

    if not team.available():
        pytest.skip("no native team here (MINFER_NUMBA_TEAM=0, or numba's threading layer is not OpenMP/TBB)")
    rng = np.random.default_rng(14)
    x = _random(rng, np.int8, (300, 256))
    assert x.size >= dequantize.TEAM_VALUES
    scale = rng.uniform(0.001, 0.01, 300 if per_axis else 1).astype(np.float32).reshape(-1 if per_axis else ())
    zero = _random(rng, np.int8, scale.shape)
    types = tuple(TensorType(v.dtype, v.shape) for v in (x, scale, zero))
    ctx = KernelContext("d", "DequantizeLinear", 13, types, (TensorType(np.float32, x.shape),), (None,) * 3, 1)
    fn = dequantize.dequantize_linear_13.prepared(ctx, {"axis": 0})
    alone = fn(x, scale, zero, out=np.empty(x.shape, np.float32))
    calls = _counted(monkeypatch, dequantize, "_dequantize_team")
    with using_threads(2):
        got = fn(x, scale, zero, out=np.empty(x.shape, np.float32))
    assert calls == [1] and np.unique(alone).size > 20
    assert got.tobytes() == alone.tobytes()


def test_quantizing_a_large_input_on_a_team_is_one_threads_result(monkeypatch):
    """A quantized conv's float input quantized to 8 bits over a native team (its product runs there next): one
    thread's bytes, and the same count of NaN inputs."""
    from minfer_ops_numba import qconv_gemm

    if not team.available():
        pytest.skip("no native team here (MINFER_NUMBA_TEAM=0, or numba's threading layer is not OpenMP/TBB)")
    rng = np.random.default_rng(15)
    x = (rng.standard_normal((1, 32, 60, 70)) * 3).astype(np.float32)
    assert x.size >= qconv_gemm.TEAM_QUANTIZE
    x.reshape(-1)[[5, 70000, 100000]] = np.nan
    steps = (np.float32(0.03), np.float32(-128 - 3), np.float32(127 - 3))
    qconv_gemm.compile_for(np.dtype(np.int8))
    alone, bad = qconv_gemm.quantized(x, steps, np.dtype(np.int8), 3)
    alone = alone.copy()  # thread scratch: the next call on this thread writes it again
    qconv_gemm.quantized(np.full_like(x, 2.0), steps, np.dtype(np.int8), 3)  # other bytes in that scratch now
    calls = _counted(monkeypatch, qconv_gemm, "_quantize_team")
    with using_threads(2):
        got, bad_team = qconv_gemm.quantized(x, steps, np.dtype(np.int8), 3)
    assert calls == [1] and bad == bad_team == 3 and np.unique(alone).size > 20
    assert got.tobytes() == alone.tobytes()


def test_a_dynamic_input_is_ranged_and_centered_on_the_team(monkeypatch):
    """A dynamic ScaledConvInteger's input of TEAM_RANGE values or more: its range and grid (dynamic_quant.py's
    `dynamic_grid`) and its centering into the product's operand (qconv_blas.py) each shared by the team, one call
    a run; the output the bytes of the same kernel on one thread and with no team."""
    from minfer_core import KernelContext, TensorType
    from minfer_ops_numba import dynamic_quant, qconv_blas

    if not team.available() or not team.gemm_address():
        pytest.skip("no native team here, or numpy's BLAS is not callable from compiled code (the kernel declines)")
    rng = np.random.default_rng(16)
    m, c, hw = 48, 16, (64, 70)
    x = (rng.standard_normal((1, c) + hw) * 3).astype(np.float32)
    x[0, 11, 40:] -= 9  # the minimum in the second half: the fold of the parts must find it
    assert x.size >= max(dynamic_quant.TEAM_RANGE, qconv_blas.TEAM_CENTER)
    inputs = [x, _random(rng, np.int8, (m, c, 1, 1)), None, np.array(2, np.int8), np.array([0.0007], np.float32)]
    attrs = dict(dynamic_input=1, activation="Relu")
    types = tuple(None if v is None else TensorType(v.dtype, v.shape) for v in inputs)
    consts = tuple(v if i in (1, 3, 4) else None for i, v in enumerate(inputs))  # as a model's
    ctx = KernelContext("n", "ScaledConvInteger", 1, types, (TensorType(np.float32, (1, m) + hw),), consts, 1)
    assert qconv_blas.scaled_conv_integer_blas.applies(ctx, attrs)
    kernel_run = qconv_blas.scaled_conv_integer_blas.fn(ctx, **attrs)
    args = [None if i in (1, 3, 4) else v for i, v in enumerate(inputs)]
    alone = kernel_run(*args)
    kernel_run(x[:, ::-1].copy(), *args[1:])  # other values in the thread's centering scratch now
    ranges = _counted(monkeypatch, dynamic_quant, "_grid_team")  # the range and its grid, one compiled call
    centers = _counted(monkeypatch, qconv_blas, "_center_team")
    with using_threads(2):
        got = kernel_run(*args)
    assert ranges == [1] and centers == [1]
    _team_off(monkeypatch)
    with using_threads(2):
        pooled = kernel_run(*args)
    assert ranges == [1] and centers == [1]  # no team: one thread's passes
    assert np.unique(got).size > 20 and got.tobytes() == pooled.tobytes() == alone.tobytes()
