"""The numpy kernel of ``ai.minfer::FusedElementwise``: the step program, block by block, into ``out``.

The output is cut into blocks of at most `BLOCK` elements along its leading
axes (each block is ``out[i, j, a:b]``: a contiguous part of ``out``, and a
strided view of each input broadcast to the output's shape, so a bias vector
or a scalar input is never copied). For each block every step runs in turn,
its result in a per-thread scratch buffer of the block's size
(`minfer_core.scratch`), the last step straight into ``out``: the whole group
reads its inputs and writes its output once, with no full-size temporary.
Scratch buffers are assigned at build like registers: a step reuses the
buffer of an operand that dies there when its formula allows writing over an
operand, else a free one, so a chain needs two or three buffers whatever its
length. From `SPLIT` elements on, runs of blocks go to the intra-op threads;
the blocks depend only on the shape, so each element is computed alike with
one thread or several.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np

from minfer_core import KernelContext, KernelError, TensorType, get_registry, kernel, parallel_for, scratch

from ._util import MINFER_DOMAIN
from .elementwise import OP, decode

BLOCK = 1 << 16  # elements per block: a float32 block is 256 KB, so a few of them stay in L2
# elements per range handed to a thread, from two ranges on: each block makes a few numpy calls per step, and a
# second thread waits for the GIL on each (see docs/kernel-contract.md), so ranges must be long
SPLIT = 1 << 18
NEWEST = 10_000  # the Erf step runs the newest registered Erf kernel (Erf-9 and Erf-13 agree)
SCRATCH = "minfer_passes.elementwise."

_FILLED: dict[tuple[np.dtype, float], np.ndarray] = {}


def _filled(like: np.ndarray, value: Any) -> np.ndarray:
    """A read-only array of ``value`` shaped like ``like``: numpy 2.4's maximum/minimum against a scalar is ~5x slower."""
    key = (like.dtype, float(value))
    block = _FILLED.get(key)
    if block is None:
        block = np.full(BLOCK, value, like.dtype)
        block.flags.writeable = False
        _FILLED[key] = block  # a racing thread may make its own: both hold the same values
    return block[: like.size].reshape(like.shape)


def _array(v: Any, like: np.ndarray) -> Any:
    return _filled(like, v) if isinstance(v, np.generic) else v


# ---- steps: fn(out, *operands) writes the step's result into out --------------------------------


def _binary(ufunc: Any) -> Callable[..., None]:
    return lambda out, a, b: ufunc(a, b, out=out)


def _extremum(ufunc: Any) -> Callable[..., None]:
    return lambda out, a, b: ufunc(_array(a, out), _array(b, out), out=out)


def _unary(ufunc: Any) -> Callable[..., None]:
    return lambda out, x: ufunc(x, out=out)


def _reciprocal(out: np.ndarray, x: Any) -> None:
    np.divide(out.dtype.type(1), x, out=out)  # as exact as np.reciprocal, and faster in numpy 2.4


def _relu(out: np.ndarray, x: Any) -> None:
    np.maximum(x, _filled(out, 0.0), out=out)


def _sigmoid(out: np.ndarray, x: Any) -> None:
    one = out.dtype.type(1)
    np.negative(x, out=out)  # x is read whole here: out may be x
    np.exp(out, out=out)  # inf below -88 (float32): 1 / inf is the right 0
    np.add(out, one, out=out)
    np.divide(one, out, out=out)


def _hard_sigmoid(out: np.ndarray, x: Any, alpha: Any, beta: Any) -> None:
    np.multiply(x, alpha, out=out)
    np.add(out, beta, out=out)
    np.clip(out, out.dtype.type(0), out.dtype.type(1), out=out)


def _hard_swish(out: np.ndarray, x: Any) -> None:
    _hard_sigmoid(out, x, out.dtype.type(1 / 6), out.dtype.type(0.5))
    np.multiply(out, x, out=out)  # reads x after out was written: out must not be x


def _leaky_relu(out: np.ndarray, x: Any, alpha: Any) -> None:
    np.multiply(x, alpha, out=out)
    # max(x, alpha*x) picks x for x >= 0 when alpha <= 1; min does when alpha > 1 (as the LeakyRelu kernel)
    (np.maximum if alpha <= 1 else np.minimum)(x, out, out=out)


def _clip(out: np.ndarray, x: Any, lo: Any, hi: Any) -> None:
    np.clip(x, lo, hi, out=out)


def _pow(out: np.ndarray, x: Any, e: Any) -> None:
    if e == 2:
        np.multiply(x, x, out=out)  # correctly rounded, as powf is
    elif e == 3:
        np.multiply(x, x, out=out)
        np.multiply(out, x, out=out)  # within 2 ulps of powf, ~10x faster
    else:
        np.power(x, e, out=out)


def _where(out: np.ndarray, cond: Any, a: Any, b: Any) -> None:
    np.copyto(out, b)
    np.copyto(out, a, where=cond)


STEP_FNS: dict[str, Callable[..., None]] = {
    "Add": _binary(np.add), "Sub": _binary(np.subtract), "Mul": _binary(np.multiply), "Div": _binary(np.divide),
    "Max": _extremum(np.maximum), "Min": _extremum(np.minimum), "Pow": _pow, "Where": _where,
    "Neg": _unary(np.negative), "Abs": _unary(np.absolute), "Sqrt": _unary(np.sqrt), "Exp": _unary(np.exp),
    "Log": _unary(np.log), "Tanh": _unary(np.tanh), "Reciprocal": _reciprocal, "Sigmoid": _sigmoid,
    "Relu": _relu, "HardSwish": _hard_swish, "LeakyRelu": _leaky_relu, "HardSigmoid": _hard_sigmoid, "Clip": _clip,
}
# steps that read an operand after writing out: out must be none of their operands
READ_AFTER_WRITE = {"HardSwish", "LeakyRelu", "Pow", "Where"}


def _erf_step(ctx: KernelContext, dtype: np.dtype) -> tuple[Callable[..., None], bool]:
    """The Erf step through the registered Erf kernel (prepared as the engine would), and whether out may be x."""
    kern = get_registry().select_kernel("", "Erf", NEWEST)
    if kern is None:
        raise KernelError(f"node {ctx.node_name!r} (ai.minfer::{OP}): its program has an Erf step and no Erf "
                          "kernel is installed; install minfer-ops-basic or disable elementwise_fusion")
    t = TensorType(dtype, None)
    fn = kern.prepared(KernelContext(ctx.node_name, "Erf", NEWEST, (t,), (t,), (None,), 1), {})
    if kern.out:
        return (lambda out, x: fn(x, out=out)), 0 in kern.inplace
    return (lambda out, x: np.copyto(out, fn(x))), True


# ---- build: steps with their scratch buffers -----------------------------------------------------


def _allocate(steps: list[tuple[str, tuple[int, ...]]], base: int, overwrites: Callable[[str], bool]) -> tuple[list[int], int]:
    """Per step, the scratch buffer its result goes to (-1: the output), and how many buffers there are.

    ``base`` is the first step result's reference. A buffer is free again after
    the last step reading it; a step that may write over its operand takes
    the buffer of one dying there.
    """
    last = {base + k: k for k in range(len(steps))}
    for k, (_, refs) in enumerate(steps):
        for r in refs:
            if r >= base:
                last[r] = k
    holder: dict[int, int] = {}
    free: list[int] = []
    dsts, count = [], 0
    for k, (name, refs) in enumerate(steps):
        dying = list(dict.fromkeys(holder[r] for r in refs if r >= base and last[r] == k))
        if k == len(steps) - 1:
            dst = -1
        elif dying and overwrites(name):
            dst = dying.pop(0)
        elif free:
            dst = free.pop()
        else:
            dst, count = count, count + 1
        free += dying
        dsts.append(dst)
        if dst >= 0:
            holder[base + k] = dst
            if last[base + k] == k:  # never read (not in a pass-made group): free at once
                free.append(dst)
    return dsts, count


@functools.lru_cache(maxsize=64)
def blocks(shape: tuple[int, ...]) -> list[tuple[Any, ...]]:
    """Index tuples cutting an array of ``shape`` into C-contiguous parts of at most `BLOCK` elements.

    Trailing axes are kept whole as long as they fit in a block; the axis before
    them is cut into runs, and the axes before that are walked one index at a time.
    """
    k, inner = len(shape), 1
    while k > 0 and inner * shape[k - 1] <= BLOCK:
        k -= 1
        inner *= shape[k]
    if k == 0:
        return [()]
    run = max(1, BLOCK // inner)
    return [(*lead, slice(a, min(a + run, shape[k - 1])))
            for lead in np.ndindex(*shape[: k - 1]) for a in range(0, shape[k - 1], run)]


# ---- the kernel ----------------------------------------------------------------------------------


def _compile(ctx: KernelContext, ops: list[str], args: list[int], constants: Any) -> tuple[Any, ...]:
    """(steps as (fn, refs, buffer), constants as dtype scalars, buffer count, spare buffer or -1, dtype or None).

    The spare buffer takes the last step's result when ``out`` is one of the
    inputs and that step reads an operand after writing (copied to ``out`` after).
    """
    n = len(ctx.input_types)
    try:
        steps, consts = decode(n, ops, args, constants)
    except ValueError as exc:
        raise KernelError(f"node {ctx.node_name!r} (ai.minfer::{OP}): bad program: {exc}") from None
    out_type = ctx.output_types[0] if ctx.output_types else None
    dtype = consts.dtype if constants is not None else (out_type.dtype if out_type is not None else None)
    fns = dict(STEP_FNS)
    safe = {name: name not in READ_AFTER_WRITE for name in STEP_FNS}
    if any(name == "Erf" for name, _ in steps):
        fns["Erf"], safe["Erf"] = _erf_step(ctx, dtype or np.dtype(np.float32))
    dsts, count = _allocate(steps, n + consts.size, safe.__getitem__)
    compiled = [(fns[name], refs, dst) for (name, refs), dst in zip(steps, dsts)]
    scalars = [(dtype or consts.dtype).type(c) for c in consts]
    return compiled, scalars, count, -1 if safe[steps[-1][0]] else count, dtype


def _run_blocks(program: tuple[Any, ...], y: np.ndarray, views: list[np.ndarray], parts: list[tuple[Any, ...]],
                aliased: bool) -> None:
    """Every step of ``program`` on each block of ``parts`` in turn, the last into ``y``'s block."""
    steps, consts, count, spare, _ = program
    late = aliased and spare >= 0  # the last step reads after writing and out is an input: through the spare
    size = min(y.size, BLOCK)
    bufs = [scratch(f"{SCRATCH}{i}", (size,), y.dtype) for i in range(count + late)]
    with np.errstate(all="ignore"):  # inf and nan flow through as in the standalone kernels
        for idx in parts:
            dst = y[idx] if idx else y  # () on a 0-d array would give a scalar
            regs = [v[idx] if idx else v for v in views] + consts
            tmp = [b[: dst.size].reshape(dst.shape) for b in bufs]
            for fn, refs, slot in steps:
                target = tmp[slot] if slot >= 0 else (tmp[spare] if late else dst)
                fn(target, *[regs[r] for r in refs])
                regs.append(target)
            if late:
                np.copyto(dst, regs[-1])


@kernel(OP, domain=MINFER_DOMAIN, prepare=True, out=True, inplace=tuple(range(8)), views=False)
def fused_elementwise(ctx, *, ops, args, constants=None):
    """ai.minfer::FusedElementwise-1: the step program (ops, args, constants) block by block, into out."""
    program = _compile(ctx, list(ops), list(args), constants)
    dtype = program[-1]

    layouts: dict[tuple[Any, ...], tuple[tuple[int, ...], list[tuple[Any, ...]]]] = {}  # input shapes -> (shape, blocks)

    def run(*inputs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        key = tuple(np.shape(x) for x in inputs)
        layout = layouts.get(key)
        if layout is None:  # once per input shapes: a small node's run is mostly such fixed costs
            shape = np.broadcast_shapes(*key)
            layout = layouts[key] = (shape, blocks(shape))
        shape, parts = layout
        y = np.empty(shape, dtype or _float_dtype(inputs)) if out is None else out
        if y.size == 0:
            return y
        aliased = out is not None and any(np.may_share_memory(out, x) for x in inputs)
        # zero-copy: a bias is read in place; a full-shape input is itself
        views = [x if np.shape(x) == shape else np.broadcast_to(x, shape) for x in inputs]
        per = max(1, SPLIT // min(y.size, BLOCK))  # blocks per thread's range
        if y.size < 2 * SPLIT or len(parts) < 2 * per:
            _run_blocks(program, y, views, parts, aliased)
        else:
            parallel_for(-(-len(parts) // per),
                         lambda lo, hi: _run_blocks(program, y, views, parts[lo * per: hi * per], aliased))
        return y

    return run


def _float_dtype(inputs: tuple[np.ndarray, ...]) -> np.dtype:
    return next((x.dtype for x in inputs if x.dtype != np.dtype(bool)), np.dtype(np.float32))


KERNELS = [fused_elementwise]
