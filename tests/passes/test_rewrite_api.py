"""Passes rewrite graphs only through the core's public API, without import cycles, in time linear in the graph."""

from __future__ import annotations

import ast
from pathlib import Path

import numpy as np

import minfer_core
import minfer_core.testing
from minfer_core import get_registry
from minfer_core.nodeorder import NodeOrder
from minfer_core.pipeline import optimize
from minfer_core.testing import GraphBuilder

ROOT = Path(__file__).resolve().parents[2]
PASSES = ROOT / "plugins" / "minfer_passes" / "minfer_passes"
EXAMPLE = ROOT / "examples" / "minfer_contrib_example" / "minfer_contrib_example"
PUBLIC = {"minfer_core": set(minfer_core.__all__), "minfer_core.testing": set(minfer_core.testing.__all__)}


def _trees(folder: Path) -> dict[str, ast.Module]:
    return {p.stem: ast.parse(p.read_text(), str(p)) for p in sorted(folder.glob("*.py"))}


def _private_uses(tree: ast.Module) -> list[str]:
    """Imports of names minfer_core does not export, and attributes with a leading underscore."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minfer_core"):
            public = PUBLIC.get(node.module or "")
            for alias in node.names:
                if alias.name.startswith("_") or (public is not None and alias.name not in public):
                    found.append(f"line {node.lineno}: from {node.module} import {alias.name}")
        elif isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            found.append(f"line {node.lineno}: .{node.attr}")
    return found


def test_example_plugin_uses_only_public_names():
    """The example third-party plugin imports only what minfer_core exports and touches no private attribute."""
    found = {name: _private_uses(tree) for name, tree in _trees(EXAMPLE).items()}
    assert not any(found.values()), found


def test_first_party_passes_use_no_private_core_names():
    """minfer-passes gets no privilege: only exported core names, no private Graph attributes."""
    found = {name: _private_uses(tree) for name, tree in _trees(PASSES).items()}
    assert not any(found.values()), found


def test_pass_plugin_keeps_no_private_graph_helpers():
    """The graph helpers passes need are Graph methods; the plugin's _util no longer defines its own."""
    defined = {n.name for n in _trees(PASSES)["_util"].body if isinstance(n, ast.FunctionDef)}
    assert not defined & {"sole_consumer", "used", "bypass", "rename_output", "replace", "consumers", "producer"}


def _imports(tree: ast.Module) -> set[str]:
    """The sibling modules a module imports, at module level or inside functions."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            found.update([node.module] if node.module else [a.name for a in node.names])
        elif isinstance(node, ast.ImportFrom) and node.module == "minfer_passes":
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("minfer_passes."):
            found.add(node.module.split(".")[1])  # type: ignore[union-attr]
    return {m.split(".")[0] for m in found}


def test_pass_modules_import_each_other_without_cycles():
    """The modules of minfer-passes form an import DAG (even counting imports inside functions)."""
    edges = {name: _imports(tree) for name, tree in _trees(PASSES).items()}
    done: set[str] = set()

    def visit(name: str, path: tuple[str, ...]) -> None:
        assert name not in path, f"import cycle: {' -> '.join(path + (name,))}"
        if name in done or name not in edges:
            return
        for dep in sorted(edges[name]):
            visit(dep, path + (name,))
        done.add(name)

    for name in sorted(edges):
        visit(name, ())


def _chain(nodes: int) -> minfer_core.Graph:
    """A chain that every default pass scans and several rewrite: Add, Relu, Mul by a scalar, Identity."""
    b = GraphBuilder()
    vec, scale = b.const(np.linspace(-1, 1, 4, dtype=np.float32)), b.const(np.float32(0.5))
    y = b.input((2, 4))
    for i in range(nodes):
        op = ("Add", "Relu", "Mul", "Identity")[i % 4]
        y = b.op(op, y, *{"Add": [vec], "Mul": [scale]}.get(op, []))
    b.output(y)
    return b.build()


def _list_rebuilds(monkeypatch, nodes: int) -> int:
    """How often optimizing a chain of ``nodes`` nodes rebuilt a node list from scratch (an O(n) step)."""
    count = [0]
    build = NodeOrder.as_list

    def counting(self: NodeOrder) -> list:
        count[0] += self._list is None
        return build(self)

    monkeypatch.setattr(NodeOrder, "as_list", counting)
    optimize(_chain(nodes), get_registry(), "all")
    monkeypatch.setattr(NodeOrder, "as_list", build)
    return count[0]


def test_pipeline_work_per_node_does_not_grow_with_the_graph(monkeypatch):
    """The O(n) steps of the default pipeline are per pass application, not per rewrite: 4x the nodes, same count."""
    small, large = _list_rebuilds(monkeypatch, 100), _list_rebuilds(monkeypatch, 400)
    assert large == small, (small, large)
