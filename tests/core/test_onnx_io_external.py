"""External initializer data decodes to the same values by the direct read and by onnx's decoder."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from minfer_core import ModelLoadError
from minfer_core.onnx_io import tensor_to_array

RNG = np.random.default_rng(3)


def external(tmp_path, values: np.ndarray, *, offset: int = 0, length: int | None = -1, raw: bytes | None = None,
             elem: int | None = None) -> TensorProto:
    """A TensorProto whose data sits at ``offset`` in ``data.bin`` (length given unless None)."""
    payload = numpy_helper.from_array(values).raw_data if raw is None else raw
    (tmp_path / "data.bin").write_bytes(b"\x5a" * offset + payload + b"\x00" * 5)
    t = TensorProto(name="w", data_type=elem or helper.np_dtype_to_tensor_dtype(values.dtype), dims=values.shape)
    t.data_location = TensorProto.EXTERNAL
    info = {"location": "data.bin", "offset": str(offset)}
    if length is not None:
        info["length"] = str(len(payload) if length == -1 else length)
    for k, v in info.items():
        t.external_data.add(key=k, value=v)
    return t


@pytest.mark.parametrize("dtype", [np.float32, np.float16, np.float64, np.int64, np.int8, np.uint16, np.bool_,
                                   np.complex64, ml_dtypes.bfloat16])
@pytest.mark.parametrize("offset", [0, 3, 4096])
def test_external_values_dtype_and_shape(tmp_path, dtype, offset):
    """Every numeric dtype, at any file offset (aligned or not), decodes exactly; the array is aligned."""
    values = (RNG.standard_normal((3, 5)) * 10).astype(dtype)
    got = tensor_to_array(external(tmp_path, values, offset=offset), tmp_path)
    assert got.dtype == values.dtype and got.shape == (3, 5) and got.flags.aligned
    np.testing.assert_array_equal(got.view(np.uint8), values.view(np.uint8))


def test_external_without_length_reads_the_tensor_size(tmp_path):
    """No ``length`` key: the tensor's own size is read from the offset on."""
    values = RNG.standard_normal((4, 2)).astype(np.float32)
    np.testing.assert_array_equal(tensor_to_array(external(tmp_path, values, offset=7, length=None), tmp_path), values)


def test_external_scalar_and_empty(tmp_path):
    """A 0-d tensor and a tensor with a zero dim decode to their shapes."""
    scalar = np.array(2.5, np.float32)
    assert tensor_to_array(external(tmp_path, scalar), tmp_path).shape == ()
    empty = np.zeros((0, 3), np.float32)
    assert tensor_to_array(external(tmp_path, empty), tmp_path).shape == (0, 3)


def test_external_length_that_does_not_fit_the_shape_is_refused(tmp_path):
    """A declared length other than the tensor's size is a ModelLoadError naming the tensor."""
    values = np.ones((2, 3), np.float32)
    with pytest.raises(ModelLoadError, match="'w'.*length 20"):
        tensor_to_array(external(tmp_path, values, length=20), tmp_path)


def test_external_file_too_short_is_refused(tmp_path):
    """A file that ends before the tensor does is a ModelLoadError, not garbage values."""
    values = np.ones((2, 3), np.float32)
    t = external(tmp_path, values, length=None)
    (tmp_path / "data.bin").write_bytes(values.tobytes()[:10])
    with pytest.raises(ModelLoadError, match="holds 10 bytes, fewer than the 24"):
        tensor_to_array(t, tmp_path)


def test_external_packed_4bit_goes_through_onnx(tmp_path):
    """int4 (two values a byte) is left to onnx's decoder and still comes out right."""
    values = np.array([1, -2, 3, -4, 5], dtype=ml_dtypes.int4)
    packed = helper.make_tensor("w", TensorProto.INT4, [5], values.astype(np.int8).tolist(), raw=False)
    raw = numpy_helper.from_array(numpy_helper.to_array(packed)).raw_data
    got = tensor_to_array(external(tmp_path, values, raw=raw, elem=TensorProto.INT4), tmp_path)
    np.testing.assert_array_equal(got.astype(np.int8), values.astype(np.int8))


def test_plain_dtypes_are_read_without_a_tensorproto_copy(tmp_path, monkeypatch):
    """float32 external data goes straight into its array, never through a copied TensorProto."""
    from minfer_core import onnx_io

    def copied(*_):
        raise AssertionError("went through the TensorProto copy")

    monkeypatch.setattr(onnx_io, "_with_external_data", copied)
    values = RNG.standard_normal((2, 3)).astype(np.float32)
    got = tensor_to_array(external(tmp_path, values), tmp_path)
    np.testing.assert_array_equal(got, values)
    got[0, 0] = 1.0  # an array of its own, not a view of a read-only buffer
