"""Entry point of minfer-ops-basic: registers its ops and kernels through the public hooks."""

from __future__ import annotations

from minfer_core import hookimpl, kernels_in, onnx_op

from . import activation, cast, detection, elementwise, generate, indexing, linalg, logic, nn, pad, random, recurrent, reduce, shape, signal, strings

MODULES = (elementwise, activation, reduce, logic, cast, linalg, nn, recurrent, shape, indexing, generate, pad, signal, detection, random, strings)
KERNELS = kernels_in(*MODULES)  # found, not hand-kept


@hookimpl
def register_ops(register):
    # the ops claimed are those this plugin has kernels for (minfer_provides.json declares the same list)
    register(onnx_op(*sorted({k.op_type for k in KERNELS})))


@hookimpl
def register_kernels(register):
    register(*MODULES)  # every @kernel record the modules define
