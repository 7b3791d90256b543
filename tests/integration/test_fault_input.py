"""Hostile input against a real worker: keys that lie, timestamps from far away, clocks that jump, 10k names.

One worker subprocess, capped at 1,000 nodes and 8 apps, evicting nodes silent for 6 s:

* a node-metrics message whose key names another node, and a completion without a key, go to dead-letters
  (``key_mismatch``);
* a snapshot stamped 9.9e10 (allowed by the contract) goes to dead-letters (``ts_in_future``) and the node's
  later valid snapshots still become node-features — the node is not frozen; one two days old is
  ``ts_too_old``;
* a node whose clock ran 200 s ahead and comes back gets a fresh window (``rtt_worker_clock_resets_total``)
  and its features go on;
* 10,000 node names: the worker holds 1,000 nodes, the rest are dead letters (``node_cap``), its metric
  series stay at the cap (its memory then: ``bench/bench_chaos.py --only input``, beside the same names sent
  to a worker whose cap is raised to hold them all); 6 s of silence later the nodes are evicted: from the
  worker's state and series, and from node-features (tombstones);
* 20 app names: 8 tracked, the others ``app_cap``.
"""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from fault_worker import CAP_APPS, CAP_NODES, hostile_input

from app.config import Settings

pytestmark = pytest.mark.integration


def test_hostile_input_goes_to_dead_letters_and_nothing_grows_without_bound(kafka_settings: Settings,
                                                                            tmp_path: Path) -> None:
    s = dataclasses.replace(kafka_settings, error_period_s=1.0)
    outcome, r = asyncio.run(hostile_input(s, tmp_path))
    assert outcome.dead == 0, r["dead_processes"]
    assert ("key_mismatch", "node-metrics") in r["dead"] and ("key_mismatch", "task-completions") in r["dead"]
    assert ("ts_in_future", "node-metrics") in r["dead"] and ("ts_too_old", "node-metrics") in r["dead"]
    assert r["clock_resets"] == 1
    assert r["nodes"] <= CAP_NODES and r["weight_series"] <= CAP_NODES
    assert r["app_cap"] >= 20 - CAP_APPS
    assert r["weight_series_after"] == 0 and r["evicted"] >= CAP_NODES - 10
    assert {"gpu-future", "gpu-jump"} <= r["tombstones"] and len(r["tombstones"]) >= r["nodes"]
    assert r["alive_after"] == []  # the tombstones are the last word on node-features and node-weights
