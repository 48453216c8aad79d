"""Per-thread scratch buffers (a kernel's working memory): kept between calls, so a run allocates nothing.

A kernel that needs working memory beyond its output (an im2col slab, a
padded copy, the blocks of a blocked activation) asks for it by name::

    from minfer_core import scratch

    cols = scratch("myplugin.im2col", (k, width), x.dtype)

Each thread has its own buffer per name, grown to the largest size asked
and never shrunk by use, so two threads of a `parallel_for` never share
one and a kernel needs no lock. The contents are undefined on every call.
A kernel that needs two buffers at once gives them two names; names are
per process, so prefix them with the plugin's. `release_scratch` drops
buffers (a kernel's tuner after trials that grew another thread's scratch
for a method it did not choose), and `scratch_bytes` says what all threads
hold: peak memory is the arena plus this.
"""

from __future__ import annotations

import math
import os
import threading
import weakref

import numpy as np


class _Buffers:
    """One thread's buffers by name; weakly listed, so a thread that ends (or is lost in a fork) frees them."""

    __slots__ = ("held", "last", "__weakref__")

    def __init__(self) -> None:
        self.held: dict[str, np.ndarray] = {}
        # per name, the last (shape, dtype) asked and the view given: tiles ask the same again and again
        self.last: dict[str, tuple[tuple[int, ...], np.dtype, np.ndarray]] = {}


_local = threading.local()
_every: "weakref.WeakSet[_Buffers]" = weakref.WeakSet()
_every_lock = threading.Lock()


def _new_lock_after_fork() -> None:
    """A forked child (a process team's worker) has only the forking thread: a lock another thread held
    at the fork would stay taken for good."""
    global _every_lock
    _every_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_new_lock_after_fork)


def _mine() -> _Buffers:
    bufs = _local.__dict__.get("buffers")
    if bufs is None:
        bufs = _local.__dict__["buffers"] = _Buffers()
        with _every_lock:
            _every.add(bufs)
    return bufs


def scratch(name: str, shape: tuple[int, ...], dtype: np.dtype | type = np.float32) -> np.ndarray:
    """An uninitialized C-contiguous array private to the calling thread, reused by its next call with ``name``.

    Valid until this thread's next call with the same name (or a `release_scratch` of it).
    """
    bufs = _local.__dict__.get("buffers") or _mine()
    last = bufs.last.get(name)
    if last is not None and last[0] == shape and last[1] == dtype:
        return last[2]
    dtype = np.dtype(dtype)
    size = math.prod(shape) * dtype.itemsize
    buf = bufs.held.get(name)
    if buf is None or buf.nbytes < size:
        buf = bufs.held[name] = np.empty(max(size, 64), dtype=np.uint8)
    view = buf[:size].view(dtype).reshape(shape)
    bufs.last[name] = (tuple(shape), dtype, view)
    return view


def _all() -> list[_Buffers]:
    with _every_lock:
        return list(_every)


def release_scratch(*names: str, others_only: bool = False) -> int:
    """Drop the buffers of these names (all of them when none is given) of every thread; returns the bytes dropped.

    ``others_only``: keep the calling thread's. Arrays already handed out stay valid: the memory goes when
    the last one is gone. Another thread may be using its buffers meanwhile: call this between a kernel's
    `parallel_for` calls, not during one.
    """
    mine = _local.__dict__.get("buffers")
    dropped = 0
    for bufs in _all():
        if others_only and bufs is mine:
            continue
        held = bufs.held
        for name in list(held) if not names else names:  # list(): one step under the GIL
            buf = held.pop(name, None)
            bufs.last.pop(name, None)
            dropped += 0 if buf is None else buf.nbytes
    return dropped


def scratch_bytes() -> int:
    """Bytes of scratch all live threads of this process hold."""
    return sum(buf.nbytes for bufs in _all() for buf in list(bufs.held.values()))
