"""Tensor and TensorType: typed arrays, symbolic dims, zero-copy views."""

from __future__ import annotations

import numpy as np
import pytest

from minfer_core import Tensor, TensorType


def test_view_shares_memory_with_its_source():
    """Tensor.view reshapes without copying."""
    t = Tensor(np.arange(6, dtype=np.float32))
    v = t.view((2, 3))
    assert np.shares_memory(v.data, t.data)
    assert v.type == TensorType(np.float32, (2, 3))


def test_view_refuses_to_copy_silently():
    """A view that would need a copy (non-contiguous source) raises instead of copying."""
    with pytest.raises(AttributeError):
        Tensor(np.arange(6.0).reshape(2, 3).T).view((6,))


def test_tensor_type_keeps_symbolic_dims_and_knows_when_static():
    """Symbolic dims stay names; only all-int shapes are static and have a size in bytes."""
    dynamic = TensorType("float32", ("batch", 3))
    assert dynamic.shape == ("batch", 3) and not dynamic.is_static and dynamic.nbytes is None
    static = TensorType(np.float16, (2, 3))
    assert static.is_static and static.nbytes == 12 and str(static) == "float16[2x3]"
