"""The `all` pipeline on the nine light model-zoo models: fewer nodes, and a portable export onnxruntime runs."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from minfer_core import load_model, to_model_proto
from minfer_core.cli_passes import STANDARD_DOMAINS, optimize_graph
from minfer_core.testing.zoo import LIGHT_MODELS, model_path, randomized

# Node counts the `all` pipeline reaches on the shipped models (see plugins/minfer_passes/README.md); a regression shows here.
EXPECTED_AT_MOST = {
    "light_bvlc_alexnet": 16, "light_densenet121": 308, "light_inception_v1": 85, "light_inception_v2": 95,
    "light_resnet50": 58, "light_shufflenet": 111, "light_squeezenet": 39, "light_vgg19": 27, "light_zfnet512": 16,
}


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_all_pipeline_reduces_node_count(name):
    """`all` removes nodes on every light model, and no BatchNormalization after a Conv survives."""
    graph = load_model(model_path(name))
    before = len(graph.nodes)
    optimize_graph(graph, "all")
    ops = Counter(n.op_type for n in graph.nodes)
    assert len(graph.nodes) < before and len(graph.nodes) <= EXPECTED_AT_MOST[name], dict(ops)
    for node in graph.nodes:
        if node.op_type == "BatchNormalization":
            producer = graph.producer(node.inputs[0])
            assert producer is None or producer.op_type != "Conv", f"{name}: {node.name} follows a Conv"
    if name == "light_resnet50":
        assert ops["BatchNormalization"] == 0


@pytest.mark.parametrize("name", LIGHT_MODELS)
def test_portable_output_runs_in_onnxruntime(name):
    """`optimize --portable` writes standard ops only, and onnxruntime gives the original's outputs."""
    ort = pytest.importorskip("onnxruntime")
    model = randomized(name, seed=3)
    graph = load_model(model)
    optimize_graph(graph, "all", portable=True)
    assert {n.domain for n in graph.nodes} <= set(STANDARD_DOMAINS)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 2
    opts.log_severity_level = 3
    inp = graph.inputs[0]
    x = np.random.default_rng(4).standard_normal(graph.types[inp].shape).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString(), opts).run(None, {inp: x})
    got = ort.InferenceSession(to_model_proto(graph).SerializeToString(), opts).run(None, {inp: x})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name", ["light_squeezenet", "light_resnet50"])
def test_fused_output_reloads_in_minfer(name):
    """A model written with ai.minfer fused nodes loads back into minfer and gives the original's outputs."""
    from minfer_core import InferenceSession

    model = randomized(name, seed=5)
    graph = load_model(model)
    optimize_graph(graph, "all")
    assert any(n.domain == "ai.minfer" for n in graph.nodes)
    inp = graph.inputs[0]
    x = np.random.default_rng(6).standard_normal(graph.types[inp].shape).astype(np.float32)
    want = InferenceSession(model, passes="none").run(None, {inp: x})
    got = InferenceSession(to_model_proto(graph), passes="none").run(None, {inp: x})
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-3, atol=1e-5)
