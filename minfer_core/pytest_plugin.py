"""pytest plugin shipped with minfer-core (``pytest11`` entry point).

Imports nothing heavy at module import: every pytest run in an environment
with minfer installed loads this file.

- fixture ``minfer_plugin``: register a plugin object for one test.
- option ``--minfer-passes[=PLUGINS]``: also collect minfer's pass property
  suite (`minfer_core.testing.pass_suite`) for every installed pass, or only
  those of the named plugins (comma-separated distribution names). A
  third-party plugin checks its passes with ``pytest --minfer-passes=my-dist``.
- hypothesis profiles ``minfer-ci`` (the suite's default) and
  ``minfer-nightly``: ``--hypothesis-profile=minfer-nightly`` or
  ``MINFER_HYPOTHESIS_PROFILE=minfer-nightly``.
"""

from __future__ import annotations

import os
from typing import Any

import pytest

PROFILE_ENV = "MINFER_HYPOTHESIS_PROFILE"


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
