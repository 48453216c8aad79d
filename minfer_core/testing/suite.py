"""The hypothesis-driven properties the suite enforces for every installed pass, and its profiles.

Profiles (``--hypothesis-profile=NAME`` or ``MINFER_HYPOTHESIS_PROFILE=NAME``):
``minfer-ci`` draws few, derandomized examples per property so the whole
suite stays within CI time on two cores; ``minfer-nightly`` draws 40 times
as many with fresh randomness each run, for a scheduled job.
"""

from __future__ import annotations

from typing import Any, Iterable, Sequence

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
    "minfer-nightly": dict(max_examples=500),
}


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


def suite_settings() -> Any:
    """The settings the suite runs under.

    ``MINFER_HYPOTHESIS_PROFILE`` wins; else a loaded ``minfer-*`` profile
    (``--hypothesis-profile=minfer-nightly``) or a loaded ``nightly`` profile
    maps to ``minfer-nightly``; else ``minfer-ci``. The suite applies them per
    property, so loading them never changes other tests' settings.
    """
    import os

    from hypothesis import settings

    register_profiles()
    current = getattr(settings, "_current_profile", "") or ""
    name = os.environ.get("MINFER_HYPOTHESIS_PROFILE") or (
        current if current.startswith("minfer-") else "minfer-nightly" if current == "nightly" else "minfer-ci"
    )
    return settings.get_profile(name)


def verify_pass(p: Pass, installed: Iterable[Pass] = (), *, settings: Any = None) -> int:
    """Check ``p`` on examples from its target strategy; returns how many examples it fired on.

    Raises `PassCheckFailure` (after hypothesis shrinks the graph) when a rule
    breaks, and when the pass declares no target strategy or never fires on
    it: a pass that is never exercised cannot pass vacuously.
    """
    from hypothesis import given

    if p.patterns is None:
        raise PassCheckFailure(
            f"pass {p.name!r} (from {p.plugin}) declares no target strategy (Pass.patterns): "
            "the suite cannot show it fires where it must and keeps outputs"
        )
    installed = list(installed)
    fired: list[bool] = []

    @given(p.patterns())
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
