"""Entry point of minfer-ops-conv: registers its ops and kernels through the public hooks."""

from __future__ import annotations

from minfer_core import hookimpl, onnx_op

from . import conv, conv_transpose, deform, norm, pool, resize, roi, spatial

MODULES = (conv, conv_transpose, deform, pool, norm, resize, roi, spatial)
KERNELS = [k for module in MODULES for k in module.KERNELS]


@hookimpl
def register_ops(register):
    register(onnx_op(*sorted({k.op_type for k in KERNELS})))


@hookimpl
def register_kernels(register):
    register(KERNELS)
