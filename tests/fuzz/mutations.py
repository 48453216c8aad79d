"""Mutations of real ONNX models for the fuzzer: protobuf fields, dims, data types, attributes, external data, bytes.

Each mutation takes the model (changed in place), a ``random.Random`` and the
model's folder (for external-data files) and returns a short label saying what
it did, so a failing case reads as a list of edits. The fuzzer draws only the
seed with hypothesis: every case differs even under the derandomized CI
profile, and (model, seed) reproduces a case exactly.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any, Callable

import numpy as np
import onnx
from onnx import AttributeProto, TensorProto

# values chosen to hit edges: zero, negative, off-by-one, int32 and int64 limits
INTS = [-(2**63), -(2**31), -7, -2, -1, 0, 1, 2, 3, 5, 8, 64, 224, 1000, 2**31 - 1, 2**31, 2**62]
SMALL_INTS = [-2, -1, 0, 1, 2, 3, 7]
FLOATS = [0.0, -1.0, 1e-30, 0.5, 2.0, 1e30, float("inf"), float("-inf"), float("nan")]
ELEM_TYPES = range(0, 28)  # every TensorProto element type, an undefined 0, and two past the last
ATTR_TYPES = range(0, 15)  # the enum refuses values past TYPE_PROTOS (14) on assignment

Mutation = Callable[[onnx.ModelProto, random.Random, Path], str]


def _pick(rnd: random.Random, seq: Any) -> Any:
    return seq[rnd.randrange(len(seq))] if len(seq) else None


def _array(t: TensorProto) -> np.ndarray | None:
    """A tensor's value, or None when an earlier mutation made it undecodable (or moved it out)."""
    if t.data_location == TensorProto.EXTERNAL:
        return None
    try:
        return onnx.numpy_helper.to_array(t)
    except Exception:
        return None


def value_dim(model: onnx.ModelProto, rnd: random.Random, folder: Path) -> str:
    """A declared input, output or value_info dim becomes another number, a name, or disappears."""
    g = model.graph
    vi = _pick(rnd, list(g.input) + list(g.output) + list(g.value_info))
    if vi is None or not vi.type.tensor_type.HasField("shape"):
        return "dim:none"
    dims = vi.type.tensor_type.shape.dim
    choice = rnd.choice(["value", "param", "drop", "add", "clear"])
    if choice == "clear":
        vi.type.tensor_type.ClearField("shape")
    elif choice == "add":
        dims.add().dim_value = rnd.choice(SMALL_INTS) % 4
    elif len(dims) and choice == "drop":
        del dims[rnd.randint(0, len(dims) - 1)]
    elif len(dims):
        d = dims[rnd.randint(0, len(dims) - 1)]
        if choice == "param":
            d.dim_param = rnd.choice(["N", "", "batch", "\u00e9"])
        else:
            d.dim_value = rnd.choice([-1, 0, 1, 2, 3, 112, 225])
    return f"dim:{vi.name}:{choice}"


def tensor_dims(model: onnx.ModelProto, rnd: random.Random, folder: Path) -> str:
    """An initializer's dims no longer match its data (or its data no longer matches its dims)."""
    t = _pick(rnd, model.graph.initializer)
    if t is None:
        return "tensor-dims:none"
    choice = rnd.choice(["set", "append", "drop", "clear-data"])
    if choice == "append":
        t.dims.append(rnd.choice(SMALL_INTS))
    elif choice == "drop" and len(t.dims):
        del t.dims[-1]
    elif choice == "clear-data":
        for field in ("raw_data", "int64_data", "float_data", "int32_data"):
            t.ClearField(field)
    elif len(t.dims):
        t.dims[rnd.randint(0, len(t.dims) - 1)] = rnd.choice(INTS)
    return f"tensor-dims:{t.name}:{choice}"


def tensor_values(model: onnx.ModelProto, rnd: random.Random, folder: Path) -> str:
    """A small integer initializer (a shape, axes, pads) gets other values: value-dependent ops see new sizes."""
    small = [t for t in model.graph.initializer if t.data_type == TensorProto.INT64 and len(t.dims) <= 1]
    t = _pick(rnd, small)
    array = None if t is None else _array(t)
    if array is None:
        return "tensor-values:none"
    values = array.astype(np.int64)
    flat = values.reshape(-1).copy()
    if flat.size:
        flat[rnd.randint(0, flat.size - 1)] = rnd.choice([-3, -1, 0, 1, 2, 5, 300])
    t.CopyFrom(onnx.numpy_helper.from_array(flat.reshape(values.shape), t.name))
    return f"tensor-values:{t.name}"


def data_type(model: onnx.ModelProto, rnd: random.Random, folder: Path) -> str:
    """An initializer's or a declared value's element type becomes another (possibly undefined) type."""
    g = model.graph
    if rnd.random() < 0.5 and len(g.initializer):
        t = _pick(rnd, g.initializer)
        t.data_type = rnd.choice(ELEM_TYPES)
        return f"dtype:tensor:{t.name}:{t.data_type}"
    vi = _pick(rnd, list(g.input) + list(g.output))
    if vi is None:
        return "dtype:none"
    vi.type.tensor_type.elem_type = rnd.choice(ELEM_TYPES)
    return f"dtype:value:{vi.name}:{vi.type.tensor_type.elem_type}"


def attribute(model: onnx.ModelProto, rnd: random.Random, folder: Path) -> str:
    """A node attribute gets another value, another declared type, a new bogus name, or disappears."""
    node = _pick(rnd, [n for n in model.graph.node if len(n.attribute)] or list(model.graph.node))
    if node is None:
        return "attr:none"
    choice = rnd.choice(["value", "value", "type", "drop", "add"])
    if choice == "add" or not len(node.attribute):
        node.attribute.add().CopyFrom(onnx.helper.make_attribute(rnd.choice(["zork", "axis", "pads"]), rnd.choice(INTS)))
        return f"attr:{node.op_type}:add"
    a = node.attribute[rnd.randint(0, len(node.attribute) - 1)]
    if choice == "drop":
        node.attribute.remove(a)
    elif choice == "type":
        a.type = rnd.choice(ATTR_TYPES)
    else:
        _attribute_value(a, rnd)
    return f"attr:{node.op_type}.{a.name}:{choice}"


def _attribute_value(a: AttributeProto, rnd: random.Random) -> None:
    if a.type == AttributeProto.INT:
        a.i = rnd.choice(INTS)
    elif a.type == AttributeProto.FLOAT:
        a.f = rnd.choice(FLOATS)
    elif a.type == AttributeProto.INTS:
        values = list(a.ints)
        edit = rnd.choice(["set", "append", "drop", "clear"])
        if edit == "set" and values:
            values[rnd.randint(0, len(values) - 1)] = rnd.choice(SMALL_INTS if rnd.random() < 0.5 else INTS)
        elif edit == "append":
            values.append(rnd.choice(SMALL_INTS))
        elif edit == "drop" and values:
            values.pop()
        elif edit == "clear":
            values = []
        del a.ints[:]
        a.ints.extend(values)
    elif a.type == AttributeProto.STRING:
        a.s = rnd.choice([b"", b"NOTSET", b"\xff\xfe", b"SAME_UPPER", b"nearest", b"x" * 300])
    elif a.type == AttributeProto.FLOATS:
        a.floats.append(rnd.choice(FLOATS))
    else:
        a.type = rnd.choice(ATTR_TYPES)


def node_wiring(model: onnx.ModelProto, rnd: random.Random, folder: Path) -> str:
    """A node changes op type or domain, loses or renames an input, duplicates an output, moves, or disappears."""
    nodes = model.graph.node
    node = _pick(rnd, nodes)
    if node is None:
        return "node:none"
    choice = rnd.choice(["op", "domain", "input", "dangling", "dup-output", "move", "delete"])
    if choice == "op":
        node.op_type = rnd.choice([n.op_type for n in nodes] + ["Zork", "If", "Loop", ""])
    elif choice == "domain":
        node.domain = rnd.choice(["com.nowhere", "ai.onnx.ml", "com.microsoft", "ai.onnx"])
    elif choice == "input" and len(node.input):
        del node.input[-1]
    elif choice == "dangling" and len(node.input):
        node.input[0] = rnd.choice(["", "nowhere", node.output[0] if len(node.output) else "x"])
    elif choice == "dup-output" and len(node.output):
        node.output[0] = _pick(rnd, [o for n in nodes for o in n.output] + [i.name for i in model.graph.input])
    elif choice == "move":
        copy = onnx.NodeProto()
        copy.CopyFrom(node)
        nodes.remove(node)
        nodes.insert(rnd.randint(0, len(nodes)), copy)
    elif choice == "delete":
        nodes.remove(node)
    return f"node:{choice}"


def opset(model: onnx.ModelProto, rnd: random.Random, folder: Path) -> str:
    """The default opset or the IR version becomes another (too old, too new, negative) number."""
    if rnd.random() < 0.5:
        model.ir_version = rnd.choice([-1, 0, 1, 3, 4, 7, 10, 11, 99])
        return f"ir:{model.ir_version}"
    version = rnd.choice([-1, 0, 1, 6, 7, 11, 13, 17, 21, 22, 99, 2**40])
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            entry.version = version
    return f"opset:{version}"


def external_data(model: onnx.ModelProto, rnd: random.Random, folder: Path) -> str:
    """An initializer moves to an external file; its location, offset, length and file are then maybe wrong."""
    t = _pick(rnd, model.graph.initializer)
    array = None if t is None else _array(t)
    if array is None:
        return "external:none"
    payload = onnx.numpy_helper.from_array(array).raw_data
    offset = rnd.choice([0, 0, 3, 4096])
    (folder / "weights.bin").write_bytes(b"\x00" * offset + payload)
    entries = {"location": "weights.bin", "offset": str(offset), "length": str(len(payload))}
    fault = rnd.choice(["none", "length", "offset", "location", "dims", "missing-key", "directory"])
    if fault == "length":
        entries["length"] = rnd.choice(["0", "1", str(len(payload) + 8), str(10**12), "-4", "abc", ""])
    elif fault == "offset":
        entries["offset"] = rnd.choice([str(offset + len(payload) + 1), str(2**63), "-1", "0x10", "1.5"])
    elif fault == "location":
        entries["location"] = rnd.choice(["../weights.bin", "/etc/passwd", "nothere.bin", "we\0ights.bin", "",
                                     "a/" * 200 + "w.bin", "x" * 300])
    elif fault == "dims":
        t.dims.append(rnd.choice([0, 2, 10**9]))
    elif fault == "missing-key":
        del entries[rnd.choice(sorted(entries))]
    elif fault == "directory":
        (folder / "adir").mkdir(exist_ok=True)
        entries["location"] = "adir"
    name, elem, dims = t.name, t.data_type, list(t.dims)
    t.Clear()
    t.name, t.data_type, t.data_location = name, elem, TensorProto.EXTERNAL
    t.dims.extend(dims)
    for key, value in entries.items():
        t.external_data.add(key=key, value=value)
    return f"external:{fault}"


def wire_bytes(data: bytes, rnd: random.Random) -> tuple[bytes, str]:
    """The serialized model with bytes flipped, cut off, or repeated: protobuf itself must not get through."""
    choice = rnd.choice(["flip", "truncate", "insert", "duplicate-tail"])
    where = rnd.randint(0, max(0, len(data) - 1))
    if choice == "flip":
        value = rnd.randint(0, 255)
        data = data[:where] + bytes([value]) + data[where + 1:]
    elif choice == "truncate":
        data = data[:where]
    elif choice == "insert":
        data = data[:where] + rnd.randbytes(rnd.randint(1, 12)) + data[where:]
    else:
        data = data + data[where:]
    return data, f"bytes:{choice}@{where}"


MUTATIONS: dict[str, Mutation] = {
    "value_dim": value_dim,
    "tensor_dims": tensor_dims,
    "tensor_values": tensor_values,
    "data_type": data_type,
    "attribute": attribute,
    "node_wiring": node_wiring,
    "opset": opset,
    "external_data": external_data,
}


def mutate(model: onnx.ModelProto, rnd: random.Random, folder: Path) -> tuple[bytes, list[str]]:
    """The bytes of ``model`` after one to three mutations (and maybe a wire-level one), and what was done."""
    os.makedirs(folder, exist_ok=True)
    done = [MUTATIONS[rnd.choice(sorted(MUTATIONS))](model, rnd, folder)
            for _ in range(rnd.randint(1, 3))]
    data = model.SerializeToString()
    if rnd.randint(0, 5) == 0:
        data, label = wire_bytes(data, rnd)
        done.append(label)
    return data, done
