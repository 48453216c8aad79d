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

Every file is opened through `open_regular`, and every allocation is checked
against the bytes the file really holds: a FIFO, a device such as /dev/zero
or a tensor that claims more data than its file has is a `ModelLoadError`
before anything blocks or is allocated.
"""

from __future__ import annotations

import io
import math
import os
import stat
import sys
from pathlib import Path
from typing import BinaryIO, Sequence

import numpy as np

from .errors import ModelLoadError

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
    here = src.tell()
    size = src.seek(0, io.SEEK_END)
    src.seek(here)
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
    count = element_count(dims)
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
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    return bytes(out) + bytes([value])


def _exactly(src: BinaryIO, n: int) -> bytes:
    data = src.read(n)
    if len(data) != n:
        raise WireFormatError("the data ends inside a field")
    return data


# ---- regular files of bounded size ---------------------------------------------


def open_regular(path: str | os.PathLike, what: str) -> BinaryIO:
    """``path`` opened for binary reading if it is a regular file; anything else is a ModelLoadError.

    A FIFO would block the load forever and a device such as /dev/zero never
    ends, so the kind of file is checked before opening, and again on the
    open descriptor (opened non-blocking) in case the path changed between.
    """
    try:
        kind = _kind(os.stat(path).st_mode)
        if kind is None:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
            kind = _kind(os.fstat(fd).st_mode)
            if kind is None:
                return os.fdopen(fd, "rb")
            os.close(fd)
    except (OSError, ValueError) as exc:  # ValueError: a NUL byte in the path
        reason = getattr(exc, "strerror", None) or str(exc)
        raise ModelLoadError(f"cannot read {what} {str(path)!r}: {reason}") from exc
    raise ModelLoadError(f"{what} {str(path)!r} is {kind}, not a regular file; minfer reads models and "
                         "their external data only from regular files")


def _kind(mode: int) -> str | None:
    """None for a regular file, else what the file is, for the error message."""
    if stat.S_ISREG(mode):
        return None
    kinds = ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "not a regular file")


def file_size(fh: BinaryIO) -> int:
    """The size of an open regular file, from its descriptor."""
    return os.fstat(fh.fileno()).st_size


def element_count(dims: Sequence[int]) -> int:
    """The number of elements of a shape (exact: Python ints do not overflow); negative dims are refused."""
    if any(int(d) < 0 for d in dims):
        raise ValueError(f"shape {list(dims)} has a negative dimension")
    return math.prod(int(d) for d in dims)


def read_region(path: Path, offset: int, nbytes: int | None, what: str) -> tuple[BinaryIO, int]:
    """``path`` opened and positioned at ``offset``, with the byte count to read (the rest of the file
    when ``nbytes`` is None); raises ModelLoadError, before any allocation, when the file is shorter."""
    fh = open_regular(path, what)
    size = file_size(fh)
    count = size - offset if nbytes is None else nbytes
    if offset > size or count < 0 or offset + count > size:
        fh.close()
        raise ModelLoadError(f"{what} {str(path)!r} holds {size} bytes, fewer than the {count} asked for at offset {offset}")
    fh.seek(offset)
    return fh, count


def allocate(count: int, dtype: np.dtype, what: str) -> np.ndarray:
    """np.empty(count, dtype), refused as a ModelLoadError when it cannot fit this machine's memory."""
    nbytes = count * dtype.itemsize
    limit = memory_bytes()
    if limit is not None and nbytes > limit:
        raise ModelLoadError(f"{what} needs {nbytes} bytes, more than this machine's {limit} bytes of memory")
    try:
        return np.empty(count, dtype=dtype)
    except (MemoryError, ValueError) as exc:
        raise ModelLoadError(f"{what} needs {nbytes} bytes, which cannot be allocated: {exc}") from exc


def memory_bytes() -> int | None:
    """The machine's physical memory in bytes, or None where the platform does not say."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE")) * int(os.sysconf("SC_PHYS_PAGES"))
    except (AttributeError, ValueError, OSError):
        return None


def sparse_to_dense(values: np.ndarray, indices: np.ndarray, dims: tuple[int, ...], name: str) -> np.ndarray:
    """The dense array of a sparse tensor, with its shape, indices and values checked before allocating."""
    values = values.reshape(-1)
    try:
        count = element_count(dims)
    except ValueError as exc:
        raise ModelLoadError(f"sparse tensor {name!r}: {exc}") from exc
    flat = _flat_indices(name, indices, tuple(int(d) for d in dims), len(values))
    if flat.size and (flat.min() < 0 or flat.max() >= count):
        raise ModelLoadError(f"sparse tensor {name!r}: an index lies outside its dense shape {list(dims)}")
    dense = allocate(count, values.dtype, f"the dense form of sparse tensor {name!r}")
    dense[...] = 0
    dense[flat] = values
    return dense.reshape(tuple(dims))


def _flat_indices(name: str, indices: np.ndarray, dims: tuple[int, ...], nnz: int) -> np.ndarray:
    """Indices into the flattened dense array, from [NNZ] linear indices or [NNZ, rank] coordinates."""
    if indices.dtype.kind not in "iu":
        raise ModelLoadError(f"sparse tensor {name!r}: indices are {indices.dtype}, not integers")
    coords = indices.ndim == 2 and indices.shape == (nnz, len(dims)) and len(dims) > 0
    if not (coords or indices.shape == (nnz,)):
        raise ModelLoadError(f"sparse tensor {name!r}: indices of shape {list(indices.shape)} do not match "
                             f"{nnz} values ([{nnz}] or [{nnz}, {len(dims)}] expected)")
    if not coords:
        return indices.astype(np.int64)
    if indices.size and ((indices < 0).any() or (indices >= np.array(dims)).any()):
        raise ModelLoadError(f"sparse tensor {name!r}: an index lies outside its dense shape {list(dims)}")
    return np.ravel_multi_index(tuple(indices.T.astype(np.int64)), dims)
