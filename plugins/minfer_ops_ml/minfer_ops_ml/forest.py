"""Tree ensembles as flat arrays, evaluated for all samples and trees at once, one tree level per step.

Every node and leaf of every tree is a row of the arrays; a leaf points to
itself, so walking ``depth`` steps from the roots lands every (sample, tree)
pair on its leaf. Scores are then a gather of the leaves' weight rows.
"""

from __future__ import annotations

import attrs
import numpy as np

from minfer_core import KernelError

LEQ, LT, GTE, GT, EQ, NEQ, MEMBER, LEAF = range(8)
MODE_NAMES = {"BRANCH_LEQ": LEQ, "BRANCH_LT": LT, "BRANCH_GTE": GTE, "BRANCH_GT": GT, "BRANCH_EQ": EQ,
              "BRANCH_NEQ": NEQ, "LEAF": LEAF}


@attrs.frozen(eq=False)
class Forest:
    """Flat trees: per row a feature, threshold, mode, next rows and missing-value direction; plus the roots."""

    feature: np.ndarray  # int64
    threshold: np.ndarray  # float64
    mode: np.ndarray  # int8
    true_next: np.ndarray  # int64 rows; leaves point to themselves
    false_next: np.ndarray
    missing_true: np.ndarray  # bool
    roots: np.ndarray  # int64, one per tree
    members: dict  # row -> sorted array of member values (MEMBER rows)
    depth: int

    def leaves(self, x: np.ndarray) -> np.ndarray:
        """The leaf row reached by each sample in each tree: (N, n_trees)."""
        x = x.reshape(x.shape[0], -1) if x.ndim > 1 else x.reshape(1, -1)
        if self.feature.size and self.feature.max() >= x.shape[1]:
            raise KernelError(f"tree ensemble reads feature {self.feature.max()} of an input with {x.shape[1]}")
        rows = np.arange(x.shape[0])[:, None]
        at = np.broadcast_to(self.roots, (x.shape[0], self.roots.size)).copy()
        for _ in range(self.depth):
            at = self.step(x, rows, at)
        return at

    def step(self, x: np.ndarray, rows: np.ndarray, at: np.ndarray) -> np.ndarray:
        """One level down for every (sample, tree)."""
        v = x[rows, self.feature[at]]
        t = self.threshold[at]
        mode = self.mode[at]
        go = np.select([mode == LEQ, mode == LT, mode == GTE, mode == GT, mode == EQ, mode == NEQ],
                       [v <= t, v < t, v >= t, v > t, v == t, v != t], False)
        for row, values in self.members.items():
            here = at == row
            go[here] = np.isin(v[here], values)
        go |= np.isnan(v) & self.missing_true[at]
        return np.where(go, self.true_next[at], self.false_next[at])


def depth_of(true_next: np.ndarray, false_next: np.ndarray, roots: np.ndarray) -> int:
    """Steps needed for every root to reach a leaf (a cycle is a KernelError)."""
    level, depth = np.unique(roots), 0
    while level.size:
        nxt = np.unique(np.concatenate([true_next[level], false_next[level]]))
        nxt = nxt[(true_next[nxt] != nxt) | (false_next[nxt] != nxt)]  # drop leaves
        depth += 1
        if depth > true_next.size:
            raise KernelError("tree ensemble has a cycle: a node is its own descendant")
        level = nxt
    return depth


def from_node_lists(nodes_treeids, nodes_nodeids, nodes_featureids, nodes_modes, nodes_values,
                    nodes_truenodeids, nodes_falsenodeids, missing_true) -> tuple[Forest, dict]:
    """A Forest from the (tree id, node id) attribute lists of TreeEnsembleClassifier/Regressor-1..3.

    Also returns the map (tree id, node id) -> row, for placing the leaves' weights.
    """
    tree, node = np.asarray(nodes_treeids, np.int64), np.asarray(nodes_nodeids, np.int64)
    row_of = {key: i for i, key in enumerate(zip(tree.tolist(), node.tolist()))}
    unknown = [m for m in set(nodes_modes) if m not in MODE_NAMES]
    if unknown:
        raise KernelError(f"tree ensemble node modes {unknown} are not among {sorted(MODE_NAMES)}")
    mode = np.array([MODE_NAMES[m] for m in nodes_modes], np.int8)
    leaf = mode == LEAF
    here = np.arange(len(tree))

    def rows(ids):
        ids = np.asarray(ids, np.int64)
        return np.array([here[i] if leaf[i] else row_of.get((t, n), -1) for i, (t, n) in
                         enumerate(zip(tree.tolist(), ids.tolist()))], np.int64)

    true_next, false_next = rows(nodes_truenodeids), rows(nodes_falsenodeids)
    if (true_next < 0).any() or (false_next < 0).any():
        raise KernelError("tree ensemble points to a node id that its tree does not define")
    referenced = set(true_next[~leaf].tolist()) | set(false_next[~leaf].tolist())
    first = {}
    for i, t in enumerate(tree.tolist()):
        if i not in referenced:
            first.setdefault(t, i)
    roots = np.array([first[t] for t in sorted(first)], np.int64)
    track = np.zeros(len(tree), bool) if not missing_true else np.asarray(missing_true, bool)
    forest = Forest(np.where(leaf, 0, np.asarray(nodes_featureids, np.int64)), np.asarray(nodes_values, np.float64),
                    mode, true_next, false_next, track, roots, {}, depth_of(true_next, false_next, roots))
    return forest, row_of
