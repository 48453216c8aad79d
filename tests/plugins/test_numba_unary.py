"""minfer-ops-numba's lone Sigmoid: FusedElementwise's compiled loop on a one-step program (unary.py)."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import InferenceSession, KernelContext, TensorType, get_registry  # noqa: E402
from minfer_ops_numba import unary  # noqa: E402
from modelkit import make_model, ort_run, tensor  # noqa: E402
from onnx import helper  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


def _ctx(x: np.ndarray, opset: int = 13) -> KernelContext:
    t = TensorType(x.dtype, x.shape)
    return KernelContext("node", "Sigmoid", opset, (t,), (t,), (None,), 1)


def _numpy(x: np.ndarray) -> np.ndarray:
    kern = next(k for k in get_registry().kernel_candidates("", "Sigmoid", 13, "numpy", _ctx(x))
                if k.plugin == "minfer-ops-basic")
    return kern.prepared(_ctx(x), {})(x)


@pytest.mark.parametrize("shape", [(1, 768, 1), (3, 7), (1, 8, 32, 32), (2, 3, 70000), (0, 4)])
def test_sigmoid_within_a_few_ulps_of_numpys_kernel(shape):
    """Over normal values, +-inf, NaN, +-0 and values where exp over- or underflows, the compiled Sigmoid agrees with
    numpy's kernel within a few float32 ulps where the result is a normal float (its exp is a polynomial within 3
    ulps of np.exp) and is below the smallest normal where numpy's is, into a new array, into out= and in place."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal(shape) * 20).astype(np.float32)
    flat = x.reshape(-1)
    flat[:8][: flat.size] = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, 104.0, -104.0, 89.0], np.float32)[: flat.size]
    want = _numpy(x)
    run = unary.sigmoid.prepared(_ctx(x), {})
    out = np.empty_like(x)
    inplace = x.copy()
    normal = np.abs(want) >= np.finfo(np.float32).tiny  # below it (x < -87) a result is subnormal or 0 in either
    for got in (run(x), run(x, out=out), run(inplace, out=inplace)):
        assert np.array_equal(np.isnan(got), np.isnan(want))
        assert np.abs(got[normal].view(np.int32).astype(np.int64) - want[normal].view(np.int32)).max(initial=0) <= 4
        assert np.all(np.abs(got[~normal & ~np.isnan(want)]) < np.finfo(np.float32).tiny)
    assert run(x, out=out) is out


def test_the_core_times_it_against_numpys_kernel_at_every_opset():
    """Registered from opset 6 like minfer-ops-basic's Sigmoid: both are candidates at opsets 6 and 13 (a newer
    since would hide numpy's from the timing); other dtypes are left to numpy."""
    x = np.zeros((1, 4), np.float32)
    for opset in (6, 13):
        plugins = {k.plugin for k in get_registry().kernel_candidates("", "Sigmoid", opset, "numpy", _ctx(x, opset))}
        assert plugins == {"minfer-ops-numba", "minfer-ops-basic"}
    assert not unary.sigmoid.applies(_ctx(x.astype(np.float64)), {})


def test_a_model_with_a_lone_sigmoid_matches_onnxruntime():
    """A Sigmoid no pass fuses (a detector's objectness head) gives onnxruntime's outputs with the numba kernel."""
    nodes = [helper.make_node("Sigmoid", ["x"], ["y"])]
    model = make_model(nodes, [tensor("x", [1, 768, 1])], [tensor("y", [1, 768, 1])])
    x = (np.random.default_rng(2).standard_normal((1, 768, 1)) * 8).astype(np.float32)
    session = InferenceSession(model, threads=1)
    assert session.program.specs[0].kernel.plugin == "minfer-ops-numba"
    np.testing.assert_allclose(session.run(None, {"x": x})[0], ort_run(model, {"x": x})[0], rtol=1e-6, atol=1e-7)
