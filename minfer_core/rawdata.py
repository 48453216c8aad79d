"""Reading a model's large initializers straight into their arrays, around protobuf.

Parsing a model file with protobuf copies every weight into the message, and
decoding the message copies it again into numpy: loading vgg19 from its path
peaked at twice its 548 MB of weights. `split_model` walks the protobuf wire
format instead (ModelProto.graph -> GraphProto.initializer -> TensorProto.raw_data),
leaves each large plain-dtype ``raw_data`` out of the bytes handed to protobuf,
and notes where it is; `read_payload` then reads it from the file (or the
caller's bytes) into an aligned array of its own: each weight is held once.
Anything unexpected (groups, a repeated graph field, a truncated field) raises
`WireFormatError` and the caller parses the whole model as usual.
"""

from __future__ import annotations

import io
import sys
from typing import BinaryIO

import numpy as np

STRIP_BYTES = 1 << 16  # smaller payloads stay in the message: not worth a seek each
_GRAPH, _INITIALIZER = 7, 5  # ModelProto.graph, GraphProto.initializer
_DATA_TYPE, _RAW_DATA, _DATA_LOCATION = 2, 9, 14  # TensorProto fields
# ONNX element types whose raw_data is exactly numpy's little-endian buffer of that dtype
_PLAIN = {1: "f4", 2: "u1", 3: "i1", 4: "u2", 5: "i2", 6: "i4", 7: "i8", 9: "?", 10: "f2", 11: "f8", 12: "u4",
          13: "u8", 14: "c8", 15: "c16"}


class WireFormatError(Exception):
    """The bytes are not the plain protobuf this reader handles: parse them the usual way."""


Span = tuple[int, int, np.dtype]  # (offset of the payload in the source, its length, its dtype)


def split_model(src: BinaryIO) -> tuple[bytes, list[Span | None]]:
    """The model with large raw_data payloads of top-level initializers left out, and per initializer
    (in order) where its payload is in ``src``, or None when it stayed in the message."""
    size = _size(src)
    out = bytearray()
    spans: list[Span | None] = []
    graphs = 0
    while src.tell() < size:
        key = _varint(src)
        if key == (_GRAPH << 3 | 2):
            graphs += 1
            if graphs > 1:
                raise WireFormatError("the graph field appears twice (protobuf would merge them)")
            length = _length(src, size)
            graph = _split_graph(src, src.tell() + length, spans)
            out += _encode(key) + _encode(len(graph)) + graph
        else:
            out += _encode(key) + _field(src, key, size)
    return bytes(out), spans


def read_payload(src: BinaryIO, span: Span, dims: tuple[int, ...]) -> np.ndarray:
    """The array of a payload `split_model` left out, read from ``src`` into memory of its own."""
    offset, length, dtype = span
    count = int(np.prod(dims, dtype=np.int64))
    if count * dtype.itemsize != length:
        raise ValueError(f"raw_data holds {length} bytes, not {count} {dtype.name} values of shape {list(dims)}")
    value = np.empty(count, dtype=dtype)
    src.seek(offset)
    if src.readinto(value.data.cast("B")) != length:  # type: ignore[attr-defined]
        raise ValueError("the file ends inside the tensor's raw_data")
    return value.reshape(dims)


def _split_graph(src: BinaryIO, end: int, spans: list[Span | None]) -> bytes:
    out = bytearray()
    while src.tell() < end:
        key = _varint(src)
        if key == (_INITIALIZER << 3 | 2):
            length = _length(src, end)
            tensor = _split_tensor(src, src.tell() + length, spans)
            out += _encode(key) + _encode(len(tensor)) + tensor
        else:
            out += _encode(key) + _field(src, key, end)
    if src.tell() != end:
        raise WireFormatError("a field runs past the end of the graph")
    return bytes(out)


def _split_tensor(src: BinaryIO, end: int, spans: list[Span | None]) -> bytes:
    kept = bytearray()
    raw: list[tuple[int, int]] = []
    data_type = location = 0
    while src.tell() < end:
        key = _varint(src)
        if key == (_RAW_DATA << 3 | 2):
            length = _length(src, end)
            raw.append((src.tell(), length))
            src.seek(length, io.SEEK_CUR)
            continue
        value = _field(src, key, end)
        if key == (_DATA_TYPE << 3):
            data_type = _varint(io.BytesIO(value))
        elif key == (_DATA_LOCATION << 3):
            location = _varint(io.BytesIO(value))
        kept += _encode(key) + value
    if src.tell() != end:
        raise WireFormatError("a field runs past the end of a tensor")
    dtype = _PLAIN.get(data_type)
    plain = dtype is not None and sys.byteorder == "little" and location == 0
    if len(raw) == 1 and plain and raw[0][1] >= STRIP_BYTES:
        spans.append((raw[0][0], raw[0][1], np.dtype(dtype)))
        return bytes(kept)
    spans.append(None)
    for offset, length in raw:  # put the payload back, where protobuf will find it
        src.seek(offset)
        kept += _encode(_RAW_DATA << 3 | 2) + _encode(length) + src.read(length)
    src.seek(end)
    return bytes(kept)


def _field(src: BinaryIO, key: int, end: int) -> bytes:
    """The encoded value of a field whose key was just read (its bytes, for copying it as it is)."""
    wire = key & 7
    if wire == 0:
        return _encode(_varint(src))
    if wire == 1 or wire == 5:
        return _exactly(src, 8 if wire == 1 else 4)
    if wire == 2:
        length = _length(src, end)
        return _encode(length) + _exactly(src, length)
    raise WireFormatError(f"wire type {wire} (groups) is not handled")


def _length(src: BinaryIO, end: int) -> int:
    length = _varint(src)
    if src.tell() + length > end:
        raise WireFormatError("a length-delimited field runs past its message")
    return length


def _varint(src: BinaryIO) -> int:
    value = shift = 0
    while True:
        byte = src.read(1)
        if not byte:
            raise WireFormatError("the data ends inside a varint")
        value |= (byte[0] & 0x7F) << shift
        if byte[0] < 0x80:
            return value
        shift += 7
        if shift > 63:
            raise WireFormatError("a varint longer than 10 bytes")


def _encode(value: int) -> bytes:
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _exactly(src: BinaryIO, n: int) -> bytes:
    data = src.read(n)
    if len(data) != n:
        raise WireFormatError("the data ends inside a field")
    return data


def _size(src: BinaryIO) -> int:
    here = src.tell()
    size = src.seek(0, io.SEEK_END)
    src.seek(here)
    return size
