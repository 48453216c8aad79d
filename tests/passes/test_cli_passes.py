"""`minfer passes`, `minfer optimize` and `minfer bisect-passes`."""

from __future__ import annotations

import json

import attrs
import numpy as np
import onnx

from minfer_core import Graph, hookimpl, use_plugins
from minfer_core.cli import main
from minfer_core.testing.bisect import bisect
from minfer_core.plugins import get_registry
from minfer_core.testing import GraphBuilder, random_feeds


def test_passes_lists_every_installed_pass(capsys):
    """`minfer passes --json` names each pass with its plugin, level, ordering and tolerance."""
    assert main(["passes", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in listed["passes"]}
    assert set(rows) == {p.name for p in get_registry().passes}
    assert rows["conv_bn_fusion"]["plugin"] == "minfer-passes" and rows["conv_bn_fusion"]["rtol"] == 1e-4
    assert "shape_inference" in rows["identity_elimination"]["requires"]
    assert listed["order"]["all"].index("conv_bn_fusion") < listed["order"]["all"].index("activation_fusion")


def test_optimize_writes_fused_or_portable_models(tmp_path, capsys):
    """`minfer optimize` writes ai.minfer fused nodes; with --portable only standard ops remain."""
    src = tmp_path / "m.onnx"
    from minfer_core import save_model

    save_model(_conv_bn_relu(), src)
    assert main(["optimize", str(src), str(tmp_path / "fused.onnx")]) == 0
    out = capsys.readouterr().out
    assert "conv_bn_fusion" in out and "activation_fusion" in out and "-> 1 nodes" in out
    fused = onnx.load(str(tmp_path / "fused.onnx"))
    assert [(n.domain, n.op_type) for n in fused.graph.node] == [("ai.minfer", "FusedConv")]
    assert main(["optimize", str(src), str(tmp_path / "p.onnx"), "--portable", "--disable", "activation_fusion"]) == 0
    portable = onnx.load(str(tmp_path / "p.onnx"))
    assert {n.domain for n in portable.graph.node} == {""}
    assert "ai.minfer" not in {o.domain for o in portable.opset_import}


def test_bisect_names_the_first_pass_beyond_its_tolerance():
    """bisect-passes finds a planted broken pass and says which output moved."""
    from test_planted_bugs import _off_by_one_conv_bn

    broken = attrs.evolve(next(p for p in get_registry().passes if p.name == "conv_bn_fusion"),
                          name="broken_conv_bn", fn=_off_by_one_conv_bn)

    class Plugin:
        @hookimpl
        def register_passes(self, register):
            register(broken)

    graph = _conv_bn_relu(channels=3)
    with use_plugins(Plugin()):
        found = bisect(graph.copy(), "all", ["conv_bn_fusion"], random_feeds(graph), log=lambda line: None)
        assert found is not None and found[0].name == "broken_conv_bn" and "beyond" in found[1]
        assert bisect(graph.copy(), "all", ["broken_conv_bn"], random_feeds(graph), log=lambda line: None) is None


def _conv_bn_relu(channels: int = 2) -> Graph:
    rng = np.random.default_rng(0)
    b = GraphBuilder()
    x = b.input((1, channels, 4, 4))
    y = b.op("Conv", x, b.const(rng.standard_normal((channels, channels, 3, 3)).astype(np.float32)), kernel_shape=[3, 3])
    stats = [rng.uniform(0.5, 1.5, channels).astype(np.float32) for _ in range(4)]
    y = b.op("BatchNormalization", y, *[b.const(s) for s in stats])
    b.output(b.op("Relu", y))
    return b.build()
