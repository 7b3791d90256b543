"""The whole feedback loop on the real broker and Redis: drift on one node -> retrain -> the error falls back.

A scripted cluster of two GPU nodes runs one app (RTT grows with GPU utilisation). The test plays the
extender's part: every task gets a prediction, the worker's own node-weights ``predicted_rtt_ms`` once
a model exists. The worker (a subprocess) joins, emits samples and errors; the real trainer
(:class:`~app.trainer.service.TrainerService`, in-process) answers the worker's cold-start event with
v1. Then gpu-a's utilisation jumps and its RTT doubles: prediction-errors show it, a drift
retrain-event fires, the trainer promotes a newer version, the worker hot-swaps it, and gpu-a's error
falls back below the threshold. That a worse challenger is not promoted is tested in
``tests/integration/test_trainer.py``; feature selection is left out here (``selector=None``) for time.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
import time
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest
import redis

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.scheduler.cache import CacheKeys
from app.sim.scripted import Node, Reader, Sender, prediction, snapshot, start_worker, task
from app.trainer.service import TrainerService

pytestmark = pytest.mark.integration

PERIOD_S = 1.0
MAPE_OK = 0.15  # "below the threshold": a healthy model's per-period MAPE here is ~0.02-0.05


def period_mape(errors: list[dict[str, Any]], node: str, app: str, after: float) -> list[float]:
    return [e["apps"][app]["mape"] for e in errors if e["node"] == node and e["ts"] > after and app in e["apps"]]


async def scenario(s: Settings) -> dict[str, Any]:
    rng = random.Random(11)
    app = f"fft{uuid.uuid4().hex[:6]}"
    key = f"{app}:gpu"
    nodes = [Node("gpu-a", "Tesla M40", 300.0), Node("gpu-b", "NVIDIA GeForce RTX 4090", 100.0)]
    a = nodes[0]
    weights: dict[str, dict[str, float]] = {}
    marks: dict[str, float] = {}
    trainer = TrainerService(s, selector=None, holdout_fraction=0.1,
                             catch_up_timeout_s=10.0)
    async with (trainer, Sender(s) as out, Reader(s, "prediction-errors") as errors,
                Reader(s, "retrain-events") as events, Reader(s, "model-updates") as updates,
                Reader(s, "node-weights", lambda v: weights.__setitem__(v["node"], v["predicted_rtt_ms"]))):
        def version() -> int:
            return max((u["version"] for u in updates.values if u["model_key"] == key), default=0)

        deadline = time.monotonic() + 75
        i, last_snap, seen, at_t0, changed = 0, 0.0, 0, 0, 0.0
        while time.monotonic() < deadline:
            now = time.time()
            if now - last_snap >= 0.25:
                last_snap = now
                for n in nodes:
                    await out.send("node-metrics", snapshot(n, now, rng))
            for n in nodes:
                i += 1
                tid = f"task-{i}"
                guess = weights.get(n.name, {}).get(app) or n.base_ms * 1.5  # before any model: the old mean
                await out.send("rtt-predictions", prediction(tid, app, n.name, now, guess, version() or None))
                await out.send("task-completions", task(tid, app, n, now, rng))
            await out.flush()
            v = version()
            if v >= 1 and "v1" not in marks:
                marks["v1"] = now
            if v != seen:
                changed = now
            if "v1" in marks and "t0" not in marks and now - changed > 7 and weights.get("gpu-a", {}).get(app):
                marks["t0"], a.util, at_t0 = now, 80.0, v  # gpu-a's RTT doubles
            if "t0" in marks and v > at_t0 and v > seen:
                marks[f"v{v}"] = marks["fixed_by"] = now  # a promotion after the drift
            seen = v
            if "fixed_by" in marks:
                recent = period_mape(errors.values, "gpu-a", app, marks["fixed_by"] + 2 * PERIOD_S)
                if len(recent) >= 2 and max(recent[-2:]) < MAPE_OK:
                    break
            await asyncio.sleep(0.1)
        return {"app": app, "key": key, "marks": marks, "errors": list(errors.values),
                "events": list(events.values), "updates": list(updates.values), "outcomes": trainer.outcomes}


def test_drift_retrain_recovers(kafka_settings: Settings, redis_url: str, tmp_path: Path) -> None:
    s = dataclasses.replace(kafka_settings, redis_url=redis_url, error_period_s=PERIOD_S, retrain_debounce_s=3.0)
    with ProcessGroup(tmp_path) as group:
        # growth retrains off: one landing just after t0 trains on the new regime and hides the drift from the
        # detector (tests/unit/drift/test_growth.py covers them); this test follows the drift path alone
        url = start_worker(group, s, RTT_COLD_START_SAMPLES="100", RTT_DRIFT_MIN_INSTANCES="5",
                           RTT_RETRAIN_GROWTH="0")
        r = asyncio.run(scenario(s))
        metrics = urllib.request.urlopen(url, timeout=5).read().decode()
    app, key, marks = r["app"], r["key"], r["marks"]
    assert "v1" in marks, f"no model after the cold start: {r['events']} {r['outcomes']}"
    outcomes = [(o.reason, o.outcome, o.version) for o in r["outcomes"]]
    assert "t0" in marks and "fixed_by" in marks, f"no promotion after the drift: {marks} {outcomes}"
    t0 = marks["t0"]

    # 1. the cold start asked for v1
    assert any(e["model_key"] == key and e["reason"] == "cold_start" for e in r["events"])
    # 2. prediction-errors show gpu-a's doubling before the model that fixed it (how soon after t0:
    # bench/bench_promotion.py); gpu-b stays healthy
    shown = [e["ts"] for e in r["errors"] if e["node"] == "gpu-a" and e["ts"] > t0 and e["apps"][app]["mape"] > 0.3]
    assert shown and shown[0] < marks["fixed_by"], (shown[:1], marks)
    healthy = sorted(period_mape(r["errors"], "gpu-b", app, marks["v1"] + 5 * PERIOD_S))
    series = [(round(e["ts"] - t0, 1), e["apps"][app]["mape"]) for e in r["errors"]
              if e["node"] == "gpu-b" and app in e["apps"]]
    assert healthy and healthy[len(healthy) // 2] < MAPE_OK / 2, (
        f"gpu-b (ts - t0, mape): {series}; marks - t0: { {k: round(v - t0, 1) for k, v in marks.items()} }; "
        f"outcomes: {outcomes}")
    # 3. a drift retrain-event for the key, with its statistic above its threshold and an onset
    drift = [e for e in r["events"] if e["reason"] == "drift" and e["model_key"] == key and e["ts"] > t0]
    assert drift and drift[0]["cumulative_error"] > drift[0]["threshold"] and drift[0]["onset_ts"] is not None
    # 4. a newer version was promoted and gpu-a's error fell back below the threshold
    assert max(u["version"] for u in r["updates"] if u["model_key"] == key) >= 2
    after = period_mape(r["errors"], "gpu-a", app, marks["fixed_by"] + 2 * PERIOD_S)
    assert len(after) >= 2 and max(after[-2:]) < MAPE_OK, after
    # 5. every prediction-errors entry names its model key and carries the detector's statistic
    entry = r["errors"][-1]["apps"][app]
    assert entry["model_key"] == key and entry["cumulative"] >= 0
    # 6. metrics and the Redis cache the extender warms from
    assert 'rtt_worker_retrain_events_total{reason="drift"}' in metrics
    assert f'rtt_worker_model_version{{model_key="{key}"}}' in metrics
    assert 'rtt_worker_join_total{outcome="matched"}' in metrics
    assert 'rtt_worker_prediction_mape{app="' + app + '",node_class="gpu"}' in metrics
    assert 'rtt_worker_node_weight{node="gpu-a"}' in metrics
    client = redis.Redis.from_url(redis_url)
    keys = CacheKeys(s.topic_prefix)
    assert client.get(keys.weights("gpu-a")) and client.get(keys.features("gpu-b"))
    client.close()
