"""Fixtures shared by the plugin tests."""

from __future__ import annotations

import pytest

from minfer_core import get_registry, use_plugins

NUMBA = "minfer-ops-numba"


@pytest.fixture(scope="module")
def numba_plugin():
    """minfer-ops-numba registered whether or not it is loaded (a run with MINFER_PLUGINS leaving it out)."""
    if any(k.plugin == NUMBA for ks in get_registry().kernels.values() for k in ks):
        yield
        return
    from minfer_ops_numba import plugin

    with use_plugins(plugin):
        yield
