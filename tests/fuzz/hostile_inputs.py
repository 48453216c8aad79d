"""The hostile inputs of docs/reliability.md, tried on minfer and on onnxruntime, each in a child process.

``python -m tests.fuzz.hostile_inputs`` prints the comparison table. Each
attempt runs in its own process with its address space capped at 4 GiB and
a 30 s deadline, so a hang or a runaway read in either engine is reported
("hangs", "MemoryError") instead of taking the machine down. The minfer
column is kept true by the tests named in docs/reliability.md; this tool
refreshes the onnxruntime column.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
from modelkit import make_model, tensor  # noqa: E402

LIMIT = 4 << 30
DEADLINE_S = 30
SQUEEZENET = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / "light_squeezenet.onnx"

RUNNER = r"""
import resource, sys, numpy as np
resource.setrlimit(resource.RLIMIT_AS, ({limit}, resource.RLIM_INFINITY))
engine, path, feeds = sys.argv[1], sys.argv[2], sys.argv[3]
try:
    if engine == "ort":
        import onnxruntime as ort
        opts = ort.SessionOptions(); opts.log_severity_level = 4
        sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
    else:
        import minfer_core
        sess = minfer_core.InferenceSession(path)
    if feeds != "-":
        sess.run(None, dict(np.load(feeds, allow_pickle=True).item()))
    print("ok")
except BaseException as exc:
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    print(f"{{type(exc).__name__}}: {{text[:150]}}")
"""


def attempt(engine: str, path: str, feeds: str = "-") -> str:
    """What ``engine`` (minfer or ort) does with the model at ``path`` (and one run on ``feeds``)."""
    code = RUNNER.format(limit=LIMIT)
    try:
        done = subprocess.run([sys.executable, "-c", code, engine, path, feeds], capture_output=True, text=True,
                              timeout=DEADLINE_S, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return f"hangs (killed after {DEADLINE_S} s)"
    lines = done.stdout.strip().splitlines()
    return lines[-1] if lines else f"exit {done.returncode}: {done.stderr.strip().splitlines()[-1][:150] if done.stderr.strip() else ''}"


def identity(init: TensorProto | None = None) -> onnx.ModelProto:
    return make_model([helper.make_node("Identity", ["w"], ["y"])], [], [tensor("y", None)], [init] if init else [])


def external(location: str, dims: list[int], **entries: str) -> onnx.ModelProto:
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=dims, data_location=TensorProto.EXTERNAL)
    for key, value in {"location": location, **entries}.items():
        t.external_data.add(key=key, value=value)
    return identity(t)


def sparse(values: list[float], indices: list[int], dims: list[int]) -> onnx.ModelProto:
    model = identity()
    model.graph.sparse_initializer.append(helper.make_sparse_tensor(
        numpy_helper.from_array(np.array(values, np.float32), "w"), numpy_helper.from_array(np.array(indices, np.int64), "i"), dims))
    return model


def write(folder: Path, model: onnx.ModelProto | bytes, name: str = "model.onnx") -> str:
    path = folder / name
    path.write_bytes(model if isinstance(model, bytes) else model.SerializeToString())
    return str(path)


def _fifo(folder: Path, name: str) -> str:
    os.mkfifo(folder / name)
    return str(folder / name)


def _beside(folder: Path, model: onnx.ModelProto, data: bytes | None = None, link: str | None = None) -> str:
    """The model written with a ``w.bin`` beside it: ``data`` bytes, or a symlink to ``link``."""
    if link is not None:
        (folder / "w.bin").symlink_to(link)
    else:
        (folder / "w.bin").write_bytes(bytes(64) if data is None else data)
    return write(folder, model)


def _neg(shape: list) -> onnx.ModelProto:
    return make_model([helper.make_node("Neg", ["x"], ["y"])], [tensor("x", shape)], [tensor("y", shape)])


def _feeds(folder: Path, feeds: dict) -> str:
    np.save(folder / "feeds.npy", np.array(feeds, dtype=object), allow_pickle=True)
    return str(folder / "feeds.npy")


Case = Callable[[Path], tuple[str, str]]  # folder -> (model path, feeds path or "-")

LOAD: dict[str, Case] = {
    "model path is /dev/zero": lambda f: ("/dev/zero", "-"),
    "model path is a FIFO nobody writes": lambda f: (_fifo(f, "m.onnx"), "-"),
    "model path is a folder": lambda f: (str(f), "-"),
    "model file is missing": lambda f: (str(f / "missing.onnx"), "-"),
    "model file is empty": lambda f: (write(f, b""), "-"),
    "model file is garbage bytes": lambda f: (write(f, os.urandom(4096)), "-"),
    "model file cut in half": lambda f: (write(f, SQUEEZENET.read_bytes()[: SQUEEZENET.stat().st_size // 2]), "-"),
    "external data file is a FIFO": lambda f: (_fifo(f, "w.bin") and write(f, external("w.bin", [4])), "-"),
    "external tensor of 10^11 floats, 64-byte file": lambda f: (_beside(f, external("w.bin", [10**11])), "-"),
    "external location ../w.bin": lambda f: (write(f, external("../w.bin", [4])), "-"),
    "external location /etc/passwd": lambda f: (write(f, external("/etc/passwd", [4])), "-"),
    "external location with a NUL byte": lambda f: (write(f, external("w\0.bin", [4])), "-"),
    "external offset 'abc'": lambda f: (_beside(f, external("w.bin", [4], offset="abc")), "-"),
    "external offset past the end": lambda f: (_beside(f, external("w.bin", [4], offset="4096")), "-"),
    "external length disagrees with dims": lambda f: (_beside(f, external("w.bin", [4], length="8")), "-"),
    "external file is a symlink out of the folder": lambda f: (_beside(f, external("w.bin", [1]), link="/etc/hostname"), "-"),
    "sparse initializer, dense shape 10^6 x 10^6": lambda f: (write(f, sparse([1.0], [5], [10**6, 10**6])), "-"),
    "sparse index outside the dense shape": lambda f: (write(f, sparse([1.0], [50], [4])), "-"),
    "raw_data shorter than dims": lambda f: (write(f, identity(TensorProto(name="w", data_type=1, dims=[1000], raw_data=bytes(8)))), "-"),
    "declared input dim of -3": lambda f: (write(f, _neg([-3, 2])), _feeds(f, {"x": np.ones((3, 2), np.float32)})),
}

GRAPH: dict[str, Case] = {
    "unknown op Zork": lambda f: (write(f, make_model([helper.make_node("Zork", ["x"], ["y"])], [tensor("x", [2])], [tensor("y", [2])])), "-"),
    "node reads a value nobody makes": lambda f: (write(f, make_model([helper.make_node("Neg", ["nowhere"], ["y"])], [tensor("x", [2])], [tensor("y", [2])])), "-"),
    "two nodes write the same value": lambda f: (write(f, make_model([helper.make_node("Neg", ["x"], ["y"]), helper.make_node("Relu", ["x"], ["y"])], [tensor("x", [2])], [tensor("y", [2])])), "-"),
    "a cycle": lambda f: (write(f, make_model([helper.make_node("Add", ["x", "b"], ["a"]), helper.make_node("Neg", ["a"], ["b"])], [tensor("x", [2])], [tensor("a", [2])])), "-"),
    "opset 99": lambda f: (write(f, _opset(_neg([2]), 99)), "-"),
    "Add of [2] and [3]": lambda f: (write(f, make_model([helper.make_node("Add", ["x", "z"], ["y"])], [tensor("x", [2]), tensor("z", [3])], [tensor("y", None)])), "-"),
}

FEEDS: dict[str, Case] = {
    "feed of the wrong dtype (float64)": lambda f: (write(f, _neg([2])), _feeds(f, {"x": np.ones(2)})),
    "feed of the wrong shape": lambda f: (write(f, _neg([2])), _feeds(f, {"x": np.ones(3, np.float32)})),
    "missing feed": lambda f: (write(f, _neg([2])), _feeds(f, {})),
    "unknown feed name": lambda f: (write(f, _neg([2])), _feeds(f, {"x": np.ones(2, np.float32), "typo": np.ones(2, np.float32)})),
    "feed is a list, not an array": lambda f: (write(f, _neg([2])), _feeds(f, {"x": [1.0, 2.0]})),
}


def _opset(model: onnx.ModelProto, version: int) -> onnx.ModelProto:
    model.opset_import[0].version = version
    return model


def table(cases: dict[str, Case]) -> list[str]:
    """Markdown rows: input | minfer | onnxruntime."""
    rows = []
    for label, make in cases.items():
        with tempfile.TemporaryDirectory() as tmp:
            folder = Path(tmp) / "model"
            folder.mkdir()
            path, feeds = make(folder)
            mine, theirs = attempt("minfer", path, feeds), attempt("ort", path, feeds)
        rows.append(f"| {label} | {_cell(mine)} | {_cell(theirs)} |")
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


if __name__ == "__main__":
    import onnxruntime

    print(f"onnxruntime {onnxruntime.__version__}, onnx {onnx.__version__}")
    for title, cases in (("load", LOAD), ("graph", GRAPH), ("feeds", FEEDS)):
        print(f"\n### {title}\n\n| input | minfer | onnxruntime |\n|---|---|---|")
        print("\n".join(table(cases)))
