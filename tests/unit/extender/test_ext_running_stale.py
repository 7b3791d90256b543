"""The running-apps view as the extender reads it from a real Redis: stamped with the read time while the pods
watcher confirms it, and back to when the extender last saw it confirmed once it is stale.

The watcher confirms the view at each list and renewal: its heartbeat ``running-sync`` and each value's ``ts``
(its clock, which need not agree with the extender's). A view the extender has not seen confirmed for
``running_stale_s`` (2 x ``RTT_PODS_RESYNC_S``) of its own clock no longer shows the pods placed since: the
extender's own record of them (assumed pods) must keep counting, and ``/readyz`` and
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
from app.scheduler.cache import CacheKeys, encode_running_sync, load_running, load_running_view
from app.scheduler.decide import DecideParams, decide
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import policy_from_dict

pytestmark = pytest.mark.integration  # a real redis-server (tests/conftest.py)

W = 1_800_000_000.0  # the extender's clock at start (2027-01-15T08:00:00Z)
PERIOD = 2.0  # the refresh period
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
        self.refresher = RunningRefresher(client, self.keys, self.builder, PERIOD, now=self.clock.now,
                                          degraded=self.degraded)
        self.scrape(start)

    def scrape(self, at: float) -> None:
        """Node metrics of every node, taken at ``at``."""
        for i, node in enumerate(NODES):
            self.builder.apply_node_features({"node": node, "ts": at, "node_class": "gpu", "gpu_model": "Tesla M40",
                                              "window_s": 30.0, "count": 30, "features": {"load__mean": 1.0 + i}})

    async def watcher_writes(self, node: str, apps: dict[str, int], ts: float, ttl_ms: int | None = None) -> None:
        await self.client.set(self.keys.running(node), encode_node({"apps": apps, "started": apps}, ts), px=ttl_ms)

    async def watcher_confirms(self, ts: float, ttl_ms: int | None = None) -> None:
        """The heartbeat the watcher writes with each list and renewal (``ts``: its clock)."""
        await self.client.set(self.keys.running_sync(), encode_running_sync(ts), px=ttl_ms)

    async def watcher_lists(self, view: dict[str, dict[str, int]], ts: float) -> None:
        """A list (or a renewal): every node's value and the heartbeat written, the other nodes' keys deleted."""
        for node in set(await load_running(self.client, self.keys)) - set(view):
            await self.client.delete(self.keys.running(node))
        for node, apps in view.items():
            await self.watcher_writes(node, apps, ts)
        await self.watcher_confirms(ts)

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


async def test_placements_since_the_view_was_last_seen_confirmed_count_once_it_is_stale(redis_client) -> None:
    ext = Extender(redis_client, W)
    await ext.watcher_lists({"gpu-1": {"Motioncor2": 1}, "gpu-2": {"Motioncor2": 1}}, W)  # its last word
    await ext.refresh_at(W + 1.0)  # the first read: the view is current as of now
    ext.place("p-early", "gpu-1", W + 3.0)
    await ext.refresh_at(W + 5.0)  # nothing new, but seen confirmed 4 s ago: current, stamped with the read time
    assert ext.stamp("gpu-1") == W + 5.0
    ext.place("p-late", "gpu-1", W + 10.0)
    await ext.refresh_at(W + 61.0)  # exactly 60 s of the extender's clock since the last advance: still current
    assert ext.stamp("gpu-1") == W + 61.0 and ext.refresher.stale_since is None
    await ext.refresh_at(W + 63.0)  # longer: stale
    assert ext.stamp("gpu-1") == W - 1.0  # the advance seen at W + 1, less a period: when it was written at most
    assert ext.stamp("gpu-2") == W - 1.0
    # both placements came after the view's last confirmation: the view cannot show them, the extender does
    assert ext.running_gctf(W + 64.0) == {"gpu-1": 2.0, "gpu-2": 0.0}
    await ext.refresh_at(W + 70.0)  # stays put while nothing confirms it
    assert ext.stamp("gpu-1") == W - 1.0 and ext.running_gctf(W + 71.0)["gpu-1"] == 2.0


async def test_a_view_already_stale_at_start_is_reported_stale_after_s_later_its_emptied_nodes_too(
        redis_client) -> None:
    ext = Extender(redis_client, W)
    await ext.watcher_writes("gpu-1", {"Motioncor2": 1}, W - 80.0, ttl_ms=300)  # a watcher gone 80 s ago
    await ext.watcher_writes("gpu-2", {"gCTF": 1}, W - 80.0, ttl_ms=300)
    await ext.watcher_confirms(W - 80.0, ttl_ms=300)
    await ext.refresh_at(W)  # nothing to compare with yet: the first read stands in for a confirmation
    assert ext.stamp("gpu-1") == W and ext.gauge() == 0.0
    ext.place("p1", "gpu-1", W + 5.0)
    ext.place("p2", "gpu-2", W + 6.0)
    await asyncio.sleep(0.6)  # the keys expire
    assert await load_running(redis_client, ext.keys) == {}
    await ext.refresh_at(W + 10.0)  # still within 60 s of the first read: the nodes are empty as of now
    assert ext.stamp("gpu-1") == W + 10.0 and ext.running_gctf(W + 11.0) == {"gpu-1": 0.0, "gpu-2": 0.0}
    await ext.refresh_at(W + 61.0)  # stale: every node back to the first read less a period, emptied ones too
    assert ext.stamp("gpu-1") == W - PERIOD and ext.stamp("gpu-2") == W - PERIOD
    assert ext.running_gctf(W + 62.0) == {"gpu-1": 1.0, "gpu-2": 1.0}
    assert ext.gauge() == 1.0


async def test_without_any_watcher_there_is_no_view_to_call_stale(redis_client) -> None:
    ext = Extender(redis_client, W)  # no key ever written: no pods watcher runs (docker-compose)
    for t in (0.0, 61.0, 600.0):
        await ext.refresh_at(W + t)
        assert ext.gauge() == 0.0 and ext.degraded.reasons == {}
    await ext.watcher_lists({}, W + 601.0)  # a watcher starts: from now on its view is judged
    await ext.refresh_at(W + 602.0)
    await ext.refresh_at(W + 662.0)
    assert ext.gauge() == 0.0
    await ext.refresh_at(W + 663.0)
    assert ext.gauge() == 1.0 and ext.refresher.stale_since == W + 600.0


async def test_a_stale_view_that_then_expires_keeps_its_rewound_stamp(redis_client) -> None:
    ext = Extender(redis_client, W)
    await ext.watcher_lists({"gpu-1": {"Motioncor2": 1}}, W)
    await ext.refresh_at(W + 5.0)
    ext.place("p1", "gpu-1", W + 10.0)
    await ext.refresh_at(W + 66.0)
    assert ext.stamp("gpu-1") == W + 3.0
    await redis_client.delete(ext.keys.running("gpu-1"), ext.keys.running_sync())  # 3 resyncs: the TTL ran out
    await ext.refresh_at(W + 92.0)
    assert ext.stamp("gpu-1") == W + 3.0
    assert ext.running_gctf(W + 93.0)["gpu-1"] == 1.0


async def test_a_view_an_older_watcher_keeps_confirming_is_stamped_with_the_read_time(redis_client) -> None:
    ext = Extender(redis_client, W)  # a watcher that writes no heartbeat: the values' ts advance
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
    await ext.refresh_at(W + 59.0)
    assert (ext.stamp("gpu-1"), ext.stamp("gpu-2")) == (W + 59.0, W + 59.0)
    assert ext.running_gctf(W + 60.0) == {"gpu-1": 1.0, "gpu-2": 0.0}
    await ext.refresh_at(W + 100.0)  # 41 s after the renewal was seen: current
    assert ext.stamp("gpu-1") == W + 100.0
    assert STALE not in ext.degraded.reasons


async def test_an_older_watcher_s_empty_view_is_not_stale_its_unrenewed_values_are(redis_client) -> None:
    ext = Extender(redis_client, W)  # a watcher that writes no heartbeat: with no pod of ours, no key to renew
    await ext.watcher_writes("gpu-1", {"gCTF": 1}, W)
    await ext.refresh_at(W + 5.0)
    await redis_client.delete(ext.keys.running("gpu-1"))  # its pods ended
    for t in (10.0, 70.0, 600.0):
        await ext.refresh_at(W + t)
        assert STALE not in ext.degraded.reasons and ext.stamp("gpu-1") == W + 10.0  # empty as of that read
    await ext.watcher_writes("gpu-2", {"gCTF": 1}, W + 605.0)  # a pod again, its value never renewed
    await ext.refresh_at(W + 606.0)
    await ext.refresh_at(W + 667.0)
    assert ext.refresher.stale_since == W + 606.0 - PERIOD and ext.stamp("gpu-2") == W + 604.0


async def test_a_stale_view_is_a_degraded_reason_with_the_extender_s_time_until_confirmed_again(
        redis_client) -> None:
    ext = Extender(redis_client, W)
    await ext.watcher_lists({"gpu-1": {"gCTF": 1}}, W)
    await ext.refresh_at(W + 2.0)
    await ext.refresh_at(W + 30.0)
    assert ext.gauge() == 0.0 and ext.degraded.reasons == {}
    await ext.refresh_at(W + 63.0)
    reason = ext.degraded.reasons[STALE]
    assert "pods view stale" in reason and "since 2027-01-15T08:00:00Z (the extender's clock" in reason, reason
    assert ext.gauge() == 1.0 and ext.refresher.stale_since == W
    await redis_client.delete(ext.keys.running("gpu-1"), ext.keys.running_sync())  # expired: nothing new
    await ext.refresh_at(W + 95.0)
    assert ext.gauge() == 1.0 and "since 2027-01-15T08:00:00Z" in ext.degraded.reasons[STALE]
    await ext.watcher_lists({"gpu-1": {"gCTF": 1}}, W + 120.0)  # the watcher is back: it lists and writes
    await ext.refresh_at(W + 121.0)
    assert ext.gauge() == 0.0 and STALE not in ext.degraded.reasons
    assert ext.refresher.stale_since is None and ext.stamp("gpu-1") == W + 121.0


@pytest.mark.parametrize("expire", [False, True], ids=["keys-left", "keys-expired"])
async def test_a_watcher_back_with_an_empty_view_clears_the_reason_and_empties_the_nodes(
        redis_client, expire: bool) -> None:
    ext = Extender(redis_client, W)
    await ext.watcher_lists({"gpu-1": {"Motioncor2": 1}, "gpu-2": {"Motioncor2": 1}}, W)
    await ext.refresh_at(W + 1.0)
    ext.place("p1", "gpu-1", W + 10.0)
    await ext.refresh_at(W + 62.0)  # the watcher is down: stale, the placement counts
    assert ext.gauge() == 1.0 and ext.running_gctf(W + 63.0)["gpu-1"] == 1.0
    if expire:  # the outage outlasts the keys' TTL
        await redis_client.delete(ext.keys.running("gpu-1"), ext.keys.running("gpu-2"), ext.keys.running_sync())
        await ext.refresh_at(W + 95.0)
        assert ext.gauge() == 1.0
    # every pod of ours finished meanwhile; the watcher comes back, lists none, deletes every key
    await ext.watcher_lists({}, W + 100.0)
    await ext.refresh_at(W + 101.0)
    assert ext.gauge() == 0.0 and STALE not in ext.degraded.reasons and ext.refresher.stale_since is None
    assert ext.stamp("gpu-1") == W + 101.0 and ext.stamp("gpu-2") == W + 101.0  # nothing runs there as of now
    assert ext.running_gctf(W + 102.0) == {"gpu-1": 0.0, "gpu-2": 0.0}
    for t in (130.0, 160.0, 190.0):  # an empty view the heartbeat keeps confirming stays current
        await ext.watcher_confirms(W + t)
        await ext.refresh_at(W + t + 1.0)
    await ext.refresh_at(W + 250.0)
    assert ext.gauge() == 0.0
    await ext.refresh_at(W + 253.0)  # the heartbeat stopped at W + 190 (seen at W + 191)
    assert ext.gauge() == 1.0 and ext.refresher.stale_since == W + 189.0


@pytest.mark.parametrize("skew_s", [-90.0, 90.0], ids=["watcher-behind", "watcher-ahead"])
async def test_the_view_is_judged_on_the_extender_s_clock_whatever_the_watcher_s_clock_says(
        redis_client, skew_s: float) -> None:
    ext = Extender(redis_client, W)
    view = {"gpu-1": {"gCTF": 1}, "gpu-2": {"Motioncor2": 1}}
    ext.place("p-shown", "gpu-1", W - 5.0)  # the gCTF pod the view shows
    ext.place("p-done", "gpu-2", W + 2.0)  # a gCTF pod that ended within a second: the view never shows it
    for renewal in range(5):  # a healthy watcher renews every 30 s, its clock off by skew_s
        t = W + 30.0 * renewal
        await ext.watcher_lists(view, t + skew_s)
        for read in (t + 1.0, t + 15.0, t + 29.0):
            await ext.refresh_at(read)
            assert ext.stamp("gpu-1") == read and ext.stamp("gpu-2") == read
            assert ext.gauge() == 0.0, read
    assert ext.running_gctf(W + 150.0) == {"gpu-1": 1.0, "gpu-2": 0.0}  # what the view shows
    # the watcher stops after its renewal at W + 120 (seen at W + 121)
    ext.place("p-late", "gpu-2", W + 130.0)
    await ext.refresh_at(W + 181.0)
    assert ext.gauge() == 0.0
    await ext.refresh_at(W + 183.0)  # 62 s of the extender's clock: stale
    assert ext.gauge() == 1.0 and ext.stamp("gpu-2") == W + 119.0
    assert ext.running_gctf(W + 184.0) == {"gpu-1": 1.0, "gpu-2": 1.0}


async def test_a_heartbeat_from_a_clock_set_back_still_confirms_the_view(redis_client) -> None:
    ext = Extender(redis_client, W)
    await ext.watcher_lists({"gpu-1": {"gCTF": 1}}, W)
    await ext.refresh_at(W + 1.0)
    for i, t in enumerate((30.0, 60.0, 90.0)):  # the watcher's clock stepped back 2 minutes: values ts older
        await ext.watcher_writes("gpu-1", {"gCTF": 1}, W + t - 120.0 + i)
        await ext.watcher_confirms(W + t - 120.0 + i)
        await ext.refresh_at(W + t + 1.0)
    await ext.refresh_at(W + 150.0)
    assert ext.gauge() == 0.0 and ext.stamp("gpu-1") == W + 150.0


async def test_the_view_is_read_with_each_value_s_ts_the_heartbeat_and_a_value_without_ts_counts_as_current(
        redis_client) -> None:
    ext = Extender(redis_client, W)
    await ext.watcher_writes("gpu-1", {"gCTF": 1}, W)
    await redis_client.set(ext.keys.running("gpu-2"), b'{"apps": {"gCTF": 2}}')  # a writer that says no ts
    view = await load_running_view(redis_client, ext.keys)
    assert view.running == {"gpu-1": {"gCTF": 1}, "gpu-2": {"gCTF": 2}} and view.running_ts == {"gpu-1": W}
    assert view.running_sync is None  # no heartbeat: a watcher of an older release
    await ext.watcher_confirms(W + 3.0)
    assert (await load_running_view(redis_client, ext.keys)).running_sync == W + 3.0
    assert await load_running(redis_client, ext.keys) == view.running  # not a node: what the bridge gets
    await ext.refresh_at(W + 100.0)
    await ext.refresh_at(W + 200.0)  # nothing advanced, but a value without ts is taken as confirmed
    assert (ext.stamp("gpu-1"), ext.stamp("gpu-2")) == (W + 200.0, W + 200.0)
    assert ext.gauge() == 0.0


def test_the_stale_threshold_is_twice_the_watcher_s_resync_and_a_bad_resync_fails_at_start() -> None:
    assert ExtenderOptions.from_settings(Settings.from_env({})).running_stale_s == 60.0
    assert ExtenderOptions.from_settings(Settings.from_env({"RTT_PODS_RESYNC_S": "10"})).running_stale_s == 20.0
    refresher = RunningRefresher(None, CacheKeys(), SnapshotBuilder(), PERIOD)
    assert refresher.stale_after_s == ExtenderOptions().running_stale_s
    with pytest.raises(ConfigError, match="RTT_PODS_RESYNC_S"):
        Settings.from_env({"RTT_PODS_RESYNC_S": "0"})
