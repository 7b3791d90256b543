"""Snapshot builder: ordering, model versions, feature rows, immutability, atomic swap."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
from scheduler_fixtures import LinearPredictor, features_msg, make_linear, make_view, weights_msg

from app.scheduler.builder import SnapshotBuilder
from app.scheduler.entries import NodeState
from app.scheduler.snapshot import SnapshotHolder


@pytest.fixture
def linear() -> LinearPredictor:
    return make_linear()


@pytest.fixture
def view(linear: LinearPredictor) -> SnapshotBuilder:
    return make_view(linear)


def test_messages_only_move_forward_in_ts() -> None:
    b = SnapshotBuilder()
    assert b.apply_node_features(features_msg("n1", 10.0, 1.0))
    assert not b.apply_node_features(features_msg("n1", 9.0, 5.0))
    assert b.apply_node_weights(weights_msg("n1", 10.0, 0.8))
    assert not b.apply_node_weights(weights_msg("n1", 9.0, 0.1))
    n = b.build(now=11.0).nodes["n1"]
    assert (n.features["load__mean"], n.weight, n.features_ts) == (1.0, 0.8, 10.0)


def test_hardware_descriptors_join_features_and_stale_metrics_drop() -> None:
    b = SnapshotBuilder()
    msg = features_msg("n1", 10.0, 1.0, gpu_model="NVIDIA GeForce RTX 4090", cpu_iowait__mean=0.5)
    msg["stale"] = ["cpu_iowait"]
    b.apply_node_features(msg)
    f = b.build(now=10.0).nodes["n1"].features
    assert f["hw_gpu_mem_bw_gbs"] == 1008.0 and "cpu_iowait__mean" not in f and "hw_cpu_cores" not in f


def test_a_stale_group_drops_its_metrics_features() -> None:
    """node-features carry node-metrics' stale *groups* (what the bridge withholds): their metrics' features
    leave the model row, the other groups' stay."""
    b = SnapshotBuilder()
    msg = features_msg("n1", 10.0, 1.0, gpu_model="NVIDIA GeForce RTX 4090", nvidia_smi_utilization_gpu__mean=0.0,
                       gpu_memory_copy_util__last=0.0, cpu_iowait__mean=0.5)
    msg["stale"] = ["gpu"]
    b.apply_node_features(msg)
    f = b.build(now=10.0).nodes["n1"].features
    assert "nvidia_smi_utilization_gpu__mean" not in f and "gpu_memory_copy_util__last" not in f
    assert f["cpu_iowait__mean"] == 0.5 and f["hw_gpu_mem_bw_gbs"] == 1008.0  # hardware is no reading


def test_node_features_replace_only_what_they_carry() -> None:
    """Every field of a node's state that node-features do not carry survives a new node-features message
    (the state is rebuilt field by field: a field added to NodeState and forgotten there fails here)."""
    b = SnapshotBuilder()
    b.apply_node_features(features_msg("n1", 10.0, 1.0))
    w = weights_msg("n1", 11.0, 0.8)
    w.update(stale=True, predicted_rtt_ms={"gCTF": 120.0}, correction={"gCTF": 1.3}, samples={"gCTF": 7})
    b.apply_node_weights(w)
    b.apply_running("n1", {"gCTF": 2}, ts=12.0)
    before = b.build(now=12.0).nodes["n1"]
    msg = features_msg("n1", 13.0, 2.0, gpu_model="Tesla M40")
    msg["app_features"] = {"gCTF": {"load__mean": 3.0}}
    assert b.apply_node_features(msg)
    after = b.build(now=13.0).nodes["n1"]
    carried = {"node_class", "gpu_model", "features", "features_ts", "stale_metrics", "version", "app_features"}
    for field in dataclasses.fields(NodeState):
        if field.name not in carried:
            assert getattr(after, field.name) == getattr(before, field.name), field.name
    assert (after.features["load__mean"], after.features_ts, after.version) == (2.0, 13.0, before.version + 1)
    assert (after.gpu_model, dict(after.app_features["gCTF"])) == ("Tesla M40", {"load__mean": 3.0})
    assert before.weight == 0.8 and before.weights_stale and dict(before.running) == {"gCTF": 2}


def test_weights_before_features_keep_node_class() -> None:
    b = SnapshotBuilder()
    b.apply_node_weights({**weights_msg("n1", 5.0, 0.7), "node_class": "cpu", "gpu_model": None})
    b.apply_node_features(features_msg("n1", 6.0, 1.0, node_class="cpu"))
    n = b.build(now=6.0).nodes["n1"]
    assert (n.node_class, n.weight) == ("cpu", 0.7)


def test_models_only_move_forward_in_version(linear: LinearPredictor) -> None:
    b = SnapshotBuilder()
    assert b.set_model("gCTF:gpu", 2, linear)
    assert not b.set_model("gCTF:gpu", 2, LinearPredictor({"x": 1.0}))
    assert not b.set_model("gCTF:gpu", 1, LinearPredictor({"x": 1.0}))
    assert b.model_version("gCTF:gpu") == 2 and b.model_version("upload:cpu") is None


def test_model_matrix_rows_in_feature_order_and_read_only(view: SnapshotBuilder) -> None:
    snap = view.build(now=1001.0)
    entry = snap.models["gCTF:gpu"]
    assert entry.feature_names == ("load__mean", "task_input_size_mb")
    assert dict(entry.task_columns) == {"task_input_size_mb": 1}
    assert entry.matrix.dtype == np.float32 and not entry.matrix.flags.writeable
    assert entry.matrix[entry.row_index["slow"], 0] == 4.0 and math.isnan(entry.matrix[0, 1])
    rows = entry.rows(["slow", "fast"], {"task_input_size_mb": 10.0})
    assert rows.tolist() == [[4.0, 10.0], [1.0, 10.0]]
    with pytest.raises(ValueError):
        entry.matrix[0, 0] = 1.0


def test_rebuild_reuses_unchanged_rows_and_refreshes_changed(view: SnapshotBuilder) -> None:
    first = view.build(now=1001.0)
    again = view.build(now=1002.0)
    assert again.models["gCTF:gpu"] is first.models["gCTF:gpu"]
    view.apply_node_features(features_msg("mid", 1003.0, 9.0))
    third = view.build(now=1003.0)
    m = third.models["gCTF:gpu"]
    assert m.matrix[m.row_index["mid"], 0] == 9.0
    assert first.models["gCTF:gpu"].matrix[first.models["gCTF:gpu"].row_index["mid"], 0] == 2.0  # old view intact


def test_scope_per_class_and_per_node(view: SnapshotBuilder, linear: LinearPredictor) -> None:
    view.apply_node_features(features_msg("cpu-1", 1000.0, 1.0, node_class="cpu"))
    view.set_model("gCTF:gpu:slow", 1, linear)
    view.set_model("gCTF:gpu:cpu-1", 1, linear)  # wrong class: covers nothing
    snap = view.build(now=1000.0)
    assert set(snap.models["gCTF:gpu"].row_index) == {"fast", "mid", "slow"}
    assert set(snap.models["gCTF:gpu:slow"].row_index) == {"slow"}
    assert len(snap.models["gCTF:gpu:cpu-1"].row_index) == 0
    assert snap.model_for("gCTF", snap.nodes["slow"]).key == "gCTF:gpu:slow"
    assert snap.model_for("gCTF", snap.nodes["fast"]).key == "gCTF:gpu"
    assert snap.model_for("gCTF", snap.nodes["cpu-1"]) is None
    assert snap.model_for("upload", snap.nodes["fast"]) is None


def test_tombstone_and_running_apps(view: SnapshotBuilder) -> None:
    view.build(now=1000.0)
    view.apply_running("fast", {"Motioncor2": 1, "gCTF": 0})
    assert view.dirty
    view.remove_node("slow")
    snap = view.build(now=1000.0)
    assert dict(snap.nodes["fast"].running) == {"Motioncor2": 1}
    assert "slow" not in snap.nodes and "slow" not in snap.models["gCTF:gpu"].row_index
    assert not view.dirty


def test_holder_swaps_whole_snapshots(view: SnapshotBuilder) -> None:
    holder = SnapshotHolder()
    a = holder.swap(view.build(now=1000.0))
    seen = holder.current
    view.apply_node_features(features_msg("fast", 1001.0, 7.0))
    b = holder.swap(view.build(now=1001.0))
    assert (a.generation, b.generation) == (1, 2)
    assert seen is a and seen.nodes["fast"].features["load__mean"] == 1.0
    assert holder.current is b and b.data_ts == 1001.0 and b.age(now=1003.0) == 2.0


def test_a_large_matrix_is_copied_in_steps_when_one_row_changes(linear: LinearPredictor) -> None:
    """Thousands of nodes make a matrix of megabytes: the copy a changed row needs is spread over steps, and
    the rows of the new view are those of the old one but the changed row."""
    from app.scheduler.builder import COPY_ROWS, _copy_steps

    b = SnapshotBuilder()
    n = 3 * COPY_ROWS + 5
    for i in range(n):
        b.apply_node_features(features_msg(f"n{i}", 1000.0, float(i)))
    b.set_model("gCTF:gpu", 3, linear)
    first = b.build(now=1001.0)
    b.apply_node_features(features_msg("n7", 1002.0, -1.0))
    steps = b.build_steps(1002.0)
    count = 0
    while True:
        try:
            next(steps)
            count += 1
        except StopIteration as stop:
            snap = stop.value
            break
    old, new = first.models["gCTF:gpu"].matrix, snap.models["gCTF:gpu"].matrix
    changed = np.flatnonzero(~((old == new) | (np.isnan(old) & np.isnan(new))).all(axis=1))
    assert changed.tolist() == [snap.models["gCTF:gpu"].row_index["n7"]] and new[changed[0], 0] == -1.0
    assert not new.flags.writeable and old[changed[0], 0] == 7.0
    assert count > n // 128  # at least the table's and the routes' chunks
    copy = _copy_steps(old)
    slices = 0
    while True:
        try:
            next(copy)
            slices += 1
        except StopIteration as stop:
            assert np.array_equal(stop.value, old, equal_nan=True) and stop.value.flags.writeable
            break
    assert slices == 4  # 3 x COPY_ROWS + 5 rows


def test_the_node_table_reads_its_states_a_chunk_per_step() -> None:
    """The states' values are read and converted one chunk per step (never all 5,000 in one), and the columns
    are those of the states, in order."""
    from app.scheduler.entries import NodeState
    from app.scheduler.table import CHUNK, node_table_steps

    n = 2 * CHUNK + 3
    nodes = {f"n{i}": NodeState(f"n{i}", features_ts=float(i), weight=None if i % 2 else 0.5,
                                running={"gCTF": 1} if i % 3 == 0 else {}) for i in range(n)}
    steps = node_table_steps(nodes)
    yields = 0
    while True:
        try:
            next(steps)
            yields += 1
        except StopIteration as stop:
            table = stop.value
            break
    assert yields == 3
    assert table.features_ts.tolist() == [float(i) for i in range(n)] and dict(table.pos)["n7"] == 7
    assert np.isnan(table.weight[1]) and table.weight[2] == 0.5
    assert table.busy.tolist() == [i % 3 == 0 for i in range(n)] and not table.stale.any()
