"""Choosing among ways to compute a node by timing them on its real inputs; choices persist across processes.

Where several installed kernels apply to a node (``applies=``), its step is a `Choice`: the first call with
new input shapes times each and keeps the fastest. A plugin choosing among its own methods calls `choose`.
Choices are stored by what was timed in ``<MINFER_CACHE>/tuning-<machine fingerprint>.jsonl`` for later
processes; ``MINFER_TUNE=0`` takes the highest priority untimed (docs/kernel-contract.md has the rules).
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
import threading
import time
import warnings
from contextvars import ContextVar, copy_context
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import attrs
import numpy as np

from .kernel import Kernel, KernelContext
from .parallel import intra_op_threads
from .plugins import _pref_key

TUNE_ENV = "MINFER_TUNE"
# set by the executor around runs of a planned shape: timing happens in a shape's first run, never later
STEADY: ContextVar[bool] = ContextVar("minfer_steady_run", default=False)
# while `choose` times a candidate: the best time of the others so far. A `choose` inside (a plugin's own methods)
# whose usual best is a clear loser against it stops there (MobileNetV2 b1: numpy's Conv timed its depthwise layouts,
# 2-19 ms a node, 80-100 of a 140 ms first run, then lost to the numba kernels by 10-50x)
OUTER: ContextVar[float] = ContextVar("minfer_outer_best", default=float("inf"))
# each candidate runs up to ROUNDS times, round by round, and keeps its best time. A first call is a cold one (its
# scratch, BLAS's buffers and the output first touched, per-shape tables: resnet50's 7x7 stem by smallconv.py 6-23 ms
# first, 2 warm, lost to numpy's 3.5 and kept it), so one over COLD_LOSS times the best after the first round is not
# run again (a cold first run of mobilenet_v2 timed 4-7 candidates a node), one over CLEAR_LOSS after the second; under
# WARM seconds every candidate runs the second round (a depthwise kernel 14-18 us first, 5-6 warm, against 5-10).
# Three rounds: with two, a candidate had one warm call, which a backward second round made the one right after the
# first round's last (numpy's Conv of a depthwise layer, 0.3-4 ms through its own methods): MobileNetV3-small's
# 16x112x112 stride-2 depthwise timed its fastest kernel (35 us warm) 88 and 86 us, took one of 50
# (bench/results/session23/tuning-rounds.txt; the cold first calls: bench/results/session27/stem-choice.txt)
ROUNDS, CLEAR_LOSS, COLD_LOSS, WARM, MARGIN = 3, 2.0, 10.0, 50e-6, 1.1
# a choice is stored for later processes only when the timing thread ran at least this share of every timing: under
# another process's load a candidate lost by waiting for a CPU (the test suite stored numpy's conv for a depthwise
# layer that way: MobileNetV2 8.3 ms a run instead of 3.5, in every later process)
CALM = 0.8


def enabled() -> bool:
    """Whether choices are made by timing (``MINFER_TUNE`` is not ``0``)."""
    return os.environ.get(TUNE_ENV, "1") != "0"


@functools.lru_cache(maxsize=1)
def fingerprint() -> str:
    """This machine as its timings depend on it: CPU model (with family, model, stepping and flags: a cloud VM's
    name, "AMD EPYC", is one for several generations) and count, architecture, numpy and Python versions."""
    try:  # /proc/cpuinfo first: platform.processor() runs `uname -p` in a subprocess (ms in a first run)
        lines = open("/proc/cpuinfo").read().split("\n\n")[0].splitlines()  # the first CPU's block
        first = {k.strip(): v for k, v in (ln.split(":", 1) for ln in lines if ":" in ln)}
    except OSError:
        first = {}
    cpu = "|".join(first.get(k, "").strip() for k in ("model name", "cpu family", "model", "stepping", "flags")).strip("|")
    raw = f"{platform.machine()}|{cpu or platform.processor()}|{os.cpu_count()}|numpy {np.__version__}|{sys.version_info[:2]}"
    return hashlib.sha256(raw.encode()).hexdigest()[:16]


class ChoiceStore:
    """The persisted choices of one machine: JSON lines ``[key, choice]``, appended (a key's last line wins)."""

    def __init__(self, path: Path) -> None:
        self.path, self.data, self._lock = path, self._read(path), threading.Lock()

    def put(self, key: str, value: str) -> None:
        # one short appended line: other processes' lines stay, and a first run timing dozens of nodes does
        # not rewrite a file of thousands of choices each time (that took ~90 ms a choice at 1.5 MB)
        with self._lock:
            self.data[key] = value
            try:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.path, "a", encoding="utf-8") as fh:
                    fh.write("\n" + json.dumps([key, value]))  # a line of its own even after a torn one
            except OSError as exc:  # a read-only home: the choice still holds in this process
                warnings.warn(f"minfer could not store a tuning choice in {self.path}: {exc}", stacklevel=2)

    @staticmethod
    def _read(path: Path) -> dict[str, str]:
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except (OSError, ValueError):
            return {}
        data: dict[str, str] = {}
        for line in lines:
            try:
                key, value = json.loads(line)
                data[str(key)] = str(value)
            except (ValueError, TypeError):  # a line cut short by a crash, or not a choice
                pass
        return data


_STORES: dict[str, ChoiceStore] = {}  # by MINFER_CACHE's value: a first run asks per node, and a Path costs ~10 us


def store() -> ChoiceStore:
    """The choice store of this machine in the cache folder (``MINFER_CACHE``, default ``~/.cache/minfer``)."""
    folder = os.environ.get("MINFER_CACHE") or ""
    return _STORES.get(folder) or _STORES.setdefault(folder, ChoiceStore(  # the file is read once per process
        Path(folder or Path.home() / ".cache" / "minfer") / f"tuning-{fingerprint()}.jsonl"))


def choose(key: str, names: Sequence[str], time_one: Callable[[int], float], prior: str | None = None,
           margin: float = MARGIN) -> int:
    """The index of the fastest of ``names`` (the usual best first: another must beat it ``margin``-fold) for ``key``:
    as stored, else timed now with ``time_one(i)`` and stored (for later processes too unless another process's
    load disturbed the timing: `CALM`). ``time_one(i)`` runs candidate ``i`` once on the real inputs and returns
    its seconds (inf: it declines, unrun). Without timing (one candidate, ``MINFER_TUNE=0``, or a key first met in
    a later run of a shape, as when the thread count changes) it is 0, or ``prior``: the name an earlier input
    shape of the same node chose, which a new shape also takes untimed and unstored, unless ``MINFER_TUNE=all``.
    Called while a `choose` times its candidates (`OUTER`), it is 0 as soon as names[0] lost clearly to them."""
    if len(names) < 2 or not enabled():
        return 0
    chosen = store().data.get(full := f"{key}|{','.join(names)}")
    if chosen in names:
        return list(names).index(chosen)
    if STEADY.get() or (prior in names and os.environ.get(TUNE_ENV) != "all"):
        return list(names).index(prior) if prior in names else 0
    best, calm, outer = [float("inf")] * len(names), True, OUTER.get()
    for r in range(ROUNDS):  # every other round backwards: no candidate always runs right after the same one
        for i in [j for j in range(len(names)) if best[j] <= (COLD_LOSS if r < 2 else CLEAR_LOSS) * min(best) or min(best) < WARM and r < 2][:: 1 - 2 * (r % 2)]:
            cpu, inner = time.thread_time(), copy_context()  # the candidate's own `choose` sees the others' best
            inner.run(OUTER.set, min(best))
            best[i] = min(best[i], took := inner.run(time_one, i))
            # else this thread waited for a CPU (a candidate timed inf declined without running: nothing to wait for)
            calm = calm and (took == float("inf") or time.thread_time() - cpu >= CALM * took)
            if i == 0 and WARM <= outer < best[0] / CLEAR_LOSS:  # the enclosing timing's clear loser: unstored
                return 0
    win = best.index(min(best))
    win = 0 if best[0] <= margin * best[win] else win  # names[0], the usual best, stays unless clearly beaten
    store().put(full, names[win]) if calm else store().data.setdefault(full, names[win])  # disturbed: this process'
    return win


def seconds(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> float:
    """How long one call of ``fn(*args, **kwargs)`` takes."""
    start = time.perf_counter()
    fn(*args, **kwargs)
    return time.perf_counter() - start


class Choice:
    """A node's run callable over several kernels' prepared callables: per input shapes, the one `choose` picks.

    Timing runs apply the epilogue (its cost is each kernel's) into a copy of
    ``out``, the real output getting it once; given no ``out``, none.
    """

    def __init__(self, key: str, names: list[str], fns: list[Callable[..., Any]], static: bool = False) -> None:
        self.key, self.names, self.fns, self.static = key, names, fns, static  # static: one input shape ever
        self._chosen: dict[tuple[Any, ...], Callable[..., Any]] = {}
        self._prior: str | None = None  # the name the last new input shapes chose: the next ones' `choose` prior
        self.last: Callable[..., Any] | None = None  # what the last call looked up ran: `settled`

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(self._chosen) == 1 and STEADY.get():  # one shape met (in first runs): skip the 1.6 us key
            return next(iter(self._chosen.values()))(*args, **kwargs)  # (any candidate computes any shape)
        shapes = tuple((a.shape, a.dtype.str) if isinstance(a, np.ndarray) else None for a in args)
        fn = self._chosen.get(shapes)
        if fn is None:
            trial = ({**kwargs, "out": kwargs["out"].copy()} if kwargs.get("out") is not None else  # touched: no
                     {**kwargs, "epilogue": None} if "epilogue" in kwargs else kwargs)  # first-touch faults timed
            key = f"{self.key}|{shapes}|threads={intra_op_threads()}"
            won = choose(key, self.names, lambda i: seconds(self.fns[i], *args, **trial), self._prior)
            fn = self._chosen[shapes] = self.fns[won]
            self._prior = self.names[won]
            if self.static:  # no other shape will come: the losers' packed weights go (they held a second copy)
                self.names, self.fns = [self.names[won]], [fn]  # (then `choose` has one name: no timing)
        self.last = fn
        return fn(*args, **kwargs)


def settled(fn: Callable[..., Any]) -> Callable[..., Any]:
    """A step's callable with its `Choice` (bare, or under a partial binding an epilogue) replaced by the candidate
    the Choice's last call ran: a planned shape's steps call the chosen kernel directly (a look-up costs ~1 us)."""
    inner = fn.func if type(fn) is functools.partial else fn
    last = inner.last if type(inner) is Choice else None
    return fn if last is None else last if inner is fn else functools.partial(last, *fn.args, **fn.keywords)


def node_kernels(registry: Any, ctx: KernelContext, attributes: Mapping[str, Any], domain: str,
                 provider: str) -> tuple[Kernel, list[Kernel]] | None:
    """(what the node's step declares, the kernels it runs), None when no kernel can compute the node.

    Candidates: the kernels that apply and call like the top-priority one (same ``out`` and ``epilogue``),
    unless a preference names a plugin or tuning is off. Several declare what holds for all (never in place,
    views unless none may, packed only where all pack).
    """
    top = registry.select_kernel(domain, ctx.op_type, ctx.opset, provider, ctx, attributes)
    if top is None:
        return None
    rest = [k for k in registry.kernel_candidates(domain, ctx.op_type, ctx.opset, provider, ctx, attributes)
            if k is not top and (k.out, k.epilogue) == (top.out, top.epilogue)]
    if not rest or not enabled() or _pref_key(domain, ctx.op_type) in registry.preferences:  # the user chose
        return top, [top]
    kernels = [top, *rest]
    packed = set(top.packed).intersection(*(k.packed if k.prepare else () for k in rest))
    declared = attrs.evolve(top, inplace=(), packed=tuple(sorted(packed)),
                            views=False if all(k.views is False for k in kernels) else None)
    return declared, kernels


def prepare(kernels: Sequence[Kernel], ctx: KernelContext, attributes: Mapping[str, Any], registry: Any = None) -> Callable[..., Any]:
    """The run callable of a node over `node_kernels`' kernels: the one kernel's, or a `Choice` among them.

    A candidate is named with its plugin's version: a stored choice holds until a plugin is upgraded.
    """
    if len(kernels) == 1:
        return kernels[0].prepared(ctx, attributes)
    consts = [None if c is None else c.shape for c in ctx.constants]
    key = f"{kernels[0].domain}::{ctx.op_type}-{ctx.opset}|{sorted(attributes.items())}|consts={consts}"
    info = getattr(registry, "plugins", {})
    names = [f"{k.plugin}-{getattr(info.get(k.plugin), 'version', '')}:{k.fn.__module__}.{k.fn.__qualname__}" for k in kernels]
    # static: the node meets one input shape ever, so the losers of its one choice are dropped
    return Choice(key, names, [k.prepared(ctx, attributes) for k in kernels], all(t is None or t.is_static for t in ctx.input_types))


def prepare_node(registry: Any, ctx: KernelContext, attributes: Mapping[str, Any], domain: str = "",
                 provider: str = "numpy") -> tuple[Kernel, Callable[..., Any]] | None:
    """`node_kernels` then `prepare`: what a fused op's kernel uses to run its base op (``FusedConv``'s Conv)."""
    found = node_kernels(registry, ctx, attributes, domain, provider)
    return None if found is None else (found[0], prepare(found[1], ctx, attributes, registry))
