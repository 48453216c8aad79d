"""An in-test plugin whose kernels use the planner declarations (``out=``, ``inplace``, ``views``).

Ops live in their own domain so they never collide with the first-party
plugins. Every ``out=`` each kernel receives is recorded, so tests can check
buffer identity across runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from onnx import helper

from minfer_core import hookimpl, kernel, op

DOMAIN = "test.runtime"
SEEN_OUT: list[tuple[str, int]] = []  # (node name, id of the out buffer) per call


def _record(ctx_name: str, out: Any) -> None:
    if out is not None:
        SEEN_OUT.append((ctx_name, id(out)))


@kernel("AddOut", domain=DOMAIN, prepare=True, out=True, inplace=(0, 1))
def add_out(ctx):
    """AddOut: a + b, written into ``out`` when given."""
    name = ctx.node_name

    def run(a, b, out=None):
        _record(name, out)
        return np.add(a, b, out=out)

    return run


@kernel("ReluOut", domain=DOMAIN, prepare=True, out=True, inplace=(0,))
def relu_out(ctx):
    """ReluOut: max(x, 0), written into ``out`` (possibly x itself) when given."""
    name = ctx.node_name

    def run(x, out=None):
        _record(name, out)
        return np.maximum(x, 0, out=out)

    return run


@kernel("Twice", domain=DOMAIN)
def twice(x):
    """Twice: 2x in a fresh array (no ``out=``)."""
    return x * 2


@kernel("Flat", domain=DOMAIN)
def flat(x):
    """Flat: a zero-copy view of x as 1-D (undeclared: the engine must notice)."""
    return x.reshape(-1)


@kernel("ScaleBy", domain=DOMAIN, prepare=True, packed=(1,))
def scale_by(ctx):
    """ScaleBy: x * w with the constant w copied at build time (so the engine may free the original)."""
    w = np.array(ctx.constants[1], copy=True)

    def run(x, _w=None):
        return x * w  # _w: None once the engine freed the original, else the same constant

    return run


def _flat_infer(t, **_):
    from minfer_core import TensorType

    if t is None or not t.is_static:
        return [None]
    return [TensorType(t.dtype, (int(np.prod(t.shape)),))]


class OutPlugin:
    """Registers the ops and kernels above."""

    @hookimpl
    def register_ops(self, register):
        register(op("AddOut", domain=DOMAIN), op("ReluOut", domain=DOMAIN), op("Twice", domain=DOMAIN))
        register(op("Flat", domain=DOMAIN, infer=_flat_infer), op("ScaleBy", domain=DOMAIN))

    @hookimpl
    def register_kernels(self, register):
        register(add_out, relu_out, twice, flat, scale_by)


def node(op_type: str, inputs: list[str], outputs: list[str], name: str) -> Any:
    return helper.make_node(op_type, inputs, outputs, name=name, domain=DOMAIN)


def opset() -> Any:
    return helper.make_opsetid(DOMAIN, 1)
