"""An XGBoost tree ensemble as flat arrays of perfect binary trees, ready for a branch-light traversal.

The booster's own JSON (``save_raw("json")``) lists, per tree, ``left_children``, ``right_children``,
``split_indices``, ``split_conditions`` (the leaf value on a leaf) and ``default_left``. Each tree is
re-laid out as a *perfect* tree of its own depth ``D`` in breadth-first order: node ``p`` has children
``2p + 1`` (taken when ``x < threshold``) and ``2p + 2``; a leaf shallower than ``D`` is padded with
dummy splits whose every descendant leaf carries the same value. Walking a tree is then exactly ``D``
steps of ``p = 2p + 1 + go_right`` — no child arrays, no leaf test.

Per internal node ``codes`` holds ``(feature << 1) | missing_right``: a NaN goes right when the bit is
set, left (XGBoost's ``default_left``) when not. ``base_score`` (a string such as ``"[1.2E2]"`` since
XGBoost 3, in output space) becomes ``base_margin`` through the objective's link.

:func:`float_keys` maps float32 values to int32 keys of the same order (``a >= b`` exactly when
``key(a) >= key(b)``; ``-0.0`` and ``0.0`` share a key), so a kernel may compare integers in place of
XGBoost's float32 comparisons.

>>> tree = {"left_children": [1, -1, -1], "right_children": [2, -1, -1], "split_indices": [0, 0, 0],
...         "split_conditions": [0.5, -1.0, 1.0], "default_left": [1, 0, 0]}
>>> codes, thresholds, leaves, depth = perfect_tree(tree)
>>> codes.tolist(), thresholds.tolist(), leaves.tolist(), depth
([0], [0.5], [-1.0, 1.0], 1)
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import orjson
import xgboost

from app.model.errors import UnsupportedModelError

MAX_DEPTH = 14  # a perfect tree of depth 14 is 32k nodes; deeper trees are refused, not silently slow
IDENTITY_OBJECTIVES = frozenset({
    "reg:squarederror", "reg:absoluteerror", "reg:pseudohubererror", "reg:quantileerror",
    "reg:squaredlogerror", "reg:linear",
})
LOG_OBJECTIVES = frozenset({"reg:gamma", "count:poisson", "reg:tweedie"})


@dataclasses.dataclass(frozen=True, eq=False)
class Forest:
    """Flat arrays of every tree of one single-output booster (see the module docstring)."""

    codes: np.ndarray  # int32, internal nodes of all trees: (feature << 1) | missing_right
    thresholds: np.ndarray  # float32, same index as codes
    leaves: np.ndarray  # float64, 2**depth leaves per tree
    trees: np.ndarray  # int64 (n_trees, 3): offset in codes, offset in leaves, depth
    base_margin: float
    link: str  # "identity" or "log"
    objective: str
    feature_names: tuple[str, ...]

    @property
    def num_feature(self) -> int:
        return len(self.feature_names)


def perfect_tree(tree: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """``(codes, thresholds, leaves, depth)`` of one tree of XGBoost's JSON, padded to a perfect tree."""
    codes, thresholds, leaves, layout = perfect_trees([tree])
    return codes, thresholds, leaves, int(layout[0, 2])


def perfect_trees(trees: Sequence[Mapping[str, Any]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Every tree of XGBoost's JSON padded to a perfect tree, laid out one after another:
    ``(codes, thresholds, leaves, layout)``, ``layout`` (n_trees, 3) int64: offset in codes, offset in
    leaves, depth.

    Array operations over all trees at once: the nodes of every tree in one set of arrays, each tree's
    depth found level by level, then the trees of each depth padded together, one level at a time.
    """
    n_trees = len(trees)
    sizes = np.fromiter((len(t["left_children"]) for t in trees), dtype=np.int64, count=n_trees)
    total = int(sizes.sum())

    def column(field: str, dtype: type) -> np.ndarray:
        return np.fromiter(itertools.chain.from_iterable(t[field] for t in trees), dtype=dtype, count=total)

    root = np.cumsum(sizes) - sizes  # each tree's root among every tree's nodes
    shift = np.repeat(root, sizes)
    left, right = column("left_children", np.int64), column("right_children", np.int64)
    left = np.where(left >= 0, left + shift, -1)
    right = np.where(right >= 0, right + shift, -1)
    code = (column("split_indices", np.int64) << 1) | (1 - column("default_left", np.int64))  # NaN goes right
    cond = column("split_conditions", np.float32)
    depth = np.zeros(n_trees, dtype=np.int64)
    level, owner = root, np.arange(n_trees)
    for d in range(MAX_DEPTH + 1):  # depth: 1 + the deepest level holding a split
        inner = left[level] >= 0
        if not inner.any():
            break
        if d == MAX_DEPTH:
            raise UnsupportedModelError(f"a tree deeper than {MAX_DEPTH} levels (use max_depth <= {MAX_DEPTH})")
        depth[owner[inner]] = d + 1
        level, owner = level[inner], owner[inner]
        level, owner = np.concatenate((left[level], right[level])), np.concatenate((owner, owner))
    n_codes, n_leaves = (1 << depth) - 1, 1 << depth
    layout = np.column_stack((np.cumsum(n_codes) - n_codes, np.cumsum(n_leaves) - n_leaves, depth))
    codes = np.empty(int(n_codes.sum()), dtype=np.int32)
    thresholds = np.empty(codes.size, dtype=np.float32)
    leaves = np.empty(int(n_leaves.sum()), dtype=np.float64)
    for tree_depth in np.unique(depth).tolist():
        group = np.flatnonzero(depth == tree_depth)
        at = root[group][:, None]  # source node at each position of the current level, a row per tree
        level_codes, level_thresholds = [], []
        for _ in range(tree_depth):
            leaf = left[at] < 0  # a leaf above the tree's depth: a dummy split, both children the leaf itself
            level_codes.append(np.where(leaf, 0, code[at]))
            level_thresholds.append(np.where(leaf, np.float32(0), cond[at]))
            nxt = np.empty((group.size, 2 * at.shape[1]), dtype=np.int64)
            nxt[:, 0::2] = np.where(leaf, at, left[at])
            nxt[:, 1::2] = np.where(leaf, at, right[at])
            at = nxt
        if tree_depth:
            place = layout[group, 0][:, None] + np.arange((1 << tree_depth) - 1)
            codes[place] = np.concatenate(level_codes, axis=1)
            thresholds[place] = np.concatenate(level_thresholds, axis=1)
        leaves[layout[group, 1][:, None] + np.arange(1 << tree_depth)] = cond[at]
    return codes, thresholds, leaves, layout


def float_keys(values: np.ndarray) -> np.ndarray:
    """Order-preserving int32 keys of float32 ``values`` (not NaN): the IEEE bits, negatives mirrored.

    Every key lies strictly between ``INT32_MIN`` and ``INT32_MAX``, which stay free to stand for NaN.

    >>> float_keys(np.array([-np.inf, -1.5, -0.0, 0.0, 1e-45, 1.5, np.inf], dtype=np.float32)).tolist()
    [-2139095041, -1069547521, 0, 0, 1, 1069547520, 2139095040]
    """
    v = np.asarray(values, dtype=np.float32)
    bits = np.where(v == 0, np.float32(0), v).view(np.int32)
    return np.where(bits >= 0, bits, bits ^ np.int32(0x7FFFFFFF)).astype(np.int32)


def _scalar_base_score(raw: Any) -> float:
    text = str(raw).strip().strip("[]")
    parts = [p for p in text.replace(",", " ").split() if p]
    if len(parts) != 1:
        raise UnsupportedModelError(f"base_score {raw!r}: only single-output models are supported")
    return float(parts[0])


def forest_from_json(model: Mapping[str, Any], feature_names: tuple[str, ...] | None = None) -> Forest:
    """A :class:`Forest` from the parsed JSON of ``Booster.save_raw("json")``."""
    learner = model["learner"]
    params = learner["learner_model_param"]
    objective = str(learner["objective"]["name"])
    if objective in IDENTITY_OBJECTIVES:
        link = "identity"
    elif objective in LOG_OBJECTIVES:
        link = "log"
    else:
        raise UnsupportedModelError(f"objective {objective!r} is not a regression the fast predictor knows")
    if int(params.get("num_class", "0")) > 1 or int(params.get("num_target", "1")) != 1:
        raise UnsupportedModelError("only single-output models are supported")
    booster = learner["gradient_booster"]
    if booster.get("name") != "gbtree":
        raise UnsupportedModelError(f"booster {booster.get('name')!r}: only 'gbtree' is supported")
    base_score = _scalar_base_score(params["base_score"])
    base_margin = math.log(base_score) if link == "log" else base_score
    n_feature = int(params["num_feature"])
    names = feature_names or tuple(learner.get("feature_names") or ()) or tuple(f"f{i}" for i in range(n_feature))
    if len(names) != n_feature:
        raise UnsupportedModelError(f"{len(names)} feature names for a model of {n_feature} features")

    trees = booster["model"]["trees"]
    for tree in trees:
        if any(t != 0 for t in tree.get("split_type", ())):
            raise UnsupportedModelError("categorical splits are not supported")
        if int(tree.get("tree_param", {}).get("size_leaf_vector", "1")) > 1:
            raise UnsupportedModelError("vector leaves (multi-target trees) are not supported")
    flat_codes, thresholds, leaves, layout = perfect_trees(trees)
    if flat_codes.size and int(flat_codes.max() >> 1) >= n_feature:
        raise UnsupportedModelError(f"a split on feature {int(flat_codes.max() >> 1)} of a {n_feature}-feature model")
    return Forest(
        codes=flat_codes,
        thresholds=thresholds,
        leaves=leaves,
        trees=layout,
        base_margin=float(base_margin),
        link=link,
        objective=objective,
        feature_names=tuple(names),
    )


def forest_from_booster(booster: xgboost.Booster, feature_names: tuple[str, ...] | None = None) -> Forest:
    """A :class:`Forest` of a live booster (through its JSON dump)."""
    return forest_from_json(orjson.loads(bytes(booster.save_raw(raw_format="json"))), feature_names)
