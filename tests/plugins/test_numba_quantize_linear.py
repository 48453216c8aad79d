"""minfer-ops-numba's QuantizeLinear (float32 into 8 bits, per tensor) gives minfer-ops-basic's bytes, NaN included."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import KernelContext, TensorType, get_registry  # noqa: E402
from minfer_ops_basic import cast  # noqa: E402
from minfer_ops_numba import quantize  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


def _ctx(x, scale, zp, constants=True, out_dtype=None):
    types = (TensorType(x.dtype, x.shape), TensorType(scale.dtype, scale.shape),
             None if zp is None else TensorType(zp.dtype, zp.shape))
    out = TensorType(out_dtype or (np.uint8 if zp is None else zp.dtype), x.shape)
    consts = (None, scale, zp) if constants else (None, None, None)
    return KernelContext("q", "QuantizeLinear", 13, types, (out,), consts, 1)


def _inputs():
    rng = np.random.default_rng(5)
    yield rng.standard_normal((2, 3, 17, 19)).astype(np.float32) * 5
    yield (np.arange(-300, 300, dtype=np.float32) + 0.5) * np.float32(0.02)  # many ties: half to even
    yield np.array([-1e30, 1e30, -np.inf, np.inf, -0.0, 0.0, 1e-30], np.float32)  # saturation both ways
    yield rng.standard_normal((128, 256)).astype(np.float32)


PARAMS = [(np.float32(0.02), np.int8(0)), (np.float32(0.013), np.int8(-7)), (np.float32(0.05), np.uint8(128)),
          (np.float32(0.007), np.uint8(3)), (np.float32(0.1), None)]


@pytest.mark.parametrize("constants", [True, False], ids=["constant", "computed"])
@pytest.mark.parametrize("param", PARAMS, ids=["int8", "int8-zp", "uint8", "uint8-zp", "no-zp"])
def test_same_bytes_as_minfer_ops_basic(param, constants):
    """Every input, each type and zero point, scale and zero point constant or given at run: numpy's bytes."""
    scale, zp = np.asarray(param[0]), None if param[1] is None else np.asarray(param[1])
    for x in _inputs():
        run = quantize.quantize_linear_13.prepared(_ctx(x, scale, zp, constants), {})
        got, want = run(x, scale, zp), cast.quantize_linear_13.fn(x, scale, zp)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_nan_takes_the_numpy_formula():
    """A tensor holding NaN is quantized again by numpy's steps, so its NaN gets the byte numpy's cast gives."""
    x = np.array([1.0, np.nan, -2.0, 300.0], np.float32)
    scale, zp = np.asarray(np.float32(0.5)), np.asarray(np.int8(1))
    run = quantize.quantize_linear_13.prepared(_ctx(x, scale, zp), {})
    with np.errstate(invalid="ignore"):
        want = cast.quantize_linear_13.fn(x, scale, zp)
    np.testing.assert_array_equal(run(x, scale, zp), want)
    assert run(x, scale, zp)[3] == 127  # the values around it were quantized too


def test_an_empty_tensor_and_a_scalar():
    scale, zp = np.asarray(np.float32(0.5)), np.asarray(np.uint8(10))
    for x in (np.zeros((0, 3), np.float32), np.asarray(np.float32(2.25))):
        run = quantize.quantize_linear_13.prepared(_ctx(x, scale, zp), {})
        got = run(x, scale, zp)
        assert got.shape == x.shape and got.dtype == np.uint8
        np.testing.assert_array_equal(got, cast.quantize_linear_13.fn(x, scale, zp))


def test_applies_per_tensor_8_bit_only_and_is_timed_against_numpy():
    """A per-tensor float32 node offers the compiled kernel and numpy's; per-axis scales, float16 inputs, 16-bit
    outputs and blocks keep numpy's alone."""
    x, s, z = np.zeros((4, 8), np.float32), np.asarray(np.float32(0.1)), np.asarray(np.int8(0))
    found = get_registry().kernel_candidates("", "QuantizeLinear", 13, "numpy", _ctx(x, s, z), {})
    assert [k.fn for k in found] == [quantize.quantize_linear_13.fn, cast.quantize_linear_13.fn]
    assert not quantize.quantize_linear_13.applies(_ctx(x, np.full(8, 0.1, np.float32), np.zeros(8, np.int8)), {})
    assert not quantize.quantize_linear_13.applies(_ctx(x.astype(np.float16), s, z), {})
    assert not quantize.quantize_linear_13.applies(_ctx(x, s, np.asarray(np.int16(0))), {})
    assert not quantize.quantize_linear_21.applies(_ctx(x, s, z), {"block_size": 4})
