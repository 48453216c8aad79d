"""onnxruntime's API: code written for onnxruntime runs by changing the import; what minfer lacks is refused."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

import minfer_core
from modelkit import make_model, tensor
from minfer_core import (
    Engine,
    GraphOptimizationLevel,
    InferenceSession,
    InvalidOutputError,
    RunOptions,
    SessionOptions,
    UnsupportedOptionError,
)
from minfer_core.cli_passes import optimize_graph

ort = pytest.importorskip("onnxruntime")


def mlp_model() -> onnx.ModelProto:
    """x -> Identity -> MatMul -> Add -> Relu -> Mul(2) -> y: something for every pass level to do."""
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(3).astype(np.float32), "b")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    nodes = [
        helper.make_node("Identity", ["x"], ["xi"], name="identity"),
        helper.make_node("MatMul", ["xi", "w"], ["m"], name="matmul"),
        helper.make_node("Add", ["m", "b"], ["a"], name="add"),
        helper.make_node("Relu", ["a"], ["r"], name="relu"),
        helper.make_node("Mul", ["r", "two"], ["y"], name="scale"),
    ]
    model = make_model(nodes, [tensor("x", ["N", 4])], [tensor("y", ["N", 3])], [w, b, two],
                       producer_name="snippet-maker", doc_string="a tiny MLP")
    model.graph.name = "mlp"
    model.metadata_props.add(key="author", value="tests")
    return model


FEED = {"x": np.random.default_rng(1).standard_normal((2, 4)).astype(np.float32)}


def onnxruntime_snippet(rt, model_bytes: bytes, folder: Path) -> dict:
    """Typical onnxruntime code; ``rt`` is onnxruntime or minfer_core and nothing else changes."""
    so = rt.SessionOptions()
    so.intra_op_num_threads = 1
    so.inter_op_num_threads = 1
    so.graph_optimization_level = rt.GraphOptimizationLevel.ORT_ENABLE_ALL
    so.execution_mode = rt.ExecutionMode.ORT_SEQUENTIAL
    so.log_severity_level = 3
    so.optimized_model_filepath = str(folder / "optimized.onnx")
    so.enable_profiling = True
    so.profile_file_prefix = str(folder / "profile")
    assert "CPUExecutionProvider" in rt.get_available_providers()
    sess = rt.InferenceSession(model_bytes, sess_options=so, providers=["CPUExecutionProvider"])
    inputs, outputs = sess.get_inputs(), sess.get_outputs()
    feed = {inputs[0].name: FEED["x"]}
    every = sess.run(None, feed)
    named = sess.run([outputs[0].name], feed)
    meta = sess.get_modelmeta()
    return {
        "providers": sess.get_providers(),
        "inputs": [(i.name, i.type, i.shape) for i in inputs],
        "outputs": [(o.name, o.type, o.shape) for o in outputs],
        "every": every,
        "named": named,
        "meta": (meta.producer_name, meta.graph_name, meta.description, meta.custom_metadata_map),
        "profile": sess.end_profiling(),
    }


def test_onnxruntime_snippet_runs_unchanged_except_the_import(tmp_path):
    """The same onnxruntime snippet runs with `import minfer_core as ort` and gives onnxruntime's answers."""
    model = mlp_model().SerializeToString()
    (tmp_path / "ort").mkdir()
    (tmp_path / "minfer").mkdir()
    want = onnxruntime_snippet(ort, model, tmp_path / "ort")
    got = onnxruntime_snippet(minfer_core, model, tmp_path / "minfer")
    for key in ("providers", "inputs", "outputs", "meta"):
        assert got[key] == want[key], key
    for key in ("every", "named"):
        assert len(got[key]) == len(want[key]) == 1
        np.testing.assert_allclose(got[key][0], want[key][0], rtol=1e-5, atol=1e-6)
    trace = json.loads(Path(got["profile"]).read_text())
    assert Path(got["profile"]).name.startswith("profile_") and Path(want["profile"]).name.startswith("profile_")
    assert {e["name"] for e in trace["traceEvents"] if e["cat"] == "Session"} >= {"model_run", "session_initialization"}
    onnx.checker.check_model(onnx.load(str(tmp_path / "minfer" / "optimized.onnx")))


@pytest.mark.parametrize("name,what", [("r", "intermediate"), ("x", "model input"), ("w", "initializer"),
                                       ("nope", "model's outputs")])
def test_a_name_that_is_not_an_output_is_an_error_as_in_onnxruntime(name, what):
    """run([name]) for an input, initializer, intermediate or unknown name raises, never returns [None] or a weight."""
    model = mlp_model().SerializeToString()
    with pytest.raises(Exception, match="Invalid output name"):
        ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run([name], FEED)
    sess = InferenceSession(model, passes="none")
    with pytest.raises(InvalidOutputError, match=rf"unknown output '{name}'.*{what}.*\['y'\]") as info:
        sess.run([name], FEED)
    assert isinstance(info.value, ValueError)


@pytest.mark.parametrize("names", [None, [], ()])
def test_none_and_an_empty_list_return_every_output(names):
    """run(None) and run([]) both return every output, as onnxruntime does."""
    model = mlp_model().SerializeToString()
    want = ort.InferenceSession(model, providers=["CPUExecutionProvider"]).run(names, FEED)
    got = InferenceSession(model).run(names, FEED)
    assert len(got) == len(want) == 1
    np.testing.assert_allclose(got[0], want[0], rtol=1e-5, atol=1e-6)


def test_output_names_may_repeat_but_not_be_a_string():
    """A repeated name returns the output twice; a bare string is a TypeError (onnxruntime: incompatible arguments)."""
    sess = InferenceSession(mlp_model())
    first, second = sess.run(["y", "y"], FEED)
    np.testing.assert_array_equal(first, second)
    with pytest.raises(TypeError, match=r"write \['y'\]"):
        sess.run("y", FEED)
    with pytest.raises(TypeError, match="input_feed must be a dict"):
        sess.run(None, [FEED["x"]])


@pytest.mark.parametrize("providers", [None, ["CPUExecutionProvider"], [("CPUExecutionProvider", {})],
                                       ("CPUExecutionProvider",)])
def test_the_cpu_provider_is_accepted(providers):
    """None, ["CPUExecutionProvider"] and [("CPUExecutionProvider", {})] build a CPU session."""
    assert InferenceSession(mlp_model(), providers=providers).get_providers() == ["CPUExecutionProvider"]


@pytest.mark.parametrize("providers", [["CUDAExecutionProvider"], ["CUDAExecutionProvider", "CPUExecutionProvider"],
                                       "CPUExecutionProvider", [], [("CPUExecutionProvider", {"arena": "1"})]])
def test_any_other_provider_is_refused_naming_the_available_ones(providers):
    """A provider minfer lacks is an UnsupportedOptionError naming get_available_providers(), not a silent CPU run."""
    with pytest.raises(UnsupportedOptionError, match="CPUExecutionProvider"):
        InferenceSession(mlp_model(), providers=providers)


@pytest.mark.parametrize("keyword", ["sess_option", "disabled_optimizers", "thread"])
def test_an_unknown_keyword_is_a_type_error(keyword):
    """InferenceSession(..., typo=...) raises TypeError naming it and the keywords that exist, instead of swallowing it."""
    with pytest.raises(TypeError, match=rf"\['{keyword}'\]; it takes .*disabled_passes"):
        InferenceSession(mlp_model(), **{keyword: None})


@pytest.mark.parametrize("name", ["intra_op_num_thread", "add_session_config_entry", "use_deterministic_compute"])
def test_session_options_refuse_what_minfer_lacks(name):
    """Setting or calling a SessionOptions member minfer lacks raises, listing the supported names."""
    so = SessionOptions()
    pattern = rf"SessionOptions.{name} is not supported.*intra_op_num_threads"
    with pytest.raises(UnsupportedOptionError, match=pattern) as info:
        setattr(so, name, 1)
    assert isinstance(info.value, AttributeError)
    assert not hasattr(so, name)


@pytest.mark.parametrize("name,value", [("enable_mem_pattern", False), ("intra_op_num_threads", -1),
                                        ("intra_op_num_threads", None), ("log_severity_level", "high"),
                                        ("graph_optimization_level", 7), ("execution_mode", "fast")])
def test_session_options_refuse_values_minfer_cannot_honour(name, value):
    """An option value minfer cannot honour is refused, not ignored."""
    with pytest.raises(UnsupportedOptionError):
        setattr(SessionOptions(), name, value)


def test_onnxruntime_enum_values_are_accepted():
    """onnxruntime's own GraphOptimizationLevel values set minfer's option (users mix the two imports)."""
    so = SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert so.graph_optimization_level is GraphOptimizationLevel.ORT_ENABLE_BASIC


@pytest.mark.parametrize("level,passes", [("ORT_DISABLE_ALL", "none"), ("ORT_ENABLE_BASIC", "basic"),
                                          ("ORT_ENABLE_EXTENDED", "extended"), ("ORT_ENABLE_ALL", "all")])
def test_optimization_level_selects_the_matching_pass_level(level, passes):
    """graph_optimization_level runs exactly minfer's passes of the mapped level."""
    so = SessionOptions()
    so.graph_optimization_level = GraphOptimizationLevel[level]
    got = [r.name for r in InferenceSession(mlp_model(), so).pass_results]
    assert got == [r.name for r in Engine(mlp_model(), passes=passes).pass_results]
    assert bool(got) == (passes != "none")


def test_a_setting_given_twice_is_an_error():
    """passes= with a non-default optimization level (or threads= with intra_op_num_threads) is refused."""
    so = SessionOptions()
    so.graph_optimization_level = GraphOptimizationLevel.ORT_DISABLE_ALL
    with pytest.raises(UnsupportedOptionError, match="passes='all' and sess_options.graph_optimization_level"):
        InferenceSession(mlp_model(), so, passes="all")
    so = SessionOptions()
    so.intra_op_num_threads = 2
    with pytest.raises(UnsupportedOptionError, match="threads=1 and sess_options.intra_op_num_threads"):
        InferenceSession(mlp_model(), so, threads=1)


def test_threads_and_execution_mode_reach_the_engine(monkeypatch):
    """intra_op_num_threads sets the engine's threads; ORT_PARALLEL asks for concurrent branches (inter_op "auto")."""
    seen = []
    monkeypatch.setattr(Engine, "__init__", lambda self, model, **kw: seen.append(kw))
    so = SessionOptions()
    so.intra_op_num_threads = 3
    so.execution_mode = minfer_core.ExecutionMode.ORT_PARALLEL
    InferenceSession(mlp_model(), so)
    InferenceSession(mlp_model())
    assert [(kw["threads"], kw["inter_op"]) for kw in seen] == [(3, "auto"), ("auto", None)]


def test_optimized_model_file_is_what_minfer_optimize_writes(tmp_path):
    """optimized_model_filepath holds the model after the session's passes, as `minfer optimize` writes it."""
    so = SessionOptions()
    so.optimized_model_filepath = str(tmp_path / "opt.onnx")
    sess = InferenceSession(mlp_model(), so)
    written = minfer_core.load_model(tmp_path / "opt.onnx")
    expected = minfer_core.load_model(mlp_model())
    applied = optimize_graph(expected, "all")
    assert [n.op_type for n in written.nodes] == [n.op_type for n in expected.nodes]
    assert len(written.nodes) < len(mlp_model().graph.node)
    np.testing.assert_allclose(InferenceSession(written, passes="none").run(None, FEED)[0], sess.run(None, FEED)[0])
    assert [r.name for r in sess.pass_results] == [r.name for r in applied]


def test_profiling_records_each_run_until_end_profiling(tmp_path):
    """enable_profiling traces every node of every run; end_profiling writes the trace once and stops."""
    so = SessionOptions()
    so.enable_profiling = True
    so.profile_file_prefix = str(tmp_path / "trace")
    so.graph_optimization_level = GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = InferenceSession(mlp_model(), so)
    assert sess.get_profiling_start_time_ns() > 0
    for _ in range(3):
        sess.run(None, FEED)
    path = sess.end_profiling()
    events = json.loads(Path(path).read_text())["traceEvents"]
    assert sum(e["name"] == "model_run" for e in events) == 3
    assert sum(e["cat"] == "Node" for e in events) == 3 * len(mlp_model().graph.node)
    sess.run(None, FEED)
    assert sess.end_profiling() == "" and InferenceSession(mlp_model()).end_profiling() == ""


def test_modelmeta_matches_onnxruntime():
    """get_modelmeta() reports producer, graph name, description and metadata_props as onnxruntime does."""
    model = mlp_model()
    want = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).get_modelmeta()
    got = InferenceSession(model).get_modelmeta()
    for field in ("producer_name", "graph_name", "description", "custom_metadata_map", "domain"):
        assert getattr(got, field) == getattr(want, field), field


def test_run_options_and_session_introspection():
    """RunOptions are accepted (terminate refused); get_session_options returns a copy of the options."""
    opts = RunOptions()
    opts.log_severity_level = 3
    sess = InferenceSession(mlp_model(), providers=["CPUExecutionProvider"])
    assert len(sess.run(None, FEED, opts)) == 1
    with pytest.raises(UnsupportedOptionError, match="terminate"):
        opts.terminate = True
    assert sess.get_session_options() == SessionOptions()
    assert sess.get_provider_options() == {"CPUExecutionProvider": {}}
    with pytest.raises(UnsupportedOptionError, match="io_binding is onnxruntime's"):
        sess.io_binding()
