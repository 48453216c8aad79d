"""An importable plugin module used by the plugin-loading tests."""

from __future__ import annotations

import numpy as np

from minfer_core import hookimpl, kernel, op


@kernel("Twice", domain="test.fixture")
def twice(x):
    """Twice-1: 2 * x."""
    return x * np.asarray(2, x.dtype)


@hookimpl
def register_ops(register):
    register(op("Twice", domain="test.fixture"))


@hookimpl
def register_kernels(register):
    register(twice)
