"""The live run's watcher takes a message as the production consumers take it: key checked, tombstones apart."""

from __future__ import annotations

import time

from app.config import Settings
from app.contracts import encode
from app.sim.live_watch import FeedbackWatcher

UPDATE = {"model_key": "gCTF:gpu", "version": 2, "sha256": "0" * 64, "features": [], "metrics": {},
          "location": "redis://x#k", "ts": 1.0}


def test_a_model_update_counts_only_under_its_own_key() -> None:
    w = FeedbackWatcher(Settings())
    raw = encode("model-updates", UPDATE)
    w.apply("model-updates", None, raw)          # no key: the worker, the trainer and the extender refuse it
    w.apply("model-updates", b"upload:cpu", raw)  # another key's partition
    w.apply("model-updates", b"gCTF:gpu", None)   # a tombstone: no model is deleted
    assert (w.models, w.rejected, w.tombstones) == ([], 2, 1)
    w.apply("model-updates", b"gCTF:gpu", raw)
    assert w.models == [(1.0, "gCTF:gpu", 2)]


def test_node_weights_tombstones_are_no_rejections() -> None:
    """Eviction sends them on purpose."""
    w = FeedbackWatcher(Settings())
    value = {"node": "gpu-1", "ts": time.time(), "weight": 0.5, "predicted_rtt_ms": {"gCTF": 100.0}, "stale": False}
    w.apply("node-weights", b"gpu-1", encode("node-weights", value))
    w.apply("node-weights", b"gpu-1", None)
    w.apply("node-weights", b"gpu-2", encode("node-weights", value))
    assert ([n for _, n, _ in w.weights], w.tombstones, w.rejected) == (["gpu-1"], 1, 1)
