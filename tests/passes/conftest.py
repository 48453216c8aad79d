"""The pass tests run the property suite under the minfer-ci hypothesis profile unless told otherwise."""

from __future__ import annotations

import os

from hypothesis import settings

from minfer_core.testing import register_profiles

register_profiles()
if not os.environ.get("MINFER_HYPOTHESIS_PROFILE") and settings._current_profile == "default":
    settings.load_profile("minfer-ci")
