"""Test-suite configuration: the testing kit's hypothesis profiles, the one set (minfer_core.testing.suite).

Select with MINFER_HYPOTHESIS_PROFILE=minfer-ci|minfer-dev|minfer-nightly (default minfer-dev;
scripts/test.sh sets minfer-ci).
"""

from __future__ import annotations

from minfer_core.testing import load_profile

load_profile()
