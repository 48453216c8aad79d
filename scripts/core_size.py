"""Print the core's size and import structure: the figures issue 13 asks for.

    .venv/bin/python scripts/core_size.py

Size: non-blank, non-comment lines of ``minfer_core/`` without ``testing/``
(docstrings count: they are code a reader reads). Imports: every ``import``
statement of every core module, at module level or inside a function (a
lazy import is still a dependency), parsed with ast; the report lists the
core's import cycles (there must be none) and the top-level packages it
imports from outside itself. tests/core/test_core_size.py asserts on the same
numbers.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "minfer_core"
PACKAGE = "minfer_core"
LIMIT = 5000
# what the core may import besides the standard library (testing/ and the pytest plugin may add test tools)
# ("google" is protobuf, which onnx is built on: a ModelProto's DecodeError)
ALLOWED = {"numpy", "onnx", "pluggy", "attrs", "google"}
TEST_TOOLS = {"pytest", "hypothesis", "_pytest", "onnxruntime"}  # onnxruntime: the kit's oracle, imported lazily


def modules() -> dict[str, Path]:
    """Dotted module name -> file, for every module of the core package."""
    found = {}
    for path in sorted(CORE.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        found[name] = path
    return found


def code_lines(path: Path) -> int:
    """Lines that are neither blank nor only a comment."""
    return sum(1 for line in path.read_text().splitlines() if line.strip() and not line.strip().startswith("#"))


def core_size() -> dict[str, int]:
    """Per module outside testing/, its code lines."""
    return {name: code_lines(path) for name, path in modules().items() if ".testing" not in name + "."
            and not name.startswith(f"{PACKAGE}.testing")}


def imports(name: str, path: Path, known: set[str]) -> tuple[set[str], set[str]]:
    """(core modules ``name`` imports, top-level outside packages it imports)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    inside, outside = set(), set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [(a.name, None) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            targets = [(base, a.name) for a in node.names]
        else:
            continue
        for module, attr in targets:
            top = module.split(".")[0]
            if top != PACKAGE:
                outside.add(top)
                continue
            sub = f"{module}.{attr}" if attr else None
            inside.add(sub if sub in known else module)
    inside.discard(name)
    return inside, outside


def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """Per core module: the core modules it imports, and the outside packages it imports."""
    mods = modules()
    edges, external = {}, {}
    for name, path in mods.items():
        edges[name], external[name] = imports(name, path, set(mods))
    return edges, external


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected groups of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def forbidden(external: dict[str, set[str]]) -> dict[str, set[str]]:
    """Per module, the outside packages it may not import (not stdlib, not `ALLOWED`)."""
    bad = {}
    for name, tops in external.items():
        test_side = name.startswith(f"{PACKAGE}.testing")
        allowed = ALLOWED | (TEST_TOOLS if test_side else set())
        extra = {t for t in tops if t not in sys.stdlib_module_names and t not in allowed and t != "__future__"}
        if extra:
            bad[name] = extra
    return bad


def main() -> int:
    sizes = core_size()
    edges, external = graph()
    found = cycles(edges)
    bad = forbidden(external)
    total = sum(sizes.values())
    for name, n in sorted(sizes.items(), key=lambda kv: -kv[1]):
        print(f"{n:6d}  {name}")
    print(f"{total:6d}  total code lines of {PACKAGE}/ without testing/ (limit {LIMIT})")
    print(f"import cycles: {found or 'none'}")
    outside = sorted(set().union(*external.values()) - set(sys.stdlib_module_names) - {"__future__"})
    print(f"outside packages imported: {', '.join(outside)}")
    print(f"forbidden imports: {bad or 'none'}")
    return 0 if total <= LIMIT and not found and not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())
