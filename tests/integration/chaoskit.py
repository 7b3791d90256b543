"""The whole system under faults: a broker, worker, trainer and extender as real processes, and a scripted load.

Used by the fault tests (``tests/integration/test_fault_*.py``) and by ``bench/bench_chaos.py``, which
prints the chaos table. A :class:`Stack` runs on its own embedded broker (so a test may kill it) and,
when asked, its own redis-server (so a test may stop it). :class:`Load` plays the cluster: one node per
partition, snapshots and tasks with predictions, counting what it produced so a scenario can say what was
lost or counted twice.

What a scenario reports (:class:`Outcome`): processes that died, messages lost (produced after the fault
and never processed), counted twice, and seconds from the end of the fault to the system being whole
again (its criterion is the scenario's).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

import orjson
import redis
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from feedbackkit import Reader, prediction, produce, start_worker
from twokit import nodes_per_partition

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.contracts import contract, encode
from app.kafka.admin import ensure_topics
from app.kafka.client import client_options
from app.kafka.embedded import EmbeddedBroker, free_port
from app.streams.app import worker_topics

APP = "gCTF"
KEY = f"{APP}:gpu"


@dataclasses.dataclass
class Outcome:
    fault: str
    dead: int
    lost: int
    twice: int
    recover_s: float
    detail: str = ""

    def row(self) -> list[str]:
        return [self.fault, str(self.dead), str(self.lost), str(self.twice), f"{self.recover_s:.1f}", self.detail]


class RedisServer:
    """A redis-server of the test's own on a free port, stopped and started at will (data kept in memory
    only while it runs: a restart comes back empty unless ``persist``)."""

    def __init__(self, workdir: Path, persist: bool = True) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.persist = persist
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        exe = shutil.which("redis-server")
        assert exe is not None, "redis-server not installed"
        save = ["--save", "1 1", "--appendonly", "yes"] if self.persist else ["--save", "", "--appendonly", "no"]
        self._proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                                       str(self.workdir), *save], stdout=subprocess.DEVNULL,
                                      stderr=subprocess.DEVNULL, start_new_session=True)
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                assert time.monotonic() < deadline, "redis-server did not start"
                time.sleep(0.05)
        client.close()
        return self

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # an outage, not a shutdown: nothing flushed now
            proc.wait(5)


@dataclasses.dataclass
class Stack:
    """One deployment on its own broker: worker, trainer and extender subprocesses."""

    root: Path
    redis_url: str = ""
    worker_env: dict[str, str] = dataclasses.field(default_factory=dict)
    broker: EmbeddedBroker | None = None
    group: ProcessGroup | None = None
    s: Settings | None = None
    worker_url: str = ""
    extender_url: str = ""
    extender_name: str = "extender"

    def start(self, *, trainer: bool = True, extender: bool = True) -> Stack:
        self.broker = EmbeddedBroker().start()
        self.s = Settings.from_env({}, kafka_bootstrap=self.broker.bootstrap, topic_prefix="chaos-",
                                   models_dir=str(self.root / "models"), redis_url=self.redis_url,
                                   error_period_s=1.0, retrain_debounce_s=2.0, join_ttl_s=600.0)
        self.create_topics()
        self.group = ProcessGroup(self.root / "logs", {"RTT_COLD_START_SAMPLES": "60", "RTT_RETRY_MAX_BACKOFF_S": "2"})
        self.worker_url = start_worker(self.group, self.s, "worker", **self.worker_env)
        if trainer:
            self.start_trainer()
        if extender:
            self.start_extender()
        return self

    def env(self) -> dict[str, str]:
        s = self.settings
        return {"RTT_KAFKA_BOOTSTRAP": s.bootstrap_servers, "RTT_TOPIC_PREFIX": s.topic_prefix,
                "RTT_MODELS_DIR": s.models_dir, "REDIS_URL": s.redis_url}

    def start_trainer(self) -> None:
        assert self.group is not None
        self.group.start("trainer", ["trainer", "--margin", "0"], env={**self.env(), "RTT_METRICS_PORT": "0"})

    def start_extender(self, name: str = "extender") -> None:
        assert self.group is not None
        port = free_port()
        self.group.start(name, ["extender", "--host", "127.0.0.1", "--port", str(port), "--no-publish"],
                         env=self.env())
        self.extender_url, self.extender_name = f"http://127.0.0.1:{port}", name
        self.group.wait_http(name, f"{self.extender_url}/healthz", 40)

    @property
    def settings(self) -> Settings:
        assert self.s is not None
        return self.s

    def create_topics(self) -> None:
        asyncio.run(ensure_topics(self.settings, worker_topics(self.settings)))

    def pids(self) -> list[int]:
        assert self.group is not None
        return [p.pid for p in self.group.children.values() if p.poll() is None]

    def dead(self) -> list[str]:
        assert self.group is not None
        return [name for name, p in self.group.children.items() if p.poll() is not None]

    async def wipe_broker(self) -> float:
        """SIGKILL the memory-only broker and start it again empty on the same port, then recreate every topic.

        Tansu creates a topic (with 4 partitions) the moment any client asks about it, so the processes are
        paused (SIGSTOP) across the restart and the topics come from topics/ first — as on a Kafka with
        ``auto.create.topics.enable=false``. Returns the time the broker was back.
        """
        assert self.broker is not None
        pids = self.pids()
        for pid in pids:
            os.killpg(pid, signal.SIGSTOP)
        try:
            self.broker.kill()
            await asyncio.to_thread(self.broker.start)
            await ensure_topics(self.settings, worker_topics(self.settings))
        finally:
            for pid in pids:
                os.killpg(pid, signal.SIGCONT)
        return time.monotonic()

    def stop(self) -> None:
        if self.group is not None:
            self.group.stop()
        if self.broker is not None:
            self.broker.stop()


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback URL built here
        return str(resp.read().decode())


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 if none)."""
    from e2ekit import samples

    return float(sum(samples(text, name, **labels)))


def get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback URL built here
        return dict(orjson.loads(resp.read()))


class Load:
    """Scripted cluster: one GPU node per partition; each task gets a prediction and, later, a completion."""

    def __init__(self, s: Settings, seed: int = 1, rtt_scale: float = 1.0) -> None:
        self.s = s
        self.rng = random.Random(seed)
        self.nodes = nodes_per_partition(contract("node-metrics").partitions, prefix="chaos-gpu-")
        self.util = {n: 20.0 + 8.0 * i for i, n in enumerate(self.nodes)}
        self.rtt_scale = rtt_scale
        self.tasks: list[str] = []  # task ids whose completion was produced (ok)
        self.snapshots = 0
        self._seq = 0

    def rtt(self, node: str) -> float:
        return 200.0 * (1.0 + self.util[node] / 40.0) * self.rtt_scale * self.rng.gauss(1.0, 0.02)

    async def round(self, tasks_per_node: int = 2) -> None:
        """One second of cluster: a snapshot of every node, ``tasks_per_node`` tasks on each."""
        now = time.time()
        items: list[tuple[str, dict[str, Any]]] = []
        for n in self.nodes:
            util = self.util[n] + self.rng.uniform(-2, 2)
            items.append(("node-metrics", {"node": n, "ts": now, "node_class": "gpu", "gpu_model": "Tesla M40",
                                           "metrics": {"nvidia_smi_utilization_gpu": util,
                                                       "cpu_iowait": self.rng.uniform(0, 1)}}))
            self.snapshots += 1
            for _ in range(tasks_per_node):
                self._seq += 1
                tid = f"chaos-{self._seq}"
                rtt = self.rtt(n)
                items.append(("rtt-predictions", prediction(tid, APP, n, now - 1.0, rtt * 1.05)))
                items.append(("task-completions", {"task_id": tid, "app": APP, "node": n, "submitted_ts": now - 1.1,
                                                   "started_ts": now - 1.0, "finished_ts": now - 1.0 + rtt / 1000,
                                                   "rtt_ms": rtt, "status": "ok", "input_size_mb": 64.0}))
                self.tasks.append(tid)
        await produce(self.s, items)

    async def run(self, seconds: float, tasks_per_node: int = 2) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            await self.round(tasks_per_node)
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))


async def retrain_event(s: Settings, reason: str = "drift") -> None:
    """Ask the trainer for a retrain of :data:`KEY` now (as a worker's drift detector would)."""
    await produce(s, [("retrain-events", {"model_key": KEY, "reason": reason, "cumulative_error": 1.0,
                                          "threshold": 0.5, "ts": time.time(), "onset_ts": None})])


def served_version(stack: Stack) -> tuple[int, int]:
    """The version of :data:`KEY` the worker predicts with, and the newest the extender installed (from its log)."""
    text = scrape(stack.worker_url)
    worker = int(metric(text, "rtt_worker_model_version", model_key=KEY))
    assert stack.group is not None
    log = (stack.group.log_dir / f"{stack.extender_name}.log").read_text(errors="replace")
    versions = [int(line.split(f"model {KEY} v")[1].split()[0]) for line in log.splitlines()
                if f"model {KEY} v" in line and "installed" in line]
    return worker, max(versions, default=0)


async def wait_for(check: Any, timeout_s: float, what: str, every_s: float = 0.25) -> float:
    """Poll ``check()`` (sync or async) until truthy; seconds waited."""
    t0 = time.monotonic()
    while True:
        got = check()
        if asyncio.iscoroutine(got):
            got = await got
        if got:
            return time.monotonic() - t0
        if time.monotonic() - t0 > timeout_s:
            raise AssertionError(f"{what} not within {timeout_s:.0f} s")
        await asyncio.sleep(every_s)


@contextlib.asynccontextmanager
async def readers(s: Settings, *topics: str) -> Any:
    async with contextlib.AsyncExitStack() as stack:
        yield [await stack.enter_async_context(Reader(s, t)) for t in topics]


def counted(errors: list[dict[str, Any]]) -> int:
    return sum(v["apps"][APP]["n"] for v in errors if APP in v["apps"])


def sample_ids(values: list[dict[str, Any]]) -> list[str]:
    return [v["task_id"] for v in values]


async def drained(stack: Stack, produced_snapshots: int) -> None:
    """Wait until the worker processed every snapshot produced so far (and its join caught up)."""
    def done() -> bool:
        text = scrape(stack.worker_url)
        return metric(text, "rtt_worker_messages_in_total", topic="node-metrics") >= produced_snapshots

    await wait_for(done, 60, "the worker reading every snapshot")


async def broker_wipe(stack: Stack, load: Load, pause_s: float = 2.0) -> Outcome:
    """The broker loses everything mid-stream and comes back empty; topics recreated from topics/.

    Before: v1 of :data:`KEY` served everywhere. After: the load goes on (after ``pause_s``), a retrain is
    asked for. Lost = tasks completed after the wipe without a training sample or a counted pair, and
    snapshots after the wipe the worker never read; twice = pairs counted beyond the tasks.
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
    async with readers(s, "training-samples", "prediction-errors") as (samples, errors):
        t_load = time.monotonic()
        await load.run(8)
        after = set(load.tasks[first:])
        await retrain_event(s)
        seen = await _seen_first(samples, after, t_load)
        with contextlib.suppress(AssertionError):
            await wait_for(lambda: after <= set(sample_ids(samples.values)), 60, "every task's sample after the wipe")
        with contextlib.suppress(AssertionError):
            await wait_for(lambda: counted(errors.values) >= len(after), 30, "every pair after the wipe counted")
        await wait_for(lambda: served_version(stack) >= (2, 2), 120, "v2 served by the worker and the extender")
        await asyncio.sleep(3.0)  # a double count would show by now
        got = sample_ids(samples.values)
        read_after = metric(scrape(stack.worker_url), "rtt_worker_messages_in_total", topic="node-metrics")
        resets = metric(scrape(stack.worker_url), "rtt_kafka_position_resets_total")
        pairs = counted(errors.values)
    lost_tasks = len(after - set(got))
    lost_pairs = max(0, len(after) - pairs)
    lost_snaps = max(0, (load.snapshots - snaps_before) - int(read_after - read_before))
    twice = max(0, pairs - len(after)) + (len(got) - len(set(got)))
    return Outcome("broker wiped and restarted (memory-only), topics recreated", len(stack.dead()),
                   lost_tasks + lost_pairs + lost_snaps, twice, seen - back,
                   f"worker position resets {resets:.0f}; v2 served in worker and extender; load resumed "
                   f"{pause_s:g} s after the broker")


async def _seen_first(samples: Reader, tasks: set[str], since: float) -> float:
    """The time (monotonic) the first training sample of ``tasks`` was seen."""
    await wait_for(lambda: tasks & set(sample_ids(samples.values)), 60, "a first sample after the wipe", every_s=0.05)
    return time.monotonic()


def register_copy(s: Settings) -> dict[str, Any]:
    """Save the current model of :data:`KEY` again as a new version, make it current; its model-updates value."""
    from app.model.registry import open_store
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
        server.start()
        up = time.monotonic()
        await load.run(2)
        await wait_for(lambda: served_version(stack) >= (3, 3), 120, "v3 served by the worker and the extender")
        recover = time.monotonic() - up
        await wait_for(lambda: not worker_degraded(stack), 30, "the worker no longer degraded")
        await wait_for(lambda: counted(errors.values) >= len(load.tasks), 60, "every pair counted")
        await asyncio.sleep(3.0)  # a double count would show by now
        pairs = counted(errors.values)
    ext = get_json(f"{stack.extender_url}/readyz")
    worker_v, ext_v = served_version(stack)
    return Outcome("Redis stopped and started under the processes", len(stack.dead()),
                   int(worker_v < 3) + int(ext_v < 3) + max(0, len(load.tasks) - pairs),
                   max(0, pairs - len(load.tasks)), recover,
                   f"degraded while down: running worker {sorted(degraded_running)}, restarted worker "
                   f"{sorted(degraded_started)}; after: extender degraded {ext.get('degraded')}, "
                   f"serving v{worker_v} (worker) v{ext_v} (extender)")


async def _degraded_within(stack: Stack, timeout_s: float) -> dict[str, str]:
    with contextlib.suppress(AssertionError):
        await wait_for(lambda: "model_store" in worker_degraded(stack), timeout_s, "the worker degraded")
    return worker_degraded(stack)


def _ready(stack: Stack) -> bool:
    try:
        return bool(get_json(f"{stack.extender_url}/readyz").get("ready"))
    except OSError:
        return False


# -- SIGKILL right at period close ------------------------------------------------------------------------
KILL_NODES = [f"gpu-k{i:03d}" for i in range(300)]


def kill_wave(k: int, t0: float) -> list[tuple[str, dict[str, Any]]]:
    """One pair per node: its prediction, then its completion."""
    rng = random.Random(k)
    items: list[tuple[str, dict[str, Any]]] = []
    for n in KILL_NODES:
        tid = f"w{k}-{n}"
        rtt = rng.uniform(100.0, 300.0)
        items.append(("rtt-predictions", prediction(tid, APP, n, t0, rtt * 1.1)))
        items.append(("task-completions", {"task_id": tid, "app": APP, "node": n, "submitted_ts": t0 - 0.01,
                                           "started_ts": t0, "finished_ts": t0 + rtt / 1000, "rtt_ms": rtt,
                                           "status": "ok"}))
    return items


async def _one_life(s: Settings, group: ProcessGroup, name: str, waves: range, t0: float,
                    errors: Reader, kill: bool) -> float:
    """A worker's life: start it, feed ``waves``; with ``kill``, SIGKILL it the moment the first message of a
    period arrives (the rest of that period is being sent). Returns when it was killed."""
    start_worker(group, s, name)
    pid = group.children[name].pid
    for k in waves:
        await produce(s, kill_wave(k, t0))
        await asyncio.sleep(0.3)
    if not kill:
        return 0.0
    before = len(errors.values)
    while len(errors.values) == before:
        await asyncio.sleep(0.005)
    os.kill(pid, signal.SIGKILL)
    group.children.pop(name).wait(10)
    return time.monotonic()


async def period_kill(s: Settings, root: Path, waves: int = 12) -> tuple[Outcome, list[dict[str, Any]]]:
    """300 nodes' pairs; the worker SIGKILLed twice right at period close. Lost / twice = pairs never / more
    than once in prediction-errors; recover = from the second kill to the last pair reported."""
    async with Reader(s, "prediction-errors") as errors:
        errors.poll_ms = 20
        with ProcessGroup(root) as group:
            third = waves - 2 * (waves // 3)
            await _one_life(s, group, "first", range(0, waves // 3), time.time(), errors, kill=True)
            killed = await _one_life(s, group, "second", range(waves // 3, 2 * (waves // 3)), time.time(), errors,
                                     kill=True)
            await _one_life(s, group, "third", range(waves - third, waves), time.time(), errors, kill=False)
            total = waves * len(KILL_NODES)
            await errors.wait(lambda v: counted(v) >= total, 90.0, "every pair reported")
            recover = time.monotonic() - killed
            await asyncio.sleep(3 * s.error_period_s)  # a repeat would show up by now
            dead = [n for n, p in group.children.items() if p.poll() is not None]
        values = list(errors.values)
    pairs = counted(values)
    idents = [(v["node"], v["ts"]) for v in values]
    return Outcome("worker SIGKILLed right at period close (twice)", len(dead), max(0, total - pairs),
                   max(0, pairs - total) + len(idents) - len(set(idents)), recover,
                   f"{total} pairs on {len(KILL_NODES)} nodes, {len(values)} messages"), values


# -- hostile input -------------------------------------------------------------------------------------------
CAP_NODES, CAP_APPS = 1000, 8


def snap(node: str, ts: float, util: float = 30.0) -> dict[str, Any]:
    return {"node": node, "ts": ts, "node_class": "gpu", "gpu_model": "Tesla M40",
            "metrics": {"nvidia_smi_utilization_gpu": util, "cpu_iowait": 0.2}}


def completion(task: str, node: str, app: str) -> dict[str, Any]:
    now = time.time()
    return {"task_id": task, "app": app, "node": node, "submitted_ts": now - 2, "started_ts": now - 1.5,
            "finished_ts": now - 0.5, "rtt_ms": 1000.0, "status": "ok"}


async def send_raw(s: Settings, topic: str, items: list[tuple[bytes | None, dict[str, Any]]]) -> None:
    p = AIOKafkaProducer(**client_options(s))
    await p.start()
    try:
        for key, value in items:
            await p.send(s.topic(topic), encode(topic, value), key=key)
        await p.flush()
    finally:
        await p.stop()


class RawReader:
    """node-features with tombstones (value None), by key."""

    def __init__(self, s: Settings, topic: str) -> None:
        self.s, self.topic = s, topic
        self.records: list[tuple[str, dict[str, Any] | None]] = []
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> RawReader:
        c = AIOKafkaConsumer(**client_options(self.s, group_id=None, auto_offset_reset="earliest"))
        await c.start()
        c.assign([TopicPartition(self.s.topic(self.topic), p) for p in range(contract(self.topic).partitions)])

        async def run() -> None:
            try:
                while True:
                    for msgs in (await c.getmany(timeout_ms=200)).values():
                        self.records += [(m.key.decode(), orjson.loads(m.value) if m.value else None) for m in msgs]
            finally:
                await c.stop()

        self._task = asyncio.get_running_loop().create_task(run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def _until(check: Any, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"{what} not within {timeout_s} s"
        await asyncio.sleep(0.25)




async def hostile_input(s: Settings, root: Path) -> tuple[Outcome, dict[str, Any]]:
    """Keys that lie, far-future / far-past timestamps, a clock jump, 10k node names, 20 apps, then silence."""
    with ProcessGroup(root) as group:
        url = start_worker(group, s, "worker", RTT_WORKER_MAX_NODES=str(CAP_NODES), RTT_WORKER_MAX_APPS=str(CAP_APPS),
                           RTT_NODE_EVICT_AFTER_S="6")
        pid = group.children["worker"].pid

        async def scenario() -> dict[str, Any]:
            async with Reader(s, "dead-letters") as dead, RawReader(s, "node-features") as feats, \
                    RawReader(s, "node-weights") as weights:
                now = time.time()
                # keys that lie
                await send_raw(s, "node-metrics", [(b"gpu-liar-2", snap("gpu-liar-1", now))])
                await send_raw(s, "task-completions", [(None, completion("t-nokey", "gpu-liar-1", "gCTF"))])
                # far future, far past, then valid snapshots of the same node
                await produce(s, [("node-metrics", snap("gpu-future", 9.9e10)),
                                  ("node-metrics", snap("gpu-future", now - 2 * 86_400))])
                valid_at = time.monotonic()
                await produce(s, [("node-metrics", snap("gpu-future", time.time() + 0.1 * k, util=55.0))
                                  for k in range(5)])
                # a node's clock 200 s ahead (within the skew), then right again
                await produce(s, [("node-metrics", snap("gpu-jump", time.time() + 200 + 0.1 * k)) for k in range(3)])
                await asyncio.sleep(1.5)
                await produce(s, [("node-metrics", snap("gpu-jump", time.time() + 0.1 * k, util=77.0))
                                  for k in range(3)])
                await _until(lambda: any(k == "gpu-future" and v and v["ts"] < now + 60 for k, v in feats.records),
                             30, "node-features of gpu-future after its far-future snapshot")
                future_recover_s = time.monotonic() - valid_at
                await _until(lambda: any(k == "gpu-jump" and v and v["ts"] < now + 60 for k, v in feats.records),
                             30, "node-features of gpu-jump after its clock came back")
                text = scrape(url)
                out: dict[str, Any] = {"clock_resets": metric(text, "rtt_worker_clock_resets_total"),
                                       "future_recover_s": future_recover_s}
                # 10,000 node names, and 20 app names
                rss0 = rss_kb(pid)
                t = time.time()
                await produce(s, [("node-metrics", snap(f"n{i:05d}", t)) for i in range(10_000)])
                await produce(s, [("task-completions", completion(f"t-app-{a}", "gpu-future", f"app{a:02d}"))
                                  for a in range(20)])
                await _until(lambda: metric(scrape(url), "rtt_worker_dead_letters_total", topic="node-metrics",
                                            reason="node_cap") >= 10_000 - CAP_NODES, 60, "node_cap dead letters")
                await asyncio.sleep(2.5)  # a node-weights period with every held node in it
                text = scrape(url)
                out.update(nodes=metric(text, "rtt_worker_nodes"), rss_growth_kb=rss_kb(pid) - rss0,
                           weight_series=text.count("rtt_worker_node_weight{"),
                           app_cap=metric(text, "rtt_worker_dead_letters_total", reason="app_cap"))
                # silence: every node is evicted
                await _until(lambda: metric(scrape(url), "rtt_worker_nodes") == 0, 40, "every node evicted")
                await asyncio.sleep(1.0)
                text = scrape(url)
                last = {k: v for k, v in feats.records} | {f"w:{k}": v for k, v in weights.records}
                out["alive_after"] = sorted(k for k, v in last.items() if v is not None)
                out.update(weight_series_after=text.count("rtt_worker_node_weight{"),
                           evicted=metric(text, "rtt_worker_evicted_total", kind="node"),
                           tombstones={k for k, v in feats.records if v is None})
                out["dead"] = {(d["reason"], d["topic"].removeprefix(s.topic_prefix)) for d in dead.values}
                out["dead_n"] = len(dead.values)
                return out

        r = await scenario()
        r["dead_processes"] = [n for n, p in group.children.items() if p.poll() is not None]
    dead_letters = {"key_mismatch", "ts_in_future", "ts_too_old"} - {reason for reason, _ in r["dead"]}
    lost = len(dead_letters) + int(r["clock_resets"] != 1) + int(r["weight_series_after"] != 0) + len(r["alive_after"])
    return Outcome("hostile input: lying keys, ts 9.9e10 / 2 days old, clock jump, 10k node names",
                   len(r["dead_processes"]), lost, 0, r["future_recover_s"],
                   f"held {r['nodes']:.0f} of 10,000 names (cap {CAP_NODES}), RSS +{r['rss_growth_kb'] / 1024:.0f}"
                   f" MB, {r['weight_series']} weight series, then all evicted ({r['evicted']:.0f})"), r
