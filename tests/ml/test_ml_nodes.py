"""Single ai.onnx.ml nodes built by hand (attributes skl2onnx does not emit) match onnxruntime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import TensorProto, helper

from modelkit import make_model, ort_run, tensor

import minfer_core

ML = "ai.onnx.ml"
RNG = np.random.default_rng(0)


def check_node(op, inputs, outputs, feeds, ml_opset=3, **attrs):
    """Run one ai.onnx.ml node on minfer and onnxruntime; outputs equal (floats within 1e-5)."""
    node = helper.make_node(op, [i.name for i in inputs], [o.name for o in outputs], domain=ML, **attrs)
    model = make_model([node], inputs, outputs, extra_opsets=[helper.make_opsetid(ML, ml_opset)])
    expected = ort_run(model, feeds)
    got = minfer_core.InferenceSession(model.SerializeToString()).run(None, feeds)
    for g, e in zip(got, expected):
        assert g.dtype == e.dtype and g.shape == e.shape
        np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-6) if e.dtype.kind == "f" else np.testing.assert_array_equal(g, e)


def two_trees(**extra):
    """Two small trees on 3 features using every branch mode, missing values tracked true in some nodes."""
    return dict(
        nodes_treeids=[0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1],
        nodes_nodeids=[0, 1, 2, 3, 4, 0, 1, 2, 3, 4, 5, 6],
        nodes_featureids=[0, 1, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0],
        nodes_modes=["BRANCH_LEQ", "BRANCH_GT", "LEAF", "LEAF", "LEAF",
                     "BRANCH_GTE", "BRANCH_LT", "BRANCH_EQ", "LEAF", "LEAF", "LEAF", "LEAF"],
        nodes_values=[0.1, -0.3, 0, 0, 0, 0.0, 0.5, 1.0, 0, 0, 0, 0],
        nodes_truenodeids=[1, 2, 0, 0, 0, 1, 3, 5, 0, 0, 0, 0],
        nodes_falsenodeids=[4, 3, 0, 0, 0, 2, 4, 6, 0, 0, 0, 0],
        nodes_missing_value_tracks_true=[1, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0],
        **extra)


def tree_input():
    """Features with NaNs and an exact 1.0 (for BRANCH_EQ)."""
    x = RNG.normal(size=(64, 3)).astype(np.float32)
    x[::5, 0] = np.nan
    x[::3, 1] = np.nan
    x[::4, 0] = 1.0
    return x


@pytest.mark.parametrize("how", ["SUM", "AVERAGE", "MIN", "MAX"])
def test_tree_regressor_modes_missing_and_aggregates(how):
    """TreeEnsembleRegressor: every branch mode, NaN tracked true or false, each aggregate, base values."""
    leaves = dict(target_treeids=[0, 0, 0, 1, 1, 1, 1, 1], target_nodeids=[2, 3, 4, 3, 4, 5, 6, 6],
                  target_ids=[0, 1, 0, 0, 1, 1, 0, 1], target_weights=[1.5, -2.0, 0.25, 3.0, -1.0, 0.5, 2.0, 4.0])
    check_node("TreeEnsembleRegressor", [tensor("x", [None, 3])], [tensor("y", [None, 2])], {"x": tree_input()},
               n_targets=2, aggregate_function=how, base_values=[0.5, -0.5], **two_trees(**leaves))


@pytest.mark.parametrize("transform", ["NONE", "SOFTMAX", "LOGISTIC", "SOFTMAX_ZERO"])
def test_tree_classifier_post_transforms(transform):
    """TreeEnsembleClassifier with three classes under each post_transform matches onnxruntime (ties included)."""
    # zero weights make rows whose only scores are 0 (label: first scored class); under SOFTMAX_ZERO such a row is
    # 0/0, NaN in onnxruntime and 0.5 in onnx's reference (minfer follows the reference), so that case avoids them
    zero = 0.3 if transform == "SOFTMAX_ZERO" else 0.0
    leaves = dict(class_treeids=[0, 0, 0, 1, 1, 1, 1], class_nodeids=[2, 3, 4, 3, 4, 5, 6],
                  class_ids=[0, 1, 2, 0, 1, 2, 2], class_weights=[0.5, 1.0, zero, 2.0, 0.0, 1.5, 0.25])
    check_node("TreeEnsembleClassifier", [tensor("x", [None, 3])],
               [tensor("label", [None], TensorProto.INT64), tensor("scores", [None, 3])], {"x": tree_input()},
               classlabels_int64s=[4, 5, 6], post_transform=transform, **two_trees(**leaves))


def test_imputer_one_hot_and_feature_vectorizer():
    """Imputer (NaN -> per-column values), OneHotEncoder (unknown -> zeros) and FeatureVectorizer match onnxruntime."""
    x = RNG.normal(size=(10, 3)).astype(np.float32)
    x[::3, 1] = np.nan
    check_node("Imputer", [tensor("x", [None, 3])], [tensor("y", [None, 3])], {"x": x},
               imputed_value_floats=[1.0, 2.0, 3.0], replaced_value_float=float("nan"))
    cats = np.array([[1, 4], [3, 9], [4, 1]], np.int64)
    check_node("OneHotEncoder", [tensor("x", [None, 2], TensorProto.INT64)], [tensor("y", [None, 2, 3])],
               {"x": cats}, cats_int64s=[1, 3, 4], zeros=1)
    a, b = RNG.normal(size=(4, 2)).astype(np.float32), RNG.normal(size=(4, 5)).astype(np.float32)
    check_node("FeatureVectorizer", [tensor("a", [None, 2]), tensor("b", [None, 5])], [tensor("y", [None, 6])],
               {"a": a, "b": b}, inputdimensions=[3, 3])


def test_category_mapper_and_label_encoder_numbers():
    """CategoryMapper (strings -> ints) and LabelEncoder-2 (int64 -> float, with default) match onnxruntime."""
    words = np.array(["a", "b", "zz", "c"], dtype=object)
    check_node("CategoryMapper", [tensor("x", [None], TensorProto.STRING)], [tensor("y", [None], TensorProto.INT64)],
               {"x": words}, cats_strings=["a", "b", "c"], cats_int64s=[7, 8, 9], default_int64=-5)
    check_node("LabelEncoder", [tensor("x", [None], TensorProto.INT64)], [tensor("y", [None])],
               {"x": np.array([3, 1, 2, 9], np.int64)}, keys_int64s=[1, 2, 3], values_floats=[0.5, 1.5, 2.5],
               default_float=-1.0)


def test_scaler_on_integers_and_linear_regressor_targets():
    """Scaler casts int64 input to float32; LinearRegressor with two targets and intercepts matches onnxruntime."""
    check_node("Scaler", [tensor("x", [None, 2], TensorProto.INT64)], [tensor("y", [None, 2])],
               {"x": np.array([[1, 2], [3, -4]], np.int64)}, offset=[0.5, 1.0], scale=[2.0, 0.25])
    x = RNG.normal(size=(5, 3)).astype(np.float32)
    check_node("LinearRegressor", [tensor("x", [None, 3])], [tensor("y", [None, 2])], {"x": x},
               coefficients=[1.0, 2.0, 3.0, -1.0, 0.5, 0.0], intercepts=[0.1, 0.2], targets=2)


def test_label_encoder_1_both_directions():
    """LabelEncoder-1 maps strings to their index in classes_strings and int64 back to strings, with defaults."""
    classes = ["cat", "dog", "eel"]
    check_node("LabelEncoder", [tensor("x", [None], TensorProto.STRING)], [tensor("y", [None], TensorProto.INT64)],
               {"x": np.array(["eel", "cat", "fox"], dtype=object)}, ml_opset=1, classes_strings=classes,
               default_int64=-7)
    check_node("LabelEncoder", [tensor("x", [None], TensorProto.INT64)], [tensor("y", [None], TensorProto.STRING)],
               {"x": np.array([2, 0, 5], np.int64)}, ml_opset=1, classes_strings=classes, default_string="none")
