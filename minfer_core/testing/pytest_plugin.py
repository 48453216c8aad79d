"""pytest plugin shipped with minfer-core (``pytest11`` entry point).

Imports nothing heavy at module import: every pytest run in an environment
with minfer installed loads this file.

- fixture ``minfer_plugin``: register a plugin object for one test.
- option ``--minfer-passes[=PLUGINS]``: also collect minfer's pass property
  suite (`minfer_core.testing.pass_suite`) for every installed pass, or only
  those of the named plugins (comma-separated distribution names). A
  third-party plugin checks its passes with ``pytest --minfer-passes=my-dist``.
- hypothesis profiles ``minfer-ci`` (the suite's default), ``minfer-dev``
  and ``minfer-nightly`` (`minfer_core.testing.suite.PROFILES`, the one set):
  ``--hypothesis-profile=minfer-nightly`` or ``MINFER_HYPOTHESIS_PROFILE=minfer-nightly``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

PROFILE_ENV = "MINFER_HYPOTHESIS_PROFILE"  # as minfer_core.testing.suite.PROFILE_ENV, without importing it


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("minfer")
    group.addoption(
        "--minfer-passes",
        action="store",
        nargs="?",
        const="all",
        default=None,
        dest="minfer_passes",
        metavar="PLUGINS",
        help="run minfer's pass property suite for all installed passes, or only those of PLUGINS (comma-separated)",
    )


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: Any) -> None:
    wanted = config.getoption("minfer_passes", None)
    profile = os.environ.get(PROFILE_ENV) or config.getoption("hypothesis_profile", None) or ""
    if wanted or profile.startswith("minfer-"):
        # registered before hypothesis's own plugin loads --hypothesis-profile (this hook runs first)
        from minfer_core.testing.suite import register_profiles

        register_profiles()
    if wanted:
        from minfer_core.testing import pass_suite

        config.args.append(pass_suite.__file__)


def pytest_collection_finish(session: Any) -> None:
    """Refuse ``--minfer-passes=NAME`` when NAME is no installed pass plugin or pass (not 0 tests, green)."""
    wanted = session.config.getoption("minfer_passes", None)
    if not wanted or wanted == "all":
        return
    # after collection: a conftest anywhere under the arguments may have registered the plugin in code
    from minfer_core.plugins import get_registry
    from minfer_core.testing.pass_suite import select

    unknown = select(wanted)[1]
    if unknown:
        passes = get_registry().passes
        plugins = sorted({str(p.plugin) for p in passes})
        raise pytest.UsageError(
            f"--minfer-passes={wanted}: {', '.join(map(repr, unknown))} names no installed pass plugin or pass. "
            f"Pass plugins: {', '.join(plugins) or 'none'}; passes: {', '.join(sorted(p.name for p in passes)) or 'none'}. "
            "Install the plugin's distribution (pip install ...) or fix the name; --minfer-passes alone checks them all."
        )


@pytest.fixture
def minfer_plugin() -> Any:
    """Register a plugin object for the duration of one test: ``minfer_plugin(obj)``."""
    from minfer_core.plugins import use_plugins

    stack: list[Any] = []

    def register(*plugins: object) -> None:
        ctx = use_plugins(*plugins)
        ctx.__enter__()
        stack.append(ctx)

    yield register
    for ctx in reversed(stack):
        ctx.__exit__(None, None, None)
