"""The outage scenarios of the fault stack: the broker loses its data, Redis stops under the processes.

Each runs on a :class:`fault_stack.Stack` and returns a :class:`fault_stack.Outcome` (tests and
``bench/bench_chaos.py`` share them).
"""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import time
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from fault_stack import (
    KEY,
    Load,
    Outcome,
    RedisServer,
    Stack,
    all_counted,
    counted,
    drained,
    get_json,
    metric,
    readers,
    sample_ids,
    scrape,
    served_version,
    wait_for,
)

from app.config import Settings
from app.contracts import contract
from app.kafka.client import client_options
from app.sim.scripted import Reader, produce, start_worker
from app.streams.app import default_id
from app.streams.feedback_loop import TABLE_NAME as FEEDBACK_TABLE
from app.streams.feedback_table import NODE, parse_row_key
from app.streams.node_features import TABLE_NAME as NODE_TABLE
from app.streams.node_state import META, row_key


async def broker_wipe(stack: Stack, load: Load, pause_s: float = 2.0) -> Outcome:
    """The broker loses everything mid-stream and comes back empty; topics recreated from topics/.

    Before: v1 of :data:`KEY` served everywhere. After: the load goes on (after ``pause_s``) with every RTT
    doubled, one node reporting metrics but running nothing, and a drift retrain from then on is asked for:
    the challenger has a reason to beat v1, and the trainer announces v2 on the recreated model-updates.
    Lost = tasks completed after the wipe without a training sample or a counted pair, snapshots after the
    wipe the worker never read, and nodes whose window or tracker the recreated changelogs lack (a restart
    would lose them); twice = pairs counted beyond the tasks.
    """
    s = stack.settings
    async with readers(s, "prediction-errors") as (before,):
        await load.run(8)
        await wait_for(lambda: served_version(stack) >= (1, 1), 90, "v1 served by the worker and the extender")
        await drained(stack, load.snapshots)
        await wait_for(lambda: counted(before.values) >= len(load.tasks), 30, "every pair before the wipe counted")
    read_before = metric(scrape(stack.worker_url), "rtt_worker_messages_in_total", topic="node-metrics")
    back = await stack.wipe_broker()
    await asyncio.sleep(pause_s)
    first = len(load.tasks)
    snaps_before = load.snapshots
    load.rtt_scale, onset = 2.0, time.time()
    load.quiet = {load.nodes[0]}
    async with readers(s, "training-samples", "prediction-errors") as (samples, errors):
        first_seen = asyncio.ensure_future(_seen_first(samples, load, first))
        await load.run(8)
        after = set(load.tasks[first:])
        await produce(s, [("retrain-events", {"model_key": KEY, "reason": "drift", "cumulative_error": 1.0,
                                              "threshold": 0.5, "ts": time.time(), "onset_ts": onset})])
        seen = await first_seen
        with contextlib.suppress(AssertionError):
            await wait_for(lambda: after <= set(sample_ids(samples.values)), 60, "every task's sample after the wipe")
        with contextlib.suppress(AssertionError):
            await wait_for(lambda: counted(errors.values) >= len(after), 30, "every pair after the wipe counted")
        await wait_for(lambda: served_version(stack) >= (2, 2), 120, "v2 served by the worker and the extender")
        await asyncio.sleep(3.0)  # a double count would show by now
        got = sample_ids(samples.values)
        exposition = scrape(stack.worker_url)
        read_after = metric(exposition, "rtt_worker_messages_in_total", topic="node-metrics")
        resets = metric(exposition, "rtt_kafka_position_resets_total")
        rewinds = {t: metric(exposition, "rtt_worker_changelog_rewinds_total", table=t)
                   for t in (NODE_TABLE, FEEDBACK_TABLE)}
        pairs = counted(errors.values)
    windows = await changelog_keys(s, NODE_TABLE)
    trackers = {p[2] for k in await changelog_keys(s, FEEDBACK_TABLE) if (p := parse_row_key(k)) and p[1] == NODE}
    missing = [n for n in load.nodes if row_key(n, META) not in windows] + sorted(set(load.nodes) - trackers)
    lost_tasks = len(after - set(got))
    lost_pairs = max(0, len(after) - pairs)
    lost_snaps = max(0, (load.snapshots - snaps_before) - int(read_after - read_before))
    missing += await _restart_restores(stack, load)
    twice = max(0, pairs - len(after)) + (len(got) - len(set(got)))
    return Outcome("broker wiped and restarted (memory-only), topics recreated", len(stack.dead()),
                   lost_tasks + lost_pairs + lost_snaps + len(missing), twice, seen - back,
                   f"worker position resets {resets:.0f}; changelog partitions found recreated "
                   f"{ {t: int(v) for t, v in rewinds.items()} }; v2 served in worker and extender; load resumed "
                   f"{pause_s:g} s after the broker; changelog rows missing, or not restored by a worker started "
                   f"after the wipe: {missing or 'none'}")


def _client_lines(stack: Stack) -> dict[str, int]:
    """Lines each process has logged from aiokafka's loggers so far."""
    assert stack.group is not None
    out = {}
    for name in stack.group.children:
        path = stack.group.log_dir / f"{name}.log"
        text = path.read_text(errors="replace") if path.exists() else ""
        out[name] = sum(1 for line in text.splitlines() if re.search(r" (ERROR|WARNING) aiokafka[.:]", line))
    return out


async def broker_away(stack: Stack, load: Load, away_s: float = 50.0) -> Outcome:
    """The broker is away for ``away_s`` under the running processes, then comes back (empty: memory-only).

    While it is away: nobody exits, the extender keeps answering ready from what it holds, and each process
    logs aiokafka's per-retry errors once per period (with a count of those held back), not on every retry.
    After: the load goes on; every task produced after the broker came back has its training sample and its
    counted pair. Lost = those missing; twice = pairs counted beyond the tasks. ``detail`` gives the aiokafka
    lines each process logged during the outage.
    """
    assert stack.broker is not None
    await load.run(6)
    await wait_for(lambda: served_version(stack) >= (1, 1), 90, "v1 served by the worker and the extender")
    before = _client_lines(stack)
    stack.broker.kill()
    t0 = time.monotonic()
    dead_during: set[str] = set()
    ready_during = True
    while time.monotonic() - t0 < away_s:
        await asyncio.sleep(1.0)
        dead_during |= set(stack.dead())
        ready_during = ready_during and _ready(stack)
    lines = {n: c - before.get(n, 0) for n, c in _client_lines(stack).items()}
    back = await stack.wipe_broker()  # the processes paused across the restart: topics come from topics/
    first = len(load.tasks)
    async with readers(stack.settings, "training-samples", "prediction-errors") as (samples, errors):
        first_seen = asyncio.ensure_future(_seen_first(samples, load, first))
        await load.run(6)
        after = set(load.tasks[first:])
        seen = await first_seen
        with contextlib.suppress(AssertionError):
            await wait_for(lambda: after <= set(sample_ids(samples.values)), 60, "every task's sample after")
        with contextlib.suppress(AssertionError):
            await wait_for(lambda: counted(errors.values) >= len(after), 60, "every pair after counted")
        await asyncio.sleep(2.0)  # a double count would show by now
        got, pairs = sample_ids(samples.values), counted(errors.values)
    dead = set(stack.dead()) | dead_during
    return Outcome(f"broker away {away_s:g} s under the running processes, back empty", len(dead),
                   len(after - set(got)) + max(0, len(after) - pairs), max(0, pairs - len(after)), seen - back,
                   f"aiokafka lines logged during the outage: {lines}; extender ready throughout: {ready_during}")


async def _restart_restores(stack: Stack, load: Load) -> list[str]:
    """SIGKILL the worker and start another: the nodes whose tracker or window it did not restore from the
    changelogs (one entry per thing missing)."""
    assert stack.group is not None
    stack.group.children.pop("worker").kill()
    stack.worker_url = start_worker(stack.group, stack.settings, "worker-after-wipe")
    log_path = stack.group.log_dir / "worker-after-wipe.log"

    def restored() -> tuple[int, set[str]]:
        text = log_path.read_text(errors="replace")
        counts = [int(m) for m in re.findall(r"partitions \[[0-9, ]+\]: restored \d+ join entries, (\d+) node trackers",
                                             text)]
        return max(counts, default=0), set(re.findall(r"node (\S+): window rebuilt from the changelog", text))

    async def snapshots_until_rebuilt() -> bool:
        await load.run(1, tasks_per_node=0)  # a snapshot of every node rebuilds its window on arrival
        return restored()[1] >= set(load.nodes)

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and not await snapshots_until_rebuilt():
        pass
    trackers, rebuilt = restored()
    return sorted(set(load.nodes) - rebuilt) + ["trackers"] * max(0, len(load.nodes) - trackers)


async def changelog_keys(s: Settings, table: str, timeout_s: float = 30.0) -> set[bytes]:
    """The keys of the live rows of the worker group's changelog of ``table``, read from its start to its end."""
    topic = f"{default_id(s)}-{table}-changelog"
    tps = [TopicPartition(topic, p) for p in range(contract("node-metrics").partitions)]
    c = AIOKafkaConsumer(**client_options(s, enable_auto_commit=False, group_id=None))
    await c.start()
    try:
        c.assign(tps)
        await c.seek_to_beginning(*tps)
        ends = await c.end_offsets(tps)
        live: dict[bytes, bool] = {}
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and any([await c.position(tp) < ends[tp] for tp in tps]):
            for msgs in (await c.getmany(timeout_ms=500)).values():
                for m in msgs:
                    live[m.key] = m.value is not None
        return {k for k, alive in live.items() if alive}
    finally:
        await c.stop()


async def _seen_first(samples: Reader, load: Load, first: int) -> float:
    """The time (monotonic) the first training sample of a task produced after the wipe was seen."""
    await wait_for(lambda: set(load.tasks[first:]) & set(sample_ids(samples.values)), 60,
                   "a first sample after the wipe", every_s=0.05)
    return time.monotonic()


def register_copy(s: Settings) -> dict[str, Any]:
    """Save the current model of :data:`KEY` again as a new version, make it current; its model-updates value."""
    from app.registry.store import open_store
    from app.trainer.registry import update_message

    store = open_store(s)
    blob, record = store.load(KEY)
    saved = store.save(KEY, blob, fmt=record.format, features=list(record.features), params=dict(record.params),
                       metrics=dict(record.metrics), n_samples=record.n_samples)
    promoted = store.promote(KEY, saved.version)
    return {**update_message(promoted), "ts": time.time(), "onset_ts": None}


def worker_degraded(stack: Stack) -> dict[str, str]:
    return dict(get_json(stack.worker_url.replace("/metrics", "/readyz"))["degraded"])


async def redis_outage(stack: Stack, load: Load, server: RedisServer, outage_s: float = 10.0) -> Outcome:
    """Redis stops under the running processes (SIGKILL) and comes back ``outage_s`` later.

    During the outage: a model-updates message arrives (v2, registered before), a retrain is asked for
    (the RTT of every node doubled), the worker is SIGKILLed and started again, the extender restarted.
    Whole again = the worker and the extender serve the retrain's model (v3 or later) and nobody reports
    degraded. Lost = models the worker or the extender never served, plus pairs never counted; twice =
    pairs counted more than once (the worker was killed in the middle).
    """
    s = stack.settings
    assert stack.group is not None
    async with readers(s, "prediction-errors") as (errors,):
        await load.run(6)
        await wait_for(lambda: served_version(stack) >= (1, 1), 90, "v1 served by the worker and the extender")
        v2 = register_copy(s)
        await asyncio.sleep(1.5)  # appendfsync everysec: v2 is on disk before the outage
        server.stop()
        await produce(s, [("model-updates", v2)])
        degraded_running = await _degraded_within(stack, 10.0)
        load.rtt_scale = 2.0
        onset = time.time()
        await load.run(4)
        await produce(s, [("retrain-events", {"model_key": KEY, "reason": "drift", "cumulative_error": 1.0,
                                              "threshold": 0.5, "ts": time.time(), "onset_ts": onset})])
        worker = stack.group.children.pop("worker")
        worker.send_signal(signal.SIGKILL)
        worker.wait(10)
        stack.worker_url = start_worker(stack.group, s, "worker-2")
        degraded_started = await _degraded_within(stack, 15.0)
        stack.group.children.pop("extender").send_signal(signal.SIGTERM)
        stack.start_extender("extender-2")
        await wait_for(lambda: _ready(stack), 30, "the restarted extender ready without Redis")
        await wait_for(lambda: "running_view" in get_json(f"{stack.extender_url}/readyz").get("degraded", {}), 15,
                       "the extender reporting its running-pods view unreadable")
        ext_down = sorted(get_json(f"{stack.extender_url}/readyz").get("degraded", {}))
        server.start()
        up = time.monotonic()
        await load.run(2)
        await wait_for(lambda: served_version(stack) >= (3, 3), 120, "v3 served by the worker and the extender")
        recover = time.monotonic() - up
        await wait_for(lambda: not worker_degraded(stack), 30, "the worker no longer degraded")
        await all_counted(errors, load, 60, stack)
        await asyncio.sleep(3.0)  # a double count would show by now
        pairs = counted(errors.values)
    ext = get_json(f"{stack.extender_url}/readyz")
    worker_v, ext_v = served_version(stack)
    return Outcome("Redis stopped and started under the processes", len(stack.dead()),
                   int(worker_v < 3) + int(ext_v < 3) + max(0, len(load.tasks) - pairs),
                   max(0, pairs - len(load.tasks)), recover,
                   f"degraded while down: running worker {sorted(degraded_running)}, restarted worker "
                   f"{sorted(degraded_started)}, restarted extender {ext_down}; after: extender degraded "
                   f"{ext.get('degraded')}, "
                   f"serving v{worker_v} (worker) v{ext_v} (extender)")


async def redis_wiped(stack: Stack, load: Load, server: RedisServer) -> Outcome:
    """Redis is SIGKILLed and comes back without its data (memory only): the registry is empty while the
    worker and the extender serve v1, and the version counter starts again at 1.

    Whole again = the trainer noticed (its registry check, ``RTT_REGISTRY_CHECK_S``), trained a model from its
    sample history and announced it as v2, and the worker and an extender started after the wipe serve it.
    Lost = processes that do not serve v2, plus pairs never counted; twice = pairs counted more than once.
    """
    s = stack.settings
    assert stack.group is not None
    async with readers(s, "prediction-errors") as (errors,):
        await load.run(6)
        await wait_for(lambda: served_version(stack) >= (1, 1), 90, "v1 served by the worker and the extender")
        server.stop()
        server.start()
        up = time.monotonic()
        await load.run(2)
        await wait_for(lambda: served_version(stack)[0] >= 2, 120, "v2 served by the worker")
        recover = time.monotonic() - up
        stack.group.children.pop("extender").send_signal(signal.SIGTERM)
        stack.start_extender("extender-2")  # reads model-updates from the start: v1 is gone, v2 is there
        await wait_for(lambda: served_version(stack) >= (2, 2), 60, "v2 served by an extender started after")
        await all_counted(errors, load, 60, stack)
        await asyncio.sleep(2.0)  # a double count would show by now
        pairs = counted(errors.values)
    worker_v, ext_v = served_version(stack)
    return Outcome("Redis restarted without its data (the registry empty)", len(stack.dead()),
                   int(worker_v < 2) + int(ext_v < 2) + max(0, len(load.tasks) - pairs),
                   max(0, pairs - len(load.tasks)), recover,
                   f"the trainer's registry check trained and announced v{worker_v}; served by the worker and an "
                   f"extender started after the wipe (v{ext_v})")


async def _degraded_within(stack: Stack, timeout_s: float) -> dict[str, str]:
    with contextlib.suppress(AssertionError):
        await wait_for(lambda: "model_store" in worker_degraded(stack), timeout_s, "the worker degraded")
    return worker_degraded(stack)


def _ready(stack: Stack) -> bool:
    try:
        return bool(get_json(f"{stack.extender_url}/readyz").get("ready"))
    except OSError:
        return False
