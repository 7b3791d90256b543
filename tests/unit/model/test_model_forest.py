from __future__ import annotations

import copy
import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.model.errors import UnsupportedModelError
from app.model.forest import (
    MAX_DEPTH,
    float_keys,
    forest_from_booster,
    forest_from_json,
    perfect_tree,
    perfect_trees,
)

# root splits f1 < 2.0 (NaN left); its left child is a leaf (-5), its right child splits f0 < 0.0 (NaN right)
TREE = {
    "left_children": [1, -1, 3, -1, -1],
    "right_children": [2, -1, 4, -1, -1],
    "split_indices": [1, 0, 0, 0, 0],
    "split_conditions": [2.0, -5.0, 0.0, 7.0, 9.0],
    "default_left": [1, 0, 0, 0, 0],
}


def test_a_shallow_leaf_is_padded_to_the_tree_depth():
    codes, thresholds, leaves, depth = perfect_tree(TREE)
    assert depth == 2
    # level 0: root; level 1: padded leaf (dummy split), real split on f0 with NaN going right
    assert codes.tolist() == [(1 << 1) | 0, 0, (0 << 1) | 1]
    assert thresholds.tolist() == [2.0, 0.0, 0.0]
    assert leaves.tolist() == [-5.0, -5.0, 7.0, 9.0]


def _chain(depth: int) -> dict:
    n = 2 * depth + 1
    left, right = [-1] * n, [-1] * n
    for d in range(depth):  # node 2d splits into leaf 2d+1 and the next split 2d+2
        left[2 * d], right[2 * d] = 2 * d + 1, 2 * d + 2
    return {"left_children": left, "right_children": right, "split_indices": [0] * n,
            "split_conditions": [float(i) for i in range(n)], "default_left": [0] * n}


def test_trees_deeper_than_the_limit_are_refused():
    assert perfect_tree(_chain(MAX_DEPTH))[3] == MAX_DEPTH
    with pytest.raises(UnsupportedModelError, match="deeper"):
        perfect_tree(_chain(MAX_DEPTH + 1))


def _padded(tree: dict) -> tuple[list[int], list[float], list[float], int]:
    """The perfect layout by its definition, position by position: follow the position's path from the root,
    staying on a leaf once one is reached."""
    left, right = tree["left_children"], tree["right_children"]

    def deepest(node: int, d: int) -> int:
        return d if left[node] == -1 else max(deepest(left[node], d + 1), deepest(right[node], d + 1))

    depth = deepest(0, 0)

    def node_at(d: int, position: int) -> int:
        node = 0
        for bit in range(d - 1, -1, -1):
            if left[node] != -1:
                node = right[node] if (position >> bit) & 1 else left[node]
        return node

    codes, thresholds = [], []
    for d in range(depth):
        for position in range(1 << d):
            node = node_at(d, position)
            leaf = left[node] == -1
            codes.append(0 if leaf else (tree["split_indices"][node] << 1) | (1 - tree["default_left"][node]))
            thresholds.append(0.0 if leaf else float(np.float32(tree["split_conditions"][node])))
    leaves = [float(np.float32(tree["split_conditions"][node_at(depth, p)])) for p in range(1 << depth)]
    return codes, thresholds, leaves, depth


@st.composite
def _trees(draw: st.DrawFn, max_depth: int = 6) -> dict:
    """A random binary tree in XGBoost's JSON layout (nodes numbered as they are created)."""
    left, right, feature, cond, default_left = [-1], [-1], [0], [0.0], [0]
    frontier = [(0, 0)]
    while frontier:
        node, d = frontier.pop(0)
        feature[node] = draw(st.integers(0, 5))
        cond[node] = draw(st.floats(-1e3, 1e3, width=32))
        default_left[node] = draw(st.integers(0, 1))
        if d < max_depth and draw(st.booleans()):
            left[node], right[node] = len(left), len(left) + 1
            for _ in range(2):
                left.append(-1)
                right.append(-1)
                feature.append(0)
                cond.append(0.0)
                default_left.append(0)
            frontier += [(left[node], d + 1), (right[node], d + 1)]
    return {"left_children": left, "right_children": right, "split_indices": feature,
            "split_conditions": cond, "default_left": default_left}


@given(st.lists(_trees(), min_size=0, max_size=8))
def test_trees_of_mixed_depths_are_laid_out_one_after_another(trees):
    codes, thresholds, leaves, layout = perfect_trees(trees)
    assert layout.shape == (len(trees), 3)
    at_code = at_leaf = 0
    for tree, (code_offset, leaf_offset, depth) in zip(trees, layout.tolist(), strict=True):
        want_codes, want_thresholds, want_leaves, want_depth = _padded(tree)
        assert (code_offset, leaf_offset, depth) == (at_code, at_leaf, want_depth)
        assert codes[at_code:at_code + len(want_codes)].tolist() == want_codes
        assert thresholds[at_code:at_code + len(want_codes)].tolist() == want_thresholds
        assert leaves[at_leaf:at_leaf + len(want_leaves)].tolist() == want_leaves
        at_code += len(want_codes)
        at_leaf += len(want_leaves)
    assert (codes.size, leaves.size) == (at_code, at_leaf)
    assert (codes.dtype, thresholds.dtype, leaves.dtype) == (np.int32, np.float32, np.float64)


def test_a_tree_past_the_depth_limit_is_refused_among_others():
    with pytest.raises(UnsupportedModelError, match="deeper"):
        perfect_trees([TREE, _chain(MAX_DEPTH + 1), TREE])


@pytest.fixture(scope="module")
def model_json(small_booster) -> dict:
    return json.loads(bytes(small_booster.save_raw(raw_format="json")))


def test_base_score_string_of_xgboost_3_is_read(model_json, small_booster):
    forest = forest_from_booster(small_booster)
    raw = model_json["learner"]["learner_model_param"]["base_score"]
    assert forest.base_margin == pytest.approx(float(str(raw).strip("[]")))
    assert forest.link == "identity"
    assert forest.trees.shape == (small_booster.num_boosted_rounds(), 3)
    assert forest.codes.dtype == np.int32 and forest.thresholds.dtype == np.float32


def test_multi_output_base_score_is_refused(model_json):
    bad = copy.deepcopy(model_json)
    bad["learner"]["learner_model_param"]["base_score"] = "[1E0,2E0]"
    with pytest.raises(UnsupportedModelError, match="single-output"):
        forest_from_json(bad)


def test_a_split_on_a_feature_the_model_lacks_is_refused(model_json):
    bad = copy.deepcopy(model_json)
    tree = bad["learner"]["gradient_booster"]["model"]["trees"][0]
    tree["split_indices"][0] = 99
    with pytest.raises(UnsupportedModelError, match="feature 99"):
        forest_from_json(bad)


def test_categorical_splits_are_refused(model_json):
    bad = copy.deepcopy(model_json)
    tree = bad["learner"]["gradient_booster"]["model"]["trees"][0]
    tree["split_type"][0] = 1
    with pytest.raises(UnsupportedModelError, match="categorical"):
        forest_from_json(bad)


finite_or_inf = st.floats(width=32, allow_nan=False)


@given(a=finite_or_inf, b=finite_or_inf)
def test_float_keys_keep_the_float32_order(a, b):
    ka, kb = float_keys(np.array([a, b], dtype=np.float32)).tolist()
    assert (ka >= kb) == (np.float32(a) >= np.float32(b))
    assert (ka == kb) == (np.float32(a) == np.float32(b))
    assert -(2**31) < ka < 2**31 - 1  # the two extremes stay free for NaN


def test_float_keys_of_signed_zeros_and_extremes():
    keys = float_keys(np.array([-0.0, 0.0, -np.inf, np.inf], dtype=np.float32))
    assert keys.dtype == np.int32
    assert keys[0] == keys[1] == 0
    assert keys[2] < keys[0] < keys[3]
