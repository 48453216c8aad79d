"""minfer-ops-numba's Add of two float32 tensors of one shape (binary.py): np.add's bytes on one thread and over a
native team, into the planned buffer; broadcasting and other types left to numpy."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("numba", reason="minfer-ops-numba needs numba (pip install minfer-ops-numba)")

from minfer_core import KernelContext, TensorType  # noqa: E402
from minfer_core.parallel import using_threads  # noqa: E402
from minfer_ops_numba import binary, team  # noqa: E402

pytestmark = pytest.mark.usefixtures("numba_plugin")  # tests/plugins/conftest.py


def _ctx(a, b):
    return KernelContext("add", "Add", 14, (TensorType(a.dtype, a.shape), TensorType(b.dtype, b.shape)), (None,),
                         (None, None), 1)


@pytest.mark.parametrize("shape", [(1, 24, 56, 56), (3, 7), (5,), (0, 4), (2, 1 << 16)])
@pytest.mark.parametrize("threads", [1, 2], ids=["serial", "two-threads"])
def test_add_is_numpys_bytes(shape, threads, monkeypatch):
    """The sum's bytes are np.add's (NaN payloads, infinities, -0.0 + 0.0 too), whether one thread adds or a native
    team shares a large one; a strided input is added by value; the planned buffer is written."""
    rng = np.random.default_rng(len(shape))
    a = rng.standard_normal(shape).astype(np.float32)
    b = rng.standard_normal(shape).astype(np.float32)
    if a.size > 4:
        a.reshape(-1)[:4] = (np.float32(np.nan), np.inf, -0.0, -np.inf)
        b.reshape(-1)[:4] = (1.0, -np.inf, 0.0, 2.0)
        b.reshape(-1)[4] = np.frombuffer(np.uint32(0x7FC00123).tobytes(), np.float32)[0]  # a NaN with a payload
    run = binary.add.prepared(_ctx(a, b), {})
    calls = []
    real = binary._add_team
    monkeypatch.setattr(binary, "_add_team", lambda *args: calls.append(args[-1]) or real(*args))
    with using_threads(threads):
        got = run(a, b)
        out = np.full(shape, 7.0, np.float32)
        assert run(a, b, out=out) is out
    with np.errstate(invalid="ignore"):  # inf + -inf
        want = np.add(a, b)
    assert got.dtype == np.float32 and got.tobytes() == want.tobytes() and out.tobytes() == want.tobytes()
    on_team = threads > 1 and team.available() and a.size >= binary.TEAM_SPLIT
    assert calls == ([2, 2] if on_team else []), calls
    if a.ndim > 1 and a.size:
        strided = np.asfortranarray(a)
        assert run(strided, b).tobytes() == want.tobytes()


def test_add_leaves_broadcasting_and_other_types_to_numpy():
    """Broadcast shapes, unknown dims, other dtypes: the numpy kernel keeps the node; a run whose inputs differ in
    shape from the model's raises instead of broadcasting."""
    a = np.zeros((2, 3), np.float32)
    assert binary.add.applies(_ctx(a, a), {})
    assert not binary.add.applies(_ctx(a, np.zeros((1, 3), np.float32)), {})
    assert not binary.add.applies(_ctx(a, np.zeros((2, 3), np.float64)), {})
    assert not binary.add.applies(_ctx(a.astype(np.int64), a.astype(np.int64)), {})
    dynamic = KernelContext("add", "Add", 14, (TensorType(np.float32, ("n", 3)), TensorType(np.float32, ("n", 3))),
                            (None,), (None, None), 1)
    assert not binary.add.applies(dynamic, {})
    run = binary.add.prepared(_ctx(a, a), {})
    with pytest.raises(ValueError, match="differ"):
        run(a, np.zeros((1, 3), np.float32))
