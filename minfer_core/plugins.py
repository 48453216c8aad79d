"""Plugin manager and registry: loads ``minfer.plugins`` entry points, collects what each registers.

Each entry point is loaded inside its own ``try``: a plugin that fails to
import is reported by name and the others still load, unless
``MINFER_STRICT_PLUGINS=1`` (for CI) turns any failure into an error.
``MINFER_PLUGINS=a,b`` is an allow-list of plugin names to load.

A plugin contributes atomically: its hooks register into a staging area that
joins the Registry only when every hook of the plugin succeeded. A failure in
its import or any hook (``SystemExit`` included) leaves it contributing
nothing, recorded with the hook, file and line (`PluginInfo.error`), and every
session built while it is broken warns (`check_plugins`).
"""

from __future__ import annotations

import os
from contextlib import contextmanager
from contextvars import ContextVar
from importlib import metadata
from types import ModuleType
from typing import Any, Iterable, Iterator

import attrs
import pluggy

from . import hookspecs
from .errors import AmbiguousKernelError, PluginLoadError, RegistrationError
from .kernel import DEFAULT_PROVIDER, Kernel, OpDef, kernels_in
# re-exported (``X as X``): the build, the pipeline and the CLI reach them here
from .plugin_failures import STRICT_ENV as STRICT_ENV, Failure, strict_plugins, warn_or_raise, where
from .provides import ENTRY_POINT_GROUP, provider_hint as provider_hint

ALLOW_ENV = "MINFER_PLUGINS"
PREFER_ENV = "MINFER_PREFER"


@attrs.frozen
class PluginInfo:
    """What one plugin is and what it contributed (or why it failed)."""

    name: str
    distribution: str | None = None
    version: str | None = None
    error: str | None = None
    ops: tuple[str, ...] = ()
    kernels: tuple[str, ...] = ()
    passes: tuple[str, ...] = ()
    executors: tuple[str, ...] = ()
    hook: str | None = None  # where it failed: "import" or a hook name
    where: str | None = None  # "file:line" of the plugin code that failed

    def as_dict(self) -> dict[str, Any]:
        return attrs.asdict(self)


class Registry:
    """Everything the loaded plugins registered, with conflict resolution in one place.

    Preferences (``{"Conv": "my-plugin"}`` or ``{"com.x::Op": ...}``) come from
    ``MINFER_PREFER="Conv=my-plugin,..."`` and `prefer`; they decide ties that
    would otherwise be an AmbiguousKernelError.
    """

    def __init__(self) -> None:
        self.ops: dict[tuple[str, str], list[OpDef]] = {}
        self.kernels: dict[tuple[str, str], list[Kernel]] = {}
        self.passes: list[Any] = []
        self.observers: list[Any] = []
        self.executors: list[Any] = []  # Executor records (register_executors)
        self.plugins: dict[str, PluginInfo] = {}
        self.preferences: dict[str, str] = _env_preferences()

    def prefer(self, op_type: str, plugin: str, domain: str = "") -> None:
        """Resolve a conflict for ``op_type`` in favour of ``plugin``."""
        self.preferences[_pref_key(domain, op_type)] = plugin

    # ---- lookups -------------------------------------------------------

    def op_def(self, domain: str, op_type: str) -> OpDef | None:
        """The OpDef for an op; two plugins claiming it is ambiguous unless preferred."""
        claims = self.ops.get((domain, op_type), [])
        return self._decide(claims, domain, op_type, what="op") if claims else None

    def select_kernel(self, domain: str, op_type: str, opset: int, provider: str = DEFAULT_PROVIDER,
                      ctx: Any = None, attrs: Any = None) -> Kernel | None:
        """The kernel for ``op_type`` at ``opset``: the newest ``since`` <= opset, then the highest priority.

        The version comes first: a kernel written for an older version of an
        op whose semantics changed since (Softmax-1 vs 13) never runs a newer
        model, whatever its priority. A kernel declaring ``applies`` competes
        only for a node it accepts (given as ``ctx`` and ``attrs``). Equal
        priority from two plugins is an AmbiguousKernelError unless a preference decides.
        """
        fitting = self.kernel_candidates(domain, op_type, opset, provider, ctx, attrs)
        if not fitting:
            return None
        return self._decide([k for k in fitting if k.priority == fitting[0].priority], domain, op_type, what="kernel")

    def kernel_candidates(self, domain: str, op_type: str, opset: int, provider: str = DEFAULT_PROVIDER,
                          ctx: Any = None, attrs: Any = None) -> list[Kernel]:
        """The kernels accepting the node (``applies``), at the newest ``since`` <= opset of those; highest priority first.

        A kernel that does not accept the node counts as not installed, so it
        never hides an older kernel that does.
        """
        fitting = [k for k in self.kernels.get((domain, op_type), []) if k.provider == provider and k.since <= opset
                   and (k.applies is None or (ctx is not None and k.applies(ctx, attrs or {})))]
        newest = max((k.since for k in fitting), default=0)
        return sorted((k for k in fitting if k.since == newest), key=lambda k: -k.priority)

    def _decide(self, candidates: list[Any], domain: str, op_type: str, what: str) -> Any:
        plugins = sorted({str(c.plugin) for c in candidates})
        if len(plugins) == 1:
            return candidates[0]
        wanted = self.preferences.get(_pref_key(domain, op_type))
        for c in candidates:
            if c.plugin == wanted:
                return c
        key = _pref_key(domain, op_type)
        how = "claim" if what == "op" else f"provide the kernel (since {candidates[0].since}) at equal priority for"
        raise AmbiguousKernelError(
            f"{len(plugins)} plugins {how} the op {key}: {', '.join(plugins)}. "
            f"Choose one with {PREFER_ENV}='{key}={plugins[0]}' or registry.prefer({op_type!r}, {plugins[0]!r}"
            + (f", domain={domain!r})" if domain else ")"))

    def conflicts(self) -> list[str]:
        """Human-readable list of unresolved op and kernel conflicts."""
        found = []
        for (domain, op_type), claims in sorted(self.ops.items()):
            if len({c.plugin for c in claims}) > 1 and _pref_key(domain, op_type) not in self.preferences:
                found.append(f"op {_pref_key(domain, op_type)} claimed by {sorted({str(c.plugin) for c in claims})}")
        for (domain, op_type), kernels in sorted(self.kernels.items()):
            seen: dict[tuple[int, str, int], set[str]] = {}
            for k in kernels:
                seen.setdefault((k.since, k.provider, k.priority), set()).add(str(k.plugin))
            for (since, provider, prio), owners in seen.items():
                if len(owners) > 1 and _pref_key(domain, op_type) not in self.preferences:
                    found.append(
                        f"kernel {_pref_key(domain, op_type)} since {since} ({provider}, priority {prio}) "
                        f"from {sorted(owners)}"
                    )
        return found

    # ---- registration --------------------------------------------------

    def add(self, plugin: str, hook: str, items: Iterable[Any]) -> list[str]:
        """Check and store records a plugin handed to ``register``; returns their labels."""
        records = checked(plugin, hook, items)
        self.store(hook, records)
        return [_label(r) for r in records]

    def store(self, hook: str, records: Iterable[Any]) -> None:
        """Store records already checked by `checked` (the plugin's name stamped on them)."""
        for rec in records:
            if hook == "register_ops":
                self.ops.setdefault(rec.key, []).append(rec)
            elif hook == "register_kernels":
                self.kernels.setdefault((rec.domain, rec.op_type), []).append(rec)
            elif hook == "register_passes":
                self.passes.append(rec)
            elif hook == "register_executors":
                self.executors.append(rec)
            else:
                self.observers.append(rec)


def checked(plugin: str, hook: str, items: Iterable[Any]) -> list[Any]:
    """The records ``plugin`` handed to ``hook``'s register, checked and stamped with the plugin's name.

    A module stands for every kernel record it holds (see `kernels_in`).
    """
    from .executor import Executor
    from .passes import Pass

    expected = {"register_ops": OpDef, "register_kernels": Kernel, "register_passes": Pass,
                "register_executors": Executor}.get(hook)
    if expected is None:
        return list(_flatten(items))  # observers: any object
    return [attrs.evolve(_expect(item, expected, plugin, hook), plugin=plugin)  # a record two modules hold: once
            for item in {id(i): i for i in _flatten(items)}.values()]


def _label(rec: Any) -> str:
    if isinstance(rec, OpDef):
        return _pref_key(rec.domain, rec.op_type)
    if isinstance(rec, Kernel):
        return f"{_pref_key(rec.domain, rec.op_type)}-{rec.since}"
    return str(getattr(rec, "name", None) or type(rec).__name__)


def _pref_key(domain: str, op_type: str) -> str:
    return f"{domain}::{op_type}" if domain else op_type


def _env_preferences() -> dict[str, str]:
    prefs = {}
    for part in filter(None, os.environ.get(PREFER_ENV, "").split(",")):
        key, _, plugin = part.partition("=")
        prefs[key.strip()] = plugin.strip()
    return prefs


def _flatten(items: Iterable[Any]) -> Iterable[Any]:
    for item in items:
        if isinstance(item, (list, tuple)):
            yield from _flatten(item)
        elif isinstance(item, ModuleType):
            yield from kernels_in(item)
        else:
            yield item


def _expect(item: Any, cls: type, plugin: str, hook: str) -> Any:
    if not isinstance(item, cls):
        raise RegistrationError(f"plugin {plugin!r} passed {item!r} to {hook}'s register; expected a {cls.__name__}")
    return item


# ---- the plugin manager ----------------------------------------------------


class PluginSet:
    """A pluggy PluginManager plus load failures and the Registry built from it."""

    def __init__(self, *, entry_points: bool = True) -> None:
        self.pm = pluggy.PluginManager("minfer")
        self.pm.add_hookspecs(hookspecs)
        self.failures: dict[str, str] = {}
        self.dists: dict[str, tuple[str | None, str | None]] = {}
        self._registry: Registry | None = None
        if entry_points:
            self._load_entry_points()

    def _load_entry_points(self) -> None:
        allow = {n.strip() for n in os.environ.get(ALLOW_ENV, "").split(",") if n.strip()} or None
        for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = getattr(ep, "dist", None)
            name = dist.name if dist is not None else ep.name
            if allow is not None and name not in allow and ep.name not in allow:
                continue
            self.dists[name] = (dist.name if dist else None, dist.version if dist else None)
            try:
                plugin = ep.load()
            except (Exception, SystemExit) as exc:  # a broken plugin (even one calling sys.exit) must not take the others down
                self._fail(name, "import", exc)
                continue
            try:
                self.register(plugin, name)
            except PluginLoadError as exc:
                self._fail(name, "import", exc)

    def register(self, plugin: object, name: str | None = None) -> str:
        """Register a plugin object (module or instance); ``check_pending`` validates it."""
        name = name or getattr(plugin, "__name__", None) or type(plugin).__name__
        try:
            self.pm.register(plugin, name=name)
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            if self.pm.is_registered(plugin):
                self.pm.unregister(plugin)
            raise PluginLoadError(f"plugin {name!r} has an invalid hook implementation: {exc}") from exc
        self._registry = None
        return name

    def unregister(self, name: str) -> None:
        self.pm.unregister(name=name)
        self.failures.pop(name, None)
        self._registry = None

    def _fail(self, name: str, hook: str, exc: BaseException) -> None:
        self.failures[name] = Failure(hook, where(exc), f"{type(exc).__name__}: {exc}")
        self._registry = None
        if strict_plugins():
            raise PluginLoadError(self.failures[name].describe(name)) from exc

    @property
    def registry(self) -> Registry:
        """The Registry, built on first use after any change."""
        if self._registry is None:
            self._registry = self._build_registry()
        return self._registry

    def _build_registry(self) -> Registry:
        reg = Registry()
        for name, plugin in self.pm.list_name_plugin():
            staged = self._contributions(name, plugin) if name not in self.failures else None
            if staged is not None:
                for hook, records in staged.items():
                    reg.store(hook, records)
            got = {hook: [_label(r) for r in records] for hook, records in (staged or {}).items()}
            reg.plugins[name] = self._info(name, got)
        for name in self.failures:
            reg.plugins.setdefault(name, self._info(name, {}))
        return reg

    def _contributions(self, name: str, plugin: object) -> dict[str, list[Any]] | None:
        """Every record ``plugin``'s hooks register, or None when one of them failed (then it contributes nothing)."""
        staged: dict[str, list[Any]] = {}
        for hook in hookspecs.HOOK_NAMES:
            for impl in getattr(self.pm.hook, hook).get_hookimpls():
                if impl.plugin is not plugin:
                    continue
                try:
                    impl.function(register=lambda *items, h=hook: staged.setdefault(h, []).extend(checked(name, h, items)))
                except (Exception, SystemExit) as exc:
                    self._fail(name, hook, exc)
                    return None
        return staged

    def _info(self, name: str, got: dict[str, list[str]]) -> PluginInfo:
        dist, version = self.dists.get(name, (None, None))
        failure = self.failures.get(name)
        return PluginInfo(
            name, dist, version, failure.describe(name) if failure else None,
            tuple(got.get("register_ops", ())), tuple(got.get("register_kernels", ())),
            tuple(got.get("register_passes", ())), tuple(got.get("register_executors", ())),
            hook=failure.hook if failure else None, where=failure.where if failure else None,
        )


def check_plugins(registry: Registry) -> None:
    """Warn about every plugin that failed (raise under ``MINFER_STRICT_PLUGINS=1``): called when a session is built."""
    warn_or_raise([info.error for info in registry.plugins.values() if info.error])


_CURRENT: PluginSet | None = None


def plugin_set() -> PluginSet:
    """The process-wide PluginSet, loaded from entry points on first use."""
    global _CURRENT
    if _CURRENT is None:
        _CURRENT = PluginSet()
    return _CURRENT


_ACTIVE: ContextVar[Registry | None] = ContextVar("minfer_active_registry", default=None)


def get_registry() -> Registry:
    """The Registry in use: the one an engine is building with, else the process-wide one.

    Passes and preparing kernels call this during a build; inside
    `active_registry` they see the engine's registry, not the global one.
    """
    active = _ACTIVE.get()
    return active if active is not None else plugin_set().registry


@contextmanager
def active_registry(registry: Registry) -> Iterator[Registry]:
    """Make ``registry`` what `get_registry` returns for the duration of the block."""
    token = _ACTIVE.set(registry)
    try:
        yield registry
    finally:
        _ACTIVE.reset(token)


class use_plugins:
    """Register plugin objects in code: for a test (``with use_plugins(p): ...``) or a notebook.

    Used without ``with``, the plugins stay registered until `close` is called.
    """

    def __init__(self, *plugins: object) -> None:
        self._names = [plugin_set().register(p, _unique_name(p)) for p in plugins]

    def close(self) -> None:
        for name in self._names:
            if plugin_set().pm.get_plugin(name) is not None:
                plugin_set().unregister(name)
        self._names = []

    def __enter__(self) -> use_plugins:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _unique_name(plugin: object) -> str:
    base = getattr(plugin, "__name__", None) or type(plugin).__name__
    name, n = base, 1
    while plugin_set().pm.get_plugin(name) is not None:
        n += 1
        name = f"{base}#{n}"
    return name
