"""Entry point of minfer-passes: registers its passes, and the fused ops and kernels they create.

Levels follow onnxruntime's: ``basic`` passes rewrite with standard ops
only (folding, elimination, weight folding); ``extended`` passes create
minfer's own ``ai.minfer`` ops (fused activations, scalar forms, weighted
sums); ``all`` adds layout rewrites that change which kernel runs.
"""

from __future__ import annotations

from typing import Any, Callable

from minfer_core import Pass, hookimpl

from . import (activation, affine, algebra, control_flow, elimination, fusion, folding, gelu, layout, ops, portable, residual,
               shapes, squeeze_excite)
from . import layernorm, linear, pad_fusion, reshape_dims, softmax
from . import elementwise, elementwise_kernel
from . import integer, integer_matmul, lookup, qdq, qdq_exact, qdq_matmul, qdq_ops
from ._util import fixpoint


def _pass(fn: Callable[..., bool], level: str, *, loop: bool = False, **kw: Any) -> Pass:
    name = fn.__name__
    doc = (fn.__doc__ or "").strip()
    # an import string: hypothesis is a test dependency, imported only when the property suite resolves it
    return Pass(name, fixpoint(fn) if loop else fn, level, doc=doc, patterns=f"minfer_passes.patterns:{name}", **kw)


TYPED = ("shape_inference",)

PASSES = [
    _pass(shapes.shape_inference, "basic"),
    _pass(folding.shape_folding, "basic", requires=TYPED, before=("constant_folding",)),
    _pass(folding.constant_folding, "basic", after=TYPED),
    _pass(elimination.identity_elimination, "basic", requires=TYPED, after=("constant_folding",), loop=True),
    # after folding (pads a Shape/Concat chain computes are constants then), before the passes that make the Conv
    # another node (FusedConv, Gemm) or fold into its weights
    Pass("pad_conv_fusion", pad_fusion.pad_conv_fusion, "basic", after=("constant_folding",),
         before=("conv_bn_fusion", "affine_fusion", "conv_residual_fusion", "activation_fusion", "channel_affine_fusion",
                 "global_conv_to_gemm"),
         doc=(pad_fusion.pad_conv_fusion.__doc__ or "").strip(), patterns="minfer_passes.pad_fusion:patterns"),
    _pass(fusion.conv_bn_fusion, "basic", after=("constant_folding", "identity_elimination"), rtol=1e-4, atol=1e-5),
    _pass(fusion.affine_fusion, "basic", requires=TYPED, after=("conv_bn_fusion",), loop=True, rtol=1e-4, atol=1e-5),
    _pass(fusion.matmul_add_to_gemm, "basic", requires=TYPED, after=("constant_folding",), rtol=1e-5, atol=1e-6),
    _pass(layout.transpose_merge, "basic", loop=True),
    _pass(layout.reshape_merge, "basic", after=("constant_folding",), loop=True),
    Pass("reshape_dim_copy", reshape_dims.reshape_dim_copy, "basic", requires=TYPED,
         after=("constant_folding", "shape_folding"), before=("dead_code_elimination",),
         doc=(reshape_dims.reshape_dim_copy.__doc__ or "").strip(), patterns="minfer_passes.reshape_dims:patterns"),
    _pass(elimination.dead_code_elimination, "basic", after=("constant_folding", "reshape_merge", "identity_elimination")),
    _pass(layout.global_conv_to_gemm, "all", requires=TYPED, before=("global_pool_flatten", "activation_fusion"),
          after=("affine_fusion",), rtol=1e-5, atol=1e-6),
    _pass(layout.global_pool_flatten, "all", requires=TYPED, rtol=1e-5, atol=1e-6),
    # before the scalar passes, which would take its Div/Add/Mul by constants apart first
    Pass("gelu_fusion", gelu.gelu_fusion, "extended", requires=TYPED, after=("constant_folding",),
         before=("scalar_binary", "weighted_sum_fusion"), rtol=1e-5, atol=1e-6,
         doc=(gelu.gelu_fusion.__doc__ or "").strip(), patterns="minfer_passes.gelu:patterns"),
    # after gelu_fusion (its Gelu becomes the activation), before the passes that would take its Adds apart
    Pass("matmul_bias_fusion", linear.matmul_bias_fusion, "extended", requires=TYPED,
         after=("constant_folding", "identity_elimination", "matmul_add_to_gemm", "gelu_fusion", "reshape_dim_copy"),
         before=("elementwise_fusion", "scalar_binary", "weighted_sum_fusion", "activation_fusion"), rtol=1e-5, atol=1e-6,
         doc=(linear.matmul_bias_fusion.__doc__ or "").strip(), patterns="minfer_passes.linear:patterns"),
    # before the passes that would take its Add/Sqrt/Div/Mul chain apart or into FusedElementwise
    Pass("layer_norm_fusion", layernorm.layer_norm_fusion, "basic", requires=TYPED,
         after=("constant_folding", "identity_elimination"),
         before=("elementwise_fusion", "scalar_binary", "weighted_sum_fusion", "matmul_bias_fusion"), rtol=1e-4, atol=1e-5,
         doc=(layernorm.layer_norm_fusion.__doc__ or "").strip(), patterns="minfer_passes.layernorm:patterns"),
    # before the scalar forms and elementwise_fusion, which would take its Mul/Div and Where apart
    Pass("masked_softmax_fusion", softmax.masked_softmax_fusion, "extended", requires=TYPED,
         after=("constant_folding", "identity_elimination"),
         before=("elementwise_fusion", "scalar_binary", "weighted_sum_fusion"), rtol=1e-5, atol=1e-6,
         doc=(softmax.masked_softmax_fusion.__doc__ or "").strip(), patterns="minfer_passes.softmax:patterns"),
    _pass(algebra.weighted_sum_fusion, "extended", requires=TYPED, before=("scalar_binary",),
          after=("affine_fusion", "matmul_add_to_gemm")),
    _pass(algebra.scalar_binary, "extended", requires=TYPED, after=("affine_fusion", "matmul_add_to_gemm")),
    # before activation_fusion: Conv -> Add -> Relu keeps its Relu for the residual node (either order gives the
    # same graph, since activation_fusion needs the activation right after the Conv; this one is deterministic)
    _pass(residual.conv_residual_fusion, "extended", requires=TYPED, before=("activation_fusion",),
          after=("conv_bn_fusion", "affine_fusion", "identity_elimination"), rtol=1e-5, atol=1e-6),
    _pass(activation.activation_fusion, "extended", requires=TYPED,
          after=("conv_bn_fusion", "affine_fusion", "matmul_add_to_gemm"), rtol=1e-5, atol=1e-6),
    # after activation_fusion (its convs' activations become the block's), before the passes that take its Mul
    Pass("squeeze_excite_fusion", squeeze_excite.squeeze_excite_fusion, "extended", requires=TYPED,
         after=("constant_folding", "identity_elimination", "activation_fusion", "conv_bn_fusion", "affine_fusion"),
         before=("elementwise_fusion", "scalar_binary", "weighted_sum_fusion"), rtol=1e-5, atol=1e-6,
         doc=(squeeze_excite.squeeze_excite_fusion.__doc__ or "").strip(),
         patterns="minfer_passes.squeeze_excite:patterns"),
    Pass("channel_affine_fusion", affine.channel_affine_fusion, "all", requires=TYPED,
         after=("conv_bn_fusion", "affine_fusion"), rtol=1e-5, atol=1e-6,
         doc=(affine.channel_affine_fusion.__doc__ or "").strip(), patterns="minfer_passes.affine:patterns"),
    # before constant_folding, which would fold each int8 weight's DequantizeLinear into a float copy
    Pass("qdq_fusion", qdq.qdq_fusion, "extended", requires=TYPED, before=("constant_folding",),
         doc=(qdq.qdq_fusion.__doc__ or "").strip(), patterns="minfer_passes.qdq:patterns"),
    # before qdq_fusion, which would make the group's weight a DequantConv and its Q/DQ pairs roundings
    Pass("qdq_integer_conv", qdq_exact.qdq_integer_conv, "extended", requires=TYPED, before=("qdq_fusion", "constant_folding"),
         atol=qdq_exact.STEP, doc=(qdq_exact.qdq_integer_conv.__doc__ or "").strip(),
         patterns="minfer_passes.qdq_exact:patterns"),
    # before qdq_fusion, which would make the weight a DequantMatMul (float GEMM of a per-run float copy)
    Pass("qdq_integer_matmul", qdq_matmul.qdq_integer_matmul, "extended", requires=TYPED,
         before=("qdq_fusion", "constant_folding", "matmul_add_to_gemm", "matmul_bias_fusion", "activation_fusion"),
         atol=qdq_matmul.STEP, doc=(qdq_matmul.qdq_integer_matmul.__doc__ or "").strip(),
         patterns="minfer_passes.qdq_matmul:patterns"),
    # before elementwise_fusion, which would take a Relu that this folds into the rounding's bounds
    Pass("qdq_epilogue_fusion", qdq.qdq_epilogue_fusion, "extended", requires=("qdq_fusion",),
         after=("activation_fusion", "conv_residual_fusion", "channel_affine_fusion"), before=("elementwise_fusion",),
         doc=(qdq.qdq_epilogue_fusion.__doc__ or "").strip(), patterns="minfer_passes.qdq:patterns"),
    # after every pass that fuses elementwise ops into another node, so it takes only what they leave; before the
    # scalar forms, which would first split its chains into single-op nodes
    Pass("elementwise_fusion", elementwise.elementwise_fusion, "extended", requires=TYPED,
         after=("constant_folding", "identity_elimination", "affine_fusion", "matmul_add_to_gemm", "gelu_fusion",
                "conv_residual_fusion", "activation_fusion", "channel_affine_fusion", "global_conv_to_gemm"),
         before=("scalar_binary", "weighted_sum_fusion"), rtol=1e-5, atol=1e-6,
         doc=(elementwise.elementwise_fusion.__doc__ or "").strip(), patterns="minfer_passes.elementwise_patterns:patterns"),
    # Q -> QLinearConv -> DQ (QOperator models), ConvInteger -> Cast -> Mul (dynamic ones) in one node each, then
    # the ChannelAffine after each (a BatchNormalization the quantizer left) in its epilogue: exact
    Pass("integer_conv_fusion", integer.integer_conv_fusion, "extended", requires=TYPED,
         after=("constant_folding", "channel_affine_fusion"), doc=(integer.integer_conv_fusion.__doc__ or "").strip(),
         patterns="minfer_passes.integer:patterns"),
    # DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul -> Add(bias) (dynamic models' linear layers) in one node:
    # exact (the property suite holds it to zero tolerance); before the passes that would take its Mul/Add apart
    Pass("integer_matmul_fusion", integer_matmul.integer_matmul_fusion, "extended", requires=TYPED,
         after=("constant_folding", "identity_elimination"),
         before=("elementwise_fusion", "scalar_binary", "weighted_sum_fusion", "activation_fusion", "lookup_fusion",
                 "matmul_bias_fusion"), rtol=0.0, atol=0.0,
         doc=(integer_matmul.integer_matmul_fusion.__doc__ or "").strip(), patterns="minfer_passes.integer_matmul:patterns"),
    # last among the fusions: it takes the elementwise chains they leave between quantized layers
    Pass("lookup_fusion", lookup.lookup_fusion, "extended", requires=TYPED,
         after=("constant_folding", "qdq_epilogue_fusion", "elementwise_fusion", "scalar_binary", "weighted_sum_fusion",
                "activation_fusion", "gelu_fusion", "integer_conv_fusion"),
         doc=(lookup.lookup_fusion.__doc__ or "").strip(), patterns="minfer_passes.lookup:patterns"),
    _pass(portable.expand_fused, "basic", role="portable"),
    # after folding (which makes a computed condition a constant), before the passes that clean up after it
    Pass("constant_if_inlining", control_flow.constant_if_inlining, "basic", after=("constant_folding",),
         before=("identity_elimination", "dead_code_elimination"),
         doc=(control_flow.constant_if_inlining.__doc__ or "").strip(), patterns="minfer_passes.control_flow:patterns"),
]


@hookimpl
def register_ops(register):
    register(ops.OPS, affine.OPS, gelu.OPS, elementwise.OPS, qdq_ops.OPS, linear.OPS, softmax.OPS, lookup.OPS,
             squeeze_excite.OPS)


@hookimpl
def register_kernels(register):
    register(ops.KERNELS, affine.KERNELS, gelu.KERNELS, elementwise_kernel.KERNELS, qdq_ops.KERNELS, linear.KERNELS, softmax.KERNELS,
             lookup.KERNELS, squeeze_excite.KERNELS)


@hookimpl
def register_passes(register):
    register(PASSES)
