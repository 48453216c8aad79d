"""Loading reads only regular files, checks sizes before allocating, and every bad file is a ModelLoadError."""

from __future__ import annotations

import os
import subprocess
import sys
import threading

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from modelkit import make_model, tensor
from minfer_core import ModelLoadError, load_model
from minfer_core.testing.zoo import randomized

posix_only = pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="FIFOs and /dev files are POSIX")


def identity_of(init: TensorProto | None = None, sparse: onnx.SparseTensorProto | None = None) -> onnx.ModelProto:
    """A model whose output is its one (possibly sparse) initializer ``w``."""
    model = make_model([helper.make_node("Identity", ["w"], ["y"])], [], [tensor("y", None)], [init] if init else [])
    if sparse is not None:
        model.graph.sparse_initializer.append(sparse)
    return model


def external_w(location: str, dims: list[int], **entries: str) -> TensorProto:
    """A float tensor ``w`` of shape ``dims`` whose data is said to be in ``location``."""
    t = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=dims, data_location=TensorProto.EXTERNAL)
    for key, value in {"location": location, **entries}.items():
        t.external_data.add(key=key, value=value)
    return t


def save(tmp_path, model: onnx.ModelProto) -> str:
    path = tmp_path / "model.onnx"
    path.write_bytes(model.SerializeToString())
    return str(path)


class FifoWriter:
    """A writer waiting on a FIFO: if a loader opens the FIFO, it gets a few bytes and EOF instead of hanging."""

    def __init__(self, path: str, payload: bytes = b"\x08\x07" * 8):
        os.mkfifo(path)
        self.path, self.payload, self.connected = path, payload, threading.Event()
        self.thread = threading.Thread(target=self._write, daemon=True)
        self.thread.start()

    def _write(self) -> None:
        try:
            with open(self.path, "wb") as fh:  # blocks until someone opens the FIFO for reading
                self.connected.set()
                fh.write(self.payload)
        except OSError:
            pass

    def release(self) -> None:
        """Unblock the writer if nobody opened the FIFO (opening its read end without blocking)."""
        fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        self.thread.join(5)
        os.close(fd)


@posix_only
def test_a_model_path_that_is_a_fifo_is_refused_unopened(tmp_path):
    """A model path that is a FIFO is refused as not a regular file, without opening it (which would block)."""
    writer = FifoWriter(str(tmp_path / "model.onnx"))
    try:
        with pytest.raises(ModelLoadError, match="FIFO.*not a regular file"):
            load_model(writer.path)
        assert not writer.connected.is_set()
    finally:
        writer.release()


@posix_only
def test_a_device_model_path_is_refused_unread():
    """/dev/null (a character device) is refused by its kind, not read."""
    with pytest.raises(ModelLoadError, match="character device, not a regular file"):
        load_model("/dev/null")


@posix_only
def test_dev_zero_as_a_model_is_refused_not_read_until_memory_runs_out():
    """/dev/zero as a model path is a ModelLoadError at once (the child's memory is capped so the old code failed fast)."""
    code = (
        "import resource; resource.setrlimit(resource.RLIMIT_AS, (3 << 30, resource.RLIM_INFINITY))\n"
        "from minfer_core import ModelLoadError, load_model\n"
        "try:\n    load_model('/dev/zero')\nexcept ModelLoadError as exc:\n    print('refused:', exc)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-500:]
    assert "refused:" in done.stdout and "character device" in done.stdout


@posix_only
def test_external_data_in_a_fifo_is_refused_unopened(tmp_path):
    """External data whose file is a FIFO is refused without opening it: the load never waits on a writer."""
    writer = FifoWriter(str(tmp_path / "w.bin"))
    try:
        with pytest.raises(ModelLoadError, match="FIFO.*not a regular file"):
            load_model(save(tmp_path, identity_of(external_w("w.bin", [4]))))
        assert not writer.connected.is_set()
    finally:
        writer.release()


def test_external_tensor_larger_than_its_file_fails_before_allocating(tmp_path, monkeypatch):
    """A tensor claiming 10^11 floats from a 64-byte file is refused by the file size, with no allocation tried."""
    (tmp_path / "w.bin").write_bytes(bytes(64))
    monkeypatch.setattr(np, "empty", _no_allocation(np.empty))
    with pytest.raises(ModelLoadError, match="holds 64 bytes"):
        load_model(save(tmp_path, identity_of(external_w("w.bin", [10**11]))))


def _no_allocation(real):
    def empty(shape, *args, **kw):
        if np.prod(shape, dtype=object) > 10**6:
            raise AssertionError(f"allocated {shape} before checking the file")
        return real(shape, *args, **kw)

    return empty


@pytest.mark.parametrize("entries, match", [
    ({"offset": "abc"}, "offset 'abc' is not a non-negative integer"),
    ({"offset": "-8"}, "offset '-8' is not a non-negative integer"),
    ({"length": "1e3"}, "length '1e3' is not a non-negative integer"),
    ({"offset": "60"}, "holds 64 bytes"),
    ({"offset": str(2**70)}, "holds 64 bytes"),
], ids=["non-numeric-offset", "negative-offset", "float-length", "offset-near-end", "offset-2^70"])
def test_bad_external_offsets_and_lengths_are_model_load_errors(tmp_path, entries, match):
    """Non-numeric, negative or out-of-file external-data offsets and lengths are ModelLoadErrors naming the entry."""
    (tmp_path / "w.bin").write_bytes(bytes(64))
    with pytest.raises(ModelLoadError, match=match):
        load_model(save(tmp_path, identity_of(external_w("w.bin", [4], **entries))))


@pytest.mark.parametrize("location", ["w\0.bin", "", "../w.bin", "/etc/passwd", "sub/../../w.bin"])
def test_bad_external_locations_are_model_load_errors(tmp_path, location):
    """A NUL byte in, an empty, or a folder-leaving external-data location is a ModelLoadError."""
    (tmp_path / "w.bin").write_bytes(bytes(64))
    with pytest.raises(ModelLoadError, match="NUL|without a location|leaves the model's folder"):
        load_model(save(tmp_path, identity_of(external_w(location, [4]))))


def test_negative_external_dims_are_a_model_load_error(tmp_path):
    """An external tensor with a negative dim is a ModelLoadError naming the shape."""
    (tmp_path / "w.bin").write_bytes(bytes(64))
    with pytest.raises(ModelLoadError, match="negative dimension"):
        load_model(save(tmp_path, identity_of(external_w("w.bin", [-4]))))


def sparse_w(values: list, indices: np.ndarray, dims: list[int]) -> onnx.SparseTensorProto:
    return helper.make_sparse_tensor(numpy_helper.from_array(np.array(values, np.float32), "w"),
                                     numpy_helper.from_array(indices, "w_indices"), dims)


@pytest.mark.parametrize("sparse, match", [
    (sparse_w([1.0], np.array([5], np.int64), [10**6, 10**6]), "more than this machine's"),
    (sparse_w([1.0], np.array([5], np.int64), [10**10, 10**10]), "more than this machine's"),
    (sparse_w([1.0], np.array([50], np.int64), [4]), "outside its dense shape"),
    (sparse_w([1.0], np.array([-1], np.int64), [4]), "outside its dense shape"),
    (sparse_w([1.0], np.array([[0, 7]], np.int64), [2, 3]), "outside its dense shape"),
    (sparse_w([1.0, 2.0], np.array([1], np.int64), [4]), "do not match 2 values"),
    (sparse_w([1.0], np.array([1.0], np.float32), [4]), "not integers"),
    (sparse_w([1.0], np.array([1], np.int64), [-4]), "negative dimension"),
], ids=["huge-dense", "dense-beyond-int64", "index-past-end", "negative-index", "coordinate-out-of-range",
        "count-mismatch", "float-indices", "negative-dim"])
def test_bad_sparse_initializers_are_model_load_errors(tmp_path, sparse, match):
    """A sparse initializer with a huge dense shape or bad indices is a ModelLoadError, checked before allocating."""
    with pytest.raises(ModelLoadError, match=match):
        load_model(save(tmp_path, identity_of(sparse=sparse)))


def test_good_sparse_initializers_still_load(tmp_path):
    """Linear and coordinate indices both scatter into a zero dense array."""
    linear = load_model(save(tmp_path, identity_of(sparse=sparse_w([1.0, 2.0], np.array([1, 5], np.int64), [2, 3]))))
    coords = load_model(identity_of(sparse=sparse_w([1.0, 2.0], np.array([[0, 1], [1, 2]], np.int64), [2, 3])))
    want = np.array([[0, 1, 0], [0, 0, 2]], np.float32)
    np.testing.assert_array_equal(linear.initializers["w"], want)
    np.testing.assert_array_equal(coords.initializers["w"], want)


@pytest.mark.parametrize("model", [None, 3.5, ["m.onnx"]])
def test_a_model_that_is_not_a_path_bytes_or_proto_is_a_model_load_error(model):
    """Anything but a path, bytes or a ModelProto is a ModelLoadError naming its type."""
    with pytest.raises(ModelLoadError, match=type(model).__name__):
        load_model(model)


def test_a_directory_model_path_is_a_model_load_error(tmp_path):
    """A folder given as the model is refused by its kind."""
    with pytest.raises(ModelLoadError, match="directory"):
        load_model(str(tmp_path))


@posix_only
def test_randomized_reads_model_files_as_loading_does():
    """`zoo.randomized` (behind `minfer run --random-weights`) refuses a device too, rather than reading it."""
    with pytest.raises(ModelLoadError, match="character device"):
        randomized("/dev/null")


@posix_only
def test_failed_loads_leave_no_file_open(tmp_path):
    """Loads that fail on a bad external file or a bad model close every file they opened."""
    (tmp_path / "w.bin").write_bytes(bytes(64))
    bad = [save(tmp_path, identity_of(external_w("w.bin", [10**11]))), str(tmp_path / "w.bin"), "/dev/null"]
    before = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    for _ in range(20):
        for path in bad:
            with pytest.raises(ModelLoadError):
                load_model(path)
    if before is not None:
        assert len(os.listdir("/proc/self/fd")) == before


@posix_only
def test_an_external_file_that_is_a_symlink_out_of_the_folder_is_refused(tmp_path):
    """External data through a symlink that leads out of the model's folder is refused like a ../ path."""
    outside = tmp_path / "outside.bin"
    outside.write_bytes(bytes(16))
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / "w.bin").symlink_to(outside)
    with pytest.raises(ModelLoadError, match="leaves the model's folder"):
        load_model(save(tmp_path / "model", identity_of(external_w("w.bin", [4]))))


def test_raw_data_shorter_than_its_dims_is_a_model_load_error():
    """An initializer whose raw_data holds fewer bytes than its dims need is a ModelLoadError."""
    short = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[1000], raw_data=bytes(8))
    with pytest.raises(ModelLoadError, match="cannot be decoded"):
        load_model(identity_of(short))


def test_a_negative_declared_dim_is_read_as_unknown():
    """A declared dim of -1 or -3 (some exporters' dynamic dim) is unknown, as onnxruntime reads it."""
    model = make_model([helper.make_node("Neg", ["x"], ["y"])], [tensor("x", [-3, 2])], [tensor("y", [-1, 2])])
    graph = load_model(model)
    assert graph.types["x"].shape == (None, 2) and graph.types["y"].shape == (None, 2)
