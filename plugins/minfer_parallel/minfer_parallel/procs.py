"""Intra-op parallelism over two processes: a forked worker takes a share of each conv's tiles.

Why processes: a kernel's half on the second *thread* needs the GIL for
every numpy call it makes, and on this kind of VM (idle vCPUs halt at
once) each contended hand-over of the GIL costs 25-75 us. A Winograd conv
makes ~60 numpy calls per tile, so two threads ran resnet50's 3x3 convs
only 1.1x faster than one. A forked worker has its own interpreter and GIL.

How (SPMD): the worker is a fork of this process taken after the build,
so it holds the same kernels, weights and step callables at the same
addresses. The arena is in memory both processes share (`shared_empty`).
For a step whose kernel declares ``spmd`` (every write to its output
happens inside ``parallel_for(..., outputs_only=True)``; anything else it
writes is private scratch), the executor sends the worker the step's key and
its arrays as (region, offset, shape, strides, dtype); then both processes
call the same kernel: each runs its own share of the output ranges and
computes the rest (padding copies, transforms of its own tiles) privately.
Shared counters in memory make the barrier at the end of each output
region (~1 us). Between runs the worker sleeps on a pipe.

What must hold for that to be right, and how it is kept:
- Both processes hold the same state: anything a kernel sets up on the
  first call for a shape (a tuner's timed choice) happens in the
  discovery run, after which the executor calls `state_changed`; the team
  re-forks at the next run when the state changed since its fork, and
  dispatches nothing during a run in which it changes.
- Arrays the worker gets live in shared memory; a step with any other
  array (a feed, a freshly allocated value) runs in this process alone.
- A failure in either process aborts the other's step; the executor then
  runs the step again alone (outputs are rewritten whole) and the worker
  is replaced at the next run.
"""

from __future__ import annotations

import atexit
import ctypes
import functools
import mmap
import os
import pickle
import signal
import threading
import time
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from minfer_core import using_pool

from .blas import set_blas_threads
from .pool import pin_caller, unpin_caller

# ---- shared memory and state generations ------------------------------------------------

_generation = 0


def state_changed() -> None:
    """Something a forked worker would need changed here (a new arena, a tuner's choice): re-fork before use."""
    global _generation
    _generation += 1


# (first address, end address, weak reference to the uint8 array) per shared region, in creation order
_regions: list[tuple[int, int, Any]] = []


def shared_empty(nbytes: int) -> np.ndarray:
    """A uint8 array of ``nbytes`` in memory a forked worker shares (contents undefined, zero on Linux).

    Where there is no fork (no MAP_SHARED), a plain array: no team will need it.
    """
    if not hasattr(mmap, "MAP_SHARED"):
        return np.empty(int(nbytes), dtype=np.uint8)
    buf = mmap.mmap(-1, max(int(nbytes), 1), flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    arr = np.frombuffer(buf, dtype=np.uint8)[: int(nbytes)]
    lo = arr.__array_interface__["data"][0]
    _regions[:] = [r for r in _regions if r[2]() is not None]  # forgetting shifts indices: a re-fork follows
    _regions.append((lo, lo + max(int(nbytes), 1), weakref.ref(arr)))
    state_changed()
    return arr


def _locate(a: np.ndarray) -> tuple[Any, ...] | None:
    """(region index, byte offset, shape, strides, dtype) of an array in a shared region, else None."""
    lo = a.__array_interface__["data"][0]
    for k, (start, end, _ref) in enumerate(_regions):
        if start <= lo < end:
            return (k, lo - start, a.shape, a.strides, a.dtype.str)
    return None


def _view(desc: tuple[Any, ...]) -> np.ndarray:
    k, offset, shape, strides, dtype = desc
    root = _regions[k][2]()
    return np.ndarray(shape, dtype=np.dtype(dtype), buffer=root, offset=offset, strides=strides)


# arrays that never change once made (a model's initializers): the worker has the same object at the same id
_frozen: "weakref.WeakValueDictionary[int, np.ndarray]" = weakref.WeakValueDictionary()


def freeze(a: np.ndarray) -> None:
    """Declare ``a`` constant: a step may hand it to the worker as itself (made before the fork)."""
    _frozen[id(a)] = a


def encode(args: Sequence[Any]) -> list[Any] | None:
    """The arguments as the worker can rebuild them, or None if one of them is in neither shared nor frozen memory."""
    out: list[Any] = []
    for a in args:
        if a is None:
            out.append(None)
        elif type(a) is np.ndarray:
            if _frozen.get(id(a)) is a:
                out.append(id(a))
                continue
            desc = _locate(a)
            if desc is None:
                return None
            out.append(desc)
        else:
            return None
    return out


def decode(encoded: Sequence[Any]) -> list[Any]:
    return [None if d is None else _frozen[d] if type(d) is int else _view(d) for d in encoded]


class Dispatch:
    """Which of a plan's shareable steps the team runs together: each is timed both ways in the first runs.

    Sharing a step costs a message and a barrier or two (10-30 us) and pays only when the step's output
    ranges split evenly: shufflenet's small convs and pools at batch 1 lost. Runs alternate between
    sharing every candidate and sharing none, `TRIALS` times each, after one shared run that is not
    counted (a new worker's first writes to its scratch copy pages); then a step is shared when its best
    shared time was below `GAIN` of its best time alone.
    """

    TRIALS = 2
    GAIN = 0.9

    def __init__(self, candidates: Sequence[bool]) -> None:
        self.candidates = list(candidates)
        self.flags: list[bool] | None = None
        self.feeds: tuple[list[bool], list[int]] | None = None  # (the flags, the feed slots they read): a cache
        self._shared: list[list[float]] = []
        self._alone: list[list[float]] = []
        self._first = True
        self._none = [False] * len(self.candidates)

    def trial(self) -> list[bool] | None:
        """The flags for the next timed run, or None once decided (then use `flags`)."""
        if self.flags is not None:
            return None
        if not any(self.candidates):
            self.flags = self._none
            return None
        return self.candidates if self._first or len(self._shared) <= len(self._alone) else self._none

    def record(self, flags: Sequence[bool], times: list[float]) -> None:
        if self._first:
            self._first = False
            return
        (self._shared if flags is self.candidates else self._alone).append(times)
        if len(self._alone) >= self.TRIALS and len(self._shared) >= self.TRIALS:
            n = len(self.candidates)
            shared = [min(t[i] for t in self._shared) for i in range(n)]
            alone = [min(t[i] for t in self._alone) for i in range(n)]
            self.flags = [c and s < self.GAIN * a for c, s, a in zip(self.candidates, shared, alone)]


TEAM, THREADS, SERIAL = "team", "threads", "serial"  # how a run uses the threads (executors.py, `ModeChoice`)


class ModeChoice:
    """For the process team: whether one input shape's runs use the team, from whole runs timed each way once its
    steps' sharing is set.

    The modes: ``team`` (kernels may claim the threads for a team of their own: here the process team's worker),
    ``threads`` (the run of the threads executor, in its own mode for the shape: executors.py's `_choose_mode`).
    Steps the team does not share run in this process alone, while the threads mode splits some of them (MatMuls,
    elementwise ops, softmax) over two threads: a transformer block at batch 1 shared none of its steps and ran
    20% slower with the team. So runs take the modes in turn `TRIALS` times each and the faster, by its best run,
    stays (the team's best divided by `GAIN`).
    """

    TRIALS = 2
    GAIN = 1.0  # the team stays when its best run took less than this times the others' best
    modes = (TEAM, THREADS)

    def __init__(self, team: bool | None = None) -> None:
        self.mode = None if team is None else TEAM if team else THREADS
        self._times: dict[str, list[float]] = {m: [] for m in self.modes}

    @property
    def team(self) -> bool | None:
        """Whether the team stays (None: still timing)."""
        return None if self.mode is None else self.mode == TEAM

    def want(self) -> str:
        """The mode of the next run: the decided one, else the one timed least (in `modes` order)."""
        if self.mode is not None:
            return self.mode
        return min(self.modes, key=lambda m: len(self._times[m]))

    def want_team(self) -> bool:
        return self.want() == TEAM

    def record(self, mode: str | bool, seconds: float) -> None:
        """A run's wall time in ``mode`` (True: the team, False: threads)."""
        if self.mode is not None:
            return
        self._times[TEAM if mode is True else THREADS if mode is False else mode].append(seconds)
        if all(len(t) >= self.TRIALS for t in self._times.values()):
            self.mode = min(self.modes, key=lambda m: min(self._times[m]) / (self.GAIN if m == TEAM else 1.0))


# ---- step registry ----------------------------------------------------------------------

_steps: "weakref.WeakValueDictionary[int, Callable[..., Any]]" = weakref.WeakValueDictionary()


def register(fn: Callable[..., Any]) -> int:
    """A key the worker resolves to this same callable (a bound step's partial, made before the fork)."""
    _steps[id(fn)] = fn
    return id(fn)


def shareable(steps: Sequence[Any]) -> list[bool]:
    """Per bound step: does its kernel write its output only in ranges a team may share (``spmd``, ``out=``)?"""
    flags = []
    for fn, *_ in steps:
        base = fn.func if isinstance(fn, functools.partial) else fn
        shared = bool(getattr(base, "spmd", False)) and isinstance(fn, functools.partial) and "out" in fn.keywords
        if shared:
            register(fn)  # the forked worker finds the step's callable by this key
        flags.append(shared)
    return flags


def _resolve(key: int) -> Callable[..., Any]:
    fn = _steps.get(key)
    if fn is None:
        raise RuntimeError(f"step {key} unknown in the worker")
    return fn


# ---- the team -----------------------------------------------------------------------------

# control words (int64) in the shared control block
_SEQ, _ACK, _ARRIVE0, _ARRIVE1, _FAILED, _ABORT, _DONE, _LEN, _RUNS = range(9)
_PAYLOAD = 64 * 8
_CONTROL_BYTES = 1 << 20
_PARK, _EXIT = "park", "exit"
_CHECK_EVERY = 1 << 16  # spins between checks that the other process is still alive
# after a run the worker keeps spinning this long for the next before it sleeps: waking a sleeping process
# costs 50-100+ us on this VM (its idle vCPU halts), which back-to-back runs would pay every time
LINGER = 0.005


class PeerFailed(Exception):
    """The other process of the team failed or left during a step."""


class RankPool:
    """The intra-op pool a kernel sees in one process of the team: ``threads`` is the team's size, and
    ``parallel_for(..., outputs_only=True)`` runs this rank's share of the ranges, then waits for the other."""

    ranked = True

    def __init__(self, team: "_Control", rank: int, ranks: int) -> None:
        self.team = team
        self.rank = rank
        self.threads = ranks

    def run(self, n: int, fn: Callable[[int, int], None], parts: int) -> None:
        fn(0, n)  # ranges that write private memory: each process computes all of them itself

    def run_outputs(self, n: int, fn: Callable[[int, int], None], parts: int) -> None:
        parts = max(1, min(parts, n))
        bounds = [n * k // parts for k in range(parts + 1)]
        # contiguous shares: tiles are cut in an order that keeps neighbours' inputs together
        ranks = self.threads
        lo, hi = -(-parts * self.rank // ranks), -(-parts * (self.rank + 1) // ranks)  # rank 0 takes a lone part
        try:
            if hi > lo:
                fn(bounds[lo], bounds[hi])
        finally:
            self.team.barrier(self.rank)


class SoloPool:
    """The pool of a process-team run's steps that run in this process alone: every range here, serially.

    Its ``threads`` equals the team's size so that per-thread-count choices (the conv tuner's) are made
    once, for the count the team's steps run with.
    """

    ranked = True

    def __init__(self, ranks: int) -> None:
        self.threads = ranks

    def run(self, n: int, fn: Callable[[int, int], None], parts: int) -> None:
        fn(0, n)

    run_outputs = run


class _Control:
    """The shared control block: counters, the payload, and the barrier both processes use."""

    def __init__(self) -> None:
        self.buf = mmap.mmap(-1, _CONTROL_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        self.words = np.frombuffer(self.buf, dtype=np.int64, count=_PAYLOAD // 8)
        self.payload = memoryview(self.buf)[_PAYLOAD:]
        self.seq = 0
        self.peer_alive: Callable[[], bool] = lambda: True

    def _stop(self, rank: int) -> bool:
        w = self.words
        return (w[_FAILED] == w[_SEQ]) if rank == 0 else (w[_ABORT] == w[_SEQ])

    def barrier(self, rank: int) -> None:
        w = self.words
        mine, theirs = (_ARRIVE0, _ARRIVE1) if rank == 0 else (_ARRIVE1, _ARRIVE0)
        w[mine] += 1
        target = w[mine]
        spins = 0
        while w[theirs] < target:
            spins += 1
            if spins % 512 == 0 and self._stop(rank):
                raise PeerFailed("the other process of the team failed during this step")
            if spins % _CHECK_EVERY == 0 and not self.peer_alive():
                raise PeerFailed("the other process of the team is gone")


class Team:
    """This process (rank 0) and one forked worker (rank 1), forked again whenever `state_changed`."""

    def __init__(self) -> None:
        self.pid = 0
        self.generation = -1
        self.control: _Control | None = None
        self.wake_fd = -1
        self.lock = threading.Lock()
        self.broken = False
        self.awake = False
        self.pool0: RankPool | None = None
        self.solo = SoloPool(2)
        self.shared_steps = 0  # steps run together with a worker, ever (tests and diagnostics)
        self.forks = 0

    # -- lifetime --
    def ready(self) -> bool:
        """Fork (again) if the state changed since the last fork or the worker failed; False if we cannot."""
        if self.pid and not self.broken and self.generation == _generation:
            return True
        self.stop()
        try:
            self._fork()
        except OSError:
            return False
        return True

    def _fork(self) -> None:
        control = _Control()
        read_fd, write_fd = os.pipe()
        parent = os.getpid()
        gen = _generation
        pid = os.fork()
        if pid == 0:  # the worker
            try:
                os.close(write_fd)
                _worker(control, read_fd, parent)
            finally:
                os._exit(0)
        os.close(read_fd)
        self.pid, self.control, self.wake_fd, self.generation = pid, control, write_fd, gen
        self.forks += 1
        self.broken = False
        self.awake = False
        control.peer_alive = self._alive
        self.pool0 = RankPool(control, 0, 2)

    def _alive(self) -> bool:
        try:
            done, _ = os.waitpid(self.pid, os.WNOHANG)
        except ChildProcessError:
            return False
        return done == 0

    def stop(self) -> None:
        if not self.pid:
            return
        pid, self.pid = self.pid, 0
        try:
            os.close(self.wake_fd)  # the worker reads EOF and leaves
        except OSError:
            pass
        self.wake_fd = -1  # (the number may be reused: never close it twice)
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (OSError, ChildProcessError):
            pass
        self.control = None
        self.awake = False

    # -- runs --
    def begin(self) -> bool:
        """A run starts: wake the worker (it spins for steps until `end`). False: no team this run."""
        if len(os.sched_getaffinity(0)) < 2:  # two spinning processes on one CPU wait for each other's ticks
            return False
        if not self.lock.acquire(blocking=False):
            return False
        try:
            if not self.ready():
                self.lock.release()
                return False
            os.write(self.wake_fd, b"w")  # one byte per run, written before the count the worker may be watching
        except OSError:  # the worker is gone (EPIPE): this run goes alone, the next forks a new one
            self.broken = True
            self.lock.release()
            return False
        assert self.control is not None
        self.control.words[_RUNS] += 1
        _place(self.pid)
        self.awake = True
        return True

    def end(self) -> None:
        """The run ended: send the worker back to sleep."""
        try:
            if self.awake and not self.broken and self.control is not None:
                self._post(_PARK)
                self._wait_ack()
        except PeerFailed:
            self.broken = True
        finally:
            if self.broken:
                self.stop()  # a worker that failed a step is not left spinning between runs
            self.awake = False
            _unplace()
            self.lock.release()

    def usable(self) -> bool:
        return self.awake and not self.broken and self.generation == _generation

    def _post(self, message: Any) -> None:
        c = self.control
        assert c is not None
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if len(data) > len(c.payload):
            raise ValueError("step message too large")
        c.payload[: len(data)] = data
        c.words[_LEN] = len(data)
        c.seq += 1
        c.words[_SEQ] = c.seq

    def _wait_ack(self) -> None:
        c = self.control
        assert c is not None
        spins = 0
        while c.words[_ACK] != c.seq:
            spins += 1
            if spins % _CHECK_EVERY == 0 and not self._alive():
                raise PeerFailed("the worker process is gone")

    def run_step(self, fn: Callable[..., Any], args: list[Any], encoded: list[Any]) -> Any:
        """``fn(*args)`` with the worker running its share; raises PeerFailed if the worker failed."""
        c = self.control
        assert c is not None and self.pool0 is not None
        self._post((id(fn), encoded))  # `register`ed when its plan was bound, before the fork
        self.shared_steps += 1
        try:
            with using_pool(self.pool0):
                res = fn(*args)
        except PeerFailed:
            self.broken = True
            raise
        except BaseException:
            c.words[_ABORT] = c.seq  # the worker leaves the step at its next barrier
            self.broken = True
            raise
        spins = 0
        w = c.words
        while w[_DONE] != c.seq:
            spins += 1
            if w[_FAILED] == c.seq or (spins % _CHECK_EVERY == 0 and not self._alive()):
                self.broken = True
                raise PeerFailed("the worker process failed its share of the step")
        return res


def _worker(control: _Control, read_fd: int, parent: int) -> None:
    """The worker's loop: sleep until woken, then run steps until told to park."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _die_with_parent()
    set_blas_threads(1)
    control.peer_alive = lambda: os.getppid() == parent
    pool = RankPool(control, 1, 2)
    w = control.words
    seen = 0  # the block is new; the parent may have posted before this line runs
    runs = 0
    while True:
        _linger(w, runs)  # whether or not the run started meanwhile, its byte is (or will be) in the pipe
        if not os.read(read_fd, 1):
            return  # the parent closed the pipe
        runs += 1
        while True:
            spins = 0
            while w[_SEQ] == seen:
                spins += 1
                if spins % _CHECK_EVERY == 0 and os.getppid() != parent:
                    return
            seen = int(w[_SEQ])
            message = pickle.loads(control.payload[: int(w[_LEN])])
            control.seq = seen
            w[_ACK] = seen
            if message == _PARK:
                break
            if message == _EXIT:
                return
            key, encoded = message
            try:
                fn = _resolve(key)
                with using_pool(pool):
                    fn(*decode(encoded))
            except PeerFailed:
                pass  # the parent aborted the step
            except BaseException:
                w[_FAILED] = seen
                continue
            w[_DONE] = seen


def _linger(w: np.ndarray, runs: int) -> bool:
    """Spin up to LINGER seconds for run ``runs + 1`` to start; True if it did."""
    clock = time.perf_counter
    end = clock() + LINGER
    spins = 0
    while w[_RUNS] == runs:
        spins += 1
        if spins % 256 == 0 and clock() > end:
            return False
    return True


def _die_with_parent() -> None:
    try:
        libc = ctypes.CDLL(None)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def _place(worker: int) -> None:
    """Pin this thread to its CPU and the worker to the others for the run (two spinners must not share one)."""
    cpus = os.sched_getaffinity(0)
    here = pin_caller()
    if here is not None:
        try:
            os.sched_setaffinity(worker, cpus - {here})
        except OSError:  # the worker is gone: its step fails over to this process
            pass


def _unplace() -> None:
    unpin_caller()


_team: Team | None = None


def team() -> Team | None:
    """The process's team (made on first use), or None where processes cannot fork or there is one CPU."""
    global _team
    if _team is None:
        if not hasattr(os, "fork") or not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2:
            return None
        if not _handlers:
            # with the first team, not at import: a process that never forks a worker registers nothing
            os.register_at_fork(after_in_child=_forget_after_fork)
            atexit.register(_shutdown)
            _handlers.append(True)
        _team = Team()
    return _team


_handlers: list[bool] = []


def worker_cpu_seconds() -> float:
    """CPU-seconds the live worker of this process's team has used (0 without one)."""
    if _team is None or not _team.pid:
        return 0.0
    try:
        with open(f"/proc/{_team.pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _forget_after_fork() -> None:
    """A process forked from a team's parent (our worker, or the program's own fork) has no team."""
    global _team
    if _team is not None and _team.wake_fd >= 0:
        try:
            os.close(_team.wake_fd)  # else the worker would not see EOF when its parent lets go of it
        except OSError:
            pass
    _team = None


def _shutdown() -> None:
    if _team is not None:
        _team.stop()

