"""Entry point of minfer-ops-numba: registers its kernels, above the numpy ones, through the public hooks.

It claims no op (``onnx_op``): minfer-ops-conv and minfer-ops-basic do, and
without them these kernels would have nothing to override. Each kernel says
through ``applies`` which nodes it computes (a depthwise Conv, a float32
pool); the numpy kernels keep every other node.
"""

from __future__ import annotations

from minfer_core import hookimpl, kernels_in

from . import (activation, affine, channels, depthwise, dequantize, dynamic_quant, elementwise, fewchannels, gelu,
               linear, liveconv, lookup, pool, qconv, qlinear_binary, qlinear_softmax, qmatmul, quant, resize, rows,
               smallconv, upsample, winograd)
from . import (binary, dequant_linear, depthwise_blocked, masked_softmax, pad, pointwise, qconv_blas, qdepthwise,
               quantize, reduce, squeeze, unary)

# a new module of kernels joins this tuple (and its ops, if it declares any, a register_ops hook)
MODULES = (depthwise, channels, smallconv, fewchannels, pool, activation, resize, quant, elementwise, gelu, affine,
           dynamic_quant, rows, lookup, dequantize, qlinear_binary, qlinear_softmax, qmatmul, qconv, linear, winograd,
           upsample, liveconv, depthwise_blocked, unary, masked_softmax, qdepthwise, qconv_blas, quantize,
           dequant_linear, pointwise, squeeze, pad, reduce, binary)
KERNELS = kernels_in(*MODULES)  # found, not hand-kept


@hookimpl
def register_kernels(register):
    register(*MODULES)  # every @kernel record the modules define
