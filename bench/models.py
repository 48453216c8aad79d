"""The benchmark's models: onnx's nine light model-zoo CNNs with random weights, and the real-model set.

The light models ship with every weight replaced by a ConstantOfShape of
zeros; `light_model` turns those into random initializers (so outputs mean
something and no engine can skip work) and rewrites the batch dim, since the
files fix it at 1.

The real-model set is what users run: the test suite's builders (tests/models/realmodels.py: a YOLO-style
detector head, a DBNet text detector and a CRNN recognizer, MobileNetV2/V3, a PP-LCNet orientation classifier,
a PyTorch-style encoder block) at deployment input sizes, and this module's transformer block. Building the
calibrated ones takes seconds, so built models are kept in a cache directory keyed by their builders' source.
"""

from __future__ import annotations

import hashlib
import sys
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

LIGHT = (
    "bvlc_alexnet",
    "densenet121",
    "inception_v1",
    "inception_v2",
    "resnet50",
    "shufflenet",
    "squeezenet",
    "vgg19",
    "zfnet512",
)
# name -> (builder in tests/models/realmodels.py, keyword arguments): deployment sizes, not the tests' small ones
REAL: dict[str, tuple[str, dict[str, Any]]] = {
    "detector": ("yolo_head", {}),  # fixed at 64x64 by its builder
    # 320x320: PP-OCR's detector usually sees 640-960 pixels a side, where one b8 run takes seconds here
    "ocr_detector": ("ocr_detector", {"size": 320}),
    "ocr_recognizer": ("ocr_recognizer", {}),  # fixed at 32x64 by its builder
    "mobilenet_v2": ("mobilenet_v2", {"width": 1.0}),
    "mobilenet_v3_small": ("mobilenet_v3", {"variant": "small"}),
    "mobilenet_v3_large": ("mobilenet_v3", {"variant": "large"}),
    "orientation": ("orientation_classifier", {}),
    "encoder": ("encoder_block", {}),
    "transformer": ("", {}),  # transformer_block below
}
GROUPS = {"light": LIGHT, "real": tuple(REAL)}
# sizes of symbolic input dims other than the batch (the encoder's sequence)
SYMBOLIC_DIMS = {"seq": 128}
TESTS = Path(__file__).resolve().parent.parent / "tests"
ORT_IR_VERSION = 10  # onnx 1.23 stamps IR 14; onnxruntime 1.31 reads up to 10


def light_path(name: str) -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light" / f"light_{name}.onnx"


def light_model(name: str, batch: int, seed: int = 0) -> onnx.ModelProto:
    """``light_<name>.onnx`` with random weights and batch size ``batch``."""
    model = onnx.load(str(light_path(name)))
    _randomize(model, np.random.default_rng(seed))
    _set_batch(model, batch)
    model.ir_version = min(model.ir_version, ORT_IR_VERSION)
    return model


def _randomize(model: onnx.ModelProto, rng: np.random.Generator) -> None:
    graph = model.graph
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    keep = []
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in consts:
            shape = tuple(int(d) for d in consts[node.input[0]])
            graph.initializer.append(numpy_helper.from_array(_draw(rng, shape), node.output[0]))
        else:
            keep.append(node)
    del graph.node[:]
    graph.node.extend(keep)
    used = {i for n in graph.node for i in n.input}
    dead = {t.name for t in graph.initializer if t.name not in used}
    live = [t for t in graph.initializer if t.name not in dead]
    del graph.initializer[:]
    graph.initializer.extend(live)
    inputs = [v for v in graph.input if v.name not in dead]  # IR 3 lists initializers as inputs too
    del graph.input[:]
    graph.input.extend(inputs)


def _draw(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    if len(shape) <= 1:  # biases and batch-norm statistics: positive keeps variances valid
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    fan_in = int(np.prod(shape[1:]))  # N(0, 1/fan_in) keeps activations finite through 100+ layers
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def _set_batch(model: onnx.ModelProto, batch: int) -> None:
    graph = model.graph
    inits = {t.name: t for t in graph.initializer}
    for value in list(graph.input) + list(graph.output):
        if value.name not in inits:
            value.type.tensor_type.shape.dim[0].dim_value = batch
    del graph.value_info[:]
    if batch == 1:
        return
    # Reshape targets written as [1, ...] mean "the batch": make them 0 (copy the input's dim)
    for i, node in enumerate(graph.node):
        if node.op_type == "Reshape" and node.input[0] not in inits and node.input[1] in inits:
            target = numpy_helper.to_array(inits[node.input[1]]).copy()
            if target.size and target[0] == 1:
                target[0] = 0
                name = f"{node.input[1]}__batch{i}"
                graph.initializer.append(numpy_helper.from_array(target.astype(np.int64), name))
                node.input[1] = name


def transformer_block(batch: int, seq: int = 128, d: int = 256, heads: int = 4, ffn: int = 1024, seed: int = 0) -> onnx.ModelProto:
    """A pre-LayerNorm transformer encoder block (multi-head attention + GELU MLP), opset 17."""
    rng = np.random.default_rng(seed)
    dh = d // heads
    inits: list[onnx.TensorProto] = []

    def weight(name: str, shape: tuple[int, ...]) -> str:
        inits.append(numpy_helper.from_array(_draw(rng, shape) if len(shape) > 1 else rng.uniform(-0.1, 0.1, shape).astype(np.float32), name))
        return name

    def const(name: str, value: object, dtype: object = np.int64) -> str:
        inits.append(numpy_helper.from_array(np.asarray(value, dtype=dtype), name))
        return name

    n = helper.make_node
    nodes = [
        n("LayerNormalization", ["x", weight("ln1_g", (d,)), weight("ln1_b", (d,))], ["ln1"], axis=-1),
        n("MatMul", ["ln1", weight("wq", (d, d))], ["q0"]), n("Add", ["q0", weight("bq", (d,))], ["q1"]),
        n("MatMul", ["ln1", weight("wk", (d, d))], ["k0"]), n("Add", ["k0", weight("bk", (d,))], ["k1"]),
        n("MatMul", ["ln1", weight("wv", (d, d))], ["v0"]), n("Add", ["v0", weight("bv", (d,))], ["v1"]),
        n("Reshape", ["q1", const("split_heads", [0, 0, heads, dh])], ["q2"]),
        n("Reshape", ["k1", "split_heads"], ["k2"]),
        n("Reshape", ["v1", "split_heads"], ["v2"]),
        n("Transpose", ["q2"], ["q"], perm=[0, 2, 1, 3]),
        n("Transpose", ["k2"], ["kt"], perm=[0, 2, 3, 1]),
        n("Transpose", ["v2"], ["v"], perm=[0, 2, 1, 3]),
        n("MatMul", ["q", "kt"], ["s0"]),
        n("Mul", ["s0", const("scale", 1.0 / np.sqrt(dh), np.float32)], ["s"]),
        n("Softmax", ["s"], ["p"], axis=-1),
        n("MatMul", ["p", "v"], ["c0"]),
        n("Transpose", ["c0"], ["c1"], perm=[0, 2, 1, 3]),
        n("Reshape", ["c1", const("merge_heads", [0, 0, d])], ["c"]),
        n("MatMul", ["c", weight("wo", (d, d))], ["o0"]), n("Add", ["o0", weight("bo", (d,))], ["o"]),
        n("Add", ["o", "x"], ["h"]),
        n("LayerNormalization", ["h", weight("ln2_g", (d,)), weight("ln2_b", (d,))], ["ln2"], axis=-1),
        n("MatMul", ["ln2", weight("w1", (d, ffn))], ["f0"]), n("Add", ["f0", weight("b1", (ffn,))], ["f1"]),
        # GELU spelt with Erf, as exporters write it (onnxruntime fuses it back)
        n("Div", ["f1", const("sqrt2", np.sqrt(2.0), np.float32)], ["g0"]),
        n("Erf", ["g0"], ["g1"]),
        n("Add", ["g1", const("one", 1.0, np.float32)], ["g2"]),
        n("Mul", ["f1", "g2"], ["g3"]),
        n("Mul", ["g3", const("half", 0.5, np.float32)], ["g"]),
        n("MatMul", ["g", weight("w2", (ffn, d))], ["m0"]), n("Add", ["m0", weight("b2", (d,))], ["m"]),
        n("Add", ["m", "h"], ["y"]),
    ]
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [batch, seq, d])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [batch, seq, d])
    graph = helper.make_graph(nodes, "transformer_block", [x], [y], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="minfer-bench")
    model.ir_version = ORT_IR_VERSION
    return model


def models(names: list[str] | None = None) -> list[str]:
    """Benchmark model names in order, light models first: all of them, or those ``names`` lists by name or by
    group ("light", "real"). An unknown name is an error naming the known ones; a model whose builder this
    checkout lacks is an error when named, left out (said on stderr) of a group."""
    every = list(LIGHT) + list(REAL)
    asked = {m for n in names for m in GROUPS.get(n, (n,))} if names else set(every)
    unknown = sorted(asked - set(every))
    if unknown:
        raise SystemExit(f"unknown benchmark model(s) {', '.join(unknown)}: known are {', '.join(every)} "
                         f"and the groups {', '.join(GROUPS)}")
    absent = {n: why for n in asked if (why := missing(n))}
    if absent and names and not set(names) & set(GROUPS):
        raise SystemExit("; ".join(f"{n}: {why}" for n, why in absent.items()))
    for n, why in absent.items():  # a group or the default set goes on without it
        print(f"bench: leaving out {n} ({why})", file=sys.stderr)
    return [n for n in every if n in asked and n not in absent]


def group_of(name: str) -> str:
    """"light" or "real": which geo-mean a model counts in."""
    return "light" if name in LIGHT else "real"


def build(name: str, batch: int) -> onnx.ModelProto:
    """The benchmark's model ``name`` at batch size ``batch``."""
    if name == "transformer":
        return transformer_block(batch)
    if name in REAL:
        return _cached(name, batch, lambda: real_model(name, batch))
    return light_model(name, batch)


def missing(name: str) -> str | None:
    """Why model ``name`` cannot be built in this checkout (its builder is not in realmodels.py yet), or None."""
    builder = REAL.get(name, ("",))[0]
    if builder and not hasattr(_realmodels(), builder):
        return f"tests/models/realmodels.py has no {builder}()"
    return None


def _realmodels() -> Any:
    for path in (str(TESTS), str(TESTS / "models")):  # realmodels imports modelkit as a top-level module
        if path not in sys.path:
            sys.path.append(path)
    import realmodels

    return realmodels


def real_model(name: str, batch: int, seed: int = 0) -> onnx.ModelProto:
    """A real-set model from the test suite's builders, its batch dim set to ``batch``."""
    builder, kwargs = REAL[name]
    model = getattr(_realmodels(), builder)(seed, **kwargs)
    _set_batch(model, batch)
    model.ir_version = min(model.ir_version, ORT_IR_VERSION)
    return model


def _cached(name: str, batch: int, make: Callable[[], onnx.ModelProto]) -> onnx.ModelProto:
    """``make()``, kept on disk under a key of the builders' source (a changed builder builds again)."""
    source = b"".join(p.read_bytes() for p in (Path(__file__), TESTS / "models" / "realmodels.py"))
    key = hashlib.sha256(source + f"{name}/{batch}".encode()).hexdigest()[:16]
    path = Path(tempfile.gettempdir()) / "minfer-bench-models" / f"{name}-b{batch}-{key}.onnx"
    if path.exists():
        return onnx.load(str(path))
    model = make()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{id(model)}.tmp")
    tmp.write_bytes(model.SerializeToString())
    tmp.replace(path)  # atomic: a concurrent reader sees the whole file or none
    return model


def random_feeds(model: onnx.ModelProto, seed: int = 0) -> dict[str, np.ndarray]:
    """Random inputs for ``model``: standard normal floats; integer inputs are attention masks (1 keep, 0 pad, the
    first position always kept); symbolic dims other than the batch take their SYMBOLIC_DIMS size."""
    inits = {t.name for t in model.graph.initializer}
    rng = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        if value.name in inits:
            continue
        t = value.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else SYMBOLIC_DIMS.get(d.dim_param, 1) for d in t.shape.dim]
        dtype = helper.tensor_dtype_to_np_dtype(t.elem_type)
        if np.issubdtype(dtype, np.integer):
            mask = (rng.random(shape) > 0.2).astype(dtype)
            mask[..., 0] = 1
            feeds[value.name] = mask
        else:
            feeds[value.name] = rng.standard_normal(shape).astype(dtype)
    return feeds
