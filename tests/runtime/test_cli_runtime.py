"""The runtime CLI commands: ``minfer run --profile`` and ``minfer memory``."""

from __future__ import annotations

import json

import onnx
from onnx import helper

from minfer_core.cli import main
from modelkit import make_model, tensor


def _model_file(tmp_path):
    nodes = [helper.make_node("Relu", ["x"], ["h"], name="relu"), helper.make_node("Neg", ["h"], ["y"], name="neg")]
    path = tmp_path / "m.onnx"
    onnx.save(make_model(nodes, [tensor("x", ["N", 8])], [tensor("y", ["N", 8])]), str(path))
    return str(path)


def test_run_profile_writes_a_chrome_trace(tmp_path, capsys):
    """`minfer run MODEL --profile trace.json` writes per-node trace events and prints op totals."""
    trace = tmp_path / "trace.json"
    # --passes basic: elementwise_fusion ("extended") would make Relu + Neg one node
    assert main(["run", _model_file(tmp_path), "--dim", "N=4", "--repeat", "2", "--passes", "basic",
                 "--profile", str(trace)]) == 0
    events = json.loads(trace.read_text())["traceEvents"]
    assert [e["name"] for e in events if e["cat"] == "Node"] == ["relu", "neg"] * 2
    assert "Relu" in capsys.readouterr().out


def test_memory_command_prints_the_plan(tmp_path, capsys):
    """`minfer memory MODEL` prints arena, live-set and naive sizes for the model's input shapes."""
    assert main(["memory", _model_file(tmp_path), "--dim", "N=16"]) == 0
    out = capsys.readouterr().out
    for key in ("arena_bytes", "live_set_bytes", "naive_bytes"):
        assert key in out
