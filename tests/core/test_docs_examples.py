"""The examples in docs/kernel-contract.md headed ``# example: NAME`` run as written."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DOC = Path(__file__).resolve().parents[2] / "docs" / "kernel-contract.md"
EXAMPLES = dict(re.findall(r"```python\n# example: (\w+)\n(.*?)```", DOC.read_text(), flags=re.S))


def test_the_documented_examples_are_found():
    """The doc holds the examples this file runs (a renamed heading would silently skip one)."""
    assert {"applies", "choose", "subgraphs", "claim_threads"} <= set(EXAMPLES)


@pytest.mark.parametrize("name", sorted(EXAMPLES))
def test_example_runs(name, monkeypatch, tmp_path):
    """Each example's asserts hold against the installed minfer."""
    monkeypatch.setenv("MINFER_CACHE", str(tmp_path))
    exec(compile(EXAMPLES[name], f"{DOC.name}:{name}", "exec"), {"__name__": f"doc_example_{name}"})
