"""What installed plugins declare they provide, read without importing them: for "install X" hints.

A plugin package may ship ``minfer_provides.json`` next to its top-level
``__init__.py``: ``{"ops": ["Conv", "ai.minfer::FusedConv", ...]}``. The core
finds it through the ``minfer.plugins`` entry points and
`importlib.util.find_spec` (which locates a package without running it), so
a hint works for a plugin that is installed but not loaded (left out by
``MINFER_PLUGINS``, or failing to import). First-party plugins generate
their file with ``scripts/update_known_ops.py``; a test keeps it in sync
with what they register. The core keeps no list of anyone's ops.
"""

from __future__ import annotations

import importlib.util
import json
from importlib import metadata
from pathlib import Path

ENTRY_POINT_GROUP = "minfer.plugins"
PROVIDES_FILE = "minfer_provides.json"


def declared_ops() -> dict[str, tuple[str, ...]]:
    """Per installed plugin distribution, the ops its ``minfer_provides.json`` declares ("domain::Op" or "Op")."""
    found: dict[str, tuple[str, ...]] = {}
    for ep in metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = getattr(ep, "dist", None)
        path = provides_file(ep.module)
        if dist is None or path is None or not path.is_file():
            continue
        try:
            ops = json.loads(path.read_text()).get("ops", [])
        except (OSError, ValueError, AttributeError):
            continue  # a malformed declaration only costs a hint
        found[dist.name] = found.get(dist.name, ()) + tuple(str(o) for o in ops)
    return found


def provides_file(module: str) -> Path | None:
    """Where the package of ``module`` keeps its ``minfer_provides.json`` (None when it is no package)."""
    try:
        spec = importlib.util.find_spec(module.split(".")[0])
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0]) / PROVIDES_FILE


def provider_hint(domain: str, op_type: str) -> str | None:
    """The installed distribution that declares ``domain::op_type``, for "what to install or enable" messages."""
    key = f"{domain}::{op_type}" if domain else op_type
    for dist, ops in sorted(declared_ops().items()):
        if key in ops:
            return dist
    return None
