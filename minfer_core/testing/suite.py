"""The hypothesis-driven properties the suite enforces for every installed pass, and its profiles.

Profiles, the one set for the pass suite and for minfer's own tests
(``MINFER_HYPOTHESIS_PROFILE=NAME`` or ``--hypothesis-profile=NAME``):
``minfer-ci`` draws few, derandomized examples per property so the whole
suite stays within CI time on two cores; ``minfer-dev`` (the default of a
test run, see `load_profile`) twice as many with fresh randomness;
``minfer-nightly`` 20 times as many, for a scheduled job.
"""

from __future__ import annotations

import importlib
from typing import Any, Iterable, Sequence

from ..errors import MinferError
from ..passes import Pass
from .checks import PassCheckFailure, UnusableExample, check_pass, check_pipeline


def _usable(check: Any, *args: Any, **kw: Any) -> Any:
    """Run a check; an example that fails without any pass is rejected, not counted."""
    from hypothesis import reject

    try:
        return check(*args, **kw)
    except UnusableExample:
        reject()

PROFILES: dict[str, dict[str, Any]] = {
    "minfer-ci": dict(max_examples=25, derandomize=True),
    "minfer-dev": dict(max_examples=50),
    "minfer-nightly": dict(max_examples=500),
}
PROFILE_ENV = "MINFER_HYPOTHESIS_PROFILE"


def register_profiles() -> None:
    """Register the minfer hypothesis profiles (idempotent)."""
    from hypothesis import HealthCheck, settings

    for name, kw in PROFILES.items():
        settings.register_profile(
            name,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much],
            print_blob=True,
            **kw,
        )


def load_profile(default: str = "minfer-dev") -> str:
    """Load the profile ``MINFER_HYPOTHESIS_PROFILE`` names (else ``default``) for every test; returns its name.

    A test suite's conftest calls it (minfer's own does). An unknown name, or
    hypothesis's own ``HYPOTHESIS_PROFILE`` set instead, is an error: a
    profile that silently does not apply costs a nightly run.
    """
    import os

    from hypothesis import settings

    register_profiles()
    name = os.environ.get(PROFILE_ENV) or default
    choices = f"set {PROFILE_ENV} to one of {', '.join(PROFILES)}"
    if os.environ.get("HYPOTHESIS_PROFILE") and not os.environ.get(PROFILE_ENV):
        raise MinferError(f"HYPOTHESIS_PROFILE={os.environ['HYPOTHESIS_PROFILE']} is not read by minfer's tests; {choices}")
    if name not in PROFILES:
        raise MinferError(f"{PROFILE_ENV}={name}: no such hypothesis profile; {choices}")
    settings.load_profile(name)
    return name


def suite_settings() -> Any:
    """The settings the suite runs under.

    ``MINFER_HYPOTHESIS_PROFILE`` wins; else ``minfer-nightly`` when it is
    the loaded profile (``--hypothesis-profile=minfer-nightly``); else
    ``minfer-ci``, so a local run's ``minfer-dev`` does not double the suite's
    time. The suite applies them per property: other tests keep theirs.
    """
    import os

    from hypothesis import settings

    register_profiles()
    current = getattr(settings, "_current_profile", "") or ""
    name = os.environ.get(PROFILE_ENV) or ("minfer-nightly" if current == "minfer-nightly" else "minfer-ci")
    return settings.get_profile(name)


def target_strategy(p: Pass) -> Any:
    """``p``'s target strategy: its ``Pass.patterns`` resolved (an import string is imported now) and called.

    Raises `PassCheckFailure` naming the pass and its plugin when it declares
    none, when the import string does not resolve, or when it names no callable.
    """
    spec = p.patterns
    where = f"pass {p.name!r} (from {p.plugin})"
    if spec is None:
        raise PassCheckFailure(
            f"{where} declares no target strategy (Pass.patterns): the suite cannot show it fires where it "
            "must and keeps outputs; declare patterns='package.module:name'"
        )
    if isinstance(spec, str):
        spec = _resolve(spec, where)
    if not callable(spec):
        raise PassCheckFailure(f"{where}: its patterns {p.patterns!r} is a {type(spec).__name__}, not a zero-argument "
                               "callable returning a hypothesis strategy")
    return spec()


def _resolve(spec: str, where: str) -> Any:
    """The object an import string ``"package.module:attr.path"`` names."""
    module, _, path = spec.partition(":")
    try:
        obj: Any = importlib.import_module(module)
        for part in path.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError) as exc:
        raise PassCheckFailure(
            f"{where}: its patterns {spec!r} does not resolve ({type(exc).__name__}: {exc}); "
            "fix the import string, or install what the strategy module imports (hypothesis: the plugin's test extra)"
        ) from exc
    return obj


def verify_pass(p: Pass, installed: Iterable[Pass] = (), *, settings: Any = None) -> int:
    """Check ``p`` on examples from its target strategy; returns how many examples it fired on.

    Raises `PassCheckFailure` (after hypothesis shrinks the graph) when a rule
    breaks, and when the pass declares no target strategy or never fires on
    it: a pass that is never exercised cannot pass vacuously.
    """
    from hypothesis import given

    strategy = target_strategy(p)
    installed = list(installed)
    fired: list[bool] = []

    @given(strategy)
    def prop(graph: Any) -> None:
        fired.append(_usable(check_pass, p, graph, installed=installed).changed)

    (settings or suite_settings())(prop)()
    if not any(fired):
        raise PassCheckFailure(
            f"pass {p.name!r} (from {p.plugin}) never changed any of {len(fired)} graphs from its target "
            "strategy: either it is broken or its strategy does not contain its pattern"
        )
    return sum(fired)


def verify_on_random_graphs(p: Pass, installed: Iterable[Pass] = (), *, settings: Any = None) -> None:
    """Check ``p`` keeps outputs, validity and idempotence on random graphs (it need not fire)."""
    from hypothesis import given

    from .strategies import graphs

    installed = list(installed)

    @given(graphs())
    def prop(graph: Any) -> None:
        _usable(check_pass, p, graph, installed=installed)

    (settings or suite_settings())(prop)()


def verify_pipeline(passes: Sequence[Pass], sources: Sequence[Any], *, settings: Any = None) -> None:
    """Check the ordered ``passes`` run to a fixed point keep outputs on graphs from ``sources``."""
    from hypothesis import given
    from hypothesis import strategies as st

    @given(st.one_of(*sources))
    def prop(graph: Any) -> None:
        _usable(check_pipeline, graph, passes)

    (settings or suite_settings())(prop)()
