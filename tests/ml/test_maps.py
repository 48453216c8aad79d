"""Maps in scikit-learn models: skl2onnx's default ZipMap output and DictVectorizer input, as onnxruntime runs them."""

from __future__ import annotations

import numpy as np
import pytest

from modelkit import ORT_IR_VERSION

pytest.importorskip("sklearn", reason="the ml model tests need scikit-learn (pip install minfer-ops-ml[test])")
pytest.importorskip("skl2onnx", reason="the ml model tests need skl2onnx (pip install minfer-ops-ml[test])")
ort = pytest.importorskip("onnxruntime", reason="onnxruntime is the oracle")

from skl2onnx import to_onnx  # noqa: E402
from skl2onnx.common.data_types import DictionaryType, FloatTensorType, Int64TensorType, StringTensorType  # noqa: E402
from sklearn import datasets, ensemble, linear_model, pipeline  # noqa: E402
from sklearn.feature_extraction import DictVectorizer  # noqa: E402

import minfer_core  # noqa: E402


def both(onx, feed):
    """(minfer's outputs, onnxruntime's outputs, minfer's session) for one feed."""
    onx.ir_version = ORT_IR_VERSION
    data = onx.SerializeToString()
    sess = minfer_core.InferenceSession(data)
    return sess.run(None, feed), ort.InferenceSession(data, providers=["CPUExecutionProvider"]).run(None, feed), sess


@pytest.mark.parametrize("make", [
    lambda: linear_model.LogisticRegression(max_iter=500),
    lambda: ensemble.RandomForestClassifier(n_estimators=5, max_depth=4, random_state=0),
], ids=["logistic", "forest"])
def test_zipmap_probabilities_are_the_maps_onnxruntime_returns(make):
    """A classifier converted with skl2onnx's default ZipMap: the same labels, one {class: probability} per row."""
    x, y = datasets.load_iris(return_X_y=True)
    x = x.astype(np.float32)
    model = make().fit(x, y)
    got, want, sess = both(to_onnx(model, x[:1], target_opset={"": 17, "ai.onnx.ml": 3}), {"X": x})
    np.testing.assert_array_equal(got[0], want[0])
    assert isinstance(got[1], list) and len(got[1]) == len(want[1]) == len(x)
    for g, w in zip(got[1], want[1]):
        assert sorted(g) == sorted(w)
        np.testing.assert_allclose([g[k] for k in sorted(g)], [w[k] for k in sorted(w)], rtol=1e-5, atol=1e-6)
    assert sess.get_outputs()[1].type == "seq(map(int64,tensor(float)))"  # onnxruntime's name for it


def test_string_labels_zip_to_string_keys():
    """Classes given as strings become the maps' string keys."""
    x, y = datasets.load_iris(return_X_y=True)
    x, labels = x.astype(np.float32), np.array(["setosa", "versicolor", "virginica"])[y]
    model = linear_model.LogisticRegression(max_iter=500).fit(x, labels)
    got, want, _ = both(to_onnx(model, x[:1], target_opset={"": 17, "ai.onnx.ml": 3}), {"X": x[:7]})
    np.testing.assert_array_equal(got[0], want[0])
    assert [sorted(g) for g in got[1]] == [sorted(w) for w in want[1]] == [["setosa", "versicolor", "virginica"]] * 7


@pytest.mark.parametrize("key_type, records", [
    (StringTensorType([1]), [{"a": 1.0, "b": 2.0}, {"c": 3.0, "a": -1.0}, {"b": 0.5}]),
    (Int64TensorType([1]), [{1: 1.0, 7: 2.0}, {3: 3.0}, {7: -4.0, 1: 0.25}]),
], ids=["string-keys", "int-keys"])
def test_dict_vectorizer_pipeline_matches_onnxruntime(key_type, records):
    """DictVectorizer -> LogisticRegression on a map feed: the same vector and the same labels per record."""
    model = pipeline.make_pipeline(DictVectorizer(sparse=False), linear_model.LogisticRegression())
    model.fit(records, [0, 1, 0])
    onx = to_onnx(model, initial_types=[("input", DictionaryType(key_type, FloatTensorType([1])))],
                  target_opset={"": 17, "ai.onnx.ml": 3}, options={id(model.steps[-1][1]): {"zipmap": False}})
    for record in records:
        got, want, sess = both(onx, {"input": record})
        np.testing.assert_array_equal(got[0], want[0])
        np.testing.assert_allclose(got[1], want[1], rtol=1e-5, atol=1e-6)
    assert sess.get_inputs()[0].type == ort.InferenceSession(onx.SerializeToString()).get_inputs()[0].type


def test_dict_vectorizer_refuses_a_tensor_feed():
    """A map input fed an array is a clear error, not a silent wrong vector."""
    model = DictVectorizer(sparse=False).fit([{"a": 1.0}])
    onx = to_onnx(model, initial_types=[("input", DictionaryType(StringTensorType([1]), FloatTensorType([1])))],
                  target_opset={"": 17, "ai.onnx.ml": 3})
    onx.ir_version = ORT_IR_VERSION
    with pytest.raises(minfer_core.MinferError, match="map"):
        minfer_core.InferenceSession(onx.SerializeToString()).run(None, {"input": np.ones(1, np.float32)})
