"""Plugin loading: failures are reported by name, conflicts are explicit, in-code plugins work."""

from __future__ import annotations

from importlib import metadata

import numpy as np
import pytest
from onnx import helper

from modelkit import make_model, tensor
from minfer_core import (
    AmbiguousKernelError,
    InferenceSession,
    PluginLoadError,
    UnsupportedOpError,
    hookimpl,
    kernel,
    op,
    use_plugins,
)
from minfer_core.plugins import PluginSet


def fake_entry_points(monkeypatch, *specs):
    eps = [metadata.EntryPoint(name, value, "minfer.plugins") for name, value in specs]
    monkeypatch.setattr("minfer_core.plugins.metadata.entry_points", lambda group: eps if group == "minfer.plugins" else [])


def test_broken_plugin_is_reported_and_the_others_load(monkeypatch):
    """A plugin that fails to import is named with its error; the good one still registers."""
    monkeypatch.delenv("MINFER_STRICT_PLUGINS", raising=False)
    fake_entry_points(monkeypatch, ("broken", "no_such_module_for_minfer"), ("good", "plugin_fixture"))
    ps = PluginSet()
    reg = ps.registry
    assert "ModuleNotFoundError" in reg.plugins["broken"].error
    assert reg.plugins["good"].ops == ("test.fixture::Twice",)
    assert reg.select_kernel("test.fixture", "Twice", 1) is not None


def test_strict_mode_turns_a_load_failure_into_an_error(monkeypatch):
    """With MINFER_STRICT_PLUGINS=1 a broken plugin raises PluginLoadError naming it."""
    monkeypatch.setenv("MINFER_STRICT_PLUGINS", "1")
    fake_entry_points(monkeypatch, ("broken", "no_such_module_for_minfer"))
    with pytest.raises(PluginLoadError, match="'broken'"):
        PluginSet()


def test_allow_list_limits_which_plugins_load(monkeypatch):
    """MINFER_PLUGINS names the only plugins to load."""
    monkeypatch.setenv("MINFER_PLUGINS", "good")
    fake_entry_points(monkeypatch, ("broken", "no_such_module_for_minfer"), ("good", "plugin_fixture"))
    assert set(PluginSet().registry.plugins) == {"good"}


def test_misspelt_hookimpl_is_an_error():
    """check_pending makes a hookimpl with an unknown name a PluginLoadError."""

    class Typo:
        @hookimpl
        def register_kernel(self, register):  # missing "s"
            pass

    with pytest.raises(PluginLoadError, match="Typo"):
        use_plugins(Typo())


def test_plugin_registering_garbage_is_reported(monkeypatch):
    """Handing register something that is not a record fails that plugin, by name."""
    monkeypatch.delenv("MINFER_STRICT_PLUGINS", raising=False)

    class Bad:
        @hookimpl
        def register_kernels(self, register):
            register("not a kernel")

    ps = PluginSet(entry_points=False)
    ps.register(Bad(), "bad-plugin")
    assert "RegistrationError" in ps.registry.plugins["bad-plugin"].error


def custom_model():
    node = helper.make_node("Triple", ["x"], ["y"], domain="test.conflict", name="t0")
    return make_model([node], [tensor("x", [3])], [tensor("y", [3])], extra_opsets=[helper.make_opsetid("test.conflict", 1)])


def provider(name, factor, priority=0, claim=True):
    """A plugin with a Triple kernel; ``claim``: it also declares the op (only one plugin may, unless preferred)."""

    @kernel("Triple", domain="test.conflict", priority=priority)
    def triple(x):
        """Triple-1: factor * x."""
        return x * np.float32(factor)

    class Plugin:
        __name__ = name

        @hookimpl
        def register_ops(self, register):
            if claim:
                register(op("Triple", domain="test.conflict"))

        @hookimpl
        def register_kernels(self, register):
            register(triple)

    return Plugin()


def test_equal_priority_kernels_are_ambiguous_until_preferred():
    """Two plugins' kernels at equal priority raise, naming both and the fix; a preference decides."""
    x = np.ones(3, np.float32)
    with use_plugins(provider("one", 3), provider("two", 30, claim=False)):
        with pytest.raises(AmbiguousKernelError, match=r"one.*two.*MINFER_PREFER"):
            InferenceSession(custom_model())
        from minfer_core import get_registry

        get_registry().prefer("Triple", "two", domain="test.conflict")
        assert InferenceSession(custom_model()).run(None, {"x": x})[0][0] == 30


def test_higher_priority_kernel_overrides_on_purpose(monkeypatch):
    """Without timing (MINFER_TUNE=0), a kernel with higher priority from another plugin wins without ambiguity."""
    monkeypatch.setenv("MINFER_TUNE", "0")
    x = np.ones(3, np.float32)
    with use_plugins(provider("base", 3), provider("fast", 3.0001, priority=10, claim=False)):
        got = InferenceSession(custom_model()).run(None, {"x": x})[0]
    assert got[0] == np.float32(3.0001)


@pytest.mark.parametrize("faster", ["base", "fast"])
def test_kernels_from_two_plugins_are_timed_and_the_faster_kept(monkeypatch, tmp_path, faster):
    """With timing on, the core times both plugins' kernels on the first run (build's warm-up run here) and keeps the
    faster, whatever its priority."""
    from minfer_core import tuning

    monkeypatch.setenv("MINFER_CACHE", str(tmp_path))
    factor = {"base": 3.0, "fast": 3.0001}

    def seconds(fn, x, **kw):  # the measured time, faked: which kernel ran is seen in its result
        return 1.0 if fn(np.ones(3, np.float32))[0] == np.float32(factor[faster]) else 2.0

    monkeypatch.setattr(tuning, "seconds", seconds)
    monkeypatch.setattr(tuning, "CALM", 0.0)  # faked seconds spend no CPU: the timing counts as undisturbed
    x = np.ones(3, np.float32)
    with use_plugins(provider("base", 3), provider("fast", 3.0001, priority=10, claim=False)):
        got = [InferenceSession(custom_model()).run(None, {"x": x})[0][0] for _ in range(2)]
    assert got == [np.float32(factor[faster])] * 2
    assert any(tmp_path.glob("tuning-*.jsonl"))  # the choice persisted for later processes


def test_in_code_plugin_lasts_only_for_the_block():
    """use_plugins registers for the with-block only."""
    with use_plugins(provider("temp", 3)):
        InferenceSession(custom_model())
    with pytest.raises(UnsupportedOpError, match="Triple"):
        InferenceSession(custom_model())


def test_first_party_plugins_are_installed():
    """The three first-party plugins load through their entry points."""
    from minfer_core import get_registry

    plugins = get_registry().plugins
    for dist in ("minfer-ops-basic", "minfer-ops-conv", "minfer-passes"):
        assert dist in plugins and plugins[dist].error is None
    assert "Conv" in plugins["minfer-ops-conv"].ops and "Relu" in plugins["minfer-ops-basic"].ops


def test_active_registry_is_what_get_registry_returns_inside_a_build():
    """Inside active_registry, get_registry (used by passes and kernels) returns that registry."""
    from minfer_core import get_registry
    from minfer_core.plugins import Registry, active_registry

    custom = Registry()
    with active_registry(custom):
        assert get_registry() is custom
    assert get_registry() is not custom
