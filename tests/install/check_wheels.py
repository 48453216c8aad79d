"""Check the wheels of the installed-wheels stage: every file of every package in the sources ships.

Usage: python check_wheels.py SRC WHEEL...  For each wheel, each top-level package it holds is found
in the source copy SRC (the checkout's tracked and new files), and every file under that package
(subpackages, data files, py.typed) must be in the wheel. Exits 1 naming each missing file.
"""

from __future__ import annotations

import sys
import zipfile
from pathlib import Path


def package_dirs(src: Path, name: str) -> list[Path]:
    """Where package ``name`` lives in the sources: at the root, or in a plugins/ or examples/ project."""
    return [d for d in (src / name, *src.glob(f"plugins/*/{name}"), *src.glob(f"examples/*/{name}")) if d.is_dir()]


def missing(src: Path, wheel: Path) -> list[str]:
    """The source files of the wheel's packages that the wheel does not hold."""
    shipped = set(zipfile.ZipFile(wheel).namelist())
    tops = {n.split("/")[0] for n in shipped if "/" in n and not n.split("/")[0].endswith(".dist-info")}
    lost = []
    for top in sorted(tops):
        for root in package_dirs(src, top):
            for f in sorted(p for p in root.rglob("*") if p.is_file()):
                rel = f.relative_to(root.parent).as_posix()
                if rel not in shipped:
                    lost.append(f"{wheel.name}: {rel}")
    return lost


def main(argv: list[str]) -> int:
    src, wheels = Path(argv[0]), [Path(w) for w in argv[1:]]
    lost = [line for w in wheels for line in missing(src, w)]
    for line in lost:
        print(f"not in the wheel: {line}", file=sys.stderr)
    if not lost:
        print(f"wheels: every source file of their packages ships ({', '.join(w.name for w in wheels)})")
    return 1 if lost else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
