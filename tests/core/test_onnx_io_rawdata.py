"""Large initializers read around protobuf (minfer_core.rawdata) decode exactly as onnx decodes them."""

from __future__ import annotations

import io

import ml_dtypes
import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from minfer_core import ModelLoadError, load_model
from minfer_core.rawdata import STRIP_BYTES, WireFormatError, read_payload, split_model

RNG = np.random.default_rng(5)
BIG = STRIP_BYTES // 4 + 3  # elements of a float32 payload just over the threshold


def identity_model(inits: list[TensorProto]) -> onnx.ModelProto:
    """One Identity per initializer, so every initializer is used."""
    nodes = [helper.make_node("Identity", [t.name], [f"y{i}"]) for i, t in enumerate(inits)]
    outs = [helper.make_tensor_value_info(f"y{i}", t.data_type, list(t.dims)) for i, t in enumerate(inits)]
    graph = helper.make_graph(nodes, "g", [], outs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


def mixed_inits() -> list[TensorProto]:
    arrays = {
        "f32": RNG.standard_normal((BIG,)).astype(np.float32).reshape(-1, 1),
        "f16": RNG.standard_normal((3, BIG)).astype(np.float16),
        "i64": RNG.integers(-9, 9, (2, BIG // 2)).astype(np.int64),
        "bool": RNG.integers(0, 2, STRIP_BYTES + 1).astype(np.bool_),
        "c64": (RNG.standard_normal(BIG) + 1j).astype(np.complex64),
        "bf16": RNG.standard_normal((2, BIG)).astype(ml_dtypes.bfloat16),  # not plain numpy: stays in the message
        "small": np.arange(6, dtype=np.float32).reshape(2, 3),  # under the threshold: stays in the message
        "scalar": np.array(4.5, np.float64),
    }
    inits = [numpy_helper.from_array(a, n) for n, a in arrays.items()]
    inits.append(helper.make_tensor("typed", TensorProto.FLOAT, [BIG], np.ones(BIG, np.float32).tolist(), raw=False))
    return inits


def expected(model: onnx.ModelProto) -> dict[str, np.ndarray]:
    return {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}


@pytest.mark.parametrize("source", ["path", "bytes"])
def test_every_storage_form_matches_onnx(tmp_path, source):
    """Plain dtypes over the threshold, bfloat16, small, 0-d and typed-field initializers all decode exactly."""
    model = identity_model(mixed_inits())
    blob = model.SerializeToString()
    (tmp_path / "m.onnx").write_bytes(blob)
    graph = load_model(tmp_path / "m.onnx" if source == "path" else blob)
    want = expected(model)
    assert list(graph.initializers) == list(want)
    for name, value in want.items():
        got = graph.initializers[name]
        assert got.dtype == value.dtype and got.shape == value.shape, name
        assert got.tobytes() == value.tobytes(), name
    assert graph.initializers["f32"].flags.writeable and graph.initializers["f32"].flags.aligned


def test_only_large_plain_payloads_are_left_out():
    """split_model leaves out exactly the large plain-dtype payloads, and protobuf parses the rest."""
    model = identity_model(mixed_inits())
    stripped, spans = split_model(io.BytesIO(model.SerializeToString()))
    names = [t.name for t in model.graph.initializer]
    assert [n for n, s in zip(names, spans) if s is not None] == ["f32", "f16", "i64", "bool", "c64"]
    parsed = onnx.ModelProto.FromString(stripped)
    assert [t.name for t in parsed.graph.initializer] == names
    assert parsed.graph.node == model.graph.node
    assert len(stripped) < len(model.SerializeToString()) - 5 * STRIP_BYTES


def _key(field: int, wire: int) -> bytes:
    return bytes([field << 3 | wire])


def _varint(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    return bytes(out) + bytes([n])


def _len(data: bytes) -> bytes:
    return _varint(len(data))


def test_raw_data_before_its_data_type_is_still_read():
    """Field order is free in protobuf: a raw_data written before data_type and dims is found too."""
    values = RNG.standard_normal(BIG).astype(np.float32)
    raw = values.tobytes()
    tensor = (_key(9, 2) + _len(raw) + raw + _key(8, 2) + _len(b"w") + b"w"
              + _key(2, 0) + _varint(TensorProto.FLOAT) + _key(1, 0) + _varint(BIG))
    graph = _key(5, 2) + _len(tensor) + tensor + _key(2, 2) + _len(b"g") + b"g"
    model = _key(1, 0) + bytes([8]) + _key(7, 2) + _len(graph) + graph
    src = io.BytesIO(model)
    stripped, spans = split_model(src)
    parsed = onnx.ModelProto.FromString(stripped)
    assert list(parsed.graph.initializer[0].dims) == [BIG] and spans[0] is not None
    np.testing.assert_array_equal(read_payload(src, spans[0], (BIG,)), values)
    np.testing.assert_array_equal(load_model(model).initializers["w"], values)


def test_a_repeated_graph_field_falls_back_to_protobuf(tmp_path):
    """Two graph fields (protobuf merges them) are left to protobuf's own parse, which agrees with onnx."""
    first = identity_model(mixed_inits()[:1])
    extra = onnx.ModelProto()
    extra.graph.initializer.add().CopyFrom(numpy_helper.from_array(np.ones(BIG, np.float32), "more"))
    blob = first.SerializeToString() + extra.SerializeToString()
    with pytest.raises(WireFormatError):
        split_model(io.BytesIO(blob))
    graph = load_model(blob)
    assert list(graph.initializers) == ["f32", "more"]


def test_a_payload_that_does_not_fit_its_shape_is_a_load_error(tmp_path):
    """raw_data whose length disagrees with dims is a ModelLoadError naming the tensor."""
    t = numpy_helper.from_array(np.ones(BIG, np.float32), "w")
    t.dims[0] = BIG + 1
    with pytest.raises(ModelLoadError, match="'w'.*raw_data holds 65548 bytes, not 16388 float32 values"):
        load_model(identity_model([t]).SerializeToString())


def test_truncated_inside_a_payload_is_a_load_error(tmp_path):
    """A file cut inside a large payload is a ModelLoadError, as protobuf reports it."""
    blob = identity_model(mixed_inits()[:1]).SerializeToString()
    (tmp_path / "m.onnx").write_bytes(blob[: len(blob) // 2])
    with pytest.raises(ModelLoadError):
        load_model(tmp_path / "m.onnx")
