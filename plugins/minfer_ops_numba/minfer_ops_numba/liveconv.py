"""Conv (group 1, float32) whose weights arrive with each run: smallconv.py's compiled path on them.

A quantized model's 1x1 and strided convs that minfer-passes leaves as ``DequantConv`` dequantize their 8-bit
weight into scratch on every run and call the registered Conv kernel for a weight computed at run time: only
numpy's took one, which splits over `parallel_for` (serially in a run whose threads a native team claimed) and
packs the weight per tile (quantized resnet50: its 1x1 DequantConvs took 11.5 of 29 ms on two threads). Here the
run's weight, as it comes (DequantConv's scratch: no copy), is the GEMM's (M, K) left operand of smallconv's
compiled units (`smallconv.units_of`/`team_units`: im2col without its row of ones, BLAS from compiled code, the
epilogue adding the bias, as smallconv's 1x1 stride-1 path does), over a native team when one runs. An epilogue without a compiled form (DequantConv's rounding) runs once, on the whole output, after.
The units come from the shape alone, as smallconv's: the same BLAS calls at any thread count.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import KernelContext, TensorType, kernel, parallel_for, scratch

from . import smallconv, team
from ._jit import F32, PRIORITY, input_type, is_float32, readonly
from .team import NOTHING


def applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """A 2-D float32 group-1 conv whose weight is computed at run time, of a static float32 4-D shape matching the
    input's channels (known, as its spatial size), pads >= 0; numpy's BLAS callable from compiled code."""
    w = input_type(ctx, 1)
    if not is_float32(ctx, 0, rank=4) or (len(ctx.constants) > 1 and ctx.constants[1] is not None):
        return False
    if w is None or w.dtype != F32 or w.shape is None or len(w.shape) != 4 or not w.is_static:
        return False
    x = ctx.input_types[0].shape
    if int(attrs.get("group", 1)) != 1 or x[1] != w.shape[1] or not all(isinstance(d, int) for d in x[1:]):
        return False
    if min(attrs.get("pads") or [0]) < 0 or min(attrs.get("strides") or [1]) < 1:
        return False
    b = input_type(ctx, 2)
    return (b is None or b.dtype == F32) and bool(team.gemm_address())


@kernel("Conv", since=1, priority=PRIORITY, prepare=True, out=True, views=False, epilogue=True, applies=applies)
def conv(ctx, *, auto_pad="NOTSET", dilations=None, group=1, kernel_shape=None, pads=None, strides=None):
    """Conv-1/11/22, group 1, its weight given each run (see `applies`): smallconv's compiled units on it."""
    shape = tuple(input_type(ctx, 1).shape)
    m, k = shape[0], int(np.prod(shape[1:]))
    fixed = ctx.constants[2] if len(ctx.constants) > 2 else None
    fixed = None if fixed is None else readonly(np.asarray(fixed, np.float32).reshape(-1).copy())
    stand_in = KernelContext(ctx.node_name, "Conv", ctx.opset, (ctx.input_types[0], TensorType(np.float32, shape)),
                             ctx.output_types, (None, np.zeros(shape, np.float32)), 1)
    node = smallconv.Node(stand_in, auto_pad, dilations, 1, pads, strides)
    # its shape only (the weights come per run; the bias column a packed node holds sizes the units as smallconv's)
    node.packed = np.broadcast_to(np.zeros(1, np.float32), (1, m, k + 1))
    address = team.gemm_address()
    smallconv.__dict__["gemm"] = team.install()  # before smallconv's units compile (as its own kernel does)
    smallconv._warm_compiled(address, np.zeros((m, k), np.float32), readonly(np.zeros(m, np.float32)))
    plans: dict[tuple[int, ...], tuple[Any, ...]] = {}

    def run(x, w, b=None, *, out=None, epilogue=None):
        full = w.reshape(m, -1)  # the run's weight as it comes (DequantConv's scratch): no copy
        if not (full.flags.c_contiguous and full.flags.writeable and full.dtype == np.float32):
            full = scratch("liveconv-weights", (m, k), np.float32)  # one compiled signature for all
            np.copyto(full, w.reshape(m, -1))
        bias = fixed if fixed is not None else None if b is None else np.asarray(b, np.float32).reshape(-1)
        fused = team.native(epilogue) if epilogue is not None else team.PLAIN
        if x.shape not in plans:
            plans[x.shape] = node.compiled_plan(x)
        found, geos, size, direct, out_shape = plans[x.shape]
        after = fused is None or not team.fits(fused[3], out_shape)  # no compiled form: once, after the units
        op, a, bb, z = team.PLAIN if after else fused
        y = out if out is not None else np.empty(out_shape, np.float32)
        if y.size == 0:
            return y
        column = NOTHING if bias is None else readonly(np.ascontiguousarray(bias, np.float32))  # added by the epilogue
        args = (address, readonly(np.ascontiguousarray(x)), full, column, y.reshape(out_shape[0], m, -1),
                NOTHING if z is None else readonly(z.reshape(-1)), found, geos)
        threads = team.size() if len(found) > 1 else 1
        if threads > 1:
            smallconv.team_units(*args, scratch("liveconv-team", (min(threads, len(found)), size), np.float32),
                                 direct, op, a, bb)
        else:

            def span(lo: int, hi: int) -> None:
                smallconv.units_of(*args, scratch("liveconv-unit", (size,), np.float32), direct, op, a, bb, lo, hi)

            parallel_for(len(found), span, outputs_only=True)  # a unit writes only its y block
        if after and epilogue is not None:
            epilogue(y, (slice(None),) * y.ndim)
        return y

    # not spmd: the epilogue after the units writes the whole output (a process team's ranks would each apply it)
    return run
