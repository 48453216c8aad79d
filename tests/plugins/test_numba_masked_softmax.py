"""minfer-ops-numba's MaskedSoftmax (masked_softmax.py): scale, mask and Softmax in one compiled pass.

It gives the bits of minfer-passes' kernel running this plugin's Softmax (both candidates of the node), for every
mask shape that broadcasts into the scores, short rows and long, and fills and scores with inf and NaN.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

import minfer_core
from minfer_core import tuning

pytest.importorskip("numba")
from modelkit import make_model, tensor  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")


def _model(shape, mask_shape, op, fill):
    """The fused node alone, on scores of symbolic dims but the last (so that the node keeps both kernels: a node of
    one static shape drops the one not chosen) and a mask of the same symbols where it does not broadcast."""
    dims = [f"d{i}" for i in range(len(shape) - 1)] + [shape[-1]]
    attrs = {"op": op}
    if op:
        attrs["scalar"] = numpy_helper.from_array(np.asarray(0.125 if op == "Mul" else 8.0, np.float32))
    inputs, names = [tensor("x", dims)], ["x"]
    if mask_shape is not None:
        attrs["fill"] = numpy_helper.from_array(np.asarray(fill, np.float32))
        mine = [1 if d == 1 else dims[len(dims) - len(mask_shape) + i] for i, d in enumerate(mask_shape)]
        inputs.append(tensor("m", mine, TensorProto.BOOL))
        names.append("m")
    node = helper.make_node("MaskedSoftmax", names, ["y"], domain="ai.minfer", **attrs)
    return make_model([node], inputs, [tensor("y", dims)],
                      extra_opsets=[helper.make_opsetid("ai.minfer", 1)])


@pytest.mark.parametrize("shape,mask_shape", [((2, 4, 16, 128), (2, 1, 1, 128)), ((2, 4, 16, 128), (2, 4, 16, 128)),
                                              ((2, 3, 5, 8), (3, 1, 8)), ((2, 4, 6, 40), (2, 1, 6, 1)),
                                              ((2, 4, 16, 128), None), ((3, 7, 24), (24,))])
@pytest.mark.parametrize("op,fill", [("Mul", -1e9), ("Div", -np.inf), ("", 0.0)])
def test_one_pass_gives_minfer_passes_bits_over_this_plugins_softmax(monkeypatch, shape, mask_shape, op, fill):
    """The compiled kernel and minfer-passes' kernel give the same bits on the same scores and mask."""
    monkeypatch.setattr(tuning, "choose", lambda key, names, time_one, prior=None: 0)  # the first: numba's
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(shape) * 4).astype(np.float32)
    x.reshape(-1)[::997] = np.inf
    x.reshape(-1)[5::1999] = np.nan
    feeds = {"x": x}
    if mask_shape is not None:
        feeds["m"] = rng.random(mask_shape) < 0.3
    session = minfer_core.InferenceSession(_model(shape, mask_shape, op, fill), passes="none")
    (step,) = session.program.specs
    names = [name.split(":")[1] for name in step.fn.names]
    assert names == ["minfer_ops_numba.masked_softmax.masked_softmax", "minfer_passes.softmax.masked_softmax"]
    got = session.run(None, feeds)[0]
    ours, theirs = (np.array(fn(*feeds.values())) for fn in step.fn.fns)
    np.testing.assert_array_equal(ours, theirs)
    np.testing.assert_array_equal(got, ours)
    assert np.isfinite(ours).any()


def test_a_mask_that_would_grow_the_scores_is_refused():
    """The kernel only writes the scores' shape: a mask broadcasting them larger is an error, not a wrong result
    (applies refuses such masks when their shapes are known; this is the run's own check)."""
    from minfer_ops_numba.masked_softmax import masked_softmax
    from minfer_core import KernelContext, TensorType

    t = TensorType(np.float32, ("B", 4, 8))
    ctx = KernelContext("n", "MaskedSoftmax", 1, (t, TensorType(np.bool_, None)), (t,), (None, None), 1)
    run = masked_softmax.prepared(ctx, {"op": ""})
    with pytest.raises(ValueError, match="broadcast the scores"):
        run(np.zeros((1, 4, 8), np.float32), np.zeros((2, 4, 8), bool))
