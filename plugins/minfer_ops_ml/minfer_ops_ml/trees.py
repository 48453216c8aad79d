"""ai.onnx.ml tree ensembles: TreeEnsembleClassifier/Regressor (1, 3) and TreeEnsemble (5)."""

from __future__ import annotations

import numpy as np

from minfer_core import KernelError, kernel

from .forest import LEAF, MEMBER, Forest, depth_of, from_node_lists
from .linear import class_labels
from .transforms import BY_CODE, binary_scores, post_transform as transform

ML = "ai.onnx.ml"
AGGREGATES = ("AVERAGE", "SUM", "MIN", "MAX")  # TreeEnsemble-5's codes 0..3


def leaf_table(n_rows: int, n_targets: int, rows, targets, weights) -> tuple[np.ndarray, np.ndarray]:
    """Per row, its summed weight for each target and whether it has one: (n_rows, n_targets) twice."""
    table = np.zeros((n_rows, n_targets), np.float64)
    has = np.zeros((n_rows, n_targets), bool)
    np.add.at(table, (rows, targets), np.asarray(weights, np.float64))
    has[rows, targets] = True
    return table, has


def aggregate(leaves: np.ndarray, table: np.ndarray, has: np.ndarray, how: str) -> tuple[np.ndarray, np.ndarray]:
    """Scores (N, n_targets) from each sample's leaves (N, n_trees): sum, average, min or max over trees.

    Also whether any reached leaf weighs each target: onnxruntime reports 0 for a
    target no leaf scored (base value not added) and picks labels among scored classes.
    """
    seen = np.zeros((leaves.shape[0], table.shape[1]), bool)
    for t in range(leaves.shape[1]):  # per tree, not per sample: keeps memory at N x targets
        seen |= has[leaves[:, t]]
    if how in ("SUM", "AVERAGE"):
        total = np.zeros(seen.shape, np.float64)
        for t in range(leaves.shape[1]):
            total += table[leaves[:, t]]
        return (total / leaves.shape[1] if how == "AVERAGE" and leaves.shape[1] else total), seen
    if how not in ("MIN", "MAX"):
        raise KernelError(f"aggregate_function {how!r} is not one of {list(AGGREGATES)}")
    pick = np.minimum if how == "MIN" else np.maximum
    best = np.full(seen.shape, np.inf if how == "MIN" else -np.inf)
    for t in range(leaves.shape[1]):
        best = np.where(has[leaves[:, t]], pick(best, table[leaves[:, t]]), best)
    return np.where(seen, best, 0.0), seen


def first_given(*values):
    """The first argument that is not None (attribute lists vs their *_as_tensor forms)."""
    return next((v for v in values if v is not None), None)


def old_forest(nodes: dict, ids: str, attrs_: dict, n_targets: int):
    """Forest and leaf table of the classifier/regressor-1..3 attributes (``ids`` is "class" or "target")."""
    forest, row_of = from_node_lists(
        nodes["nodes_treeids"], nodes["nodes_nodeids"], nodes["nodes_featureids"], nodes["nodes_modes"],
        first_given(nodes["nodes_values_as_tensor"], nodes["nodes_values"]), nodes["nodes_truenodeids"],
        nodes["nodes_falsenodeids"], nodes["nodes_missing_value_tracks_true"])
    keys = zip(attrs_[f"{ids}_treeids"], attrs_[f"{ids}_nodeids"])
    rows = np.array([row_of[k] for k in keys], np.int64)
    weights = first_given(attrs_.get(f"{ids}_weights_as_tensor"), attrs_[f"{ids}_weights"])
    table, has = leaf_table(forest.feature.size, n_targets, rows, np.asarray(attrs_[f"{ids}_ids"], np.int64), weights)
    return forest, table, has


NODE_ATTRS = ("nodes_treeids", "nodes_nodeids", "nodes_featureids", "nodes_modes", "nodes_values",
              "nodes_values_as_tensor", "nodes_truenodeids", "nodes_falsenodeids", "nodes_missing_value_tracks_true")


@kernel("TreeEnsembleRegressor", domain=ML, prepare=True)
def tree_ensemble_regressor(ctx, *, aggregate_function="SUM", base_values=None, base_values_as_tensor=None,
                            n_targets=None, nodes_falsenodeids=None, nodes_featureids=None, nodes_hitrates=None,
                            nodes_hitrates_as_tensor=None, nodes_missing_value_tracks_true=None, nodes_modes=None,
                            nodes_nodeids=None, nodes_treeids=None, nodes_truenodeids=None, nodes_values=None,
                            nodes_values_as_tensor=None, post_transform="NONE", target_ids=None, target_nodeids=None,
                            target_treeids=None, target_weights=None, target_weights_as_tensor=None):
    """TreeEnsembleRegressor-1/3: aggregated leaf weights per target, plus base values, as float32."""
    given = locals()
    n = n_targets or (max(target_ids) + 1 if target_ids else 1)
    forest, table, has = old_forest({k: given[k] for k in NODE_ATTRS}, "target", given, n)
    base = first_given(base_values_as_tensor, base_values)
    fn = transform(post_transform)

    def run(x):
        s, seen = aggregate(forest.leaves(x), table, has, aggregate_function)
        s = np.where(seen, s + np.asarray(base, np.float64), 0.0) if base is not None else s
        return fn(s).astype(np.float32)

    return run


@kernel("TreeEnsembleClassifier", domain=ML, prepare=True)
def tree_ensemble_classifier(ctx, *, base_values=None, base_values_as_tensor=None, class_ids=None,
                             class_nodeids=None, class_treeids=None, class_weights=None, class_weights_as_tensor=None,
                             classlabels_int64s=None, classlabels_strings=None, nodes_falsenodeids=None,
                             nodes_featureids=None, nodes_hitrates=None, nodes_hitrates_as_tensor=None,
                             nodes_missing_value_tracks_true=None, nodes_modes=None, nodes_nodeids=None,
                             nodes_treeids=None, nodes_truenodeids=None, nodes_values=None,
                             nodes_values_as_tensor=None, post_transform="NONE"):
    """TreeEnsembleClassifier-1/3: (label, scores); leaves voting for one class only make a binary model."""
    given = locals()
    labels = class_labels(classlabels_int64s, classlabels_strings)
    forest, table, has = old_forest({k: given[k] for k in NODE_ATTRS}, "class", given, len(labels))
    base = first_given(base_values_as_tensor, base_values)
    binary = len(set(class_ids or [])) == 1 and len(labels) == 2
    fn = transform(post_transform)

    def run(x):
        s, seen = aggregate(forest.leaves(x), table, has, "SUM")
        if base is not None:
            s = s + np.asarray(base, np.float64)[: s.shape[1]]
        column = class_ids[0] if class_ids else 0
        z = binary_scores(s[:, column:column + 1], post_transform) if binary else fn(s)
        if not binary:  # the label is the best class among those some leaf scored
            return labels[np.argmax(np.where(seen | ~seen.any(1, keepdims=True), z, -np.inf), axis=1)], z.astype(np.float32)
        return labels[np.argmax(z, axis=1)], z.astype(np.float32)

    return run


@kernel("TreeEnsemble", domain=ML, since=5, prepare=True)
def tree_ensemble(ctx, *, aggregate_function=1, leaf_targetids, leaf_weights, membership_values=None, n_targets=None,
                  nodes_falseleafs, nodes_falsenodeids, nodes_featureids, nodes_hitrates=None, nodes_modes,
                  nodes_missing_value_tracks_true=None, nodes_splits, nodes_trueleafs, nodes_truenodeids,
                  post_transform=0, tree_roots):
    """TreeEnsemble-5: leaves are rows after the nodes; scores aggregated per target, in x's dtype."""
    forest = new_forest(nodes_modes, nodes_featureids, nodes_splits, nodes_truenodeids, nodes_trueleafs,
                        nodes_falsenodeids, nodes_falseleafs, nodes_missing_value_tracks_true, tree_roots,
                        membership_values, len(np.asarray(leaf_weights).reshape(-1)))
    n_nodes = np.asarray(nodes_modes).size
    weights = np.asarray(leaf_weights, np.float64).reshape(-1)
    targets = np.asarray(leaf_targetids, np.int64)
    table, has = leaf_table(forest.feature.size, n_targets or int(targets.max()) + 1,
                            n_nodes + np.arange(weights.size), targets, weights)
    how = AGGREGATES[aggregate_function] if 0 <= aggregate_function < 4 else str(aggregate_function)
    fn = transform(BY_CODE[post_transform] if 0 <= post_transform < 5 else str(post_transform))

    def run(x):
        return fn(aggregate(forest.leaves(x), table, has, how)[0]).astype(x.dtype)

    return run


def new_forest(modes, features, splits, true_ids, true_leaf, false_ids, false_leaf, missing_true, roots, members,
               n_leaves: int) -> Forest:
    """A Forest from TreeEnsemble-5's index-based node lists (leaf i becomes row n_nodes + i)."""
    mode = np.asarray(modes, np.int64).reshape(-1).astype(np.int8)
    n = mode.size
    if ((mode < 0) | (mode > MEMBER)).any():
        raise KernelError(f"TreeEnsemble nodes_modes must be 0..{MEMBER}, got {sorted(set(mode.tolist()))}")
    true_next = np.asarray(true_ids, np.int64) + n * np.asarray(true_leaf, np.int64)
    false_next = np.asarray(false_ids, np.int64) + n * np.asarray(false_leaf, np.int64)
    leaf_rows = np.arange(n, n + n_leaves)
    member_rows = np.flatnonzero(mode == MEMBER)
    groups = np.split(np.asarray(members if members is not None else [], np.float64),
                      np.flatnonzero(np.isnan(np.asarray(members if members is not None else [], np.float64))))
    sets = [g[~np.isnan(g)] for g in groups][: member_rows.size]
    track = np.zeros(n, bool) if missing_true is None else np.asarray(missing_true, bool)
    true_all, false_all = np.concatenate([true_next, leaf_rows]), np.concatenate([false_next, leaf_rows])
    root_rows = np.asarray(roots, np.int64)
    return Forest(np.concatenate([np.asarray(features, np.int64), np.zeros(n_leaves, np.int64)]),
                  np.concatenate([np.asarray(splits, np.float64).reshape(-1), np.zeros(n_leaves)]),
                  np.concatenate([mode, np.full(n_leaves, LEAF, np.int8)]), true_all, false_all,
                  np.concatenate([track, np.zeros(n_leaves, bool)]), root_rows,
                  dict(zip(member_rows.tolist(), sets)), depth_of(true_all, false_all, root_rows))
