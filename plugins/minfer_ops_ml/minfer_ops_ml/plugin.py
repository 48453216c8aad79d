"""Entry point of minfer-ops-ml: registers the ai.onnx.ml ops it has kernels for, through the public hooks."""

from __future__ import annotations

from minfer_core import hookimpl, kernels_in, onnx_op

from . import encode, linear, maps, preprocess, svm, trees

MODULES = (preprocess, encode, linear, svm, trees, maps)
KERNELS = kernels_in(*MODULES)


@hookimpl
def register_ops(register):
    # onnx ships the ai.onnx.ml schemas, so these are standard ops of that domain
    register(onnx_op(*sorted({k.op_type for k in KERNELS}), domain="ai.onnx.ml"))


@hookimpl
def register_kernels(register):
    register(*MODULES)
