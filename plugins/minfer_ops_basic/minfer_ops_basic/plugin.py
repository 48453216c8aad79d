"""Entry point of minfer-ops-basic: registers its ops and kernels through the public hooks."""

from __future__ import annotations

from minfer_core import hookimpl, kernels_in

from . import activation, cast, control, detection, elementwise, generate, image, indexing, linalg, linear_attention, logic, nn, pad, random, recurrent, reduce, sequences, shape, signal, strings, training
from . import fastinfer, qmatmul

MODULES = (elementwise, activation, reduce, logic, cast, linalg, nn, recurrent, shape, indexing, generate, pad, signal, detection, random, strings,
           linear_attention, training, image, sequences, control)
KERNELS = kernels_in(*MODULES)  # found, not hand-kept
# modules of ai.minfer ops (each declared by its OpDef in OPS, not claimed as a standard op) and their kernels
OWN_OPS = (qmatmul,)


@hookimpl
def register_ops(register):
    # the ops claimed are those this plugin has kernels for, each in its kernel's domain (the training
    # optimizers live in ai.onnx.preview.training); minfer_provides.json declares the same list. Elementwise
    # ops, Transpose, MatMul and Gemm bring a fast infer= for a new input shape's run (fastinfer.py)
    domains = sorted({k.domain for k in KERNELS})
    register([fastinfer.claim(sorted({k.op_type for k in KERNELS if k.domain == d}), d) for d in domains], *(m.OPS for m in OWN_OPS))


@hookimpl
def register_kernels(register):
    register(*MODULES, *OWN_OPS)  # every @kernel record the modules define
