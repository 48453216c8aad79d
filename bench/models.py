"""The benchmark's models: onnx's nine light model-zoo CNNs with random weights, and a transformer block.

The light models ship with every weight replaced by a ConstantOfShape of
zeros; `light_model` turns those into random initializers (so outputs mean
something and no engine can skip work) and rewrites the batch dim, since the
files fix it at 1.
"""

from __future__ import annotations

from pathlib import Path

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
    """Benchmark model names: the nine light models, then the transformer block."""
    every = list(LIGHT) + ["transformer"]
    return every if not names else [n for n in every if n in names]


def build(name: str, batch: int) -> onnx.ModelProto:
    return transformer_block(batch) if name == "transformer" else light_model(name, batch)
