"""A third-party plugin's pass, written as the README shows it, gets the whole property suite from one option."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[2] / "README.md"
FILES = ("my_plugin/passes.py", "my_plugin/strategies.py")
# registered in code for the test; an installed distribution registers through its entry point instead
CONFTEST = "import minfer_core, my_plugin.passes\n\nminfer_core.use_plugins(my_plugin.passes)\n"
# imports fail as in an environment where neither is installed
WITHOUT_TEST_DEPS = "import sys\nsys.modules['hypothesis'] = sys.modules['pytest'] = None\n"


def readme_plugin(tmp_path: Path, broken: bool = False) -> Path:
    """Write the README's example plugin files (the blocks headed ``# my_plugin/...``) under ``tmp_path``."""
    text = README.read_text()
    for name in FILES:
        block = re.search(rf"```python\n# {re.escape(name)}\n(.*?)```", text, re.S)
        assert block, f"README.md has no python block headed '# {name}'"
        code = block.group(1)
        if broken:  # keeps the outer Neg's input: -x instead of x
            code = code.replace("inner.inputs[0], graph_outputs", "inner.outputs[0], graph_outputs")
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text(code)
    (tmp_path / "my_plugin" / "__init__.py").write_text("")
    return tmp_path


def _suite(tmp_path: Path, option: str, broken: bool = False) -> subprocess.CompletedProcess:
    readme_plugin(tmp_path, broken)
    (tmp_path / "conftest.py").write_text(CONFTEST)
    cmd = [sys.executable, "-m", "pytest", option, "-q", "-p", "no:cacheprovider", str(tmp_path)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)


def test_readme_plugin_pass_is_checked_by_the_option(tmp_path):
    """`pytest --minfer-passes=NAME` runs the suite on the README's pass, and it passes when correct."""
    result = _suite(tmp_path, "--minfer-passes=double_neg")
    assert result.returncode == 0, result.stdout[-3000:]
    assert "4 passed" in result.stdout  # its target strategy, random graphs, the pipeline, coverage


def test_readme_plugin_broken_pass_fails_the_option(tmp_path):
    """The same run fails when the pass changes the outputs."""
    result = _suite(tmp_path, "--minfer-passes=double_neg", broken=True)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "double_neg" in result.stdout and "changed the outputs" in result.stdout


def test_unknown_name_is_a_usage_error_listing_what_is_installed(tmp_path):
    """`--minfer-passes=NAME` where NAME matches no pass plugin or pass exits 4 and lists them, not 0 tests green."""
    result = _suite(tmp_path, "--minfer-passes=double_neg,no-such-plugin")
    assert result.returncode == 4, result.stdout[-3000:] + result.stderr[-3000:]
    assert "'no-such-plugin' names no installed pass plugin or pass" in result.stderr
    assert "double_neg" in result.stderr and "minfer-passes" in result.stderr


def test_readme_plugin_registers_without_hypothesis_or_pytest(tmp_path):
    """The README's plugin loads and its pass runs where hypothesis and pytest cannot be imported."""
    readme_plugin(tmp_path)
    script = WITHOUT_TEST_DEPS + (
        "import minfer_core, my_plugin.passes\n"
        "with minfer_core.use_plugins(my_plugin.passes):\n"
        "    p = next(p for p in minfer_core.get_registry().passes if p.name == 'double_neg')\n"
        "print(p.patterns, 'hypothesis' in sys.modules and sys.modules['hypothesis'] is not None)\n"
    )
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["my_plugin.strategies:double_neg_targets", "False"]
