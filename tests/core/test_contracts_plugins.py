"""The plugin contracts (issue 13): atomic contributions, attributed failures, ordering names, selection, conflicts."""

from __future__ import annotations

import sys
import textwrap
from importlib import metadata

import numpy as np
import pytest
from onnx import helper

from modelkit import make_model, tensor
from minfer_core import (
    AmbiguousKernelError,
    InferenceSession,
    Pass,
    PassError,
    PluginLoadError,
    ShapeInferenceError,
    TensorType,
    hookimpl,
    kernel,
    kernels_in,
    onnx_op,
    op,
    use_plugins,
)
from minfer_core.errors import PluginWarning
from minfer_core.plugins import PluginSet, Registry

DOMAIN = "test.contract"


def custom_model(op_type="Twice"):
    node = helper.make_node(op_type, ["x"], ["y"], domain=DOMAIN, name="n0")
    return make_model([node], [tensor("x", [3])], [tensor("y", [3])], extra_opsets=[helper.make_opsetid(DOMAIN, 1)])


@kernel("Twice", domain=DOMAIN)
def twice(x):
    """Twice-1: 2 * x."""
    return x * np.asarray(2, x.dtype)


class HalfBroken:
    """Registers an op and a kernel, then its pass hook fails."""

    __name__ = "half-broken"

    @hookimpl
    def register_ops(self, register):
        register(op("Twice", domain=DOMAIN))

    @hookimpl
    def register_kernels(self, register):
        register(twice)

    @hookimpl
    def register_passes(self, register):
        raise RuntimeError("boom in passes")


def fake_entry_points(monkeypatch, *specs):
    eps = [metadata.EntryPoint(name, value, "minfer.plugins") for name, value in specs]
    monkeypatch.setattr("minfer_core.plugins.metadata.entry_points", lambda group: eps if group == "minfer.plugins" else [])


def write_module(tmp_path, monkeypatch, name, source):
    path = tmp_path / f"{name}.py"
    path.write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return path


def test_a_plugin_whose_hook_fails_contributes_nothing(monkeypatch):
    """A failure in any hook removes everything the plugin registered in its other hooks."""
    monkeypatch.delenv("MINFER_STRICT_PLUGINS", raising=False)
    ps = PluginSet(entry_points=False)
    ps.register(HalfBroken(), "half-broken")
    reg = ps.registry
    assert reg.op_def(DOMAIN, "Twice") is None
    assert reg.select_kernel(DOMAIN, "Twice", 1) is None
    info = reg.plugins["half-broken"]
    assert info.ops == () and info.kernels == () and info.hook == "register_passes"


def test_a_hook_failure_names_plugin_hook_file_and_line(monkeypatch):
    """The recorded failure names the plugin, the hook, and the file:line of the plugin's code that raised."""
    monkeypatch.delenv("MINFER_STRICT_PLUGINS", raising=False)
    ps = PluginSet(entry_points=False)
    ps.register(HalfBroken(), "half-broken")
    info = ps.registry.plugins["half-broken"]
    line = HalfBroken.register_passes.__code__.co_firstlineno + 2
    assert info.where == f"{__file__}:{line}"
    assert "'half-broken'" in info.error and "register_passes" in info.error and f"{__file__}:{line}" in info.error
    assert "boom in passes" in info.error


def test_session_creation_warns_about_a_broken_plugin(monkeypatch):
    """Building a session while a plugin is broken warns (PluginWarning) with its name and hook."""
    monkeypatch.delenv("MINFER_STRICT_PLUGINS", raising=False)
    with use_plugins(HalfBroken()):
        with pytest.warns(PluginWarning, match=r"half-broken.*register_passes"):
            InferenceSession(make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2])], [tensor("y", [2])]))


def test_strict_mode_raises_for_a_failing_hook(monkeypatch):
    """With MINFER_STRICT_PLUGINS=1 a failing hook is a PluginLoadError naming plugin, hook and line."""
    monkeypatch.setenv("MINFER_STRICT_PLUGINS", "1")
    ps = PluginSet(entry_points=False)
    ps.register(HalfBroken(), "half-broken")
    with pytest.raises(PluginLoadError, match=r"'half-broken' failed in register_passes at .*test_contracts_plugins.py:\d+"):
        ps.registry


def test_sys_exit_in_a_plugin_import_is_caught_and_attributed(monkeypatch, tmp_path):
    """A plugin calling sys.exit while imported is a reported failure (file and line), not the end of the process."""
    monkeypatch.delenv("MINFER_STRICT_PLUGINS", raising=False)
    path = write_module(tmp_path, monkeypatch, "minfer_exiting_plugin", """\
        import sys

        sys.exit(3)
    """)
    fake_entry_points(monkeypatch, ("exiting", "minfer_exiting_plugin"), ("good", "plugin_fixture"))
    reg = PluginSet().registry
    info = reg.plugins["exiting"]
    assert info.hook == "import" and info.where == f"{path}:3" and "SystemExit: 3" in info.error
    assert reg.select_kernel("test.fixture", "Twice", 1) is not None


def test_a_failing_import_names_file_and_line(monkeypatch, tmp_path):
    """An exception while importing a plugin is recorded with the plugin module's file and line."""
    monkeypatch.delenv("MINFER_STRICT_PLUGINS", raising=False)
    path = write_module(tmp_path, monkeypatch, "minfer_raising_plugin", """\
        x = 1
        raise ValueError("bad plugin")
    """)
    fake_entry_points(monkeypatch, ("raising", "minfer_raising_plugin"))
    info = PluginSet().registry.plugins["raising"]
    assert info.where == f"{path}:2" and "ValueError: bad plugin" in info.error


def test_unknown_pass_name_in_ordering_is_an_error():
    """A misspelt pass name in after/before is a PassError listing the installed passes, not silently dropped."""

    class Misspelt:
        @hookimpl
        def register_passes(self, register):
            register(Pass("contract_noop", lambda g: False, "basic", after=("constant_foldin",)))

    model = make_model([helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2])], [tensor("y", [2])])
    with use_plugins(Misspelt()):
        with pytest.raises(PassError, match=r"contract_noop.*'constant_foldin'.*installed passes are"):
            InferenceSession(model)


def versioned(name, since, priority, factor):
    @kernel("Twice", domain=DOMAIN, since=since, priority=priority)
    def k(x):
        """Twice: factor * x."""
        return x * np.float32(factor)

    class Plugin:
        __name__ = name

        @hookimpl
        def register_kernels(self, register):
            register(k)

    return Plugin()


def test_selection_takes_the_newest_since_before_priority():
    """A since=1 kernel with a higher priority never runs a model whose opset has a newer kernel."""

    class Claim:
        @hookimpl
        def register_ops(self, register):
            register(op("Twice", domain=DOMAIN))

    with use_plugins(Claim(), versioned("old-fast", 1, 10, 1.0), versioned("new", 13, 0, 2.0)):
        from minfer_core import get_registry

        reg = get_registry()
        assert reg.select_kernel(DOMAIN, "Twice", 17).plugin == "new"
        assert reg.select_kernel(DOMAIN, "Twice", 12).plugin == "old-fast"


def claimer(name):
    class Plugin:
        __name__ = name

        @hookimpl
        def register_ops(self, register):
            register(onnx_op("Relu"))

    return Plugin()


def test_two_plugins_claiming_one_standard_op_is_ambiguous_until_preferred(monkeypatch):
    """A second claim of a standard op the model uses raises, naming both plugins and the MINFER_PREFER line."""
    monkeypatch.delenv("MINFER_PREFER", raising=False)
    model = make_model([helper.make_node("Relu", ["x"], ["y"], name="r")], [tensor("x", [2])], [tensor("y", [2])])
    with use_plugins(claimer("second-relu")):
        with pytest.raises(AmbiguousKernelError, match=r"minfer-ops-basic.*second-relu.*MINFER_PREFER='Relu="):
            InferenceSession(model)
        from minfer_core import get_registry

        get_registry().prefer("Relu", "minfer-ops-basic")
        try:
            got = InferenceSession(model).run(None, {"x": np.array([-1, 2], np.float32)})[0]
        finally:
            get_registry().preferences.pop("Relu")
    np.testing.assert_array_equal(got, [0, 2])


def test_an_infer_that_raises_is_a_shape_inference_error_naming_op_and_plugin():
    """A plugin's infer= that raises is a ShapeInferenceError naming the op and the plugin, not a silent record."""

    def bad_infer(*types, **attrs):
        raise ValueError("cannot infer")

    class BadInfer:
        __name__ = "bad-infer"

        @hookimpl
        def register_ops(self, register):
            register(op("Twice", domain=DOMAIN, infer=bad_infer))

        @hookimpl
        def register_kernels(self, register):
            register(twice)

    with use_plugins(BadInfer()):
        with pytest.raises(ShapeInferenceError, match=r"'n0'.*Twice.*'bad-infer'.*cannot infer"):
            InferenceSession(custom_model())


def test_register_takes_modules_and_finds_every_kernel_they_define():
    """One way to declare: @kernel records, handed over directly or as the modules that define them."""
    import plugin_fixture

    reg = Registry()
    reg.add("p", "register_kernels", [plugin_fixture])
    assert [k.op_type for k in reg.kernels[("test.fixture", "Twice")]] == ["Twice"]
    assert kernels_in(plugin_fixture) == [plugin_fixture.twice]


def test_a_record_one_module_imports_from_another_is_registered_once():
    """Modules handed to register together count a kernel record they share once (a module importing a sibling's
    record by name would otherwise make the core time the kernel against itself)."""
    import types

    import plugin_fixture

    sibling = types.ModuleType("sibling")
    sibling.twice = plugin_fixture.twice  # as `from .plugin_fixture import twice` leaves it
    reg = Registry()
    reg.add("p", "register_kernels", [plugin_fixture, sibling])
    assert len(reg.kernels[("test.fixture", "Twice")]) == 1


def test_first_party_plugins_register_no_kernel_their_modules_do_not_define():
    """The ops plugins' kernels are exactly the @kernel records of their modules: no hand-kept list."""
    from minfer_core import get_registry
    from minfer_ops_basic import plugin as basic

    mine = [k for ks in get_registry().kernels.values() for k in ks if k.plugin == "minfer-ops-basic"]
    defined = kernels_in(*basic.MODULES, *basic.OWN_OPS)
    assert {(k.op_type, k.since, k.fn) for k in mine} == {(k.op_type, k.since, k.fn) for k in defined}


def test_infer_returning_types_still_works():
    """A well-behaved infer= keeps working under the strict build."""

    class GoodInfer:
        @hookimpl
        def register_ops(self, register):
            register(op("Twice", domain=DOMAIN, infer=lambda t: [TensorType(t.dtype, t.shape)]))

        @hookimpl
        def register_kernels(self, register):
            register(twice)

    with use_plugins(GoodInfer()):
        y = InferenceSession(custom_model()).run(None, {"x": np.ones(3, np.float32)})[0]
    np.testing.assert_array_equal(y, [2, 2, 2])
