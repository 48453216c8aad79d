"""The core stays small and layered: its size, its import cycles and what it imports (scripts/core_size.py)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

SCRIPT = Path(__file__).parents[2] / "scripts" / "core_size.py"


def _script():
    spec = importlib.util.spec_from_file_location("core_size", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("core_size", module)
    spec.loader.exec_module(module)
    return module


def test_the_core_is_at_most_5000_code_lines():
    """Non-blank, non-comment lines of minfer_core/ without testing/ stay within the issue's 5,000."""
    cs = _script()
    sizes = cs.core_size()
    assert sum(sizes.values()) <= cs.LIMIT, f"{sum(sizes.values())} lines; largest: {sorted(sizes.items(), key=lambda kv: -kv[1])[:5]}"


def test_core_modules_import_each_other_without_cycles():
    """No two core modules import each other, directly or through others (lazy imports count)."""
    cs = _script()
    edges, _ = cs.graph()
    assert cs.cycles(edges) == []


def test_the_cycle_finder_finds_a_cycle():
    """The check can fail: a planted a -> b -> c -> a is reported, a chain is not."""
    cs = _script()
    assert cs.cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cs.cycles({"a": {"b"}, "b": {"c"}}) == []


def test_the_core_imports_no_plugin_and_nothing_beyond_its_dependencies():
    """Outside the standard library the core imports only numpy, onnx, pluggy and attrs (and never a plugin)."""
    cs = _script()
    _, external = cs.graph()
    assert cs.forbidden(external) == {}
    assert not any(t.startswith("minfer_") and t != "minfer_core" for tops in external.values() for t in tops)


def test_the_execution_machinery_lives_outside_the_core():
    """Thread pools, BLAS control, process teams and stages are the minfer-parallel plugin's, not the core's."""
    cs = _script()
    names = set(cs.modules())
    assert not names & {f"minfer_core.{m}" for m in ("procs", "threads", "stages", "sharing")}
    _, external = cs.graph()
    assert not any({"ctypes", "threadpoolctl", "mmap"} & external[f"minfer_core.{m}"] for m in ("parallel", "engine"))
