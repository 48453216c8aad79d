"""The importer reads every initializer and attribute storage form; export round-trips."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import AttributeProto, TensorProto, helper, numpy_helper

from modelkit import make_model, ort_run, tensor
from minfer_core import InferenceSession, ModelLoadError, load_model, to_model_proto
from minfer_core.graph import Graph


def add_model(init: TensorProto) -> onnx.ModelProto:
    node = helper.make_node("Add", ["x", init.name], ["y"])
    return make_model([node], [tensor("x", [2, 3])], [tensor("y", [2, 3])], [init])


VALUES = np.arange(6, dtype=np.float32).reshape(2, 3)


@pytest.mark.parametrize(
    "init",
    [
        numpy_helper.from_array(VALUES, "w"),  # raw_data
        helper.make_tensor("w", TensorProto.FLOAT, [2, 3], VALUES.ravel().tolist()),  # float_data
    ],
    ids=["raw_data", "float_data"],
)
def test_float_initializer_storage_forms(init):
    """raw_data and typed float_data decode to the same array."""
    graph = load_model(add_model(init))
    np.testing.assert_array_equal(graph.initializers["w"], VALUES)


@pytest.mark.parametrize(
    "elem,dtype,field",
    [
        (TensorProto.INT32, np.int32, "int32_data"),
        (TensorProto.INT64, np.int64, "int64_data"),
        (TensorProto.DOUBLE, np.float64, "double_data"),
        (TensorProto.FLOAT16, np.float16, "int32_data"),
        (TensorProto.BOOL, np.bool_, "int32_data"),
        (TensorProto.UINT64, np.uint64, "uint64_data"),
    ],
)
def test_typed_field_initializers(elem, dtype, field):
    """Each typed field decodes to the right dtype and values."""
    values = np.array([1, 0, 1, 1], dtype=dtype)
    t = helper.make_tensor("w", elem, [4], values.tolist(), raw=False)
    assert len(getattr(t, field)) == 4
    graph = Graph(initializers={})
    from minfer_core.onnx_io import tensor_to_array

    got = tensor_to_array(t, None)
    assert got.dtype == dtype and np.array_equal(got, values)
    assert graph is not None


def write_external(tmp_path, location: str) -> onnx.ModelProto:
    (tmp_path / "weights.bin").write_bytes(b"\0" * 8 + VALUES.tobytes())
    init = TensorProto(name="w", data_type=TensorProto.FLOAT, dims=[2, 3])
    init.data_location = TensorProto.EXTERNAL
    for k, v in {"location": location, "offset": "8", "length": str(VALUES.nbytes)}.items():
        init.external_data.add(key=k, value=v)
    model = add_model(init)
    (tmp_path / "model.onnx").write_bytes(model.SerializeToString())
    return model


def test_external_data_is_read_relative_to_the_model(tmp_path):
    """External data (with offset and length) loads from the model's folder."""
    write_external(tmp_path, "weights.bin")
    graph = load_model(tmp_path / "model.onnx")
    np.testing.assert_array_equal(graph.initializers["w"], VALUES)
    out = InferenceSession(str(tmp_path / "model.onnx")).run(None, {"x": np.ones((2, 3), np.float32)})[0]
    np.testing.assert_array_equal(out, VALUES + 1)


@pytest.mark.parametrize("location", ["../weights.bin", "/etc/passwd", "sub/../../weights.bin"])
def test_external_data_leaving_the_folder_is_refused(tmp_path, location):
    """A path that escapes the model's folder is a ModelLoadError."""
    sub = tmp_path / "m"
    sub.mkdir()
    write_external(sub, location)
    with pytest.raises(ModelLoadError, match="leaves the model's folder"):
        load_model(sub / "model.onnx")


def test_external_data_without_a_folder_is_explained(tmp_path):
    """A ModelProto with external data and no base_dir says how to fix it."""
    model = write_external(tmp_path, "weights.bin")
    with pytest.raises(ModelLoadError, match="base_dir"):
        load_model(model)
    assert load_model(model, base_dir=tmp_path).initializers["w"].shape == (2, 3)


def test_sparse_initializer_becomes_dense():
    """A sparse initializer is densified."""
    values = numpy_helper.from_array(np.array([5.0, 7.0], np.float32), "w")
    indices = numpy_helper.from_array(np.array([1, 4], np.int64), "w_idx")
    sparse = helper.make_sparse_tensor(values, indices, [2, 3])
    model = add_model(numpy_helper.from_array(VALUES, "unused"))
    model.graph.sparse_initializer.append(sparse)
    got = load_model(model).initializers["w"]
    np.testing.assert_array_equal(got, np.array([[0, 5, 0], [0, 7, 0]], np.float32))


def test_every_attribute_type_is_imported_and_exported():
    """Scalars, lists, tensors, graphs, sparse tensors and type protos survive import and export."""
    sub = helper.make_graph([helper.make_node("Identity", ["a"], ["b"])], "sub", [tensor("a", [1])], [tensor("b", [1])])
    t = numpy_helper.from_array(VALUES, "t")
    sparse = helper.make_sparse_tensor(
        numpy_helper.from_array(np.array([1.0], np.float32)), numpy_helper.from_array(np.array([2], np.int64)), [3]
    )
    attrs = {
        "f": helper.make_attribute("f", 1.5),
        "i": helper.make_attribute("i", 3),
        "s": helper.make_attribute("s", "hello"),
        "t": helper.make_attribute("t", t),
        "g": helper.make_attribute("g", sub),
        "fs": helper.make_attribute("fs", [1.0, 2.0]),
        "is": helper.make_attribute("is", [1, 2]),
        "ss": helper.make_attribute("ss", ["a", "b"]),
        "ts": helper.make_attribute("ts", [t]),
        "gs": helper.make_attribute("gs", [sub]),
        "sp": helper.make_attribute("sp", sparse),
        "tp": helper.make_attribute("tp", helper.make_tensor_type_proto(TensorProto.FLOAT, [2])),
    }
    node = helper.make_node("Custom", ["x"], ["y"], domain="com.test")
    node.attribute.extend(attrs.values())
    model = make_model([node], [tensor("x", [2])], [tensor("y", [2])], extra_opsets=[helper.make_opsetid("com.test", 1)])
    graph = load_model(model)
    got = graph.nodes[0].attrs
    assert got["f"] == 1.5 and got["i"] == 3 and got["s"] == "hello"
    assert got["fs"] == [1.0, 2.0] and got["is"] == [1, 2] and got["ss"] == ["a", "b"]
    np.testing.assert_array_equal(got["t"], VALUES)
    np.testing.assert_array_equal(got["ts"][0], VALUES)
    assert isinstance(got["g"], Graph) and got["g"].nodes[0].op_type == "Identity"
    assert isinstance(got["gs"][0], Graph)
    np.testing.assert_array_equal(got["sp"], [0, 0, 1])
    assert got["tp"].tensor_type.elem_type == TensorProto.FLOAT
    assert graph.opsets == {"": 17, "com.test": 1}
    exported = {a.name: a for a in to_model_proto(graph).graph.node[0].attribute}
    kinds = {k: exported[k].type for k in attrs}
    assert kinds["f"] == AttributeProto.FLOAT and kinds["g"] == AttributeProto.GRAPH
    assert kinds["gs"] == AttributeProto.GRAPHS and kinds["ts"] == AttributeProto.TENSORS
    assert kinds["ss"] == AttributeProto.STRINGS and kinds["is"] == AttributeProto.INTS


def test_value_info_and_symbolic_dims_are_kept():
    """Declared types, including symbolic dims, are imported."""
    node = helper.make_node("Relu", ["x"], ["h"])
    node2 = helper.make_node("Neg", ["h"], ["y"])
    model = make_model([node, node2], [tensor("x", ["batch", 3])], [tensor("y", ["batch", 3])])
    model.graph.value_info.append(tensor("h", ["batch", 3]))
    graph = load_model(model)
    assert graph.types["h"].shape == ("batch", 3)
    assert graph.types["x"].dtype == np.float32


def test_export_round_trip_runs_in_onnxruntime():
    """Import then export gives a model onnxruntime runs with the same outputs."""
    from minfer_core.testing.zoo import randomized

    model = randomized("light_squeezenet")
    again = to_model_proto(load_model(model))
    onnx.checker.check_model(again)
    x = np.random.default_rng(0).standard_normal((1, 3, 224, 224)).astype(np.float32)
    name = model.graph.input[0].name
    np.testing.assert_allclose(ort_run(again, {name: x})[0], ort_run(model, {name: x})[0], rtol=1e-6, atol=1e-7)


def test_truncated_file_is_a_minfer_error(tmp_path):
    """A truncated model file raises ModelLoadError, not a protobuf traceback."""
    model = add_model(numpy_helper.from_array(VALUES, "w"))
    data = model.SerializeToString()
    path = tmp_path / "cut.onnx"
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelLoadError):
        load_model(path)


def test_non_model_file_is_a_minfer_error(tmp_path):
    """Random bytes or a missing file raise ModelLoadError."""
    path = tmp_path / "junk.onnx"
    path.write_bytes(b"\xff\xfe this is not protobuf \x00\x01")
    with pytest.raises(ModelLoadError):
        load_model(path)
    with pytest.raises(ModelLoadError, match="cannot read"):
        load_model(tmp_path / "missing.onnx")
