"""Entry point of minfer-ops-conv: registers its ops and kernels through the public hooks."""

from __future__ import annotations

from minfer_core import hookimpl, kernels_in

from . import conv, conv_transpose, deform, fastinfer, norm, pool, qlinear, quant, resize, roi, spatial

MODULES = (conv, conv_transpose, deform, pool, norm, quant, qlinear, resize, roi, spatial)
KERNELS = kernels_in(*MODULES)  # found, not hand-kept


@hookimpl
def register_ops(register):
    # the ops claimed are those this plugin has kernels for (minfer_provides.json declares the same list)
    register(fastinfer.claim(sorted({k.op_type for k in KERNELS if k.domain == ""})))  # Conv and the pools: with a fast infer=
    register(*qlinear.OPS)  # onnxruntime's com.microsoft ops: not in onnx.defs, so declared with their inference


@hookimpl
def register_kernels(register):
    register(*MODULES)  # every @kernel record the modules define
