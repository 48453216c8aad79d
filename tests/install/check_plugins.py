"""Check `minfer plugins --json` from the installed-wheels stage: every built plugin loaded.

Usage: python check_plugins.py plugins.json WHEEL...  Exits 1, naming each problem,
when a plugin failed to load or a built plugin distribution is not among the plugins.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path


def distribution(wheel: str) -> str:
    """The distribution name of a wheel file, normalized as `minfer plugins` prints it."""
    return re.sub(r"[-_.]+", "-", Path(wheel).name.split("-")[0]).lower()


def problems(report: dict, wheels: list[str]) -> list[str]:
    """What is wrong with the report: load failures, and built plugins that are missing."""
    found = {(p.get("distribution") or p["name"]).lower(): p for p in report["plugins"]}
    wrong = [f"{name}: FAILED TO LOAD: {p['error']}" for name, p in found.items() if p.get("error")]
    expected = {distribution(w) for w in wheels} - {"minfer-core"}
    wrong += [f"{name}: built and installed, but not a loaded plugin" for name in sorted(expected - set(found))]
    return wrong


def main(argv: list[str]) -> int:
    report = json.loads(Path(argv[0]).read_text())
    wrong = problems(report, argv[1:])
    for line in wrong:
        print(f"minfer plugins: {line}", file=sys.stderr)
    if not wrong:
        print(f"minfer plugins: {', '.join(sorted(p['name'] for p in report['plugins']))} loaded")
    return 1 if wrong else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
