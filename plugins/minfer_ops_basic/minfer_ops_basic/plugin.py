"""Entry point of minfer-ops-basic: registers its ops and kernels through the public hooks."""

from __future__ import annotations

from minfer_core import hookimpl, kernels_in, onnx_op

from . import activation, cast, control, detection, elementwise, generate, image, indexing, linalg, linear_attention, logic, nn, pad, random, recurrent, reduce, sequences, shape, signal, strings, training
from . import qmatmul

MODULES = (elementwise, activation, reduce, logic, cast, linalg, nn, recurrent, shape, indexing, generate, pad, signal, detection, random, strings,
           linear_attention, training, image, sequences, control)
KERNELS = kernels_in(*MODULES)  # found, not hand-kept
# modules of ai.minfer ops (each declared by its OpDef in OPS, not claimed as a standard op) and their kernels
OWN_OPS = (qmatmul,)


@hookimpl
def register_ops(register):
    # the ops claimed are those this plugin has kernels for, each in its kernel's domain (the training
    # optimizers live in ai.onnx.preview.training); minfer_provides.json declares the same list
    domains = sorted({k.domain for k in KERNELS})
    register([onnx_op(*sorted({k.op_type for k in KERNELS if k.domain == d}), domain=d) for d in domains], *(m.OPS for m in OWN_OPS))


@hookimpl
def register_kernels(register):
    register(*MODULES, *OWN_OPS)  # every @kernel record the modules define
