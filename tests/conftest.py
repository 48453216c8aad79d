"""Test-suite configuration: the testing kit's hypothesis profiles, the one set (minfer_core.testing.suite), and a
tuning store of the suite's own.

Select with MINFER_HYPOTHESIS_PROFILE=minfer-ci|minfer-dev|minfer-nightly (default minfer-dev;
scripts/test.sh sets minfer-ci).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

from minfer_core.testing import load_profile

load_profile()


def _own_cache() -> None:
    """Unless MINFER_CACHE is set, the suite's timed kernel choices go to a new folder, not the user's: its thousands
    of sessions, built on a loaded machine, stored choices there that the user's own sessions then took (a depthwise
    layer on numpy's conv: MobileNetV2 b1 8.3 ms instead of 3.5). Compiled kernels (NUMBA_CACHE_DIR) and the onnx
    node cases stay the user's: they are the same whatever the load, and slow to make again."""
    if os.environ.get("MINFER_CACHE"):
        return
    shared = Path.home() / ".cache" / "minfer"
    os.environ.setdefault("NUMBA_CACHE_DIR", str(shared / "numba"))
    own = Path(tempfile.mkdtemp(prefix="minfer-test-cache-"))
    atexit.register(shutil.rmtree, own, ignore_errors=True)
    for cases in shared.glob("node-cases-onnx-*.pkl"):
        (own / cases.name).symlink_to(cases)
    os.environ["MINFER_CACHE"] = str(own)


_own_cache()
