"""The minfer command line: run, plugins, info."""

from __future__ import annotations

import json

import pytest
from onnx import helper

from modelkit import make_model, tensor
from minfer_core.cli import main


def test_run_prints_outputs_and_timings(capsys):
    """`minfer run` on a shipped model prints each output and build/run time."""
    assert main(["run", "light_squeezenet"]) == 0
    out = capsys.readouterr().out
    assert "softmaxout_1: shape (1, 1000, 1, 1) dtype float32" in out
    assert "build" in out and "run" in out


def test_run_accepts_npy_inputs(tmp_path, capsys):
    """`--input NAME=FILE.npy` feeds a given array."""
    import numpy as np

    model = make_model([helper.make_node("Neg", ["x"], ["y"])], [tensor("x", [2])], [tensor("y", [2])])
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    np.save(tmp_path / "x.npy", np.array([1.5, -2], np.float32))
    assert main(["run", str(tmp_path / "m.onnx"), "--input", f"x={tmp_path / 'x.npy'}"]) == 0
    assert "[-1.5, 2.0]" in capsys.readouterr().out


def test_plugins_json_lists_first_party_and_example_plugins(capsys):
    """`minfer plugins --json` shows each plugin with its distribution, version and ops."""
    assert main(["plugins", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    by_name = {p["name"]: p for p in data["plugins"]}
    for name in ("minfer-ops-basic", "minfer-ops-conv", "minfer-passes", "minfer-contrib-example"):
        assert by_name[name]["version"] == "0.1.0" and by_name[name]["error"] is None
    assert "Conv" in by_name["minfer-ops-conv"]["ops"]


def test_info_names_providers_and_missing_ops(tmp_path, capsys):
    """`minfer info` shows the plugin behind each op and names the missing ones; exit 1 when any is missing."""
    nodes = [helper.make_node("Relu", ["x"], ["a"]), helper.make_node("Zork", ["a"], ["y"], domain="com.nowhere")]
    model = make_model(nodes, [tensor("x", [2])], [tensor("y", [2])], extra_opsets=[helper.make_opsetid("com.nowhere", 1)])
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    assert main(["info", str(tmp_path / "m.onnx")]) == 1
    out = capsys.readouterr().out
    assert "minfer-ops-basic (kernel Relu-" in out
    assert "com.nowhere::Zork" in out and "MISSING" in out


def test_bad_model_path_is_a_clean_error(capsys):
    """A missing model is a command-line mistake: exit 2 and a one-line minfer error, no traceback."""
    assert main(["run", "/nonexistent/model.onnx"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("minfer: error: no model file") and "Traceback" not in err


def test_a_model_minfer_refuses_is_exit_1(tmp_path, capsys):
    """A model file that exists but is not ONNX exits 1 with the ModelLoadError on one line."""
    (tmp_path / "m.onnx").write_bytes(b"not a model")
    assert main(["run", str(tmp_path / "m.onnx")]) == 1
    err = capsys.readouterr().err
    assert err.startswith("minfer: error: ModelLoadError") and err.count("\n") == 1


@pytest.mark.parametrize("argv", [[], ["--help"]])
def test_help(argv, capsys):
    """Without a command the CLI prints usage."""
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    assert code in (0, 2)
    assert "usage: minfer" in capsys.readouterr().out


def test_run_with_random_weights_gives_informative_outputs(capsys):
    """`--random-weights` replaces the zoo files' placeholder weights, so outputs are no longer all equal."""
    assert main(["run", "light_squeezenet", "--random-weights"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("softmaxout_1"))
    values = [float(v) for v in line.split("first values")[1].strip(" []").split(",")]
    assert len(set(values)) > 1
