"""NodeState: emitted values satisfy the node-features contract; changelog rows rebuild the same state."""

from __future__ import annotations

import numpy as np
import pytest

from app.config import Settings
from app.contracts import decode, encode
from app.errors import ConfigError
from app.streams.node_state import NodeState, decode_row, encode_row, node_of_key, row_key
from app.streams.options import WorkerOptions


def snaps(node: str, n: int, seed: int = 1) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"node": node, "ts": 1000.0 + i * 0.7, "node_class": "gpu", "gpu_model": "RTX 4090",
             "metrics": {f"m{j}": float(rng.normal(1e9, 1e3)) for j in range(30)}, "stale": []} for i in range(n)]


def test_features_value_satisfies_the_contract() -> None:
    s = NodeState.new("g1", 3, window_s=10.0, history_s=60.0)
    for snap in snaps("g1", 40):
        assert s.update(snap, 3)
    value = s.features_value()
    assert decode("node-features", encode("node-features", value)) == value
    newest = int(1000.0 + 39 * 0.7)  # the window is the 10 one-second buckets ending with the newest one
    assert value["count"] == sum(1 for i in range(40) if newest - 10 < int(1000.0 + i * 0.7) <= newest)
    assert len(value["features"]) == 30 * 5 and value["ts"] == 1000.0 + 39 * 0.7


def test_rows_rebuild_the_same_features_incrementally() -> None:
    s = NodeState.new("g1", 3, window_s=10.0, history_s=60.0)
    rows: dict[bytes, bytes] = {}
    for i, snap in enumerate(snaps("g1", 100)):
        s.update(snap, 3)
        if i % 7 == 0:
            rows.update(s.take_rows())  # compacted changelog: latest row per key
    rows.update(s.take_rows())
    r = NodeState.restore("g1", 3, rows.get, window_s=10.0, history_s=60.0)
    assert r.features_value() == s.features_value()
    assert len(rows) <= r.window.n_buckets + 1  # bounded by the ring, whatever the event count


def test_rows_taken_by_a_failed_write_are_taken_again() -> None:
    """A checkpoint whose write failed hands its rows back (retake): the next one writes them, so the
    changelog still rebuilds the same state."""
    s = NodeState.new("g1", 3, window_s=10.0, history_s=60.0)
    for snap in snaps("g1", 30):
        s.update(snap, 3)
    lost = list(s.take_rows())  # the write of these failed
    assert lost and list(s.take_rows()) == []
    s.retake(key for key, _ in lost)
    again = dict(s.take_rows())
    assert again == dict(lost)
    r = NodeState.restore("g1", 3, again.get, window_s=10.0, history_s=60.0)
    assert r.features_value() == s.features_value()


def test_a_rewrite_gives_every_row_of_the_history_again() -> None:
    """The changelog topic was recreated empty: the rows written from then on must rebuild the whole state
    (meta included), not only what changes next."""
    s = NodeState.new("g1", 3, window_s=10.0, history_s=20.0)
    for snap in snaps("g1", 60):  # 42 s of snapshots: the ring has rolled over
        s.update(snap, 3)
    list(s.take_rows())  # stored in the topic that is gone
    assert list(s.take_rows()) == []
    s.rewrite()
    rows = dict(s.take_rows())
    assert row_key("g1", "meta") in rows and len(rows) == len(s.window.held_slots()) + 1
    assert len(s.window.held_slots()) <= s.window.n_buckets
    r = NodeState.restore("g1", 3, rows.get, window_s=10.0, history_s=20.0)
    assert r.features_value() == s.features_value()


def test_row_codec_and_keys() -> None:
    stats = np.arange(7 * 3, dtype=float).reshape(7, 3)
    b, n, back = decode_row(encode_row(42, 5.0, stats))
    assert (b, n) == (42, 5.0) and np.array_equal(back, stats)
    assert node_of_key(row_key("a#b", 7)) == "a#b"


def test_late_snapshot_is_refused_and_state_unchanged() -> None:
    s = NodeState.new("c1", 0, window_s=5.0, history_s=10.0)
    s.update({"node": "c1", "ts": 500.0, "node_class": "cpu", "metrics": {"x": 1.0}}, 0)
    before = s.features_value()
    assert not s.update({"node": "c1", "ts": 100.0, "node_class": "cpu", "metrics": {"x": 9.0}}, 0)
    assert s.features_value() == before


def test_options_validate_fields() -> None:
    assert WorkerOptions.from_settings(Settings()).history_s == 120.0
    with pytest.raises(ConfigError, match="RTT_WORKER_SESSION_TIMEOUT_S"):
        WorkerOptions(session_timeout_s=0)
