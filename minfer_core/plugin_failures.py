"""How a failing plugin is recorded, located and reported: the failure record, its file:line, the warning."""

from __future__ import annotations

import os
import traceback
import warnings
from importlib import metadata
from pathlib import Path
import attrs
import pluggy

from .errors import PluginLoadError, PluginWarning

STRICT_ENV = "MINFER_STRICT_PLUGINS"


@attrs.frozen
class Failure:
    """Why a plugin contributes nothing: the hook (or ``"import"``) that failed, where, and the error."""

    hook: str
    where: str | None
    error: str

    def describe(self, plugin: str) -> str:
        at = f" at {self.where}" if self.where else ""
        return f"plugin {plugin!r} failed in {self.hook}{at}: {self.error}"


def strict_plugins() -> bool:
    """Whether ``MINFER_STRICT_PLUGINS`` turns plugin failures (and failing passes) into errors."""
    return os.environ.get(STRICT_ENV, "") not in ("", "0")


_NOT_PLUGIN_CODE = (str(Path(__file__).parent), str(Path(pluggy.__file__).parent), str(Path(metadata.__file__).parent.parent))


def where(exc: BaseException) -> str | None:
    """``file:line`` of the innermost frame of plugin code in ``exc``'s traceback (not minfer's, pluggy's or importlib's)."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f"{exc.filename}:{exc.lineno}"
    cause = exc.__cause__ if isinstance(exc, PluginLoadError) and exc.__cause__ else exc
    frames = [f for f in traceback.extract_tb(cause.__traceback__) if _is_plugin_code(f.filename)]
    return f"{frames[-1].filename}:{frames[-1].lineno}" if frames else None


def _is_plugin_code(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    return not any(filename.startswith(prefix + os.sep) for prefix in _NOT_PLUGIN_CODE)


def warn_or_raise(errors: list[str]) -> None:
    """Warn (`PluginWarning`) about the failed plugins ``errors`` describes; with ``MINFER_STRICT_PLUGINS=1`` raise instead."""
    if not errors:
        return
    message = "; ".join(errors) + " (it contributes no ops, kernels or passes; `minfer plugins` lists failures)"
    if strict_plugins():
        raise PluginLoadError(message)
    warnings.warn(message, PluginWarning, stacklevel=4)
