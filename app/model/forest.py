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
import json
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
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
    left = np.asarray(tree["left_children"], dtype=np.int64)
    right = np.asarray(tree["right_children"], dtype=np.int64)
    feature = np.asarray(tree["split_indices"], dtype=np.int64)
    cond = np.asarray(tree["split_conditions"], dtype=np.float32)
    missing_right = 1 - np.asarray(tree["default_left"], dtype=np.int64)
    codes: list[np.ndarray] = []
    thresholds: list[np.ndarray] = []
    level = np.zeros(1, dtype=np.int64)  # source node at each position of the current level
    for depth in range(MAX_DEPTH + 1):
        leaf = left[level] == -1
        if leaf.all():
            return (
                np.concatenate(codes).astype(np.int32) if codes else np.zeros(0, np.int32),
                np.concatenate(thresholds).astype(np.float32) if thresholds else np.zeros(0, np.float32),
                cond[level].astype(np.float64),
                depth,
            )
        codes.append(np.where(leaf, 0, (feature[level] << 1) | missing_right[level]))
        thresholds.append(np.where(leaf, np.float32(0), cond[level]))
        nxt = np.empty(2 * level.size, dtype=np.int64)
        nxt[0::2] = np.where(leaf, level, left[level])
        nxt[1::2] = np.where(leaf, level, right[level])
        level = nxt
    raise UnsupportedModelError(f"a tree deeper than {MAX_DEPTH} levels (use max_depth <= {MAX_DEPTH})")


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

    all_codes, all_thresholds, all_leaves, layout = [], [], [], []
    node_offset = leaf_offset = 0
    for tree in booster["model"]["trees"]:
        if any(t != 0 for t in tree.get("split_type", ())):
            raise UnsupportedModelError("categorical splits are not supported")
        if int(tree.get("tree_param", {}).get("size_leaf_vector", "1")) > 1:
            raise UnsupportedModelError("vector leaves (multi-target trees) are not supported")
        codes, thresholds, leaves, depth = perfect_tree(tree)
        layout.append((node_offset, leaf_offset, depth))
        all_codes.append(codes)
        all_thresholds.append(thresholds)
        all_leaves.append(leaves)
        node_offset += codes.size
        leaf_offset += leaves.size
    if not layout:
        all_codes, all_thresholds, all_leaves = [np.zeros(0, np.int32)], [np.zeros(0, np.float32)], [np.zeros(0)]
    flat_codes = np.ascontiguousarray(np.concatenate(all_codes), dtype=np.int32)
    if flat_codes.size and int(flat_codes.max() >> 1) >= n_feature:
        raise UnsupportedModelError(f"a split on feature {int(flat_codes.max() >> 1)} of a {n_feature}-feature model")
    return Forest(
        codes=flat_codes,
        thresholds=np.ascontiguousarray(np.concatenate(all_thresholds), dtype=np.float32),
        leaves=np.ascontiguousarray(np.concatenate(all_leaves), dtype=np.float64),
        trees=np.asarray(layout, dtype=np.int64).reshape(-1, 3),
        base_margin=float(base_margin),
        link=link,
        objective=objective,
        feature_names=tuple(names),
    )


def forest_from_booster(booster: xgboost.Booster, feature_names: tuple[str, ...] | None = None) -> Forest:
    """A :class:`Forest` of a live booster (through its JSON dump)."""
    return forest_from_json(json.loads(bytes(booster.save_raw(raw_format="json"))), feature_names)
