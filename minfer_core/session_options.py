"""onnxruntime's session options for minfer: `SessionOptions`, `RunOptions`, the enums, providers.

Attributes have onnxruntime's names and defaults; setting one minfer does not
support raises `UnsupportedOptionError` listing those it does
(docs/onnxruntime-api.md has the table). `InferenceSession` (session.py)
reads them.
"""

from __future__ import annotations

import enum
import os
from typing import Any, Callable, Mapping

from .errors import UnsupportedOptionError

CPU = "CPUExecutionProvider"
DOCS = "docs/onnxruntime-api.md"


def get_available_providers() -> list[str]:
    """The execution providers minfer offers: the CPU only (numpy and the installed kernel plugins)."""
    return [CPU]


def get_device() -> str:
    """The device minfer computes on, as onnxruntime names it."""
    return "CPU"


class GraphOptimizationLevel(enum.IntEnum):
    """onnxruntime's optimization levels; each maps to a minfer pass level (`PASS_LEVELS`)."""

    ORT_DISABLE_ALL = 0
    ORT_ENABLE_BASIC = 1
    ORT_ENABLE_EXTENDED = 2
    ORT_ENABLE_LAYOUT = 3
    ORT_ENABLE_ALL = 99


class ExecutionMode(enum.IntEnum):
    """onnxruntime's execution modes: ORT_PARALLEL runs independent branches concurrently (inter_op "auto")."""

    ORT_SEQUENTIAL = 0
    ORT_PARALLEL = 1


PASS_LEVELS = {
    GraphOptimizationLevel.ORT_DISABLE_ALL: "none",
    GraphOptimizationLevel.ORT_ENABLE_BASIC: "basic",
    GraphOptimizationLevel.ORT_ENABLE_EXTENDED: "extended",
    # minfer has no separate layout level: layout rewrites belong to "all"
    GraphOptimizationLevel.ORT_ENABLE_LAYOUT: "all",
    GraphOptimizationLevel.ORT_ENABLE_ALL: "all",
}


# ---- options -------------------------------------------------------------------


def _count(name: str) -> Callable[[Any], int]:
    def check(value: Any) -> int:
        if isinstance(value, bool) or int(value) != value or value < 0:
            raise UnsupportedOptionError(f"{name} must be a count >= 0 (0: minfer's default), not {value!r}")
        return int(value)

    return check


def _enum(kind: type[enum.IntEnum]) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        try:
            return kind(int(value))  # int(): onnxruntime's own enum values are accepted too
        except (TypeError, ValueError):
            choices = [m.name for m in kind]
            raise UnsupportedOptionError(f"{value!r} is not a {kind.__name__}; choose one of {choices}") from None

    return check


def _only(name: str, allowed: Any, why: str) -> Callable[[Any], Any]:
    def check(value: Any) -> Any:
        if value != allowed:
            raise UnsupportedOptionError(f"{name} = {value!r} is not supported: {why} (see {DOCS})")
        return value

    return check


def _text(value: Any) -> str:
    return os.fspath(value) if value is not None else ""


_ALWAYS_PLANNED = "minfer always plans activation memory per input-shape signature"

SESSION_FIELDS: dict[str, tuple[Any, Callable[[Any], Any]]] = {
    "intra_op_num_threads": (0, _count("intra_op_num_threads")),
    "inter_op_num_threads": (0, _count("inter_op_num_threads")),
    "graph_optimization_level": (GraphOptimizationLevel.ORT_ENABLE_ALL, _enum(GraphOptimizationLevel)),
    "execution_mode": (ExecutionMode.ORT_SEQUENTIAL, _enum(ExecutionMode)),
    "optimized_model_filepath": ("", _text),
    "enable_profiling": (False, bool),
    "profile_file_prefix": ("onnxruntime_profile_", _text),
    "log_severity_level": (-1, int),  # minfer writes no log: errors are raised, warnings are Python warnings
    "log_verbosity_level": (0, int),
    "logid": ("", str),
    "enable_mem_pattern": (True, _only("enable_mem_pattern", True, _ALWAYS_PLANNED)),
    "enable_mem_reuse": (True, _only("enable_mem_reuse", True, _ALWAYS_PLANNED)),
    "enable_cpu_mem_arena": (True, _only("enable_cpu_mem_arena", True, _ALWAYS_PLANNED)),
}

RUN_FIELDS: dict[str, tuple[Any, Callable[[Any], Any]]] = {
    "log_severity_level": (2, int),
    "log_verbosity_level": (0, int),
    "logid": ("", str),
    "run_tag": ("", str),
    "terminate": (False, _only("terminate", False, "a minfer run cannot be cancelled from another thread")),
}


class _Options:
    """Attributes with onnxruntime's names and defaults; setting one minfer lacks raises, listing those it has."""

    __slots__: tuple[str, ...] = ()
    _fields: dict[str, tuple[Any, Callable[[Any], Any]]] = {}

    def __init__(self) -> None:
        for name, (default, _) in self._fields.items():
            object.__setattr__(self, name, default)

    def __setattr__(self, name: str, value: Any) -> None:
        field = self._fields.get(name)
        if field is None:
            raise self._unsupported(name)
        try:
            value = field[1](value)
        except UnsupportedOptionError:
            raise
        except (TypeError, ValueError) as exc:  # int("many"), int(None): the option's type, named
            raise UnsupportedOptionError(f"{type(self).__name__}.{name} = {value!r} is invalid: {exc}") from None
        object.__setattr__(self, name, value)

    def __getattr__(self, name: str) -> Any:
        # only reached for names that are not options: onnxruntime's methods minfer lacks, or typos
        if name.startswith("__"):
            raise AttributeError(name)
        raise self._unsupported(name)

    def _unsupported(self, name: str) -> UnsupportedOptionError:
        kind = type(self).__name__
        return UnsupportedOptionError(
            f"{kind}.{name} is not supported by minfer; {kind} supports {sorted(self._fields)} (see {DOCS})"
        )

    def __getstate__(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self._fields}

    def __setstate__(self, state: Mapping[str, Any]) -> None:
        for name, value in state.items():
            setattr(self, name, value)

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and self.__getstate__() == other.__getstate__()  # type: ignore[union-attr]

    def __repr__(self) -> str:
        changed = {k: v for k, v in self.__getstate__().items() if v != self._fields[k][0]}
        return f"{type(self).__name__}({', '.join(f'{k}={v!r}' for k, v in changed.items())})"


class SessionOptions(_Options):
    """onnxruntime's ``SessionOptions``: threads, optimization level, optimized model file, profiling.

    ``intra_op_num_threads`` sets the session's threads (0: "auto");
    ``graph_optimization_level`` picks minfer's pass level (`PASS_LEVELS`);
    ``optimized_model_filepath`` writes the model after its passes, as
    ``minfer optimize`` does; ``enable_profiling`` records every run in a
    Chrome trace that `InferenceSession.end_profiling` writes to
    ``profile_file_prefix`` + a timestamp + ".json". ``execution_mode``
    ORT_PARALLEL runs independent branches concurrently where timing shows
    it pays (inter_op "auto"); they share the intra-op threads, so
    ``inter_op_num_threads`` has no separate effect. Logging options are
    accepted: minfer logs nothing. Any other attribute raises
    `UnsupportedOptionError` listing these.
    """

    __slots__ = tuple(SESSION_FIELDS)
    _fields = SESSION_FIELDS


class RunOptions(_Options):
    """onnxruntime's ``RunOptions``: logging and tag fields are accepted; ``terminate`` cannot be set."""

    __slots__ = tuple(RUN_FIELDS)
    _fields = RUN_FIELDS


def check_providers(providers: Any, provider_options: Any = None) -> list[str]:
    """``providers`` as onnxruntime accepts them, checked: minfer runs the CPU provider only."""
    if providers is None:
        providers = [CPU]
    if isinstance(providers, str) or not isinstance(providers, (list, tuple)):
        raise UnsupportedOptionError(f"providers must be a list such as [{CPU!r}], not {providers!r}")
    names = [p[0] if isinstance(p, tuple) and len(p) == 2 else p for p in providers]
    options = [p[1] for p in providers if isinstance(p, tuple) and len(p) == 2] + list(provider_options or [])
    other = [n for n in names if n != CPU]
    if other or not names:
        raise UnsupportedOptionError(
            f"providers {names} are not available in minfer: get_available_providers() is {get_available_providers()}; "
            f"pass providers=[{CPU!r}] (minfer computes on the CPU with its installed kernel plugins)")
    if any(options):
        raise UnsupportedOptionError(f"{CPU} takes no provider options in minfer, got {options}")
    return [CPU]
