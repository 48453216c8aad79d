"""A third-party plugin's pass gets the whole property suite from one pytest option."""

from __future__ import annotations

import subprocess
import sys
import textwrap

PLUGIN = '''
"""A third party's plugin: one pass, Neg(Neg(x)) -> x, with its target strategy."""
from hypothesis import strategies as st

from minfer_core import Pass, hookimpl, use_plugins
from minfer_core.testing import GraphBuilder
from minfer_core.testing.strategies import expose, shapes

BROKEN = {broken}


def double_neg(graph):
    """Bypass Neg(Neg(x)) where the inner Neg has no other reader."""
    changed = False
    for outer in list(graph.nodes):
        inner = graph.producer(outer.inputs[0]) if outer.op_type == "Neg" else None
        if inner is None or inner.op_type != "Neg" or outer.outputs[0] in graph.outputs:
            continue
        if len(graph.consumers(inner.outputs[0])) != 1 or inner.outputs[0] in graph.outputs:
            continue
        graph.remove_node(outer)
        source = inner.outputs[0] if BROKEN else inner.inputs[0]
        graph.replace_all_uses(outer.outputs[0], source, graph_outputs=False)
        changed = True
    return changed


@st.composite
def patterns(draw):
    b = GraphBuilder()
    x = b.input(draw(shapes()))
    inner = b.op("Neg", x)
    expose(draw, b, inner)
    b.output(b.op("Relu", b.op("Neg", inner)))
    return b.build()


class Plugin:
    @hookimpl
    def register_passes(self, register):
        register(Pass("double_neg", double_neg, patterns=patterns))


use_plugins(Plugin())  # an installed distribution would register through its entry point instead
'''


def _run(tmp_path, broken: bool) -> subprocess.CompletedProcess:
    (tmp_path / "conftest.py").write_text(textwrap.dedent(PLUGIN.format(broken=broken)))
    cmd = [sys.executable, "-m", "pytest", "--minfer-passes=double_neg", "-q", "-p", "no:cacheprovider", str(tmp_path)]
    return subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=600)


def test_third_party_pass_is_checked_by_the_option(tmp_path):
    """`pytest --minfer-passes=NAME` runs the suite on a third party's pass, and it passes when correct."""
    result = _run(tmp_path, broken=False)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "4 passed" in result.stdout  # its target strategy, random graphs, the pipeline, coverage


def test_third_party_broken_pass_fails_the_option(tmp_path):
    """The same run fails when the third party's pass changes the outputs."""
    result = _run(tmp_path, broken=True)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "double_neg" in result.stdout and "changed the outputs" in result.stdout
