"""An example third-party minfer plugin: ``com.example::ScaledTanh``, y = alpha * tanh(beta * x)."""

import numpy as np

from minfer_core import hookimpl, kernel, op


@kernel("ScaledTanh", domain="com.example")
def scaled_tanh(x, *, alpha=1.0, beta=1.0):
    """ScaledTanh-1: alpha * tanh(beta * x)."""
    return (alpha * np.tanh(beta * x)).astype(x.dtype, copy=False)


@hookimpl
def register_ops(register):
    register(op("ScaledTanh", domain="com.example"))  # output type = input type


@hookimpl
def register_kernels(register):
    register(scaled_tanh)


@hookimpl
def register_passes(register):
    from .passes import PASS

    register(PASS)
