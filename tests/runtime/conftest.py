"""Fixtures the runtime tests share."""

from __future__ import annotations

import pytest

from . import outkernels as ok


@pytest.fixture
def out_plugin(minfer_plugin):
    """The test.out kernels (outkernels.py) registered for one test, their record of out= calls cleared."""
    minfer_plugin(ok.OutPlugin())
    ok.SEEN_OUT.clear()
    yield
    ok.SEEN_OUT.clear()
