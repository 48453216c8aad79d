"""ONNX import (path, bytes or ModelProto -> Graph) and export (Graph -> ModelProto).

Loading never executes code from the model, reads only regular files and
never more than they hold (see rawdata.py), and resolves external-data paths
inside the model's folder or refuses them. Every bad file is a ModelLoadError.
"""

from __future__ import annotations

import functools

import io
import os
import sys
from pathlib import Path
from typing import Any, BinaryIO, Union

import numpy as np
import onnx
from google.protobuf.message import DecodeError
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from .errors import ModelLoadError
from .graph import Graph, Node
from .rawdata import (WireFormatError, allocate, element_count, file_size, open_regular, read_payload, read_region,
                      sparse_to_dense, split_model)
from .tensor import Dim, MapType, OptionalType, SequenceType, TensorType, ValueType

ModelSource = Union[str, os.PathLike, bytes, onnx.ModelProto]

# onnx.helper spells opset domains two ways; the IR uses "".
_DEFAULT_DOMAINS = ("", "ai.onnx")


def onnx_dtype(elem_type: int) -> np.dtype:
    """The numpy dtype of an ONNX tensor element type (bfloat16/float8 through ml_dtypes)."""
    return np.dtype(helper.tensor_dtype_to_np_dtype(elem_type))


def elem_type_of(dtype: np.dtype) -> int:
    """The ONNX tensor element type of a numpy dtype."""
    return int(helper.np_dtype_to_tensor_dtype(np.dtype(dtype)))


# ---- import -------------------------------------------------------------


def load_model(model: ModelSource, *, base_dir: str | os.PathLike | None = None) -> Graph:
    """Import a model file, its bytes, or a ModelProto into a Graph.

    ``base_dir`` is the folder external data is read from; it defaults to the
    model file's folder. Raises ModelLoadError for anything unreadable.
    """
    proto, folder, preloaded = _read_proto(model)
    folder = Path(base_dir) if base_dir is not None else folder
    opsets = {("" if o.domain in _DEFAULT_DOMAINS else o.domain): int(o.version) for o in proto.opset_import}
    if proto.ir_version < 3 and "" not in opsets:
        opsets[""] = 1
    graph = _import_graph(proto.graph, opsets, folder, preloaded)
    graph.meta.update(
        ir_version=int(proto.ir_version),
        producer_name=proto.producer_name,
        producer_version=proto.producer_version,
        model_version=int(proto.model_version),
        doc_string=proto.doc_string,
        metadata_props={p.key: p.value for p in proto.metadata_props},
        functions=list(proto.functions),
        opset_import=dict(opsets),  # as declared (the Graph defaults an empty one): strict.py checks it
    )
    return graph


def read_model_proto(path: str | os.PathLike) -> onnx.ModelProto:
    """The ModelProto of a model file, every initializer in it (external data stays external)."""
    with open_regular(path, "model file") as fh:
        return _parse(fh.read(file_size(fh)), str(path))


def _read_proto(model: ModelSource) -> tuple[onnx.ModelProto, Path | None, dict[int, np.ndarray]]:
    """The ModelProto, the folder of its file, and the initializers read around protobuf (by index)."""
    if isinstance(model, onnx.ModelProto):
        if not model.HasField("graph"):
            raise ModelLoadError("the ModelProto holds no graph (model.graph is unset): there is nothing to run")
        return model, None, {}
    if isinstance(model, (bytes, bytearray)):
        proto, preloaded = _parse_split(io.BytesIO(bytes(model)), "<bytes>")
        return proto, None, preloaded
    if not isinstance(model, (str, os.PathLike)):
        raise ModelLoadError(f"a model is a file path, bytes or an onnx.ModelProto, not {type(model).__name__}")
    path = Path(model)
    with open_regular(path, "model file") as fh:
        proto, preloaded = _parse_split(fh, str(path))
    return proto, path.resolve().parent, preloaded


def _parse_split(src: BinaryIO, where: str) -> tuple[onnx.ModelProto, dict[int, np.ndarray]]:
    """Parse with the large initializers read straight into arrays (rawdata.py); whole if that cannot be."""
    try:
        stripped, spans = split_model(src)
    except WireFormatError:
        spans = []
    proto = _parse(stripped, where) if spans else None
    if proto is None or len(proto.graph.initializer) != len(spans):
        size = src.seek(0, io.SEEK_END)  # the read is bounded by the size the file had when opened
        src.seek(0)
        return _parse(src.read(size), where), {}
    preloaded = {}
    for i, (tensor, span) in enumerate(zip(proto.graph.initializer, spans)):
        if span is not None:
            try:
                preloaded[i] = read_payload(src, span, tuple(tensor.dims))
            except ValueError as exc:
                raise ModelLoadError(f"tensor {tensor.name!r} cannot be decoded: {exc}") from exc
    return proto, preloaded


def _parse(data: bytes, where: str) -> onnx.ModelProto:
    proto = onnx.ModelProto()
    try:
        proto.ParseFromString(data)
    except (DecodeError, RuntimeError, ValueError) as exc:
        raise ModelLoadError(f"{where} is not a valid ONNX model (malformed or truncated protobuf: {exc})") from exc
    if not proto.HasField("graph"):
        raise ModelLoadError(f"{where} parsed as protobuf but holds no ONNX graph (is it an ONNX model?)")
    return proto


def _import_graph(gp: onnx.GraphProto, opsets: dict[str, int], folder: Path | None,
                  preloaded: dict[int, np.ndarray] | None = None) -> Graph:
    preloaded = preloaded or {}
    initializers = {t.name: preloaded[i] if i in preloaded else tensor_to_array(t, folder)
                    for i, t in enumerate(gp.initializer)}
    for sparse in gp.sparse_initializer:
        initializers[sparse.values.name] = _sparse_to_dense(sparse, folder)
    types: dict[str, TensorType] = {}
    for vi in list(gp.input) + list(gp.output) + list(gp.value_info):
        t = type_from_proto(vi.type)
        if t is not None:
            types[vi.name] = t
    inputs = [vi.name for vi in gp.input if vi.name not in initializers]
    nodes = [_import_node(n, opsets, folder) for n in gp.node]
    graph = Graph(
        inputs=inputs,
        outputs=[vi.name for vi in gp.output],
        initializers=initializers,
        types=types,
        opsets=opsets,
        name=gp.name or "graph",
    )
    graph.meta["doc_string"] = gp.doc_string
    for node in nodes:
        try:
            graph.add_node(node)
        except Exception as exc:
            raise ModelLoadError(f"graph {graph.name!r}: {exc}") from exc
    return graph


def _import_node(np_: onnx.NodeProto, opsets: dict[str, int], folder: Path | None) -> Node:
    attrs = {a.name: attribute_value(a, opsets, folder) for a in np_.attribute}
    domain = "" if np_.domain in _DEFAULT_DOMAINS else np_.domain
    return Node(np_.op_type, list(np_.input), list(np_.output), attrs, np_.name, domain)


def attribute_value(attr: AttributeProto, opsets: dict[str, int] | None = None, folder: Path | None = None) -> Any:
    """An attribute as the Python value kernels receive (see docs/kernel-contract.md)."""
    kind = attr.type
    if kind == AttributeProto.FLOAT:
        return float(attr.f)
    if kind == AttributeProto.INT:
        return int(attr.i)
    if kind == AttributeProto.STRING:
        return _text(attr.s)
    if kind == AttributeProto.TENSOR:
        return tensor_to_array(attr.t, folder)
    if kind == AttributeProto.GRAPH:
        return _import_graph(attr.g, opsets or {"": 21}, folder)
    if kind == AttributeProto.FLOATS:
        return [float(v) for v in attr.floats]
    if kind == AttributeProto.INTS:
        return [int(v) for v in attr.ints]
    if kind == AttributeProto.STRINGS:
        return [_text(v) for v in attr.strings]
    if kind == AttributeProto.TENSORS:
        return [tensor_to_array(t, folder) for t in attr.tensors]
    if kind == AttributeProto.GRAPHS:
        return [_import_graph(g, opsets or {"": 21}, folder) for g in attr.graphs]
    if kind == AttributeProto.SPARSE_TENSOR:
        return _sparse_to_dense(attr.sparse_tensor, folder)
    if kind == AttributeProto.SPARSE_TENSORS:
        return [_sparse_to_dense(s, folder) for s in attr.sparse_tensors]
    if kind == AttributeProto.TYPE_PROTO:
        return attr.tp
    if kind == AttributeProto.TYPE_PROTOS:
        return list(attr.type_protos)
    raise ModelLoadError(f"attribute {attr.name!r} has an unknown type {kind}")


def _text(raw: bytes) -> Any:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw


def tensor_to_array(tensor: TensorProto, folder: Path | None) -> np.ndarray:
    """A TensorProto's value in any storage form: typed fields, raw_data, or external data."""
    if tensor.data_location == TensorProto.EXTERNAL:
        direct = _read_external_array(tensor, folder)
        if direct is not None:
            return direct
        tensor = _with_external_data(tensor, folder)
    try:
        return numpy_helper.to_array(tensor)
    except Exception as exc:
        raise ModelLoadError(f"tensor {tensor.name!r} cannot be decoded: {exc}") from exc


def _read_external_array(tensor: TensorProto, folder: Path | None) -> np.ndarray | None:
    """External data of a plain numpy dtype read straight into its array: one copy, not three.

    (The general path copies the bytes into a TensorProto and decodes that, which for a
    large weight briefly holds it three times.) None for what only onnx decodes: strings,
    ml_dtypes types (bfloat16, float8, packed 4-bit), and big-endian hosts.
    """
    try:
        dtype = onnx_dtype(tensor.data_type)
    except (KeyError, ValueError, TypeError):
        return None
    if sys.byteorder != "little" or dtype.isbuiltin != 1 or dtype.kind not in "biufc":
        return None
    path, offset, length = _external_location(tensor, folder)
    count = _count(tensor)
    if length is not None and length != count * dtype.itemsize:
        raise ModelLoadError(
            f"tensor {tensor.name!r}: external data length {length} does not hold {count} {dtype.name} values")
    what = f"external data of tensor {tensor.name!r}"
    fh, _ = read_region(path, offset, count * dtype.itemsize, what)  # the file is checked before allocating
    try:
        with fh:
            value = allocate(count, dtype, what)
            got = fh.readinto(value.data.cast("B")) if value.nbytes else 0
    except OSError as exc:
        raise ModelLoadError(f"tensor {tensor.name!r}: cannot read external data {str(path)!r}: {exc}") from exc
    if got != value.nbytes:
        raise ModelLoadError(
            f"tensor {tensor.name!r}: external data {str(path)!r} ends after {got} of {value.nbytes} bytes")
    return value.reshape(tuple(tensor.dims))


def _external_location(tensor: TensorProto, folder: Path | None) -> tuple[Path, int, int | None]:
    """(file, offset, length or None) of a tensor's external data, the file resolved inside ``folder``."""
    info = {e.key: e.value for e in tensor.external_data}
    location = info.get("location", "")
    if folder is None:
        raise ModelLoadError(
            f"tensor {tensor.name!r} keeps its data in external file {location!r}, but the model was "
            "given without a folder: load it from its path or pass base_dir=")
    offset = _external_number(info, "offset", tensor.name)
    length = _external_number(info, "length", tensor.name)
    return safe_external_path(folder, location, tensor.name), offset or 0, length


def _external_number(info: dict[str, str], key: str, tensor_name: str) -> int | None:
    """An external-data ``offset`` or ``length`` entry as a non-negative int (None when absent)."""
    text = info.get(key)
    if text is None:
        return None
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise ModelLoadError(f"tensor {tensor_name!r}: external data {key} {text!r} is not a non-negative integer")
    return value


def _count(tensor: TensorProto) -> int:
    try:
        return element_count(tensor.dims)
    except ValueError as exc:
        raise ModelLoadError(f"tensor {tensor.name!r}: {exc}") from exc


def _with_external_data(tensor: TensorProto, folder: Path | None) -> TensorProto:
    path, offset, length = _external_location(tensor, folder)
    fh, nbytes = read_region(path, offset, length, f"external data of tensor {tensor.name!r}")
    try:
        with fh:
            data = fh.read(nbytes)
    except OSError as exc:
        raise ModelLoadError(f"tensor {tensor.name!r}: cannot read external data {str(path)!r}: {exc}") from exc
    loaded = TensorProto()
    loaded.CopyFrom(tensor)
    del loaded.external_data[:]
    loaded.data_location = TensorProto.DEFAULT
    loaded.raw_data = data
    return loaded


def safe_external_path(folder: Path, location: str, tensor_name: str) -> Path:
    """``location`` resolved inside ``folder``; refuses paths that leave it."""
    if not location:
        raise ModelLoadError(f"tensor {tensor_name!r} declares external data without a location")
    if "\0" in location:
        raise ModelLoadError(f"tensor {tensor_name!r}: external data location {location!r} holds a NUL byte; refused")
    try:
        base = folder.resolve()
        candidate = (base / location).resolve()
    except (OSError, RuntimeError) as exc:  # RuntimeError: a symlink loop on older Pythons
        raise ModelLoadError(f"tensor {tensor_name!r}: external data path {location!r} cannot be resolved: {exc}") from exc
    if os.path.isabs(location) or (candidate != base and base not in candidate.parents):
        raise ModelLoadError(
            f"tensor {tensor_name!r}: external data path {location!r} leaves the model's folder {str(base)!r}; refused")
    return candidate


def _sparse_to_dense(sparse: onnx.SparseTensorProto, folder: Path | None) -> np.ndarray:
    """The dense array of a sparse tensor; its shape, indices and values checked before anything is written."""
    values = tensor_to_array(sparse.values, folder)
    indices = tensor_to_array(sparse.indices, folder)
    return sparse_to_dense(values, indices, tuple(sparse.dims), sparse.values.name)


_ELEM_TYPES = frozenset(onnx.TensorProto.DataType.values())


def type_from_proto(tp: onnx.TypeProto) -> ValueType | None:
    """A TensorType, SequenceType, OptionalType or MapType from a TypeProto; None for other or untyped values."""
    kind = tp.WhichOneof("value")
    if kind in ("sequence_type", "optional_type"):
        inner = getattr(tp, kind).elem_type
        return (SequenceType if kind == "sequence_type" else OptionalType)(
            type_from_proto(inner) if inner.WhichOneof("value") else None)
    if kind == "map_type":
        value = tp.map_type.value_type
        return MapType(onnx_dtype(tp.map_type.key_type), type_from_proto(value) if value.WhichOneof("value") else None)
    if kind != "tensor_type" or not tp.tensor_type.elem_type:
        return None
    tt = tp.tensor_type
    shape: tuple[Dim, ...] | None = None
    if tt.HasField("shape"):
        shape = tuple(_dim_from_proto(d) for d in tt.shape.dim)
    if tt.elem_type not in _ELEM_TYPES:
        raise ModelLoadError(f"unknown tensor element type {tt.elem_type}; onnx.TensorProto.DataType defines the known ones")
    try:
        return TensorType(onnx_dtype(tt.elem_type), shape)
    except (KeyError, ValueError, TypeError):
        return None


def type_to_proto(t: ValueType) -> onnx.TypeProto:
    """The TypeProto of a TensorType, SequenceType or OptionalType (an unknown element: an empty TypeProto)."""
    if isinstance(t, TensorType):
        return helper.make_tensor_type_proto(elem_type_of(t.dtype), None if t.shape is None else list(t.shape))
    if isinstance(t, MapType):
        return helper.make_map_type_proto(elem_type_of(t.key), onnx.TypeProto() if t.value is None else type_to_proto(t.value))
    inner = onnx.TypeProto() if t.elem is None else type_to_proto(t.elem)
    return helper.make_sequence_type_proto(inner) if isinstance(t, SequenceType) else helper.make_optional_type_proto(inner)


def _dim_from_proto(d: Any) -> Dim:
    kind = d.WhichOneof("value")
    if kind == "dim_value":
        # some exporters write -1 for a dynamic dim; onnxruntime reads any negative dim as unknown, so do we
        return int(d.dim_value) if d.dim_value >= 0 else None
    return str(d.dim_param) if kind == "dim_param" else None


# ---- export -------------------------------------------------------------


def to_model_proto(graph: Graph) -> onnx.ModelProto:
    """Export a Graph as a ModelProto that onnxruntime and Netron open."""
    gp = _export_graph(graph, graph.opsets)
    opsets = [helper.make_opsetid(dom, ver) for dom, ver in sorted(graph.opsets.items())]
    meta = graph.meta
    model = helper.make_model(gp, opset_imports=opsets, producer_name=meta.get("producer_name") or "minfer")
    # IR 4+ lets initializers stand apart from inputs, which is how the IR keeps them;
    # IR 10 is the newest version onnxruntime 1.x accepts broadly.
    model.ir_version = max(4, min(int(meta.get("ir_version", 10)), 10))
    model.producer_version = meta.get("producer_version", "")
    model.model_version = int(meta.get("model_version", 0))
    model.doc_string = meta.get("doc_string", "")
    for key, value in meta.get("metadata_props", {}).items():
        model.metadata_props.add(key=key, value=value)
    model.functions.extend(meta.get("functions", []))
    return model


def save_model(graph: Graph, path: str | os.PathLike) -> None:
    """Write ``graph`` as an .onnx file; the file appears whole or not at all."""
    data = to_model_proto(graph).SerializeToString()
    tmp = Path(f"{path}.partial")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _export_graph(graph: Graph, opsets: dict[str, int]) -> onnx.GraphProto:
    inits = [numpy_helper.from_array(np.asarray(a), name) for name, a in graph.initializers.items()]
    nodes = [_export_node(n, opsets) for n in graph.nodes]
    inputs = [_value_info(graph, n) for n in graph.inputs]
    outputs = [_value_info(graph, n) for n in graph.outputs]
    listed = set(graph.inputs) | set(graph.outputs) | set(graph.initializers)
    value_info = [
        _value_info(graph, n)
        for n in sorted(graph.types)
        if n not in listed and graph.producer(n) is not None
    ]
    gp = helper.make_graph(nodes, graph.name, inputs, outputs, inits, value_info=value_info)
    gp.doc_string = graph.meta.get("doc_string", "")
    return gp


def _value_info(graph: Graph, name: str) -> onnx.ValueInfoProto:
    t = graph.type_of(name)
    return helper.make_empty_tensor_value_info(name) if t is None else helper.make_value_info(name, type_to_proto(t))


def _export_node(node: Node, opsets: dict[str, int]) -> onnx.NodeProto:
    proto = helper.make_node(node.op_type, node.inputs, node.outputs, name=node.name or None, domain=node.domain or None)
    types = _attr_types(node.op_type, opsets.get(node.domain, 1), node.domain)
    for key, value in node.attrs.items():
        proto.attribute.append(_make_attribute(key, value, types.get(key), opsets))
    return proto


@functools.lru_cache(maxsize=4096)  # inference exports every node: one schema lookup per op and opset
def _attr_types(op_type: str, opset: int, domain: str) -> dict[str, int]:
    try:
        schema = onnx.defs.get_schema(op_type, opset, domain)
    except Exception:
        return {}
    return {name: int(a.type) for name, a in schema.attributes.items()}  # type: ignore[call-overload]  # pybind enum


def _make_attribute(key: str, value: Any, kind: int | None, opsets: dict[str, int]) -> AttributeProto:
    if isinstance(value, Graph):
        return helper.make_attribute(key, _export_graph(value, opsets))
    if isinstance(value, list) and value and isinstance(value[0], Graph):
        return helper.make_attribute(key, [_export_graph(g, opsets) for g in value])
    if kind == AttributeProto.FLOAT:
        return helper.make_attribute(key, float(value))
    if kind == AttributeProto.FLOATS:
        return helper.make_attribute(key, [float(v) for v in value], attr_type=AttributeProto.FLOATS)
    if kind == AttributeProto.INTS:
        return helper.make_attribute(key, [int(v) for v in value], attr_type=AttributeProto.INTS)
    if kind == AttributeProto.STRINGS:
        return helper.make_attribute(key, list(value), attr_type=AttributeProto.STRINGS)
    if kind == AttributeProto.SPARSE_TENSOR:
        return helper.make_attribute(key, _dense_to_sparse(np.asarray(value)))
    if isinstance(value, np.ndarray):
        return helper.make_attribute(key, numpy_helper.from_array(value))
    if isinstance(value, list) and value and isinstance(value[0], np.ndarray):
        return helper.make_attribute(key, [numpy_helper.from_array(v) for v in value])
    if isinstance(value, list) and not value:
        return helper.make_attribute(key, [], attr_type=AttributeProto.INTS)
    return helper.make_attribute(key, value)


def _dense_to_sparse(dense: np.ndarray) -> onnx.SparseTensorProto:
    flat = dense.reshape(-1)
    idx = np.flatnonzero(flat).astype(np.int64)
    return helper.make_sparse_tensor(numpy_helper.from_array(flat[idx]), numpy_helper.from_array(idx), list(dense.shape))
