"""ai.minfer::FusedElementwise (float32): the node's step program compiled into one loop, once per node.

minfer-passes' ``elementwise_fusion`` writes the program into the node's
attributes: ``ops`` (one op name per step), ``args`` (three references per
step, -1 unused) and ``constants``; a reference is an input, then a constant,
then an earlier step's result. This kernel reads those attributes (it does not
import minfer-passes), writes the Python source of a loop that computes every
step per element in float32 registers, and compiles it with numba: each input
is read once and the output written once, with no intermediate array.

Broadcasting: the output's shape is cut into rows (the leading axes, walked
through a table of each input's offset per row) and one inner axis (the
trailing axes merged as far as every input either spans them or is
broadcast along them). The source is specialised on which inputs vary along
the inner axis (the others are read once per row), so an inner loop of
arithmetic steps vectorizes; the variant is picked per input shapes.

Numerics: each step is the numpy kernel's float32 formula in its order
(Sigmoid ``1 / (1 + exp(-x))``, Pow by 2 or 3 as products, HardSwish and
HardSigmoid ``alpha * x + beta`` clipped, NaN kept by Max, Min, Relu and Clip),
``fastmath=False``: arithmetic steps give the numpy kernel's bits. Exp (and
Sigmoid's) is this module's float32 polynomial (`EXP_CONSTANTS`), which
vectorizes: within 3 ulps of np.exp. Log, Tanh, Pow by other exponents and
Erf (``math.erf``) call libm one element at a time, slower than numpy's
vector loops: `applies` leaves their programs to the numpy kernel (a direct
call computes them, within a few ulps; README.md has the figures).

Where a native team runs (team.py), an output from TEAM_SPLIT elements on is
split over numba's threads by the source's second function, ``fused_team``
(``parallel=True``, compiled at its first call), instead of parallel_for:
the same loop on each share of rows (or of the inner axis), so the same
bits, and a hand-over of about a microsecond against parallel_for's ~60 us.

Compiled code is cached on disk (`_jit.cache_dir`): the generated source is
written there under a hash of itself and imported, so that numba's
``cache=True`` finds it in a later process.
"""

from __future__ import annotations

import hashlib
import math
import importlib.util
import os
import sys
import threading
from typing import Any

import numpy as np

from minfer_core import KernelError, intra_op_threads, kernel, parallel_for

from . import team
from ._jit import F32, PRIORITY, cache_dir, contiguous, readonly

OP = "FusedElementwise"
DOMAIN = "ai.minfer"
WIDTH = 3  # references per step in ``args``
BOOL = np.dtype(bool)
CHUNK = 1 << 16  # elements per parallel_for range
# from this many output elements the ranges go over the intra-op threads: the steps taken are cheap (~0.1 ns an
# element), and on a shared host a hand-over of a smaller output cost more than it saved (README.md)
SPLIT = 1 << 20
# the same over a native team (team.py), whose hand-over costs a few microseconds: a Mul + HardSwish program (one
# thread against a team of two, loaded host) went 25 -> 16 us at 301k elements, but 6.0 -> 7.5 at 65k
TEAM_SPLIT = 1 << 17
LINE = 16  # float32 elements per cache line: a team's shares of one row start on one (no line written by two)
# steps numba computes with a libm call per element (no vector math library ships with it) where numpy's float32
# loops are vectorized: 2-3x slower than the numpy kernel (README.md), so `applies` leaves their programs to numpy
LIBM = {"Log", "Tanh", "Erf"}
# exp without libm, so that the loop vectorizes, in float32: n = round(x / ln 2), r = x - n ln 2 (ln 2 in two parts, so
# r is exact), e^r = 1 + r + r^2 q(r) with q of degree 5 (our own fit: weighted least squares with Lawson reweighting on
# |r| <= ln 2 / 2, 5e-11 relative before rounding the coefficients to float32), times 2^n from a table (n from -151 to
# 128: overflow to inf as float32's; results below 2^-149 flush to 0): within 3 ulps of numpy's np.exp (README.md)
EXP_CONSTANTS = """\
_L2E, _LN2HI, _LN2LO = np.float32(1.4426950408889634), np.float32(0.693359375), np.float32(-2.12194440e-4)
_EXP_HI, _EXP_LO = np.float32(88.8), np.float32(-104.0)
_EXP_P = [np.float32(c) for c in (1.9790357328020036e-4, 1.3944649836048484e-3, 8.333496749401093e-3,
                                  4.166629537940025e-2, 0.1666666567325592, 0.5)]
_P0, _P1, _P2, _P3, _P4, _P5 = _EXP_P
_POW2 = np.ldexp(np.float32(1), np.arange(-151, 129).clip(None, 127)).astype(np.float32)  # 2^128: 2 * 2^127
"""

_MAX = "({a} if ({a} >= {b} or {a} != {a}) else {b})"  # np.maximum: NaN from either side
_MIN = "({a} if ({a} <= {b} or {a} != {a}) else {b})"
_CLIP01 = "_ONE if {t} > _ONE else (_ZERO if {t} < _ZERO else {t})"  # NaN stays NaN

# step -> (operands, source lines computing ``t`` from operands a, b, c); ``{c...}`` operands must be constants
STEPS: dict[str, tuple[int, tuple[str, ...]]] = {
    "Add": (2, ("{t} = {a} + {b}",)), "Sub": (2, ("{t} = {a} - {b}",)), "Mul": (2, ("{t} = {a} * {b}",)),
    "Div": (2, ("{t} = {a} / {b}",)), "Max": (2, ("{t} = " + _MAX,)), "Min": (2, ("{t} = " + _MIN,)),
    "Where": (3, ("{t} = {b} if {a} else {c}",)),
    "Neg": (1, ("{t} = -{a}",)), "Abs": (1, ("{t} = abs({a})",)), "Sqrt": (1, ("{t} = np.sqrt({a})",)),
    "Exp": (1, ()), "Log": (1, ("{t} = np.log({a})",)), "Tanh": (1, ("{t} = np.tanh({a})",)),  # Exp: `_exp_lines`
    "Erf": (1, ("{t} = np.float32(math.erf({a}))",)), "Reciprocal": (1, ("{t} = _ONE / {a}",)),
    "Sigmoid": (1, ()),  # 1 / (1 + exp(-x)), `_exp_lines`
    "Relu": (1, ("{t} = " + _MAX.format(a="{a}", b="_ZERO"),)),
    "HardSwish": (1, ("{t} = {a} * _SIXTH + _HALF", "{t} = " + _CLIP01, "{t} = {t} * {a}")),
    "HardSigmoid": (3, ("{t} = {a} * {b} + {c}", "{t} = " + _CLIP01)),
    "Clip": (3, ("{t} = " + _MAX.format(a="{a}", b="{b}"), "{t} = " + _MIN.format(a="{t}", b="{c}"))),
    "LeakyRelu": (2, ()),  # by the sign of alpha - 1, below
    "Pow": (2, ()),  # by the exponent, below
}
CONSTANT_OPERANDS = {"Pow": (1,), "LeakyRelu": (1,), "HardSigmoid": (1, 2), "Clip": (1, 2)}


def _decode(n: int, attrs: dict[str, Any]) -> tuple[list[tuple[str, tuple[int, ...]]], np.ndarray] | None:
    """The steps and float32 constants of the node's program, or None when this kernel does not take it."""
    ops, args, constants = list(attrs.get("ops", ())), list(attrs.get("args", ())), attrs.get("constants")
    consts = np.zeros(0, F32) if constants is None else np.asarray(constants)
    if consts.dtype != F32 and consts.size or not ops or len(args) != WIDTH * len(ops):
        return None
    base = n + consts.size
    steps = []
    for k, name in enumerate(ops):
        if name not in STEPS:
            return None
        arity = STEPS[name][0]
        row = [int(a) for a in args[WIDTH * k: WIDTH * k + WIDTH]]
        refs = tuple(row[:arity])
        if any(not 0 <= r < base + k for r in refs) or any(r != -1 for r in row[arity:]):
            return None
        if any(not n <= refs[i] < base for i in CONSTANT_OPERANDS.get(name, ())):
            return None
        steps.append((name, refs))
    return steps, consts.astype(F32).reshape(-1)


def _bool_inputs(n: int, steps: list[tuple[str, tuple[int, ...]]]) -> set[int]:
    """Inputs read only as Where's condition (they may be bool; every other input must be float32)."""
    conds = {refs[0] for name, refs in steps if name == "Where" and refs[0] < n}
    others = {r for name, refs in steps for i, r in enumerate(refs) if not (name == "Where" and i == 0)}
    return conds - others


def _vectorizes(n: int, steps: list[tuple[str, tuple[int, ...]]], consts: np.ndarray) -> bool:
    """Whether no step calls libm per element (`LIBM`, Pow by other than 2 or 3)."""
    return not any(name in LIBM or (name == "Pow" and float(consts[refs[1] - n]) not in (2.0, 3.0))
                   for name, refs in steps)


def _applies(ctx: Any, attrs: dict[str, Any]) -> bool:
    """float32 inputs and output (bool Where conditions), a program of the steps above with float32 constants."""
    n = len(ctx.input_types)
    program = _decode(n, attrs)
    if program is None or any(t is None for t in ctx.input_types) or not _vectorizes(n, *program):
        return False
    conds = _bool_inputs(n, program[0])
    out = ctx.output_types[0] if ctx.output_types else None
    return (all(t.dtype == F32 or (t.dtype == BOOL and i in conds) for i, t in enumerate(ctx.input_types))
            and (out is None or out.dtype == F32))


# ---- source ---------------------------------------------------------------------------------------------------


def _exp_lines(t: str, a: str) -> list[str]:
    """Lines setting ``t`` to float32 e^a (see `EXP_CONSTANTS`); NaN stays NaN (the table index is taken from 0)."""
    e = f"{t}_"
    return [f"{e}x = _EXP_HI if {a} > _EXP_HI else (_EXP_LO if {a} < _EXP_LO else ({a} if {a} == {a} else _ZERO))",
            f"{e}n = np.floor({e}x * _L2E + _HALF)",
            f"{e}r = {e}x - {e}n * _LN2HI", f"{e}r = {e}r - {e}n * _LN2LO",
            f"{t} = (((((_P0 * {e}r + _P1) * {e}r + _P2) * {e}r + _P3) * {e}r + _P4) * {e}r + _P5) * ({e}r * {e}r)",
            f"{t} = {t} + {e}r + _ONE",
            f"{t} = {t} + {t} if {e}n > np.float32(127) else {t}",
            f"{t} = {t} * _POW2[uintp(np.int32({e}n) + 151)]",
            f"{t} = {t} if {a} == {a} else {a}"]


def _step_lines(name: str, t: str, ops: list[str], constant: Any) -> list[str]:
    """Source lines setting ``t`` to the step's value; ``constant(i)`` is the value of operand i (a constant)."""
    a, b, c = (ops + ["", ""])[:3]
    if name == "Exp":
        return _exp_lines(t, a)
    if name == "Sigmoid":  # the numpy kernel's order: exp(-x), + 1, 1 / that
        return _exp_lines(t, f"(-{a})") + [f"{t} = _ONE / (_ONE + {t})"]
    if name == "Pow":
        e = constant(1)
        if e == 2:
            return [f"{t} = {a} * {a}"]  # correctly rounded, as powf is (the numpy kernel multiplies too)
        if e == 3:
            return [f"{t} = {a} * {a}", f"{t} = {t} * {a}"]
        return [f"{t} = np.power({a}, {b})"]
    if name == "LeakyRelu":  # max(x, alpha*x) picks x for x >= 0 when alpha <= 1; min does when alpha > 1
        pick = _MAX if constant(1) <= 1 else _MIN
        return [f"{t} = {a} * {b}", f"{t} = " + pick.format(a=a, b=t)]
    return [line.format(t=t, a=a, b=b, c=c) for line in STEPS[name][1]]


def source(n: int, steps: list[tuple[str, tuple[int, ...]]], consts: np.ndarray, inner: tuple[bool, ...]) -> str:
    """The module source of the compiled loop ``fused`` for this program, ``inner[i]``: input i varies along the
    inner axis (else it is read once per row)."""
    names = [f"v{i}" for i in range(n)] + [f"c{j}" for j in range(consts.size)]
    names += [f"t{k}" for k in range(len(steps))]
    params = "".join(f"x{i}, " for i in range(n))
    head = [f"    c{j} = c[{j}]" for j in range(consts.size)]
    body = []
    for k, (name, refs) in enumerate(steps):
        body += _step_lines(name, f"t{k}", [names[r] for r in refs], lambda i: float(consts[refs[i] - n]))
    row = [f"        b{i} = bases[{i}, r]" for i in range(n)]
    row += [f"        v{i} = x{i}[uintp(b{i})]" for i in range(n) if not inner[i]]
    loop = [f"            v{i} = x{i}[uintp(b{i} + k)]" for i in range(n) if inner[i]]
    loop += ["            " + line for line in body] + [f"            y[uintp(o + k)] = t{len(steps) - 1}"]
    return "\n".join([
        "import math", "import numpy as np", "from numba import njit, prange, uintp", "",
        "_ZERO, _ONE, _HALF, _SIXTH = np.float32(0), np.float32(1), np.float32(0.5), np.float32(1 / 6)",
        EXP_CONSTANTS, "",
        '@njit(nogil=True, cache=True, fastmath=False, error_model="numpy")',
        f"def fused({params}y, c, bases, K, r_lo, r_hi, k_lo, k_hi):  # pragma: no cover - compiled",
        *head, "    for r in range(r_lo, r_hi):", "        o = r * K", *row,
        "        for k in range(k_lo, k_hi):", *loop, "", TEAM_SOURCE.format(params=params), ""])


# a native team's driver (team.py): ``parts`` contiguous shares of the rows, or of the inner axis (starting on a
# cache line) when there are fewer rows than parts, each computed by `fused`
TEAM_SOURCE = """
@njit(nogil=True, cache=True, fastmath=False, error_model="numpy", parallel=True)
def fused_team({params}y, c, bases, K, parts):  # pragma: no cover - compiled
    rows = bases.shape[1]
    for t in prange(parts):
        if rows >= parts:
            fused({params}y, c, bases, K, rows * t // parts, rows * (t + 1) // parts, 0, K)
        else:
            lo = K * t // parts // {line} * {line}
            hi = K if t == parts - 1 else K * (t + 1) // parts // {line} * {line}
            fused({params}y, c, bases, K, 0, rows, lo, hi)""".replace("{line}", str(LINE))


_COMPILED: dict[str, Any] = {}
_LOCK = threading.Lock()


def compiled(src: str) -> Any:
    """The numba dispatchers of ``src``'s ``fused`` and ``fused_team``: from this process's memo, else imported
    from the cache folder (written there first, under a hash of the source, so numba's disk cache can key on the
    file)."""
    key = hashlib.sha1(src.encode()).hexdigest()[:20]
    with _LOCK:
        fn = _COMPILED.get(key)
        if fn is None:
            fn = _COMPILED[key] = _import(key, src)
    return fn


def _import(key: str, src: str) -> Any:
    import numba

    folder = cache_dir() / "fused_elementwise"
    path = folder / f"minfer_fused_{key}.py"
    saved = numba.config.CACHE_DIR
    numba.config.CACHE_DIR = str(cache_dir())
    try:
        try:
            if not path.exists():  # never rewritten: numba's cache checks the file's time stamp
                folder.mkdir(parents=True, exist_ok=True)
                tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
                tmp.write_text(src)
                os.replace(tmp, path)
        except OSError:  # an unwritable folder: compile from memory, without the disk cache
            namespace: dict[str, Any] = {}
            exec(compile(src.replace("cache=True", "cache=False"), f"<minfer fused {key}>", "exec"), namespace)
            return namespace["fused"], namespace["fused_team"]
        spec = importlib.util.spec_from_file_location(f"minfer_fused_{key}", path)
        module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
        sys.modules[spec.name] = module  # type: ignore[union-attr]
        spec.loader.exec_module(module)  # type: ignore[union-attr]
        return module.fused, module.fused_team
    finally:
        numba.config.CACHE_DIR = saved


# ---- layout: rows and an inner axis -------------------------------------------------------------------------


def layout(shapes: tuple[tuple[int, ...], ...]) -> tuple[tuple[int, ...], tuple[bool, ...], np.ndarray, int]:
    """(output shape, per input whether it varies along the inner axis, each input's offset per row, inner length).

    Axes of the output of length 1 are dropped; adjacent axes merge where every
    input spans both or is broadcast along both.
    """
    shape = np.broadcast_shapes(*shapes)
    keep = [d for d in range(len(shape)) if shape[d] != 1]
    dims: list[int] = []
    spans: list[tuple[bool, ...]] = []
    for d in keep:
        full = tuple(len(s) > len(shape) - 1 - d and s[d - len(shape) + len(s)] != 1 for s in shapes)
        if spans and spans[-1] == full:
            dims[-1] *= shape[d]
        else:
            dims.append(shape[d])
            spans.append(full)
    if not dims:
        dims, spans = [1], [tuple(False for _ in shapes)]
    K, outer = dims[-1], dims[:-1]
    bases = np.zeros((len(shapes), int(np.prod(outer, dtype=np.int64))), np.int64)
    for i in range(len(shapes)):
        step, offsets = K if spans[-1][i] else 1, np.zeros(1, np.int64)
        for d in range(len(outer) - 1, -1, -1):
            stride = step if spans[d][i] else 0
            offsets = (np.arange(outer[d], dtype=np.int64)[:, None] * stride + offsets[None, :]).reshape(-1)
            step *= outer[d] if spans[d][i] else 1
        bases[i] = offsets
    return shape, spans[-1], readonly(bases), K


def _static_shapes(ctx: Any) -> tuple[tuple[int, ...], ...] | None:
    """The inputs' shapes with unknown dims guessed as above 1 (the common case), or None when a rank is unknown."""
    shapes = []
    for t in ctx.input_types:
        if t.shape is None:
            return None
        shapes.append(tuple(d if isinstance(d, int) else 2 for d in t.shape))
    try:
        np.broadcast_shapes(*shapes)
    except ValueError:
        return None
    return tuple(shapes)


# ---- the kernel ----------------------------------------------------------------------------------------------


def _runner(fns: Any, views: list[np.ndarray], y: np.ndarray, c: np.ndarray, bases: np.ndarray, K: int) -> None:
    """``fns``' ``fused`` over every row and inner index: over a native team from TEAM_SPLIT on (its ``fused_team``),
    else in ranges of ~CHUNK elements over parallel_for's threads from SPLIT on."""
    fn, rows = fns[0], bases.shape[1]
    size = team.size() if rows * K >= TEAM_SPLIT else 1  # asked only here: it claims the run's threads (team.py)
    if size > 1:
        fns[1](*views, y, c, bases, K, size)
    elif rows * K < SPLIT or intra_op_threads() < 2:
        fn(*views, y, c, bases, K, 0, rows, 0, K)
    elif rows > 1:
        per = max(1, CHUNK // K)
        parallel_for(-(-rows // per), lambda lo, hi: fn(*views, y, c, bases, K, lo * per, min(rows, hi * per), 0, K))
    else:
        parallel_for(-(-K // CHUNK), lambda lo, hi: fn(*views, y, c, bases, K, 0, 1, lo * CHUNK, min(K, hi * CHUNK)))


# inplace: element (r, k) of an input that is the output is read only for the output's element (r, k), before it
# is written; the same declarations as minfer-passes' numpy kernel, so the core times the two against each other
@kernel(OP, domain=DOMAIN, since=1, priority=PRIORITY, prepare=True, out=True, inplace=tuple(range(8)), views=False,
        applies=_applies)
def fused_elementwise(ctx, *, ops, args, constants=None):
    """ai.minfer::FusedElementwise-1 (float32): the step program compiled into one loop per node."""
    n = len(ctx.input_types)
    program = _decode(n, {"ops": ops, "args": args, "constants": constants})
    if program is None:  # `applies` refuses such nodes: only a direct call gets here
        raise KernelError(f"node {ctx.node_name!r} ({DOMAIN}::{OP}): the numba kernel does not take this program "
                          f"(ops {list(ops)}); let the registry choose the kernel (numpy's takes every program)")
    steps, consts = program
    c = readonly(consts if consts.size else np.zeros(1, F32))
    variants: dict[tuple[bool, ...], Any] = {}

    def variant(inner: tuple[bool, ...]) -> Any:
        fn = variants.get(inner)
        if fn is None:
            fn = variants[inner] = compiled(source(n, steps, consts, inner))
            probe = [readonly(np.zeros(1, t.dtype)) for t in ctx.input_types]
            fn[0](*probe, np.zeros(1, F32), c, readonly(np.zeros((n, 1), np.int64)), 1, 0, 0, 0, 0)  # compile now
        return fn

    guess = _static_shapes(ctx)
    if guess is not None:
        shape, inner, _, _ = layout(guess)
        fns = variant(inner)  # at build, not in the core's timing or the first run
        if math.prod(shape) >= TEAM_SPLIT and team.available():  # the team's driver too, where it may run
            probe = [readonly(np.zeros(1, t.dtype)) for t in ctx.input_types]
            fns[1](*probe, np.zeros(1, F32), c, readonly(np.zeros((n, 1), np.int64)), 1, 1)
    layouts: dict[tuple[tuple[int, ...], ...], Any] = {}

    def plan(key: tuple[tuple[int, ...], ...]) -> Any:
        shape, inner, bases, K = layout(key)
        return shape, variant(inner), bases, K, bases.shape[1] * K >= min(SPLIT, TEAM_SPLIT)

    # per call on tiny tensors the Python around the compiled loop cost as much as the loop (a detector's
    # [1, 768, 2] Sigmoid-Mul: ~4 us of 8), so the plan holds all that depends on the shapes alone
    def run(*inputs: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        key = tuple([x.shape for x in inputs])
        found = layouts.get(key)
        if found is None:
            found = layouts[key] = plan(key)
        shape, fn, bases, K, big = found
        y = np.empty(shape, F32) if out is None or not out.flags.c_contiguous else out
        if y.size:
            views = [x.reshape(-1) if x.flags.c_contiguous and not x.flags.writeable
                     else readonly(contiguous(x)).reshape(-1) for x in inputs]
            if big:
                _runner(fn, views, y.reshape(-1), c, bases, K)
            else:
                fn[0](*views, y.reshape(-1), c, bases, K, 0, bases.shape[1], 0, K)
        if out is not None and y is not out:
            np.copyto(out, y)
            return out
        return y

    return run


KERNELS = [fused_elementwise]
