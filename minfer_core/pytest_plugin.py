"""pytest plugin shipped with minfer-core (``pytest11`` entry point).

Imports nothing heavy at module import: every pytest run in an environment
with minfer installed loads this file.
"""

from __future__ import annotations

from typing import Any

import pytest


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


