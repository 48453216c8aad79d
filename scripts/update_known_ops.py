"""Regenerate each first-party plugin's minfer_provides.json: the ops it declares it provides.

The core reads these files (without importing the plugins) only for "install
or enable X" hints when an op is missing (minfer_core/provides.py); the test
suite checks each matches what its plugin registers. The core itself keeps
no list of first-party ops: adding an op to a plugin edits only that plugin.
Run: .venv/bin/python scripts/update_known_ops.py
"""

from __future__ import annotations

import json
from importlib import metadata
from pathlib import Path

from minfer_core.plugins import get_registry
from minfer_core.provides import ENTRY_POINT_GROUP, provides_file

FIRST_PARTY = ("minfer-ops-basic", "minfer-ops-conv", "minfer-ops-ml", "minfer-passes")


def registered_ops() -> dict[str, list[str]]:
    """Per first-party distribution, the ops it registers now (sorted)."""
    plugins = get_registry().plugins
    return {dist: sorted(plugins[dist].ops) for dist in FIRST_PARTY if dist in plugins}


def provides_paths() -> dict[str, Path]:
    """Per first-party distribution, where its minfer_provides.json belongs."""
    paths = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        path = provides_file(ep.module)
        if dist is not None and dist.name in FIRST_PARTY and path is not None:
            paths[dist.name] = path
    return paths


def render(ops: list[str]) -> str:
    return json.dumps({"ops": ops}, indent=1) + "\n"


if __name__ == "__main__":
    paths = provides_paths()
    for dist, ops in registered_ops().items():
        paths[dist].write_text(render(ops))
        print(f"wrote {paths[dist]} ({len(ops)} ops)")
