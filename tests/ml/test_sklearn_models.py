"""scikit-learn models exported by skl2onnx run on minfer as on onnxruntime (ai.onnx.ml kernels of minfer-ops-ml)."""

from __future__ import annotations

import numpy as np
import pytest

from modelkit import ORT_IR_VERSION, ort_run

pytest.importorskip("sklearn", reason="the ml model tests need scikit-learn (pip install minfer-ops-ml[test])")
pytest.importorskip("skl2onnx", reason="the ml model tests need skl2onnx (pip install minfer-ops-ml[test])")

from skl2onnx import to_onnx  # noqa: E402
from sklearn import datasets, ensemble, linear_model, pipeline, preprocessing, svm  # noqa: E402
from sklearn.compose import ColumnTransformer  # noqa: E402

import minfer_core  # noqa: E402


def iris():
    """Iris as float32 features and int64 labels; three classes."""
    x, y = datasets.load_iris(return_X_y=True)
    return x.astype(np.float32), y.astype(np.int64)


def binary():
    """Two classes of iris."""
    x, y = iris()
    return x[y < 2], y[y < 2]


def regression():
    """A small dense regression problem, float32 features."""
    x, y = datasets.make_regression(n_samples=200, n_features=6, noise=0.5, random_state=0)
    return x.astype(np.float32), y


def convert(model, x):
    """skl2onnx's ONNX model for ``model`` with tensor outputs (no ZipMap), at an IR version onnxruntime accepts."""
    onx = to_onnx(model, x[:1], options={id(model): {"zipmap": False}} if hasattr(model, "classes_") else None,
                  target_opset={"": 17, "ai.onnx.ml": 3})
    onx.ir_version = ORT_IR_VERSION
    return onx


def check_same(model, x, atol=1e-5):
    """minfer and onnxruntime give the same labels exactly and the same floats within ``atol``."""
    onx = convert(model, x)
    feed = {onx.graph.input[0].name: x}
    expected = ort_run(onx, feed)
    got = minfer_core.InferenceSession(onx.SerializeToString()).run(None, feed)
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        if e.dtype.kind in "iuOSU":
            np.testing.assert_array_equal(g, e)
        else:
            np.testing.assert_allclose(g, e, rtol=1e-5, atol=atol)
    return got


@pytest.mark.parametrize("data", [iris, binary], ids=["multiclass", "binary"])
def test_random_forest_classifier(data):
    """RandomForestClassifier (TreeEnsembleClassifier, averaged leaf probabilities) matches onnxruntime."""
    x, y = data()
    check_same(ensemble.RandomForestClassifier(n_estimators=12, max_depth=6, random_state=0).fit(x, y), x)


@pytest.mark.parametrize("data", [iris, binary], ids=["multiclass", "binary"])
def test_gradient_boosting_classifier(data):
    """GradientBoostingClassifier (SOFTMAX or, binary, LOGISTIC over one score column) matches onnxruntime."""
    x, y = data()
    check_same(ensemble.GradientBoostingClassifier(n_estimators=15, max_depth=3, random_state=0).fit(x, y), x)


def test_tree_regressors():
    """GradientBoostingRegressor and RandomForestRegressor (TreeEnsembleRegressor, SUM and AVERAGE) match onnxruntime."""
    x, y = regression()
    check_same(ensemble.GradientBoostingRegressor(n_estimators=20, random_state=0).fit(x, y), x, atol=1e-3)
    check_same(ensemble.RandomForestRegressor(n_estimators=8, max_depth=5, random_state=0).fit(x, y), x, atol=1e-3)


def test_random_forest_with_missing_values():
    """RandomForestClassifier fit on NaN features (missing values tracked to a side per node) matches onnxruntime."""
    x, y = iris()
    x = x.copy()
    x[::7, 2] = np.nan
    check_same(ensemble.RandomForestClassifier(n_estimators=8, random_state=0).fit(x, y), x)


@pytest.mark.parametrize("data", [iris, binary], ids=["multiclass", "binary"])
def test_logistic_regression(data):
    """LogisticRegression (LinearClassifier, then Normalizer or a binary score column) matches onnxruntime."""
    x, y = data()
    check_same(linear_model.LogisticRegression(max_iter=500).fit(x, y), x)


def test_linear_regression():
    """LinearRegression (LinearRegressor) matches onnxruntime, one target and two."""
    x, y = regression()
    check_same(linear_model.LinearRegression().fit(x, y), x, atol=1e-3)
    check_same(linear_model.LinearRegression().fit(x, np.stack([y, -2 * y], axis=1)), x, atol=1e-3)


def test_scaler_one_hot_pipeline():
    """Pipeline(ColumnTransformer(StandardScaler, OneHotEncoder), LogisticRegression) matches onnxruntime."""
    x, y = iris()
    x = np.concatenate([x, (x[:, :1] * 2).round() % 3], axis=1)  # a categorical column 0..2
    pre = ColumnTransformer([("num", preprocessing.StandardScaler(), [0, 1, 2, 3]),
                             ("cat", preprocessing.OneHotEncoder(), [4])])
    model = pipeline.Pipeline([("pre", pre), ("clf", linear_model.LogisticRegression(max_iter=500))]).fit(x, y)
    check_same(model, x)


@pytest.mark.parametrize("norm", ["l1", "l2", "max"])
def test_normalizer(norm):
    """sklearn's Normalizer (ai.onnx.ml Normalizer) matches onnxruntime for each norm."""
    x, _ = iris()
    check_same(preprocessing.Normalizer(norm=norm).fit(x), x - 3.0)


def test_binarizer_and_scalers():
    """Binarizer, StandardScaler and MinMaxScaler (Binarizer, Scaler) match onnxruntime."""
    x, _ = iris()
    check_same(preprocessing.Binarizer(threshold=3.0).fit(x), x)
    check_same(preprocessing.StandardScaler().fit(x), x)
    check_same(preprocessing.MinMaxScaler().fit(x), x)


def test_svr():
    """SVR with an RBF kernel (SVMRegressor) matches onnxruntime."""
    x, y = regression()
    check_same(svm.SVR(C=10.0).fit(x, y), x, atol=1e-3)


def test_svc_with_probabilities():
    """SVC(probability=True) (SVMClassifier with pairwise coupling) matches onnxruntime."""
    x, y = iris()
    check_same(svm.SVC(probability=True, random_state=0).fit(x, y), x)


@pytest.mark.parametrize("kernel", ["linear", "poly", "sigmoid"])
def test_svr_kernels(kernel):
    """SVR with the linear, polynomial and sigmoid kernels matches onnxruntime."""
    x, y = regression()
    x = x / 4
    check_same(svm.SVR(kernel=kernel, C=5.0, degree=2, coef0=0.5).fit(x, y), x, atol=1e-3)


def test_svc_binary_decision_scores():
    """A binary SVC without probabilities (one decision value, [-s, s] scores) matches onnxruntime."""
    x, y = binary()
    check_same(svm.SVC(kernel="rbf").fit(x, y), x, atol=1e-4)


def test_string_class_labels():
    """Classifiers with string classes return the same string labels as onnxruntime."""
    x, y = iris()
    names = np.array(["setosa", "versicolor", "virginica"])[y]
    check_same(ensemble.RandomForestClassifier(n_estimators=5, random_state=0).fit(x, names), x)
    check_same(linear_model.LogisticRegression(max_iter=500).fit(x, names), x)
