"""Regenerate minfer_core/known_ops.json: which first-party distribution provides which op.

The core uses it only for "install X" hints when an op is missing; the test
suite checks it matches what the installed first-party plugins register.
Run: .venv/bin/python scripts/update_known_ops.py
"""

from __future__ import annotations

import json
from pathlib import Path

from minfer_core.plugins import get_registry

FIRST_PARTY = ("minfer-ops-basic", "minfer-ops-conv", "minfer-passes")


def known_ops() -> dict[str, list[str]]:
    plugins = get_registry().plugins
    return {dist: sorted(plugins[dist].ops) for dist in FIRST_PARTY if dist in plugins and plugins[dist].ops}


if __name__ == "__main__":
    path = Path(__file__).resolve().parent.parent / "minfer_core" / "known_ops.json"
    path.write_text(json.dumps(known_ops(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {path}")
