"""minfer with and without the numba plugin (minfer-ops-numba), in one process or in fresh ones.

The plugin overrides hot numpy kernels by priority. To measure what it brings, the benchmark runs minfer twice:
with every installed plugin (the default a user gets), and with a Registry built from every plugin but it,
passed to the session as ``registry=``. Fresh processes (memory, first runs) get the same choice through the
plugin allow-list ``MINFER_PLUGINS``. Without the plugin installed there is one variant and no column.
"""

from __future__ import annotations

import os
from importlib import metadata
from typing import Any

ENTRY_POINTS = "minfer.plugins"
NUMBA_DIST = "minfer-ops-numba"
NUMBA_MODULE = "minfer_ops_numba"
ALLOW_ENV = "MINFER_PLUGINS"  # minfer_core.plugins.ALLOW_ENV, documented in the README's environment variables


def _is_numba(ep: metadata.EntryPoint) -> bool:
    dist = getattr(ep, "dist", None)
    return (dist is not None and dist.name == NUMBA_DIST) or ep.value.split(".")[0].split(":")[0] == NUMBA_MODULE


def numba_installed() -> bool:
    """Whether the numba plugin is installed (an entry point of minfer's group from its distribution)."""
    return any(_is_numba(ep) for ep in metadata.entry_points(group=ENTRY_POINTS))


def allow_list_without_numba(current: str | None = None) -> str:
    """The ``MINFER_PLUGINS`` value that loads every plugin but the numba one (of ``current``'s list, when set)."""
    eps = metadata.entry_points(group=ENTRY_POINTS)
    numba = {ep.name for ep in eps if _is_numba(ep)} | {NUMBA_DIST}
    names = [n.strip() for n in current.split(",")] if current else [ep.name for ep in eps]
    return ",".join(sorted(n for n in names if n and n not in numba))


def env_without_numba(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the allow-list that leaves the numba plugin out."""
    out = dict(os.environ if env is None else env)
    out[ALLOW_ENV] = allow_list_without_numba(out.get(ALLOW_ENV))
    return out


def registry_without_numba() -> Any:
    """A minfer Registry of every installed plugin but the numba one, for ``InferenceSession(..., registry=)``.

    Built by a fresh plugin set under the allow-list, so it loads exactly what a process started with
    ``MINFER_PLUGINS`` would; the process-wide registry (with the plugin) is untouched.
    """
    from minfer_core.plugins import PluginSet  # a checkout tool may reach past the public API; plugins may not

    before = os.environ.get(ALLOW_ENV)
    os.environ[ALLOW_ENV] = allow_list_without_numba(before)
    try:
        return PluginSet().registry
    finally:
        if before is None:
            del os.environ[ALLOW_ENV]
        else:
            os.environ[ALLOW_ENV] = before


def plugin_names(registry: Any) -> list[str]:
    """The plugins a registry holds (to record in the results which variant ran what)."""
    return sorted(registry.plugins)


def select(numba: str) -> dict[str, Any]:
    """The minfer variants ``numba`` ("both", "with", "without") asks for: each one's Registry (``registries``; None:
    the installed plugins) and fresh-process environment (``envs``), the mode run and each variant's plugins."""
    installed = numba_installed()
    if numba == "without" or (numba == "both" and installed):
        without = registry_without_numba()
        env = env_without_numba()
    if numba == "without":
        registries, envs = {"minfer": without}, {"minfer": env}
    elif numba == "both" and installed:
        registries, envs = {"minfer": None, "minfer_nonumba": without}, {"minfer_nonumba": env}
    else:
        registries, envs = {"minfer": None}, {}
    import minfer_core

    plugins = {key: plugin_names(reg or minfer_core.get_registry()) for key, reg in registries.items()}
    mode = numba if installed or numba == "without" else "not installed"
    return {"registries": registries, "envs": envs, "numba": mode, "plugins": plugins}
