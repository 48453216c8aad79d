"""Conv (group 1, float32) whose weights arrive with each run: smallconv.py's compiled path on them.

A quantized model's 1x1 and strided convs that minfer-passes leaves as ``DequantConv`` dequantize their 8-bit
weight into scratch on every run and call the registered Conv kernel for a weight computed at run time: only
numpy's took one, which splits over `parallel_for` (serially in a run whose threads a native team claimed) and
packs the weight per tile (quantized resnet50: its 1x1 DequantConvs took 11.5 of 29 ms on two threads). Here the
run's weight, as it comes (DequantConv's scratch: no copy), is the GEMM's (M, K) left operand of smallconv's
compiled units (`smallconv.units_of`/`team_units`: im2col without its row of ones, BLAS from compiled code, the
epilogue adding the bias, as smallconv's 1x1 stride-1 path does), over a native team when one runs. DequantConv's
rounding epilogue (the rounding, ``* M``, ``+ A`` per channel, a second rounding: ``epilogue.rounding``) runs on
each unit while it is in cache, by quant.py's compiled QuantizeDequantize loop (`_rounded_units`); an epilogue
with neither a compiled form nor that description runs once, on the whole output, after.
The units come from the shape alone, as smallconv's: the same BLAS calls at any thread count.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from minfer_core import KernelContext, TensorType, kernel, parallel_for, scratch

from . import smallconv, team
from ._jit import F32, PRIORITY, input_type, is_float32, jit, readonly, uintp  # noqa: F401 (see _jit.uintp)
from .quant import Chains
from .quant import _requantize as _rounding_loop  # noqa: F401 (compiled code calls it)
from .smallconv import units_of  # noqa: F401 (compiled code calls it)
from .team import NONE, NOTHING, prange  # noqa: F401 (prange: numba's at compile)


@jit
def _rounded_units(address, xs, full, bias, y, found, geos, cf, direct, lo, hi, m, a, walk, params):  # pragma: no cover
    """Units lo..hi of smallconv's `units_of` (the bias added), each then rounded in place while in cache: quant.py's
    QuantizeDequantize loop on the unit's channels (``walk``: whether to multiply and to add; m, a one value or one a
    channel; ``params`` its grids)."""
    mm, ohw = y.shape[1], y.shape[2]
    yf = y.reshape(-1)
    ms, as_ = m.size > 1, a.size > 1
    for u in range(lo, hi):
        units_of(address, xs, full, bias, y, NOTHING, found, geos, cf, direct, NONE, np.float32(0),
                 np.float32(0), u, u + 1)
        i0, i1, r0, r1, m0, m1 = found[u, 0], found[u, 1], found[u, 2], found[u, 3], found[u, 4], found[u, 5]
        ncols = (r1 - r0) * geos[u, 11]
        part = np.empty(7, np.int64)  # one image's unit: m1 - m0 runs of ncols values, ohw apart
        part[0], part[1], part[2], part[3], part[4], part[5], part[6] = 1, 0, m1 - m0, ohw, ncols, walk[0], walk[1]
        for i in range(i0, i1):
            at = (i * mm + m0) * ohw + r0 * geos[u, 11]
            flat = yf[uintp(at):]
            _rounding_loop(flat, flat, part, m[m0:m1] if ms else m, a[m0:m1] if as_ else a, params)


@jit(parallel=True)
def _rounded_team(address, xs, full, bias, y, found, geos, cols, direct, m, a, walk, params):  # pragma: no cover
    """`_rounded_units` over a native team: part t of the units on team thread t, with row t of ``cols``."""
    parts, count = cols.shape[0], found.shape[0]
    for t in prange(parts):
        _rounded_units(address, xs, full, bias, y, found, geos, cols[t], direct, count * t // parts,
                       count * (t + 1) // parts, m, a, walk, params)


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
    _warm_rounded(address, m, k)
    plans: dict[tuple[int, ...], tuple[Any, ...]] = {}
    chains = Chains(m, 4)

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
        rounded = chains.of(epilogue) if after and epilogue is not None else None
        y = out if out is not None else np.empty(out_shape, np.float32)
        if y.size == 0:
            return y
        column = NOTHING if bias is None else readonly(np.ascontiguousarray(bias, np.float32))  # added by the epilogue
        xs, y3 = readonly(np.ascontiguousarray(x)), y.reshape(out_shape[0], m, -1)
        threads = team.size() if len(found) > 1 else 1
        if rounded is not None:  # a DequantConv's rounding: on each unit, in cache
            args = (address, xs, full, column, y3, found, geos)
            if threads > 1:
                _rounded_team(*args, scratch("liveconv-team", (min(threads, len(found)), size), np.float32), direct,
                              *rounded)
            else:
                parallel_for(len(found), lambda lo, hi: _rounded_units(
                    *args, scratch("liveconv-unit", (size,), np.float32), direct, lo, hi, *rounded), outputs_only=True)
            return y
        args = (address, xs, full, column, y3, NOTHING if z is None else readonly(z.reshape(-1)), found, geos)
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


def _warm_rounded(address: int, m: int, k: int) -> None:
    """Compile (or load) `_rounded_units` and its team driver at build, with a run's argument types."""
    x, y, found, geos = smallconv.warm_unit(m, k)
    one = readonly(np.ones(1, np.float32))
    flags, params = readonly(np.zeros(2, np.int64)), readonly(np.array([1, -1, 1, 0, 0, 0], np.float32))
    args = (address, x, np.zeros((m, k), np.float32), readonly(np.zeros(m, np.float32)), y, found, geos)
    _rounded_units(*args, np.zeros(1, np.float32), True, 0, 1, one, one, flags, params)
    if team.available():
        _rounded_team(*args, np.zeros((1, 1), np.float32), True, one, one, flags, params)
