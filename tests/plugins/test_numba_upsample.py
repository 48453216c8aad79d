"""minfer-ops-numba's ConvTranspose for kernel == strides (upsample.py): against onnxruntime, its team path against
its parallel_for path, and where it applies."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("numba")

from minfer_core import KernelContext, TensorType, get_registry  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_ops_numba import team, upsample  # noqa: E402
from onnx import helper, numpy_helper  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from modelkit import make_model, ort_run, tensor  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py

CASES = [  # (N, C, H, W), M, (kh, kw), bias: the OCR detector's two heads, batches, rectangular and 3x3 kernels
    ((1, 24, 80, 80), 24, (2, 2), True),
    ((1, 24, 160, 160), 1, (2, 2), True),
    ((2, 8, 7, 9), 5, (2, 2), False),
    ((3, 4, 5, 6), 3, (2, 3), True),
    ((1, 6, 4, 4), 2, (3, 3), True),
]


def case(xs, m, k, bias, seed=0):
    rng = np.random.default_rng(seed + sum(xs))
    x = rng.standard_normal(xs, dtype=np.float32)
    w = rng.standard_normal((xs[1], m) + k, dtype=np.float32)
    return x, w, rng.standard_normal(m, dtype=np.float32) if bias else None


def context(x, w, b):
    inputs = [x, w] + ([] if b is None else [b])
    types = tuple(TensorType(a.dtype, a.shape) for a in inputs)
    return KernelContext("node", "ConvTranspose", 22, types, (None,), (None, *inputs[1:]), 1)


def prepared(x, w, b, attrs):
    if not team.gemm_address():
        pytest.skip("numpy's BLAS has no cblas_sgemm callable from compiled code here")
    ctx = context(x, w, b)
    assert upsample.applies(ctx, attrs)
    return upsample.conv_transpose.prepared(ctx, attrs)


def onnxruntime_conv_transpose(x, w, b, attrs):
    inits = [numpy_helper.from_array(w, "w")] + ([] if b is None else [numpy_helper.from_array(b, "b")])
    node = helper.make_node("ConvTranspose", ["x", "w"] + ([] if b is None else ["b"]), ["y"], **attrs)
    model = make_model([node], [tensor("x", list(x.shape))], [tensor("y", None)], inits)
    return ort_run(model, {"x": x})[0]


@pytest.mark.parametrize("xs, m, k, bias", CASES)
def test_matches_onnxruntime_on_one_thread_and_two(xs, m, k, bias):
    """Each input pixel's kh x kw block, the bias added, as onnxruntime computes the ConvTranspose; on one thread
    and on two."""
    x, w, b = case(xs, m, k, bias)
    attrs = {"kernel_shape": list(k), "strides": list(k)}
    run = prepared(x, w, b, attrs)
    want = onnxruntime_conv_transpose(x, w, b, attrs)
    for threads in (1, 2):
        with using_threads(threads):
            np.testing.assert_allclose(run(x), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("xs, m, k, bias", CASES[:3])
def test_team_path_gives_the_parallel_for_bits(monkeypatch, xs, m, k, bias):
    """Over a native team the kernel gives the bits of its parallel_for path (bands from the shape alone)."""
    if not team.available():
        pytest.skip("no native team here: numba's threading layer is not OpenMP or TBB, or MINFER_NUMBA_TEAM=0")
    x, w, b = case(xs, m, k, bias)
    run = prepared(x, w, b, {"kernel_shape": list(k), "strides": list(k)})
    calls: list[int] = []
    real = upsample.team_units
    monkeypatch.setattr(upsample, "team_units", lambda *args: calls.append(1) or real(*args))
    with using_threads(2):
        got = run(x)
        assert calls, "the team driver never ran"
        monkeypatch.setattr(team, "size", lambda: 1)
        np.testing.assert_array_equal(got, run(x))


def test_applies_only_where_the_kernel_equals_the_strides():
    """It takes group-1 float32 ConvTransposes whose kernel equals the strides, without pads, dilations, output
    padding or output shape, constant weights; every other ConvTranspose goes to another kernel."""
    x, w, b = case((1, 4, 5, 5), 3, (2, 2), True)
    if not team.gemm_address():
        pytest.skip("numpy's BLAS has no cblas_sgemm callable from compiled code here")
    assert upsample.applies(context(x, w, b), {"kernel_shape": [2, 2], "strides": [2, 2]})
    assert upsample.applies(context(x, w, None), {"strides": [2, 2], "auto_pad": "VALID"})
    refused = [{"strides": [1, 1]}, {"strides": [2, 2], "pads": [1, 1, 1, 1]}, {"strides": [2, 2], "group": 2},
               {"strides": [2, 2], "dilations": [2, 2]}, {"strides": [2, 2], "output_padding": [1, 1]},
               {"strides": [2, 2], "output_shape": [10, 10]}, {"strides": [2, 2], "auto_pad": "SAME_UPPER"}]
    for attrs in refused:
        assert not upsample.applies(context(x, w, b), attrs), attrs
        chosen = get_registry().select_kernel("", "ConvTranspose", 22, ctx=context(x, w, b), attrs=attrs)
        assert chosen is not None and chosen.fn is not upsample.conv_transpose.fn
