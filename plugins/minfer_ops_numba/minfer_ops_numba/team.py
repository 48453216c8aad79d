"""Native teams: a kernel's split run by numba's OpenMP threads, handed over in about a microsecond, GIL-free.

Why: minfer's intra-op pool (minfer-parallel) hands a range to its worker
in 57-63 us on this 2-vCPU VM, even for an empty range: the worker, woken
in C, must take the GIL to start its Python part, and it sleeps while the
caller holds it. An empty two-way ``prange`` loop under numba's OpenMP
layer costs 1.3 us (numba's workqueue layer: 64 us), and a 1280x320x49
GEMM with a ReLU6 epilogue split over two OpenMP threads ran in 116 us
against 224 on one (`bench/results/session12/team.txt`). On MobileNet-sized
layers, where a kernel takes 20-200 us, only such a hand-over lets the
second core pay. A kernel whose whole split is compiled (its loop, its
BLAS call through `gemm`, its epilogue through `finish`) runs it in a
``@jit(parallel=True)`` driver, ``prange(team)``, when `size` says a
team of ``team`` threads runs (it sets numba's thread count for the
calling thread); otherwise it splits with
``minfer_core.parallel_for`` as before.

`size` is ``intra_op_threads()`` where numba's threading layer is OpenMP
or TBB (`LAYERS`: numba picks TBB when the tbb package is installed, else
OpenMP, whose libgomp comes with gcc's runtime), and 1 where it is neither,
outside a parallel session run, with ``MINFER_NUMBA_TEAM=0``, or in a
process forked after the team started (`_forked`). OpenMP's
threads inherit the CPU set of the thread that first starts a team, and
minfer-parallel pins a running session's thread to one CPU: so each thread
starts its team once with its CPU set widened to every CPU (`_start`).

Epilogues: a fused op's epilogue may describe itself (``epilogue.spec``,
docs/kernel-contract.md): activation name, its parameters and the residual
array; `native` turns that into `finish`'s arguments, with activation.py's
formulas (the same bits as the in-place activation kernels the Python
epilogue calls). A kernel given an epilogue without a spec, or with an
activation `native` does not know, runs its Python epilogue as before.
"""

from __future__ import annotations

import ctypes
import os
import threading
from typing import Any

import numpy as np

from minfer_core import claim_threads, intra_op_threads

from ._jit import jit, uintp  # noqa: F401 (uintp: rebound to numba's type at compile)
from .activation import (CLIP, F32_MAX, HARD_SIGMOID, HARD_SWISH, LEAKY_RELU, ROUND, SWISH, _swish,  # noqa: F401
                         _round, _value, round_bounds)  # (_round, _value, _swish: compiled)

ENV = "MINFER_NUMBA_TEAM"
# How long an OpenMP thread spins for work (and the caller for its team at a loop's end) before it sleeps, unless
# the user set GOMP_SPINCOUNT or OMP_WAIT_POLICY: libgomp's default (300,000, ~7 ms here) made a loop whose other
# thread had lost its CPU to another process cost ~6 ms (the caller spun all of it); 20,000 is ~0.4 ms, longer than
# the gaps between the kernels of a run, so a run's hand-overs still find the team spinning.
SPINCOUNT = "20000"
LAYERS = ("omp", "tbb")
NONE = -1  # `finish`'s op when the epilogue has no activation (bias and residual only)


def prange(*args: int) -> range:  # pragma: no cover - rebound to numba.prange at compile
    """A stand-in for ``numba.prange`` in the modules that import it (see _jit._compile_module)."""
    return range(*args)


_state: dict[str, Any] = {}
_local = threading.local()
_lock = threading.Lock()


def size() -> int:
    """The team a kernel running now may use: the session's intra-op threads where a native team can run here
    (numba's threading layer is one of `LAYERS`, MINFER_NUMBA_TEAM is not 0), else 1 (split with parallel_for).
    A team claims the run's threads (``minfer_core.claim_threads``): the pool's threads sleep, and other
    kernels' `parallel_for` runs serially, until the run ends."""
    if intra_op_threads() < 2 or not available():
        return 1
    threads = claim_threads()
    if threads < 2:
        return 1
    team = min(threads, _state["max"])
    if getattr(_local, "team", 0) != team:  # numba's count is the calling thread's own (set in compiled code,
        if not getattr(_local, "started", False):  # it would make the drivers uncachable: set here, when it changes)
            _start()
        import numba

        numba.set_num_threads(team)
        _local.team = team
    if _WHERE is not None:
        cpu = _WHERE()
        if cpu != getattr(_local, "avoided", -1):
            _place(cpu)
    return team


def _cpu_query() -> Any:
    """libc's sched_getcpu (the CPU the calling thread is on), or None where there is none. (minfer-parallel's
    pool.py has the same few lines: a plugin imports only what minfer_core exports.)"""
    try:
        fn = ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [], ctypes.c_int
    return fn if fn() >= 0 else None


_WHERE = _cpu_query()


def _place(cpu: int) -> None:
    """Keep this thread's team off the CPU the thread is on (``cpu``), as minfer-parallel keeps its pool's
    workers: a session run pins its thread to its CPU, the team's threads wait for each other spinning, and a
    team thread Linux woke on the pinned CPU waited there for a scheduler tick (measured: a 140 us conv took
    8 ms in every run)."""
    _local.avoided = cpu
    tids = _local.__dict__.get("tids")
    if tids is None:
        tids = _local.tids = _team_tids()
    try:
        others = os.sched_getaffinity(0) | set(range(os.cpu_count() or 1))
    except OSError:
        return
    others.discard(cpu)
    if not others:
        return
    for tid in tids:
        try:
            os.sched_setaffinity(tid, others)
        except OSError:  # not allowed here (some containers): placement stays the scheduler's
            pass


def _team_tids() -> list[int]:
    """The native thread ids of this thread's team, but its own."""
    gettid = getattr(ctypes.CDLL(None), "gettid", None)
    if gettid is None:
        return []
    import numba

    install()  # call_int, before _tids compiles
    tids = np.zeros(numba.get_num_threads(), np.int64)
    _tids(ctypes.cast(gettid, ctypes.c_void_p).value, tids)
    mine = threading.get_native_id()
    return sorted({int(t) for t in tids if t and t != mine})


def available() -> bool:
    """Whether native teams run in this process (decided once, at the first call: it starts numba's threads)."""
    if "ok" not in _state:
        with _lock:
            if "ok" not in _state:
                ok = os.environ.get(ENV, "1") != "0"
                if ok and not any(v in os.environ for v in ("GOMP_SPINCOUNT", "OMP_WAIT_POLICY")):
                    os.environ["GOMP_SPINCOUNT"] = SPINCOUNT  # read by libgomp when numba first loads it, below
                if ok:
                    try:
                        _start()
                        import numba

                        ok = numba.threading_layer() in LAYERS
                        _state["max"] = numba.config.NUMBA_NUM_THREADS
                        if ok and _WHERE is not None:  # now (at build), not in the first kernel to ask `size`: 8 ms
                            _local.tids = _team_tids()  # (160 uncached), and the tuner dropped that kernel for it
                        if ok and hasattr(os, "register_at_fork"):
                            os.register_at_fork(after_in_child=_forked)
                    except (ValueError, ImportError, OSError):  # no threading layer loads
                        ok = False
                _state["ok"] = ok
    return _state["ok"]


def _forked() -> None:
    """In a forked child: no native teams. numba documents its OpenMP layer as not fork-safe (the parent's team
    threads do not exist in the child; this machine's libgomp started new ones, others may wait for the old);
    the kernels split with parallel_for, whose pools start afresh after a fork."""
    _state["ok"] = False
    _local.__dict__.clear()


@jit(parallel=True)
def _probe(out):  # pragma: no cover - compiled
    """An empty team's loop: starts the calling thread's OpenMP team."""
    for t in prange(out.size):
        out[t] = t


@jit(parallel=True)
def _tids(gettid, out):  # pragma: no cover - compiled
    """out[k] = the native id of the team's thread k (libc's ``gettid`` at the address given)."""
    for t in prange(out.size):
        out[get_thread_id()] = call_int(gettid)


def get_thread_id() -> int:  # pragma: no cover - rebound to numba.get_thread_id at compile
    """A stand-in for ``numba.get_thread_id`` (the team thread running the loop's iteration)."""
    return 0


def call_int(address: int) -> int:  # pragma: no cover - replaced
    """The int a C function without arguments at ``address`` returns, from compiled code (made numba's
    intrinsic by `install`)."""
    raise RuntimeError("team.call_int runs compiled only")


def _start() -> None:
    """Start this thread's team with the thread's CPU set widened to every CPU, then give the set back: the
    team's threads inherit the set, and a pinned session thread would put them all on its own CPU."""
    try:
        saved = os.sched_getaffinity(0)
        os.sched_setaffinity(0, set(range(os.cpu_count() or 1)))
    except (AttributeError, OSError):
        saved = None
    try:
        import numba

        _probe(np.zeros(max(2, numba.config.NUMBA_NUM_THREADS), np.int64))
    finally:
        if saved is not None:
            try:
                os.sched_setaffinity(0, saved)
            except OSError:
                pass
    _local.started = True


def native(epilogue: Any) -> tuple[int, np.float32, np.float32, np.ndarray | None] | None:
    """`finish`'s (op, a, b, residual) for a fused op's epilogue that describes itself (``epilogue.spec``), or
    None when it does not or its activation has no compiled form here."""
    spec = getattr(epilogue, "spec", None)
    if spec is None:
        return None
    activation, params, residual = spec
    found = activation_form(activation, params)
    if found is None or (residual is not None and residual.dtype != np.float32):
        return None
    return (*found, residual)


def activation_form(activation: str, params: tuple[float, ...]) -> tuple[int, np.float32, np.float32] | None:
    """`finish`'s (op, a, b) for a fused op's activation and parameters, None when it has no compiled form here."""
    found = _NATIVE.get((activation, params))
    if found is None:  # once per activation and parameters: `native` runs on every fused node's every call
        form = _FORMS.get(activation)
        made = form(list(params)) if form is not None else None
        found = _NATIVE[(activation, params)] = () if made is None else (made[0], np.float32(made[1]),
                                                                         np.float32(made[2]))
    return found or None


PLAIN = (NONE, np.float32(0), np.float32(0), None)  # `native`'s answer for no epilogue at all
_NATIVE: dict[tuple[str, tuple[float, ...]], tuple[Any, ...]] = {}  # `native`'s (op, a, b), () for none


def fits(z: np.ndarray | None, shape: tuple[int, ...]) -> bool:
    """Whether `native`'s residual ``z`` (None: none) can be read flat beside an output of ``shape``: it is
    C-contiguous and of that shape (float32: `native` checked)."""
    return z is None or (z.shape == tuple(shape) and z.flags.c_contiguous)


def _leaky(p: list[float]) -> tuple[int, float, float] | None:
    alpha = p[0] if p else 0.01
    return (LEAKY_RELU, alpha, 0.0) if alpha > 0 else None  # activation.py's condition for numpy's bits


def _rounding(p: list[float]) -> tuple[int, float, float] | None:
    """minfer-passes' rounding epilogue, params [scale, low, high] (a DequantConv's): ROUND (activation.py)."""
    bounds = round_bounds(p[1], p[2]) if len(p) == 3 and p[0] > 0 else None
    return None if bounds is None else (ROUND, p[0], float(bounds))


_FORMS = {
    "": lambda p: (NONE, 0.0, 0.0),
    "Relu": lambda p: (CLIP, 0.0, np.inf),
    "Clip": lambda p: (CLIP, p[0] if p else -F32_MAX, p[1] if len(p) > 1 else F32_MAX),
    "LeakyRelu": _leaky,
    "HardSigmoid": lambda p: (HARD_SIGMOID, p[0] if p else 0.2, p[1] if len(p) > 1 else 0.5),
    "HardSwish": lambda p: (HARD_SWISH, 1 / 6, 0.5),
    "Swish": lambda p: (SWISH, p[0] if p else 1.0, 0.0),
    "QuantizeDequantize": _rounding,
}


@jit
def finish(y, z, base, rows, cells, stride, bias, bias0, op, a, b):  # pragma: no cover - compiled
    """A fused op's epilogue on ``rows`` runs of ``cells`` elements of the flat (C-contiguous) output y, run r at
    y[base + r * stride:][:cells]: + bias[bias0 + r] (when bias has elements), + z at the same places (the
    residual, flat like y, when it has elements), then the activation ``op`` (`NONE`: none), in place, each step
    rounded to float32 in the fused op's order (its Python epilogue: numpy's add, then the activation kernel).

    The activation is a second pass over the run (in cache: a kernel's unit), `_activate`'s loop for its op: one
    loop doing every step stayed scalar where a kernel's driver inlined it (MobileNetV2's 32x112x112 depthwise
    + ReLU6: 717 us against 211 without the activation, 244 now; with a residual 576 -> 284)."""
    has_bias, has_z = bias.size > 0, z.size > 0
    for r in range(rows):
        at = base + r * stride
        if has_bias or has_z:
            v0 = bias[uintp(bias0 + r)] if has_bias else np.float32(0)
            for i in range(cells):
                v = y[uintp(at + i)]
                if has_bias:
                    v = v + v0
                if has_z:
                    v = v + z[uintp(at + i)]
                y[uintp(at + i)] = v
        if op != NONE:
            _activate(y, at, at + cells, op, a, b)


@jit
def _activate(y, lo, hi, op, a, b):  # pragma: no cover - compiled
    """y[lo:hi] = `_value`(y, op, a, b) in place, one loop per op so that each vectorizes."""
    if op == CLIP:
        for i in range(lo, hi):
            y[uintp(i)] = _value(y[uintp(i)], CLIP, a, b)
    elif op == LEAKY_RELU:
        for i in range(lo, hi):
            y[uintp(i)] = _value(y[uintp(i)], LEAKY_RELU, a, b)
    elif op == HARD_SIGMOID:
        for i in range(lo, hi):
            y[uintp(i)] = _value(y[uintp(i)], HARD_SIGMOID, a, b)
    elif op == HARD_SWISH:
        for i in range(lo, hi):
            y[uintp(i)] = _value(y[uintp(i)], HARD_SWISH, a, b)
    elif op == SWISH:
        for i in range(lo, hi):
            y[uintp(i)] = _swish(y[uintp(i)], a)
    elif op == ROUND:  # a DequantConv's rounding (its own loop too: through `_value`'s branches it stayed scalar)
        for i in range(lo, hi):
            y[uintp(i)] = _round(y[uintp(i)], a, b)
    else:
        for i in range(lo, hi):
            y[uintp(i)] = _value(y[uintp(i)], op, a, b)


NOTHING = np.zeros(0, np.float32)  # `finish`'s z when there is no residual, its bias when there is none
NOTHING.flags.writeable = False


def gemm_address() -> int:
    """The address of numpy's BLAS's ``cblas_sgemm`` with 64-bit integers (OpenBLAS as numpy's wheels ship it),
    or 0 where there is none (a kernel calling `gemm` then declines its nodes)."""
    if "gemm" not in _state:
        _state["gemm"] = _find_gemm()
    return _state["gemm"]


def _find_gemm() -> int:
    try:
        import threadpoolctl

        libraries = threadpoolctl.threadpool_info()
    except Exception:  # noqa: BLE001 - no threadpoolctl, or it failed to look: no native GEMM
        return 0
    numpy_dir = os.path.dirname(np.__file__).rstrip(os.sep)
    for info in libraries:
        path = info.get("filepath", "")
        if info.get("internal_api") != "openblas" or not path.startswith(numpy_dir):  # numpy's own, in numpy.libs
            continue
        try:
            library = ctypes.CDLL(path)
        except OSError:
            continue
        for name in ("scipy_cblas_sgemm64_", "cblas_sgemm64_"):
            fn = getattr(library, name, None)
            if fn is not None:
                return ctypes.cast(fn, ctypes.c_void_p).value or 0
    return 0


def gemm(address, m, n, k, a, lda, b, ldb, c, ldc, beta):  # pragma: no cover - replaced
    """C = A @ B + beta * C, row-major float32, by the ``cblas_sgemm`` at ``address`` (pointers and leading
    dimensions as integers), from compiled code. A stand-in, made numba's intrinsic by `install`. A
    negative ``ldb`` says B is stored transposed: B' (n, k) with rows -ldb apart (cblas' transB)."""
    raise RuntimeError("team.gemm runs compiled only")


def install() -> Any:
    """`gemm` as numba's intrinsic (made at the first call, importing numba then, never at import: _jit.py's
    docstring). A module whose compiled code calls it binds the result to its own name ``gemm`` before its
    first compile: compiled code looks the name up in its own module."""
    if getattr(gemm, "_is_intrinsic", False):
        return gemm
    from llvmlite import ir
    from numba import types
    from numba.extending import intrinsic

    i32, i64, f32 = ir.IntType(32), ir.IntType(64), ir.FloatType()
    ptr = f32.as_pointer()
    fnty = ir.FunctionType(ir.VoidType(), [i32, i32, i32, i64, i64, i64, f32, ptr, i64, ptr, i64, f32, ptr, i64])

    def typer(typingctx, address, m, n, k, a, lda, b, ldb, c, ldc, beta):
        def codegen(context, builder, sig, args):
            address, m, n, k, a, lda, b, ldb, c, ldc, beta = args
            fn = builder.inttoptr(address, fnty.as_pointer())
            row_major, no_trans = ir.Constant(i32, 101), ir.Constant(i32, 111)
            transposed = builder.icmp_signed("<", ldb, ir.Constant(i64, 0))
            trans_b = builder.select(transposed, ir.Constant(i32, 112), no_trans)
            ldb = builder.select(transposed, builder.neg(ldb), ldb)
            builder.call(fn, [row_major, no_trans, trans_b, m, n, k, ir.Constant(f32, 1.0),
                              builder.inttoptr(a, ptr), lda, builder.inttoptr(b, ptr), ldb,
                              builder.fptrunc(beta, f32) if beta.type != f32 else beta,
                              builder.inttoptr(c, ptr), ldc])
            return context.get_dummy_value()

        return types.void(*([types.int64] * 10), types.float32), codegen

    typer.__name__ = "gemm"
    made = intrinsic(typer)
    made._is_intrinsic = True  # type: ignore[attr-defined]
    globals()["gemm"] = made

    def call_typer(typingctx, address):
        def codegen(context, builder, sig, args):
            fn = builder.inttoptr(args[0], ir.FunctionType(i32, []).as_pointer())
            return builder.sext(builder.call(fn, []), i64)

        return types.int64(types.int64), codegen

    call_typer.__name__ = "call_int"
    globals()["call_int"] = intrinsic(call_typer)
    return made

