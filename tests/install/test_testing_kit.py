"""The testing kit as installed code: a light pytest11 plugin, lazy pass strategies, the wheel stage's checks."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from minfer_core import MinferError, Pass, PassError
from minfer_core.testing import PassCheckFailure, load_profile, target_strategy

HERE = Path(__file__).resolve().parent
HEAVY = ("hypothesis", "onnx", "minfer_core.engine", "minfer_core.plugins", "minfer_core.graph", "minfer_core.testing.checks",
         "minfer_core.testing.suite", "minfer_core.testing.builder")


def _noop(graph):
    return False


def test_pytest_plugin_imports_nothing_heavy():
    """Importing the pytest11 plugin (every pytest run in the environment does) loads no hypothesis, onnx or engine."""
    script = "import sys, minfer_core.testing.pytest_plugin; print(' '.join(sorted(sys.modules)))"
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.split())
    assert not [m for m in HEAVY if m in loaded]


@pytest.mark.parametrize("bad", ["my_plugin.strategies", "my plugin:targets", ":targets", 3])
def test_pass_refuses_patterns_of_the_wrong_form(bad):
    """`Pass.patterns` must be an import string 'package.module:name' or a callable; anything else is a PassError."""
    with pytest.raises(PassError, match="import string 'package.module:name'"):
        Pass("p", _noop, patterns=bad)


def test_import_string_patterns_are_resolved_only_by_the_suite():
    """An import string is kept as given (nothing imported); `target_strategy` imports and calls it."""
    p = Pass("p", _noop, patterns="minfer_core.testing.strategies:shapes")
    assert p.patterns == "minfer_core.testing.strategies:shapes"
    assert type(target_strategy(p)).__name__.endswith("Strategy")


@pytest.mark.parametrize("spec", ["no_such_module.strategies:targets", "minfer_core.testing.strategies:no_such_name"])
def test_unresolvable_patterns_name_the_pass(spec):
    """A misspelt import string fails the suite with the pass, its plugin and the string in the message."""
    p = Pass("p", _noop, patterns=spec, plugin="my-dist")
    with pytest.raises(PassCheckFailure, match=rf"pass 'p' \(from my-dist\): its patterns '{spec}' does not resolve"):
        target_strategy(p)


def test_wheel_stage_checker_flags_load_failures_and_missing_plugins():
    """The wheel stage's plugin check fails on a plugin that failed to load and on a built plugin not loaded."""
    sys.path.insert(0, str(HERE))
    try:
        from check_plugins import problems
    finally:
        sys.path.remove(str(HERE))
    report = {"plugins": [{"name": "minfer-ops-basic", "distribution": "minfer-ops-basic", "error": None},
                          {"name": "minfer-passes", "distribution": "minfer-passes", "error": "ImportError: hypothesis"}]}
    wheels = ["d/minfer_core-0.1.0-py3-none-any.whl", "d/minfer_ops_basic-0.1.0-py3-none-any.whl",
              "d/minfer_passes-0.1.0-py3-none-any.whl", "d/minfer_contrib_example-0.1.0-py3-none-any.whl"]
    assert problems(report, wheels) == ["minfer-passes: FAILED TO LOAD: ImportError: hypothesis",
                                        "minfer-contrib-example: built and installed, but not a loaded plugin"]
    report["plugins"][1]["error"] = None
    assert problems(report, wheels[:3]) == []


@pytest.mark.parametrize("env", [{"MINFER_HYPOTHESIS_PROFILE": "ci"}, {"HYPOTHESIS_PROFILE": "nightly"}])
def test_an_unknown_or_foreign_profile_name_is_refused(monkeypatch, env):
    """A profile name that is not the kit's, or hypothesis's own variable instead of minfer's, is an error."""
    monkeypatch.delenv("MINFER_HYPOTHESIS_PROFILE", raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(MinferError, match="minfer-ci, minfer-dev, minfer-nightly"):
        load_profile()


def test_minfer_passes_names_a_distribution_as_pip_does():
    """`--minfer-passes=minfer_contrib_example` selects the example's pass like `minfer-contrib-example`."""
    from minfer_core.testing.pass_suite import select

    by_pip_name, unknown = select("Minfer_Contrib.Example")
    assert [p.name for p in by_pip_name] == ["plain_scaled_tanh"] and unknown == []
    assert select("plain_scaled_tanh,no-such") == (by_pip_name, ["no-such"])


def test_wheel_stage_checker_flags_a_package_file_left_out(tmp_path):
    """The wheel stage's wheel check names a source file of a shipped package that the wheel lacks."""
    import zipfile

    sys.path.insert(0, str(HERE))
    try:
        from check_wheels import missing
    finally:
        sys.path.remove(str(HERE))
    for rel in ("minfer_core/__init__.py", "minfer_core/testing/__init__.py", "minfer_core/known.json"):
        (tmp_path / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "src" / rel).write_text("")
    wheel = tmp_path / "minfer_core-0.1.0-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr("minfer_core/__init__.py", "")
        z.writestr("minfer_core-0.1.0.dist-info/RECORD", "")
    assert missing(tmp_path / "src", wheel) == [f"{wheel.name}: minfer_core/known.json",
                                                f"{wheel.name}: minfer_core/testing/__init__.py"]


def test_random_feeds_sizes_symbolic_dims_from_dims():
    """`random_feeds(graph, seed, dims)` gives a symbolic dim its size from `dims`, other non-static dims 1."""
    import numpy as np

    from minfer_core import TensorType
    from minfer_core.testing import GraphBuilder, random_feeds

    b = GraphBuilder()
    x = b.input((2, 3))
    b.output(b.op("Relu", x))
    graph = b.build()
    graph.types[x] = TensorType(np.dtype(np.float32), ("n", None))
    feeds = random_feeds(graph, 0, {"n": 4})
    assert feeds[x].shape == (4, 1) and feeds[x].dtype == np.float32
    with pytest.raises(ValueError, match=repr(x)):
        random_feeds(graph, 0)  # without dims a symbolic input has no size
