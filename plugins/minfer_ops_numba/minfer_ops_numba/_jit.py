"""How this plugin compiles: ``njit(nogil=True, cache=True, fastmath=False)``, cached in minfer's cache folder.

Compiled machine code is cached on disk so that a later process loads it
instead of compiling again (see README.md for the figures). The folder is,
first match wins:

- ``NUMBA_CACHE_DIR`` when the user set it (numba's own setting, for every
  numba function of the process);
- ``$MINFER_CACHE/numba`` (``MINFER_CACHE`` as the core reads it);
- ``~/.cache/minfer/numba``;

each in a subfolder ``minfer-ops-numba-<hash of the plugin's sources>``
(`sources_key`): an upgrade or an edit of any module compiles afresh, since
numba checks a cached function against its own file only. Within it each
module's functions are filed by module name and stamped with that hash
(`_install_locator`), so the same sources installed elsewhere or again (a new
clone, a reinstall) load what was compiled before. Other sources'
folders (older versions, other installs sharing the folder) are pruned once a
process, at its first compile (`prune`): those unused for STALE_DAYS, and
all but the KEEP_FOLDERS most recently used (~25 MB each).

Only this plugin's functions are pointed there: numba's ``config.CACHE_DIR``
is set while their dispatchers are made (numba picks a function's cache
folder then) and restored right after, so other numba code in the process
keeps numba's defaults. numba is imported, and a module's functions made
into dispatchers, at the first call of one of them (`Compiled`): kernels
call them when they are prepared, at build, never at import. An unwritable folder makes numba fall back to its
own locations (next to the sources, or its user-wide folder), never an error.

``nogil=True`` lets a compiled function run on another intra-op thread of
``minfer_core.parallel_for`` at the same time: the split over the cores is
minfer's pool's, not numba's ``parallel=True`` (which would start a second
thread pool competing with it for the same two cores). ``fastmath=False``
keeps IEEE semantics and the order of operations as written, so results
match the numpy kernels' within float32 rounding.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

CACHE_ENV = "NUMBA_CACHE_DIR"


# other sources' cache folders kept: the most recently used ones (another install sharing the folder touches its
# own at each process's first compile), none unused for STALE_DAYS. A pruned one only costs its next user a compile
KEEP_FOLDERS = 4
STALE_DAYS = 30
PREFIX = "minfer-ops-numba-"


def cache_dir() -> Path:
    """The folder compiled kernels are cached in (see the module docstring for the order), in a subfolder named
    for this plugin's sources (`sources_key`)."""
    explicit = os.environ.get(CACHE_ENV)
    base = Path(explicit) if explicit else Path(os.environ.get("MINFER_CACHE") or Path.home() / ".cache" / "minfer") / "numba"
    return base / f"{PREFIX}{sources_key()}"


def prune(own: Path, now: float, keep: int = KEEP_FOLDERS, stale_days: float = STALE_DAYS) -> list[Path]:
    """Remove the other ``minfer-ops-numba-*`` folders beside ``own`` that were last used (their modification time)
    more than ``stale_days`` before ``now``, or that are not among the ``keep`` most recently used; the removed ones.
    Errors (a folder another process removes, no permission) leave a folder in place, never raise."""
    try:
        others = [p for p in own.parent.iterdir() if p.name.startswith(PREFIX) and p != own and p.is_dir()]
        used = sorted(((p.stat().st_mtime, p) for p in others), reverse=True)
    except OSError:
        return []
    removed = []
    for rank, (mtime, folder) in enumerate(used):
        if rank >= keep or now - mtime > stale_days * 86400:
            shutil.rmtree(folder, ignore_errors=True)
            removed.append(folder)
    return removed


def _tend_cache() -> None:
    """Once a process, at its first compile: mark this sources' folder used, then `prune` the others."""
    own = cache_dir()
    try:
        own.mkdir(parents=True, exist_ok=True)
        os.utime(own)
    except OSError:
        return  # an unwritable folder: numba falls back to its own locations
    prune(own, time.time())


def _install_locator() -> None:
    """Put `SourcesLocator` first in numba's cache locators (for this package's files only; others go on to
    numba's own). numba's own locator for a folder given by ``NUMBA_CACHE_DIR`` files each function under a
    subfolder named for its source file's path and checks it against the file's modification time and size: a new
    clone, another install location or a reinstall of the same sources missed every entry, and a model's first
    build compiled all its kernels again (resnet50's in a fresh clone: 57 s instead of 1.5). Here the folder is
    named for the sources' hash already (`sources_key`): that hash is the stamp, the module's name the subfolder.
    A numba without this interface (``CacheImpl._locator_classes``) keeps its own behaviour."""
    from numba.core import caching

    classes = getattr(getattr(caching, "CacheImpl", None), "_locator_classes", None)
    base = getattr(caching, "UserProvidedCacheLocator", None)
    if not isinstance(classes, list) or base is None:
        return
    here = Path(__file__).resolve().parent

    class SourcesLocator(base):  # type: ignore[misc, valid-type]
        """This package's functions cached in the sources' folder, by module name, stamped with the sources' hash."""

        def __init__(self, py_func: Any, py_file: str) -> None:
            super().__init__(py_func, py_file)
            self._cache_path = str(cache_dir() / Path(py_file).stem)

        def get_source_stamp(self) -> Any:
            return sources_key()

        @classmethod
        def from_function(cls, py_func: Any, py_file: str) -> Any:
            if Path(py_file).resolve().parent != here:
                return None
            return super().from_function(py_func, py_file)

    classes.insert(0, SourcesLocator)


@functools.lru_cache(maxsize=1)
def sources_key() -> str:
    """A hash of this package's sources. numba checks a cached function against its own file only: a compiled
    caller inlines what it calls from other files (team.py's `finish`, loops.py's loops), and after a change
    there it would load code built on the old version. A folder per version of the sources loads none of it."""
    digest = hashlib.sha256()
    for path in sorted(Path(__file__).parent.glob("*.py")):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()[:12]


class Compiled:
    """A function to compile with numba on its first call, along with every other `jit` function of its module.

    numba itself is imported only then: ``import numba`` takes 0.2-2 s here (quiet or loaded host), and every
    process that loads minfer's plugins imports this one, whether or not its models have a node these kernels
    take.
    """

    __slots__ = ("fn", "dispatcher", "parallel", "numpy_errors", "inline")

    def __init__(self, fn: Callable[..., Any], parallel: bool = False, numpy_errors: bool = False,
                 inline: bool = False) -> None:
        self.fn = fn
        self.dispatcher: Any = None
        self.parallel = parallel
        self.numpy_errors = numpy_errors
        self.inline = inline

    def __call__(self, *args: Any) -> Any:
        if self.dispatcher is None:
            _compile_module(self.fn.__module__)
        return self.dispatcher(*args)


_PENDING: dict[str, list[Compiled]] = {}
_state: dict[str, bool] = {}
_LOCK = threading.RLock()  # reentrant: a module compiles the modules whose functions it calls


def jit(fn: Callable[..., Any] | None = None, *, parallel: bool = False, numpy_errors: bool = False,
        inline: bool = False) -> Any:
    """``numba.njit(nogil=True, cache=True, fastmath=False)``, applied at the first call, cached in `cache_dir`.

    ``@jit(parallel=True)`` also compiles ``numba.prange`` loops to run on numba's threads (team.py: only its
    drivers, called when `team.size` says a native team runs). ``@jit(numpy_errors=True)``: numba's
    ``error_model="numpy"``, a float division without the zero test Python's model puts before it (that test
    keeps a loop calling the function from vectorizing); for functions whose divisions are float only.
    ``@jit(inline=True)``: numba's ``inline="always"``, the function's body put into each caller's before LLVM
    sees it, for a small function an element loop calls (activation.py's `pow2`): called through a function that is
    itself inlined, LLVM left it a call an element (gelu.py's loop 8x slower)."""
    if fn is None:
        return lambda f: jit(f, parallel=parallel, numpy_errors=numpy_errors, inline=inline)
    compiled = Compiled(fn, parallel, numpy_errors, inline)
    _PENDING.setdefault(fn.__module__, []).append(compiled)
    return compiled


def _compile_module(name: str) -> None:
    """Make numba dispatchers of a module's `jit` functions and put them in its namespace, where compiled code
    looks up the functions it calls (and ``uintp``) when it compiles."""
    with _LOCK:
        pending = _PENDING.pop(name, [])
        if not pending:
            return
        import numba

        if not _state.get("tended"):
            _state["tended"] = True
            _tend_cache()
            _install_locator()

        namespace = vars(sys.modules[name])
        install = namespace.get("install_intrinsics")
        if callable(install):  # the module's numba intrinsics replace their stand-ins before its functions compile
            install()
        for key, value in list(namespace.items()):  # another module's jit function called from here: compiled
            if isinstance(value, Compiled) and value.fn.__module__ != name:
                if value.dispatcher is None:
                    _compile_module(value.fn.__module__)
                namespace[key] = value.dispatcher
        namespace["uintp"] = numba.uintp
        for stand_in in ("prange", "get_thread_id"):  # team.py's stand-ins, in the modules that import them
            if stand_in in namespace:
                namespace[stand_in] = getattr(numba, stand_in)
        saved = numba.config.CACHE_DIR
        numba.config.CACHE_DIR = str(cache_dir())
        try:
            made = [numba.njit(nogil=True, cache=True, fastmath=False, parallel=c.parallel,
                               error_model="numpy" if c.numpy_errors else "python",
                               inline="always" if c.inline else "never")(c.fn) for c in pending]
        finally:
            numba.config.CACHE_DIR = saved
        # every name in place before any proxy hands out its dispatcher: a thread calling one compiles it, and
        # compiling looks up the functions it calls in the namespace
        namespace.update((c.fn.__name__, d) for c, d in zip(pending, made))
        for compiled, dispatcher in zip(pending, made):
            compiled.dispatcher = dispatcher


def uintp(value: int) -> int:
    """An index as numba's unsigned ``uintp`` inside compiled code (the name is rebound to numba's type when a
    module compiles): numba then skips its negative-index check, which keeps loops from vectorizing."""
    return value


F32 = np.dtype(np.float32)


def input_type(ctx: Any, index: int = 0) -> Any:
    """The inferred TensorType of input ``index``, or None when unknown or absent."""
    types = ctx.input_types
    return types[index] if index < len(types) else None


def is_float32(ctx: Any, index: int = 0, rank: int | None = None) -> bool:
    """Whether input ``index`` is known to be float32 (of rank ``rank`` when given)."""
    t = input_type(ctx, index)
    return t is not None and t.dtype == F32 and (rank is None or t.rank == rank)


# above the numpy kernels (priority 0): where both apply, this plugin's is the registry's choice, and the one
# taken without timing (MINFER_TUNE=0)
PRIORITY = 10


def readonly(a: np.ndarray) -> np.ndarray:
    """A read-only view of ``a``: numba compiles a function once per argument type, and read-only is a type;
    feeds reach kernels read-only, so every input goes in so and one compiled version serves all."""
    if not a.flags.writeable:
        return a
    v = a.view()
    v.flags.writeable = False
    return v


def target(out: np.ndarray | None, shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Where a kernel declared ``out=True`` writes: the planned buffer when C-contiguous, else a fresh array."""
    return out if out is not None and out.flags.c_contiguous else np.empty(shape, dtype)


def delivered(y: np.ndarray, out: np.ndarray | None) -> np.ndarray:
    """``y`` (from `target`) in the planned buffer when there is one (y was written elsewhere when out was not
    C-contiguous)."""
    if out is None or out is y:
        return y
    np.copyto(out, y)
    return out


_ROW_ITEMS = {8: np.dtype(np.int64), 16: np.dtype(np.complex128)}  # copied as they are: same bits, NaNs kept


def contiguous(a: np.ndarray) -> np.ndarray:
    """``a`` C-contiguous (``a`` itself when it is). A Split's narrow outputs (a detector's [1, 768, 2] and
    [1, 768, 4] of its [1, 768, 9]) are copied a row as one 8- or 16-byte item: numpy copies such rows float by
    float (2.7 us for 768 rows, 1.3 so)."""
    if a.flags.c_contiguous:
        return a
    item = _ROW_ITEMS.get(a.shape[-1] * a.itemsize) if a.ndim else None
    if item is None or a.strides[-1] != a.itemsize:
        return np.ascontiguousarray(a)
    y = np.empty(a.shape, a.dtype)
    np.copyto(y.view(item), a.view(item))
    return y
