"""Kernels: elementwise arithmetic and unary math.

Also the helpers the other math modules share: `unary_kernels` (one factory for
every table-driven unary op), `binary_kernels` (the opset<7 ``broadcast``/``axis``
forms plus numpy broadcasting from 7 on), `as_float` and `erf`.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Callable

import numpy as np

from minfer_core import intra_op_threads, kernel, parallel_for

Fn = Callable[..., Any]

# Large outputs go to parallel_for in parts. Measured on the benchmark's 2-core VM, 1 -> 2 threads
# (an empty two-thread parallel_for costs ~50 us there, and both cores share the memory bandwidth),
# float32: Add of 1M elements 129 -> 129 us, 4M 1033 -> 831; exp 256K 89 -> 96, 1M 348 -> 225;
# tanh 1M 172 -> 151, 4M 775 -> 479.
SPLIT_CHEAP = 1 << 21  # ops of one memory pass: add, mul, max, abs, neg, relu, clip
SPLIT_COSTLY = 1 << 18  # transcendental ones: exp, log, tanh, sin, erf, sigmoid, pow


def arr(value: Any, dtype: Any = None) -> np.ndarray:
    """numpy returns scalars for 0-d results; the engine wants real arrays."""
    out = np.asarray(value)
    return out if dtype is None or out.dtype == dtype else out.astype(dtype)


def is_exotic(dtype: np.dtype) -> bool:
    """A dtype registered by ml_dtypes (bfloat16, float8, int4...); numpy gives them odd kinds."""
    return dtype.isbuiltin == 2


def as_float(x: np.ndarray) -> np.ndarray:
    """x in a dtype numpy computes well: ml_dtypes types (bfloat16, float8, int4) widen."""
    if not is_exotic(x.dtype):
        return x
    return x.astype(np.int32 if "int" in x.dtype.name else np.float32)


def scalar(value: float, like: np.ndarray) -> np.ndarray:
    """An attribute as a 0-d array of x's dtype, so float32 math stays float32."""
    return np.asarray(value, dtype=like.dtype)


def float_op(fn: Fn) -> Fn:
    """Wrap fn(x) so exotic float dtypes compute in float32 and come back in their own dtype."""

    def run(x: np.ndarray, *args: Any) -> np.ndarray:
        with np.errstate(all="ignore"):  # inf/nan results are legitimate ONNX outputs
            return arr(on_1d(fn, as_float(x), *args), x.dtype)

    return run


def on_1d(fn: Fn, x: np.ndarray, *args: Any) -> Any:
    """fn(x) for a 0-d x computed on a 1-element view: ufuncs turn 0-d results into
    numpy scalars, which in-place steps (out=) cannot write to."""
    if x.ndim:
        return fn(x, *args)
    return np.asarray(fn(x.reshape(1), *args)).reshape(())


def into(out: np.ndarray | None, value: Any) -> np.ndarray:
    """value in the engine's planned buffer when it passed one (kernel contract: out=), else as an array."""
    if out is None:
        return arr(value)
    np.copyto(out, value, casting="unsafe")
    return out


def split_flat(fn: Fn, args: tuple[np.ndarray, ...], out: np.ndarray, at: int) -> bool:
    """``fn(*args, out=out)`` in parts over the intra-op threads; False (nothing done) when that is not simple.

    Splits when ``out`` has ``at`` elements or more and more than one thread
    runs: in flat parts when every argument has out's shape (C-contiguous) or
    one element, else along the leading axis when every argument has out's
    rank and a leading dim of 1 or out's. Each part writes only its slice of
    out (which may be an argument of out's shape: each element is read before
    it is written).
    """
    if out.size < at or out.ndim == 0 or intra_op_threads() < 2 or not out.flags.c_contiguous:
        return False
    if all(a.shape == out.shape and a.flags.c_contiguous or a.size == 1 for a in args):
        flat = [a.reshape(-1) if a.shape == out.shape else a.reshape(()) for a in args]
        parts = [(lambda lo, hi, a=a: a[lo:hi]) if a.ndim else (lambda lo, hi, a=a: a) for a in flat]
        whole = out.reshape(-1)
    elif all(a.ndim == out.ndim and a.shape[0] in (1, out.shape[0]) for a in args) and out.shape[0] > 1:
        parts = [(lambda lo, hi, a=a: a[lo:hi]) if a.shape[0] > 1 else (lambda lo, hi, a=a: a) for a in args]
        whole = out
    else:
        return False

    def part(lo: int, hi: int) -> None:
        with np.errstate(all="ignore"):  # each thread has its own numpy error state
            fn(*(p(lo, hi) for p in parts), out=whole[lo:hi])

    parallel_for(len(whole), part)
    return True


def declare(op_type: str, since: int, fn: Fn, doc: str, *, out: bool = False, inplace: tuple[int, ...] = (),
            views: bool | None = None) -> Any:
    """Declare a factory-made kernel, named after its op and version for tracebacks."""
    fn.__name__ = fn.__qualname__ = f"{op_type}_{since}"
    fn.__doc__ = f"{op_type}-{since}: {doc}"
    return kernel(op_type, since=since, out=out, inplace=inplace, views=views)(fn)


def writes_out(fn: Fn) -> bool:
    """Whether fn(x, out=...) computes straight into a buffer: numpy ufuncs, or helpers marked so."""
    return isinstance(fn, np.ufunc) or getattr(fn, "writes_out", False)


def unary_kernels(op_type: str, fn: Fn, since: int, legacy: bool = False, name: str = "",
                  at: int = SPLIT_COSTLY) -> list:
    """Kernels for a unary op; ``legacy`` adds the opset-1 form with ``consumed_inputs``.

    When fn can write into a buffer, the modern kernel declares out=/inplace so
    the memory planner can hand it one (possibly its own input), and splits
    outputs of ``at`` elements or more over the intra-op threads.
    """
    run = float_op(fn)
    label = name or op_type
    kw: dict[str, Any] = {}
    if writes_out(fn):
        kw = {"out": True, "inplace": (0,)}

        def modern(x, *, out=None):
            if out is None or is_exotic(x.dtype):
                return into(out, run(x))
            with np.errstate(all="ignore"):
                return out if split_flat(fn, (x,), out, at) else fn(x, out=out)

    else:

        def modern(x):
            return run(x)

    kernels = [declare(op_type, 6 if legacy else since, modern, f"elementwise {label}.", **kw)]
    if legacy:

        def old(x, *, consumed_inputs=None):
            return run(x)

        kernels.append(declare(op_type, 1, old, f"elementwise {label} (consumed_inputs is a no-op)."))
    return kernels


# --- erf ---------------------------------------------------------------------
# The float64 approximations are fitted once, lazily, from math.erf/erfc at Chebyshev
# nodes; the float32 coefficients below come from our own fit (see there), so no
# coefficient table is copied from anywhere. Below |x| = 1, erf(x)/x as a function of
# x*x keeps full relative accuracy near 0; above it, exp(x*x)*erfc(x) is smooth.


@functools.cache
def _erf_fits() -> tuple[Any, Any]:
    """Chebyshev interpolants accurate to ~1e-14 relative, for float64 inputs."""
    from numpy.polynomial import Chebyshev

    erf_ = np.vectorize(math.erf, otypes=[float])
    erfc_ = np.vectorize(math.erfc, otypes=[float])
    small = Chebyshev.interpolate(lambda u: erf_(np.sqrt(u)) / np.sqrt(u), 10, domain=[0, 1])
    large = Chebyshev.interpolate(lambda x: np.exp(x * x) * erfc_(x), 30, domain=[1, 6])  # erf is 1 beyond 6
    return small, large


# float32 erf: evaluated in float32 throughout, in blocks that stay in cache. Coefficients
# are our own fit (power basis, float32): a near-minimax weighted least-squares fit
# (Lawson reweighting) against math.erf/erfc, each coefficient rounded to float32 and
# the higher ones refitted. Checked over every float32 input: at most 1 ulp from the
# correctly rounded result (1.3 ulp from the exact value), within the test's 1.2e-7
# relative; subnormal results at most 1 ulp from the correctly rounded value.
_ERF32_SPLIT = np.float32(1.0)  # below: erf(a) = a + a * q(a*a); above: 1 - exp(-a*a) * h(a - 2.5)
_ERF32_Q = np.array(  # q(u) ~ erf(sqrt u) / sqrt u - 1 on [0, 1]
    [0.12837916612625122, -0.3761262893676758, 0.11283618211746216, -0.02685512602329254,
     0.005190733354538679, -0.0008030750323086977, 7.920303323771805e-05], dtype=np.float32)  # fmt: skip
_ERF32_H = np.array(  # h(t) ~ exp(a*a) * erfc(a), t = a - 2.5, a in [1, 4]; error weighted by exp(-a*a)
    [0.21080760657787323, -0.07434218376874924, 0.024914618581533432, -0.008132283575832844,
     0.00230247899889946, -0.0006610904238186777, 0.0005433787009678781, 0.00022509678092319518,
     0.00010685004235710949], dtype=np.float32)  # fmt: skip
_ERF32_TOP = np.float32(4.0)  # float32 erf is 1 from 3.92 on; clamping keeps h finite
_ERF32_BLOCK = 1 << 15  # elements per block: the scratch arrays stay in L2


def _horner32(coef: np.ndarray, t: np.ndarray, out: np.ndarray) -> np.ndarray:
    np.multiply(t, coef[-1], out=out)
    out += coef[-2]
    for c in coef[-3::-1]:
        out *= t
        out += c
    return out


def erf32_block(x: np.ndarray, out: np.ndarray, a: np.ndarray, u: np.ndarray, s: np.ndarray, t: np.ndarray) -> None:
    """erf of a 1-D float32 block into out (which may be x); a, u, s, t are scratch of the same size."""
    xi, ai, ui, si, ti = x.view(np.int32), a.view(np.int32), u.view(np.int32), s.view(np.int32), t.view(np.int32)
    np.bitwise_and(xi, np.int32(0x7FFFFFFF), out=ai)  # |x|
    np.minimum(a, _ERF32_TOP, out=a)  # nan stays nan
    np.multiply(a, a, out=u)
    _horner32(_ERF32_Q, u, s)  # small branch: s = a + a * q(u)
    s *= a
    s += a
    np.subtract(a, np.float32(2.5), out=t)  # exact for a in [1, 4]
    _horner32(_ERF32_H, t, a)  # large branch: 1 - exp(-u) * h(t)
    np.negative(u, out=u)
    np.exp(u, out=u)
    u *= a
    np.subtract(np.float32(1.0), u, out=u)
    # choose by the bits (no masked copies): -1 where |x| < split, else 0 (nan and inf: large branch)
    np.bitwise_and(xi, np.int32(0x7FFFFFFF), out=ti)
    np.subtract(ti, _ERF32_SPLIT.view(np.int32), out=ti)
    np.right_shift(ti, 31, out=ti)
    np.bitwise_and(si, ti, out=si)
    np.invert(ti, out=ti)
    np.bitwise_and(ui, ti, out=ui)
    np.bitwise_or(si, ui, out=si)
    np.bitwise_and(xi, np.int32(-0x80000000), out=ui)  # x's sign, read before out (maybe x) is written
    np.bitwise_or(si, ui, out=out.view(np.int32))


def erf32(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """erf of a float32 array (into ``out``, which may be x itself), computed in float32."""
    flat = np.ascontiguousarray(x, dtype=np.float32).reshape(-1)
    if out is None:
        out = np.empty(np.shape(x), np.float32)
    res = out.reshape(-1)  # planned buffers are C-contiguous: a view
    n = flat.size
    if n == 0:
        return out
    block = min(n, _ERF32_BLOCK)
    a, u, s, t = (np.empty(block, np.float32) for _ in range(4))
    with np.errstate(all="ignore"):  # inf inputs make nan polynomial values the selection drops
        for i in range(0, n, block):
            j = min(n, i + block)
            m = j - i
            erf32_block(flat[i:j], res[i:j], a[:m], u[:m], s[:m], t[:m])
    return out


def _erf_abs_precise(a: np.ndarray) -> np.ndarray:
    small, large = _erf_fits()
    out = np.ones_like(a)
    lo = a < 1
    out[lo] = a[lo] * small(a[lo] * a[lo])
    mid = (a >= 1) & (a < 6)
    am = a[mid]
    out[mid] = 1.0 - np.exp(-am * am) * large(am)
    return out


def erf(x: np.ndarray, precise: bool | None = None) -> np.ndarray:
    """Vectorized erf of a float array, returned in float64.

    ``precise`` (default: x is float64) gives ~1e-14 relative accuracy; otherwise
    x is rounded to float32 and `erf32` (float32 accuracy) computes it.
    """
    if precise is None:
        precise = np.asarray(x).dtype == np.float64
    if not precise:
        return erf32(np.asarray(x, dtype=np.float32)).astype(np.float64)
    if np.ndim(x) == 0:
        return erf(np.reshape(x, 1), precise).reshape(())
    x64 = np.asarray(x, dtype=np.float64)
    a = np.abs(x64)
    with np.errstate(invalid="ignore"):  # inf inputs make nan polynomial values that are then replaced
        out = np.copysign(_erf_abs_precise(a), x64)
    return np.where(np.isnan(x64), x64, out)


def _erf_same_dtype(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Erf in x's dtype: float64 precisely, float32 natively, narrower floats through float32."""
    if x.dtype == np.float64:
        return into(out, erf(x))
    if x.dtype == np.float32:
        return erf32(x, out)
    return into(out, erf32(x.astype(np.float32)).astype(x.dtype))


_erf_same_dtype.writes_out = True  # type: ignore[attr-defined]


# --- unary math --------------------------------------------------------------

CHEAP = {"Abs", "Neg", "Floor", "Ceil", "Sqrt", "Reciprocal", "Sign", "Round"}  # split from SPLIT_CHEAP on

_LEGACY_UNARY = {  # ops whose opset-1 form carries consumed_inputs
    "Abs": np.abs,
    "Neg": np.negative,
    "Floor": np.floor,
    "Ceil": np.ceil,
    "Sqrt": np.sqrt,
    "Exp": np.exp,
    "Log": np.log,
    "Reciprocal": np.reciprocal,
}

_UNARY = {  # op_type: (since, fn)
    "Acos": (7, np.arccos),
    "Asin": (7, np.arcsin),
    "Atan": (7, np.arctan),
    "Cos": (7, np.cos),
    "Sin": (7, np.sin),
    "Tan": (7, np.tan),
    "Acosh": (9, np.arccosh),
    "Asinh": (9, np.arcsinh),
    "Atanh": (9, np.arctanh),
    "Cosh": (9, np.cosh),
    "Sinh": (9, np.sinh),
    "Sign": (9, np.sign),
    "Erf": (9, _erf_same_dtype),
    "Round": (11, np.round),  # numpy rounds half to even, as ONNX requires
}

KERNELS: list = []  # records made by factories below; kernels_in finds the decorated ones by themselves
for _op, _fn in _LEGACY_UNARY.items():
    KERNELS += unary_kernels(_op, _fn, 1, legacy=True, name=_fn.__name__, at=SPLIT_CHEAP if _op in CHEAP else SPLIT_COSTLY)
for _op, (_since, _fn) in _UNARY.items():
    KERNELS += unary_kernels(_op, _fn, _since, name=getattr(_fn, "__name__", _op),
                             at=SPLIT_CHEAP if _op in CHEAP else SPLIT_COSTLY)


# --- binary arithmetic -------------------------------------------------------


def legacy_broadcast(a: np.ndarray, b: np.ndarray, broadcast: int, axis: int | None) -> np.ndarray:
    """Opset<7 broadcasting: B's dims line up with A's starting at ``axis`` (default: the tail)."""
    if not broadcast or axis is None or b.ndim == 0:
        return b
    axis = axis % a.ndim if a.ndim else 0
    trailing = a.ndim - axis - b.ndim
    return b.reshape(b.shape + (1,) * trailing) if trailing > 0 else b


def binary_kernels(
    op_type: str, fn: Fn, *, legacy: bool = True, consumed: bool = True, since: int = 7,
    inplace: bool | tuple[int, ...] = True, at: int = SPLIT_CHEAP,
) -> list:
    """Kernels of a broadcasting binary op: numpy rules from ``since``, axis rules before.

    ``fn(a, b, out=None)`` writes into ``out`` when given; ``inplace`` says out
    may alias an input: True for both, a tuple for those listed, False for none
    (ops whose output dtype differs). Outputs of ``at`` elements or more are
    split over the intra-op threads where that is simple (`split_flat`).
    """

    def modern(a, b, *, out=None):
        with np.errstate(all="ignore"):
            if out is None:
                return arr(fn(a, b))
            return out if split_flat(fn, (a, b), out, at) else fn(a, b, out=out)

    doc = "elementwise with numpy broadcasting."
    aliasable = (0, 1) if inplace is True else tuple(inplace or ())
    kernels = [declare(op_type, since, modern, doc, out=True, inplace=aliasable)]
    if not legacy:
        return kernels

    def v6(a, b, *, axis=None, broadcast=0):
        return modern(a, legacy_broadcast(a, b, broadcast, axis))

    kernels.append(declare(op_type, 6 if consumed else 1, v6, "elementwise; B broadcast to A from ``axis`` when asked."))
    if consumed:

        def v1(a, b, *, axis=None, broadcast=0, consumed_inputs=None):
            return v6(a, b, axis=axis, broadcast=broadcast)

        kernels.append(declare(op_type, 1, v1, f"as {op_type}-6 (consumed_inputs is a no-op)."))
    return kernels


def divide(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Div: true division for floats, C-style truncation toward zero for integers."""
    if a.dtype.kind not in "iu":
        return _same(np.divide)(a, b, out)
    # floor and trunc differ when the division is inexact and the signs differ
    fix = (np.remainder(a, b) != 0) & ((a < 0) != (b < 0)) if a.dtype.kind == "i" else None
    q = np.floor_divide(a, b, out=out)
    if fix is not None:
        q += fix.astype(q.dtype)
    return arr(q)


def _same(ufunc: Any) -> Fn:
    """A same-dtype ufunc op: straight into out, or through float32 for ml_dtypes types."""

    def run(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
        if is_exotic(a.dtype):
            return into(out, arr(ufunc(as_float(a), as_float(b)), a.dtype))
        return ufunc(a, b, out=out)

    return run


KERNELS += binary_kernels("Add", _same(np.add))
KERNELS += binary_kernels("Sub", _same(np.subtract))
KERNELS += binary_kernels("Mul", _same(np.multiply))
KERNELS += binary_kernels("Div", divide)


def power(x: np.ndarray, y: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Pow: result has X's dtype; mixed or negative-integer exponents go through float64."""
    if x.dtype == y.dtype and x.dtype.kind == "f":
        return np.power(x, y, out=out)
    if x.dtype.kind in "iu" and y.dtype.kind in "iu" and not np.any(y < 0):
        return np.power(x, y.astype(x.dtype), out=out)
    return into(out, arr(np.power(x.astype(np.float64), y.astype(np.float64)), x.dtype))


# out may be the base X (the result has its dtype); Y may have another dtype
KERNELS += binary_kernels("Pow", power, consumed=False, inplace=(0,), at=SPLIT_COSTLY)


@kernel("Mod", since=10)
def mod(a, b, *, fmod=0):
    """Mod-10: fmod=0 floors (sign of B), fmod=1 truncates (sign of A)."""
    with np.errstate(all="ignore"):
        if fmod:
            return arr(np.fmod(as_float(a), as_float(b)), a.dtype)
        return arr(np.mod(as_float(a), as_float(b)), a.dtype)




# --- variadic ----------------------------------------------------------------


def variadic_kernels(op_type: str, fold: Callable[..., np.ndarray], writes_out: bool = False) -> list:
    """Sum/Mean/Max/Min: opset 1 has consumed_inputs, from 8 inputs broadcast.

    With ``writes_out`` the fold accepts ``out=`` and the modern kernel declares
    out=/inplace=(0, 1): the first step reads inputs 0 and 1 before writing out,
    and each later input is added to out, which is then no input.
    """

    def plain(*xs):
        with np.errstate(all="ignore"):
            return arr(fold(list(xs)), xs[0].dtype)

    def into_out(*xs, out=None):
        if out is None or any(is_exotic(x.dtype) for x in xs):
            return into(out, plain(*xs))
        with np.errstate(all="ignore"):
            if len(xs) > 1 and split_flat(lambda *parts, out: fold(list(parts), out=out), xs, out, SPLIT_CHEAP):
                return out
            return fold(list(xs), out=out)

    modern = into_out if writes_out else plain

    def v1(*xs, consumed_inputs=None):
        return plain(*xs)

    kw: dict[str, Any] = {"out": True, "inplace": (0, 1)} if writes_out else {}
    return [
        declare(op_type, 6, modern, "elementwise over any number of broadcast inputs.", **kw),
        declare(op_type, 1, v1, f"as {op_type}-6 (consumed_inputs is a no-op)."),
    ]


def _fold(ufunc: Any) -> Callable[..., np.ndarray]:
    def run(xs: list, out: np.ndarray | None = None) -> np.ndarray:
        if out is not None:  # same order as below, so the result is bit-identical
            if len(xs) == 1:
                np.copyto(out, xs[0])
                return out
            ufunc(xs[0], xs[1], out=out)
            for x in xs[2:]:
                ufunc(out, x, out=out)
            return out
        if len(xs) == 1:
            return xs[0]
        return functools.reduce(ufunc, (as_float(x) for x in xs))

    return run


def _mean(xs: list) -> np.ndarray:
    total = _fold(np.add)(xs)
    return np.divide(total, np.asarray(len(xs), dtype=total.dtype))


KERNELS += variadic_kernels("Sum", _fold(np.add), writes_out=True)
KERNELS += variadic_kernels("Mean", _mean)
KERNELS += variadic_kernels("Max", _fold(np.maximum), writes_out=True)
KERNELS += variadic_kernels("Min", _fold(np.minimum), writes_out=True)
