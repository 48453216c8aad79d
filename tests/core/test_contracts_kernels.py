"""A kernel's results are checked against the inferred types, and feeds reach kernels read-only."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

import minfer_core
from minfer_core import KernelError, hookimpl, kernel, op
from modelkit import make_model, tensor

DOMAIN = "test.contract"


def _bad(result, views=None):
    """A plugin whose op Bad (output type = input type) has a kernel returning ``result(x)``."""

    @kernel("Bad", domain=DOMAIN, views=views)
    def bad(x):
        """Bad-1: returns whatever the test asks for."""
        return result(x)

    class Plugin:
        @hookimpl
        def register_ops(self, register):
            register(op("Bad", domain=DOMAIN))

        @hookimpl
        def register_kernels(self, register):
            register(bad)

    return Plugin()


def _session(**kw):
    nodes = [helper.make_node("Bad", ["x"], ["b"], domain=DOMAIN, name="the_bad_node"),
             helper.make_node("Relu", ["b"], ["y"], name="the_next_node")]
    model = make_model(nodes, [tensor("x", [2, 3])], [tensor("y", [2, 3])],
                       extra_opsets=[helper.make_opsetid(DOMAIN, 1)])
    return minfer_core.InferenceSession(model.SerializeToString(), passes="none", **kw)


@pytest.mark.parametrize("result, why", [
    (lambda x: x.astype(np.float64), "float64"),
    (lambda x: x.reshape(3, 2).copy(), "[3, 2]"),
    (lambda x: x[None].copy(), "[1, 2, 3]"),
    (lambda x: None, "NoneType, not an array"),
    (lambda x: 1.5, "float, not an array"),
])
def test_a_kernel_result_that_contradicts_the_inferred_type_names_the_kernel_and_plugin(minfer_plugin, result, why):
    """A wrong dtype, shape or rank, None or a Python scalar is a KernelError naming that node, kernel and plugin."""
    minfer_plugin(_bad(result))
    sess = _session()
    with pytest.raises(KernelError) as info:
        sess.run(None, {"x": np.ones((2, 3), np.float32)})
    text = str(info.value)
    assert "the_bad_node" in text and "the_next_node" not in text
    assert "kernel Bad-1 from plugin" in text and why in text and "'b'" in text


def test_a_kernel_with_the_right_result_passes_the_check(minfer_plugin):
    """The check accepts a result of the inferred type (so the tests above fail for the reason they name)."""
    minfer_plugin(_bad(lambda x: x * 2))
    out = _session().run(None, {"x": np.full((2, 3), -1, np.float32)})[0]
    np.testing.assert_array_equal(out, np.zeros((2, 3), np.float32))


def test_a_kernel_writing_into_its_input_fails_and_leaves_the_feed_unchanged(minfer_plugin):
    """Feeds reach kernels read-only: a kernel writing into one fails, named, and the caller's array is intact."""

    def scribble(x):
        x[...] = 7
        return x.copy()

    minfer_plugin(_bad(scribble))
    feed = np.ones((2, 3), np.float32)
    with pytest.raises(KernelError, match="the_bad_node"):
        _session().run(None, {"x": feed})
    np.testing.assert_array_equal(feed, np.ones((2, 3), np.float32))
    assert feed.flags.writeable  # the caller's own array is not made read-only


@pytest.mark.parametrize("result", [lambda x: x, lambda x: x.reshape(3, 2).reshape(2, 3), lambda x: x[::1]])
def test_a_kernel_declaring_views_false_that_returns_a_view_of_its_input_names_the_kernel(minfer_plugin, result):
    """``views=False`` lets the memory plan give the output its own buffer and reuse the input's: a kernel breaking
    it (its input, or a view of it) is a KernelError naming node, kernel and plugin on the first run of a shape."""
    minfer_plugin(_bad(result, views=False))
    with pytest.raises(KernelError) as info:
        _session().run(None, {"x": np.ones((2, 3), np.float32)})
    text = str(info.value)
    assert "the_bad_node" in text and "kernel Bad-1 from plugin" in text and "views=False" in text and "'b'" in text


def test_a_kernel_that_may_return_views_can_return_its_input(minfer_plugin):
    """Without ``views=False`` returning the input is allowed (the plan tracks the alias): the check above is the
    declaration's, not a ban on views."""
    minfer_plugin(_bad(lambda x: x))
    out = _session().run(None, {"x": np.full((2, 3), -1, np.float32)})[0]
    np.testing.assert_array_equal(out, np.zeros((2, 3), np.float32))
