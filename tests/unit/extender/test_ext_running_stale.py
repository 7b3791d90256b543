"""The running-apps view as the extender reads it from a real Redis: stamped with the read time while the pods
watcher confirms it, with its own ``ts`` once it is stale, and kept where it was when its keys vanish unread.

A value the watcher has not confirmed for ``running_stale_s`` (2 x ``RTT_PODS_RESYNC_S``) no longer shows the
pods placed since: the extender's own record of them (assumed pods) must keep counting, and ``/readyz`` and
``rtt_extender_degraded{reason="pods_view_stale"}`` say since when.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import redis.asyncio as aioredis
from extender_fixtures import LinearPredictor
from prometheus_client import CollectorRegistry

from app.clock import ManualClock
from app.config import Settings
from app.errors import ConfigError
from app.extender.model_retry import Degraded
from app.extender.options import ExtenderOptions
from app.extender.podwatch_view import encode_node
from app.extender.warm import RunningRefresher
from app.scheduler.assumed import AssumedPods
from app.scheduler.builder import SnapshotBuilder
from app.scheduler.cache import CacheKeys, load_running
from app.scheduler.decide import DecideParams, decide
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import policy_from_dict

pytestmark = pytest.mark.integration  # a real redis-server (tests/conftest.py)

W = 1_800_000_000.0  # the watcher's last confirmation
NODES = ["gpu-1", "gpu-2"]
STALE = "pods_view_stale"  # the reason on /readyz and rtt_extender_degraded{reason}
PARAMS = DecideParams(policy_from_dict({}), credibility_prior=0.5, stale_after_s=30.0)  # scrape delay 1 s


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[Any]:
    client = aioredis.from_url(redis_url)
    yield client
    await client.aclose()


class Extender:
    """The parts of the extender the view reaches: the builder, its refresher, assumed pods and decide()."""

    def __init__(self, client: Any, start: float) -> None:
        self.keys = CacheKeys(f"t{uuid.uuid4().hex[:8]}-")
        self.client = client
        self.clock = ManualClock(start)
        self.builder = SnapshotBuilder()
        self.builder.set_model("gCTF:gpu", 1, LinearPredictor({"load__mean": 100.0, "running_pods_gCTF": 1000.0}))
        self.assumed = AssumedPods(ttl_s=120.0, scrape_delay_s=1.0)
        self.registry = CollectorRegistry()
        self.degraded = Degraded(self.registry)
        self.refresher = RunningRefresher(client, self.keys, self.builder, 2.0, now=self.clock.now,
                                          degraded=self.degraded)
        self.scrape(start)

    def scrape(self, at: float) -> None:
        """Node metrics of every node, taken at ``at``."""
        for i, node in enumerate(NODES):
            self.builder.apply_node_features({"node": node, "ts": at, "node_class": "gpu", "gpu_model": "Tesla M40",
                                              "window_s": 30.0, "count": 30, "features": {"load__mean": 1.0 + i}})

    async def watcher_writes(self, node: str, apps: dict[str, int], ts: float, ttl_ms: int | None = None) -> None:
        await self.client.set(self.keys.running(node), encode_node({"apps": apps, "started": apps}, ts), px=ttl_ms)

    async def refresh_at(self, t: float) -> None:
        self.clock.advance(t - self.clock.now())
        await self.refresher.refresh()

    def place(self, uid: str, node: str, at: float) -> None:
        self.assumed.assume(uid, "gCTF", node, now=at)

    def running_gctf(self, at: float) -> dict[str, float]:
        """``running_pods_gCTF`` per node in a decision at ``at`` (node metrics fresh then)."""
        self.scrape(at)
        pod = PodInfo("probe", "em", "uid-probe", "gCTF", 1.0)
        d = decide(self.builder.build(now=at), pod, NODES, self.assumed, PARAMS, at, note_expected=False)
        return {v.node: v.features["running_pods_gCTF"] for v in d.verdicts}

    def stamp(self, node: str) -> float:
        return self.builder.build(now=self.clock.now()).nodes[node].running_ts

    def gauge(self) -> float | None:
        return self.registry.get_sample_value("rtt_extender_degraded", {"reason": STALE})


async def test_placements_since_a_stale_view_was_last_confirmed_count_on_their_node(redis_client) -> None:
    ext = Extender(redis_client, W)
    await ext.watcher_writes("gpu-1", {"Motioncor2": 1}, W)  # the watcher's last word, then it stops
    await ext.watcher_writes("gpu-2", {"Motioncor2": 1}, W)
    ext.place("p-early", "gpu-1", W + 3.0)
    await ext.refresh_at(W + 5.0)  # confirmed 5 s ago: current, stamped with the read time
    assert ext.stamp("gpu-1") == W + 5.0
    ext.place("p-late", "gpu-1", W + 10.0)
    await ext.refresh_at(W + 61.0)  # not confirmed for more than 2 resyncs: stale
    assert ext.stamp("gpu-1") == W  # back to its last confirmation, not the read time
    assert ext.stamp("gpu-2") == W
    # both placements came after the view's last confirmation: the view cannot show them, the extender does
    assert ext.running_gctf(W + 62.0) == {"gpu-1": 2.0, "gpu-2": 0.0}
    await ext.refresh_at(W + 70.0)  # stays put while nothing confirms it
    assert ext.stamp("gpu-1") == W and ext.running_gctf(W + 71.0)["gpu-1"] == 2.0


async def test_keys_that_vanish_with_nothing_confirmed_keep_the_stamp_of_the_last_confirmation(redis_client) -> None:
    ext = Extender(redis_client, W)
    await ext.watcher_writes("gpu-1", {"Motioncor2": 1}, W, ttl_ms=300)
    await ext.watcher_writes("gpu-2", {"gCTF": 1}, W, ttl_ms=300)
    await ext.refresh_at(W + 20.0)
    assert ext.stamp("gpu-1") == W + 20.0
    ext.place("p1", "gpu-1", W + 30.0)
    ext.place("p2", "gpu-2", W + 31.0)
    await asyncio.sleep(0.6)  # the keys expire: no value left anywhere to confirm the view
    assert await load_running(redis_client, ext.keys) == {}
    await ext.refresh_at(W + 40.0)
    assert ext.stamp("gpu-1") == W + 20.0 and ext.stamp("gpu-2") == W + 20.0  # not advanced to the read
    # the view is gone, the placements since its last confirmation still count
    assert ext.running_gctf(W + 41.0) == {"gpu-1": 1.0, "gpu-2": 1.0}


async def test_a_stale_view_that_then_expires_keeps_its_last_confirmation(redis_client) -> None:
    ext = Extender(redis_client, W)
    await ext.watcher_writes("gpu-1", {"Motioncor2": 1}, W)
    await ext.refresh_at(W + 5.0)
    ext.place("p1", "gpu-1", W + 10.0)
    await ext.refresh_at(W + 65.0)
    assert ext.stamp("gpu-1") == W
    await redis_client.delete(ext.keys.running("gpu-1"))  # 3 resyncs: the key's TTL ran out
    await ext.refresh_at(W + 92.0)
    assert ext.stamp("gpu-1") == W
    assert ext.running_gctf(W + 93.0)["gpu-1"] == 1.0


async def test_a_view_the_watcher_keeps_confirming_is_stamped_with_the_read_time(redis_client) -> None:
    ext = Extender(redis_client, W)
    await ext.watcher_writes("gpu-1", {"gCTF": 1}, W)
    await ext.watcher_writes("gpu-2", {"gCTF": 2}, W)
    ext.place("p-shown", "gpu-1", W + 5.0)  # shown by the view by its next read
    await ext.refresh_at(W + 20.0)
    assert (ext.stamp("gpu-1"), ext.stamp("gpu-2")) == (W + 20.0, W + 20.0)
    assert ext.running_gctf(W + 21.0) == {"gpu-1": 1.0, "gpu-2": 2.0}  # the view's counts, nothing added
    # gpu-2's pods end (the watcher deletes its key) while gpu-1's value is renewed: the view is live
    await redis_client.delete(ext.keys.running("gpu-2"))
    await ext.watcher_writes("gpu-1", {"gCTF": 1}, W + 50.0)
    ext.place("p-gone", "gpu-2", W + 25.0)  # before the next read: the live view shows it ended
    await ext.refresh_at(W + 59.0)  # gpu-1 renewed 9 s ago: the view is live, gpu-2 empty as of now
    assert (ext.stamp("gpu-1"), ext.stamp("gpu-2")) == (W + 59.0, W + 59.0)
    assert ext.running_gctf(W + 60.0) == {"gpu-1": 1.0, "gpu-2": 0.0}
    assert STALE not in ext.degraded.reasons


async def test_a_stale_view_is_a_degraded_reason_with_its_last_confirmation_until_confirmed_again(
        redis_client) -> None:
    ext = Extender(redis_client, W)
    await ext.watcher_writes("gpu-1", {"gCTF": 1}, W)
    await ext.refresh_at(W + 30.0)
    assert ext.gauge() == 0.0 and ext.degraded.reasons == {}
    await ext.refresh_at(W + 61.0)
    reason = ext.degraded.reasons[STALE]
    assert "pods view stale" in reason and "since 2027-01-15T08:00:00Z" in reason, reason
    assert ext.gauge() == 1.0 and ext.refresher.stale_since == W
    await redis_client.delete(ext.keys.running("gpu-1"))  # expired: an empty view still says nothing new
    await ext.refresh_at(W + 95.0)
    assert ext.gauge() == 1.0 and "since 2027-01-15T08:00:00Z" in ext.degraded.reasons[STALE]
    await ext.watcher_writes("gpu-1", {"gCTF": 1}, W + 120.0)  # the watcher is back: it lists and writes
    await ext.refresh_at(W + 121.0)
    assert ext.gauge() == 0.0 and STALE not in ext.degraded.reasons
    assert ext.refresher.stale_since is None and ext.stamp("gpu-1") == W + 121.0


async def test_the_view_is_read_with_each_value_s_ts_and_a_value_without_one_counts_as_current(redis_client) -> None:
    from app.scheduler.cache import load_running_view

    ext = Extender(redis_client, W)
    await ext.watcher_writes("gpu-1", {"gCTF": 1}, W)
    await redis_client.set(ext.keys.running("gpu-2"), b'{"apps": {"gCTF": 2}}')  # a writer that says no ts
    view = await load_running_view(redis_client, ext.keys)
    assert view.running == {"gpu-1": {"gCTF": 1}, "gpu-2": {"gCTF": 2}} and view.running_ts == {"gpu-1": W}
    assert await load_running(redis_client, ext.keys) == view.running  # what the bridge gets is unchanged
    await ext.refresh_at(W + 100.0)
    assert (ext.stamp("gpu-1"), ext.stamp("gpu-2")) == (W, W + 100.0)
    assert ext.gauge() == 0.0  # one current value: the view is live


def test_the_stale_threshold_is_twice_the_watcher_s_resync_and_a_bad_resync_fails_at_start() -> None:
    assert ExtenderOptions.from_settings(Settings.from_env({})).running_stale_s == 60.0
    assert ExtenderOptions.from_settings(Settings.from_env({"RTT_PODS_RESYNC_S": "10"})).running_stale_s == 20.0
    refresher = RunningRefresher(None, CacheKeys(), SnapshotBuilder(), 2.0)
    assert refresher.stale_after_s == ExtenderOptions().running_stale_s
    with pytest.raises(ConfigError, match="RTT_PODS_RESYNC_S"):
        Settings.from_env({"RTT_PODS_RESYNC_S": "0"})
