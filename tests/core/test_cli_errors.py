"""Every mistake on the minfer command line is one line on stderr and exit code 2, never a traceback or silence."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
from onnx import helper

from modelkit import make_model, tensor
from minfer_core import __version__
from minfer_core.cli import main


def cli(argv: list[str], capsys) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of ``minfer argv`` run in this process."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own exits (--version, usage errors)
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def files(tmp_path):
    """A model ``m.onnx`` (input x of shape [N, 2]) and .npy files good and bad, named by role."""
    model = make_model([helper.make_node("Neg", ["x"], ["y"])], [tensor("x", ["N", 2])], [tensor("y", ["N", 2])])
    (tmp_path / "m.onnx").write_bytes(model.SerializeToString())
    np.save(tmp_path / "good.npy", np.ones((3, 2), np.float32))
    (tmp_path / "garbage.npy").write_bytes(b"this is not an npy file at all")
    np.save(tmp_path / "objects.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    (tmp_path / "pickled.npy").write_bytes(pickle.dumps(np.ones(2)))
    # the header claims 9x9 values, the file holds 3x2
    (tmp_path / "truncated.npy").write_bytes((tmp_path / "good.npy").read_bytes().replace(b"(3, 2)", b"(9, 9)"))
    np.savez(tmp_path / "archive.npz", x=np.ones(2))
    return {k: str(tmp_path / v) for k, v in dict(
        model="m.onnx", good="good.npy", garbage="garbage.npy", objects="objects.npy", pickled="pickled.npy",
        truncated="truncated.npy", npz="archive.npz", missing="missing.npy", dir=".", nodir="nowhere/out.onnx",
    ).items()}


MISTAKES = {
    "input-unknown-name": lambda f: ["run", f["model"], "--input", f"typo={f['good']}"],
    "input-without-equals": lambda f: ["run", f["model"], "--input", f["good"]],
    "input-missing-file": lambda f: ["run", f["model"], "--input", f"x={f['missing']}"],
    "input-garbage-file": lambda f: ["run", f["model"], "--input", f"x={f['garbage']}"],
    "input-object-array": lambda f: ["run", f["model"], "--input", f"x={f['objects']}"],
    "input-raw-pickle": lambda f: ["run", f["model"], "--input", f"x={f['pickled']}"],
    "input-truncated-npy": lambda f: ["run", f["model"], "--input", f"x={f['truncated']}"],
    "input-npz-archive": lambda f: ["run", f["model"], "--input", f"x={f['npz']}"],
    "input-is-a-folder": lambda f: ["run", f["model"], "--input", f"x={f['dir']}"],
    "dim-unknown-name": lambda f: ["run", f["model"], "--dim", "UNKNOWN=5"],
    "dim-not-a-number": lambda f: ["run", f["model"], "--dim", "N=abc"],
    "dim-negative": lambda f: ["run", f["model"], "--dim", "N=-3"],
    "dim-float-notation": lambda f: ["run", f["model"], "--dim", "N=1e11"],
    "dim-too-large": lambda f: ["run", f["model"], "--dim", "N=100000000000"],
    "dim-without-equals": lambda f: ["run", f["model"], "--dim", "N"],
    "model-missing": lambda f: ["run", f["missing"] + ".onnx"],
    "model-is-a-folder": lambda f: ["run", f["dir"]],
    "passes-unknown-level": lambda f: ["run", f["model"], "--passes", "fastest"],
    "repeat-not-a-number": lambda f: ["run", f["model"], "--repeat", "many"],
    "profile-folder-missing": lambda f: ["run", f["model"], "--profile", f["nodir"]],
    "optimize-folder-missing": lambda f: ["optimize", f["model"], f["nodir"]],
    "optimize-unknown-pass": lambda f: ["optimize", f["model"], f["model"] + ".out", "--disable", "no-such-pass"],
    "bisect-dim-not-a-number": lambda f: ["bisect-passes", f["model"], "--dim", "N=abc"],
    "memory-dim-unknown": lambda f: ["memory", f["model"], "--dim", "M=2"],
    "info-model-missing": lambda f: ["info", f["missing"] + ".onnx"],
    "unknown-command": lambda f: ["frobnicate"],
    "unknown-option": lambda f: ["run", f["model"], "--fast"],
}


@pytest.mark.parametrize("case", sorted(MISTAKES))
def test_each_command_line_mistake_is_one_line_and_exit_2(files, case, capsys):
    """A command-line mistake exits 2 with one `minfer...: error:` line on stderr, and runs nothing."""
    code, out, err = cli(MISTAKES[case](files), capsys)
    assert code == 2, err
    assert err.startswith("minfer") and "error:" in err and "Traceback" not in err
    assert err.count("\n") == 1, err
    assert "first values" not in out  # nothing ran on made-up data


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs are POSIX")
@pytest.mark.parametrize("kind", ["fifo", "device"])
def test_an_input_that_is_not_a_regular_file_is_refused_unread(files, tmp_path, kind, capsys):
    """`--input x=FIFO` or `--input x=/dev/zero` is refused by the file's kind, never read (which would hang)."""
    path = "/dev/zero"
    if kind == "fifo":
        path = str(tmp_path / "x.npy")
        os.mkfifo(path)
    code, _, err = cli(["run", files["model"], "--input", f"x={path}"], capsys)
    assert code == 2 and "not a regular file" in err and err.count("\n") == 1


def test_dims_and_inputs_given_are_used(files, capsys):
    """`--dim N=3` sizes the random input; `--input x=FILE` is what runs."""
    code, out, _ = cli(["run", files["model"], "--dim", "N=3"], capsys)
    assert code == 0 and "y: shape (3, 2)" in out
    code, out, _ = cli(["run", files["model"], "--input", f"x={files['good']}"], capsys)
    assert code == 0 and "first values [-1.0, -1.0, -1.0, -1.0, -1.0]" in out


def test_version(capsys):
    """`minfer --version` prints the package version."""
    code, out, _ = cli(["--version"], capsys)
    assert code == 0 and out.strip() == f"minfer {__version__}"


def test_python_dash_m_runs_the_cli(files):
    """`python -m minfer_core` is the minfer command: same version, same exit code 2 for a mistake."""
    done = subprocess.run([sys.executable, "-m", "minfer_core", "--version"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == f"minfer {__version__}"
    done = subprocess.run([sys.executable, "-m", "minfer_core", "run", files["model"], "--dim", "N=abc"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "Traceback" not in done.stderr
