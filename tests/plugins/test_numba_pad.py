"""minfer-ops-numba's Pad (pad.py): minfer-ops-basic's bytes in every mode, wide reflections and wraps, axes, the
planned buffer; and the nodes it leaves to numpy."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import KernelContext, TensorType  # noqa: E402
from minfer_ops_basic import pad as basic  # noqa: E402
from minfer_ops_numba import pad  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


def _ctx(x, pads, value=None, axes=None, opset=18):
    inputs = [x, pads, value, axes]
    while inputs and inputs[-1] is None:
        inputs.pop()
    types = tuple(None if v is None else TensorType(v.dtype, v.shape) for v in inputs)
    return KernelContext("pad", "Pad", opset, types, (None,), (None, *inputs[1:]), 1)


CASES = [  # shape, pads, axes, value
    ((1, 48, 16, 32), [0, 0, 0, 1, 0, 0, 0, 1], None, None),  # the OCR recognizer's reflect Pad
    ((2, 3, 5, 7), [0, 1, 2, 3, 0, 2, 1, 4], None, np.float32(-1.5)),  # every side, channels too
    ((3, 4), [3, 5, 2, 6], None, np.float32(2.0)),  # wider than the axes: repeated reflections and wraps
    ((2, 3, 4), [1, 2, 0, 3], [-1, 0], None),  # axes, one negative
    ((5,), [0, 0], None, None),  # nothing to pad
    ((1, 1, 1, 1), [1, 1, 1, 1, 1, 1, 1, 1], None, np.float32(7.0)),  # one value: edge and wrap repeat it
    ((2, 0, 3), [0, 1, 0, 0, 1, 2], None, np.float32(3.0)),  # an empty axis padded (constant only)
]


@pytest.mark.parametrize("mode", ["constant", "reflect", "edge", "wrap"])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_pad_is_minfer_ops_basics_bytes(mode, case):
    """Each mode and case: the bytes of minfer-ops-basic's Pad-18 (NaN and -0.0 copied as they are), into a fresh
    array and into the planned buffer; a second input shape through the same node."""
    shape, pads, axes, value = CASES[case]
    rng = np.random.default_rng(case)
    x = rng.standard_normal(shape).astype(np.float32)
    if x.size > 3:
        x.reshape(-1)[[0, 3]] = (np.nan, -0.0)
    pads = np.asarray(pads, np.int64)
    axes = None if axes is None else np.asarray(axes, np.int64)
    value_arr = None if value is None else np.asarray(value, np.float32)
    ctx = _ctx(x, pads, value_arr, axes, opset=19)
    attrs = {"mode": mode}
    if mode != "constant" and 0 in shape:
        with pytest.raises(ValueError):
            basic.pad_18.fn(x, pads, value_arr, axes, mode=mode)
        return
    assert pad.pad_18.applies(ctx, attrs)
    run = pad.pad_18.prepared(ctx, attrs)
    want = basic.pad_18.fn(x, pads, value_arr, axes, mode=mode)
    got = run(x, pads, value_arr, axes)
    assert got.dtype == np.float32 and got.shape == want.shape and got.tobytes() == want.tobytes()
    out = np.full(want.shape, 99.0, np.float32)
    assert run(x, pads, value_arr, axes, out=out) is out and out.tobytes() == want.tobytes()
    if x.ndim > 1 and x.size:  # another shape through the same node (its maps made again)
        x2 = rng.standard_normal((x.shape[0] + 1,) + x.shape[1:]).astype(np.float32)
        want2 = basic.pad_18.fn(x2, pads, value_arr, axes, mode=mode)
        assert run(x2, pads, value_arr, axes).tobytes() == want2.tobytes()
    assert x.size < 10 or np.unique(want).size > 10


def test_pad_11_of_a_view_is_numpys():
    """Pad-11 of a non-contiguous input (a transposed view) pads the values, not the memory's order."""
    x = np.arange(2 * 3 * 4, dtype=np.float32).reshape(2, 3, 4).transpose(2, 0, 1)
    pads = np.asarray([1, 0, 2, 0, 1, 1], np.int64)
    ctx = _ctx(x, pads, opset=13)
    run = pad.pad_11.prepared(ctx, {"mode": "reflect"})
    assert run(x, pads).tobytes() == basic.pad_11.fn(x, pads, mode="reflect").tobytes()


def test_pad_leaves_to_numpy_what_it_does_not_copy():
    """No float32 data, a negative pad (a crop), pads or a constant value computed at run, wrap before Pad-19, an
    unknown mode: minfer-ops-basic's kernel keeps the node."""
    x = np.zeros((2, 3), np.float32)
    pads = np.asarray([1, 0, 1, 0], np.int64)
    assert pad.pad_18.applies(_ctx(x, pads), {"mode": "reflect"})
    assert not pad.pad_18.applies(_ctx(x.astype(np.int64), pads), {})
    assert not pad.pad_18.applies(_ctx(x, np.asarray([1, -1, 0, 0], np.int64)), {})
    assert not pad.pad_18.applies(_ctx(x, np.asarray([1, 0, 1], np.int64)), {})
    runtime = KernelContext("pad", "Pad", 18, (TensorType(np.float32, (2, 3)), TensorType(np.int64, (4,))), (None,),
                            (None, None), 1)
    assert not pad.pad_18.applies(runtime, {})
    value_at_run = KernelContext("pad", "Pad", 18, (TensorType(np.float32, (2, 3)), TensorType(np.int64, (4,)),
                                                    TensorType(np.float32, ())), (None,), (None, pads, None), 1)
    assert not pad.pad_18.applies(value_at_run, {})
    assert not pad.pad_18.applies(_ctx(x, pads), {"mode": "wrap"})  # opset 18
    assert pad.pad_18.applies(_ctx(x, pads, opset=19), {"mode": "wrap"})
    assert not pad.pad_18.applies(_ctx(x, pads), {"mode": "mirror"})
