"""The model-zoo models shipped inside the onnx wheel, and making their weights random.

The "light" models keep their graph but replace every weight by a
ConstantOfShape of zeros, so their outputs are uninformative; `randomized`
turns those into random initializers so comparisons mean something.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

from ..errors import ModelLoadError

LIGHT_MODELS = (
    "light_bvlc_alexnet",
    "light_densenet121",
    "light_inception_v1",
    "light_inception_v2",
    "light_resnet50",
    "light_shufflenet",
    "light_squeezenet",
    "light_vgg19",
    "light_zfnet512",
)


def light_dir() -> Path:
    return Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def model_path(name: str) -> str:
    """A model file path, or the name of a model shipped in the onnx wheel (``light_resnet50``)."""
    try:
        if Path(name).exists():
            return name
        candidate = light_dir() / (name if name.endswith(".onnx") else f"{name}.onnx")
        if candidate.exists():
            return str(candidate)
    except (OSError, ValueError):  # a name too long for the file system, or with a NUL byte
        pass
    shipped = ", ".join(LIGHT_MODELS)
    raise ModelLoadError(f"no model file {name!r}, and it is not one of the models shipped with onnx: {shipped}")


def randomized(model: onnx.ModelProto | str, seed: int = 0) -> onnx.ModelProto:
    """A copy of ``model`` whose ConstantOfShape weights are random initializers.

    Rank-1 weights (biases, batch-norm statistics) are drawn in [0.5, 1.5] so
    variances stay positive; others ~ N(0, 1/fan_in) so activations stay finite.
    """
    proto = _read(model_path(model)) if isinstance(model, str) else _copy(model)
    rng = np.random.default_rng(seed)
    consts = {t.name: numpy_helper.to_array(t) for t in proto.graph.initializer}
    keep = []
    for node in proto.graph.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in consts:
            shape = tuple(int(d) for d in consts[node.input[0]])
            proto.graph.initializer.append(numpy_helper.from_array(_draw(rng, shape), node.output[0]))
        else:
            keep.append(node)
    del proto.graph.node[:]
    proto.graph.node.extend(keep)
    used = {name for node in keep for name in node.input} | {o.name for o in proto.graph.output}
    weights = {t.name for t in proto.graph.initializer}
    live = [t for t in proto.graph.initializer if t.name in used]
    del proto.graph.initializer[:]
    proto.graph.initializer.extend(live)
    # Old IR versions list weights among the inputs; IR 4+ lets them be plain constants.
    inputs = [i for i in proto.graph.input if i.name not in weights]
    del proto.graph.input[:]
    proto.graph.input.extend(inputs)
    proto.ir_version = min(max(proto.ir_version, 4), 10)
    return proto


def _draw(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    if len(shape) <= 1:
        return rng.uniform(0.5, 1.5, shape).astype(np.float32)
    fan_in = int(np.prod(shape[1:]))
    return (rng.standard_normal(shape) / np.sqrt(fan_in)).astype(np.float32)


def _read(path: str) -> onnx.ModelProto:
    """The ModelProto of a model file, read as minfer reads models (regular files only, errors as ModelLoadError)."""
    from ..onnx_io import read_model_proto

    return read_model_proto(path)


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out
