"""The whole system under faults: a broker, worker, trainer and extender as real processes, and a scripted load.

The scenarios built on it (``fault_outages.py``: broker wipe, Redis outage; ``fault_worker.py``: SIGKILL
at period close, hostile input) are run by the fault tests (``tests/integration/test_fault_*.py``) and by
``bench/bench_chaos.py``, which prints the chaos table. A :class:`Stack` runs on its own embedded broker
(so a test may kill it) and, when asked, its own redis-server (so a test may stop it). :class:`Load` plays
the cluster: one node per partition, snapshots and tasks with predictions, counting what it produced so a
scenario can say what was lost or counted twice.

What a scenario reports (:class:`Outcome`): processes that died, messages lost (produced after the fault
and never processed), counted twice, and seconds from the end of the fault to the system being whole
again (its criterion is the scenario's).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import os
import random
import shutil
import signal
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import redis
from aiokafka.admin import AIOKafkaAdminClient

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.contracts import contract
from app.kafka.admin import ensure_topics
from app.kafka.client import client_options
from app.kafka.embedded import EmbeddedBroker, free_port
from app.sim.scripted import Reader, nodes_per_partition, prediction, produce, samples, start_worker
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
    only while it runs: a restart comes back empty unless ``persist``; ``password`` makes it ask for one, which
    ``url`` leaves out, as ``REDIS_URL`` does beside ``RTT_REDIS_PASSWORD_FILE``)."""

    def __init__(self, workdir: Path, persist: bool = True, password: str = "") -> None:
        self.port = free_port()
        self.workdir = workdir
        self.persist = persist
        self.password = password
        self._proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisServer:
        """Start it and wait until it answers (10 s at most; RuntimeError, with the process killed, if not)."""
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server not found: apt-get install redis-server, or set REDIS_URL")
        save = ["--save", "1 1", "--appendonly", "yes"] if self.persist else ["--save", "", "--appendonly", "no"]
        auth = ["--requirepass", self.password] if self.password else []
        proc = self._proc = subprocess.Popen([exe, "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                                              str(self.workdir), *save, *auth], stdout=subprocess.DEVNULL,
                                             stderr=subprocess.DEVNULL, start_new_session=True)
        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password or None)
        deadline = time.monotonic() + 10
        try:
            while True:
                try:
                    client.ping()
                    return self
                except redis.ConnectionError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        self.stop()
                        raise RuntimeError("redis-server did not start") from None
                    time.sleep(0.05)
        finally:
            client.close()

    def stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # an outage, not a shutdown: nothing flushed now
            proc.wait(5)

    def freeze(self) -> None:
        """SIGSTOP it: connections are still accepted (by the kernel), nothing is answered."""
        assert self._proc is not None
        os.killpg(self._proc.pid, signal.SIGSTOP)

    def thaw(self) -> None:
        assert self._proc is not None
        os.killpg(self._proc.pid, signal.SIGCONT)


@dataclasses.dataclass
class Stack:
    """One deployment on its own broker: worker, trainer and extender subprocesses."""

    root: Path
    redis_url: str = ""
    worker_env: dict[str, str] = dataclasses.field(default_factory=dict)
    trainer_env: dict[str, str] = dataclasses.field(default_factory=dict)
    broker: EmbeddedBroker | None = None
    group: ProcessGroup | None = None
    s: Settings | None = None
    worker_url: str = ""
    extender_url: str = ""
    extender_name: str = "extender"

    def start(self, *, trainer: bool = True, extender: bool = True) -> Stack:
        """Start the broker, then the worker, trainer and extender, each ready before the next; when one of
        them fails (or the start is interrupted) what was already started is stopped before the error goes on:
        each runs in a session of its own, so nothing else would ever stop it."""
        try:
            broker = self.broker = EmbeddedBroker()  # kept before it starts: stop() reaches a half-started one
            broker.start()
            self.s = Settings.from_env({}, kafka_bootstrap=broker.bootstrap, topic_prefix="chaos-",
                                       models_dir=str(self.root / "models"), redis_url=self.redis_url,
                                       error_period_s=1.0, retrain_debounce_s=2.0, join_ttl_s=600.0)
            self.create_topics()
            # growth retrains off: the versions a scenario announces are the only ones besides v1 (cold start)
            # and the retrains it asks for, so "v2" is newer than whatever the processes serve when it is announced
            self.group = ProcessGroup(self.root / "logs", {"RTT_COLD_START_SAMPLES": "60",
                                                           "RTT_RETRY_MAX_BACKOFF_S": "2", "RTT_RETRAIN_GROWTH": "0"})
            self.worker_url = start_worker(self.group, self.s, "worker", **self.worker_env)
            if trainer:
                self.start_trainer()
            if extender:
                self.start_extender()
        except BaseException:
            self.stop()
            raise
        return self

    def env(self) -> dict[str, str]:
        s = self.settings
        return {"RTT_KAFKA_BOOTSTRAP": s.bootstrap_servers, "RTT_TOPIC_PREFIX": s.topic_prefix,
                "RTT_MODELS_DIR": s.models_dir, "REDIS_URL": s.redis_url}

    def start_trainer(self) -> None:
        assert self.group is not None
        self.group.start("trainer", ["trainer", "--margin", "0"],
                         env={**self.env(), "RTT_METRICS_PORT": "0", **self.trainer_env})

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


@contextlib.contextmanager
def stack_on_redis(root: Path, *, persist: bool = True,
                   trainer_env: dict[str, str] | None = None) -> Iterator[tuple[Stack, RedisServer]]:
    """A :class:`RedisServer` of its own (under ``root/redis``) and a :class:`Stack` using it, both started;
    both stopped on leaving, whichever start or step failed."""
    (root / "redis").mkdir(parents=True, exist_ok=True)
    server = RedisServer(root / "redis", persist=persist)
    stack = Stack(root, redis_url=server.url, trainer_env=dict(trainer_env or {}))
    with contextlib.ExitStack() as cleanup:
        cleanup.callback(server.stop)
        server.start()
        cleanup.callback(stack.stop)
        stack.start()
        yield stack, server


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback URL built here
        return str(resp.read().decode())


def metric(text: str, name: str, **labels: str) -> float:
    """Sum of the samples of ``name`` whose labels include ``labels`` (0 if none)."""
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
        self.quiet: set[str] = set()  # nodes that report metrics and run no task
        self.tasks: list[str] = []  # task ids whose completion was produced (ok)
        self.per_node: collections.Counter[str] = collections.Counter()  # those tasks by node
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
                                           "metrics": {"nvidia_smi_utilization_gpu": util / 100.0,  # 0..1
                                                       "cpu_iowait": self.rng.uniform(0, 1)}}))
            self.snapshots += 1
            for _ in range(0 if n in self.quiet else tasks_per_node):
                self._seq += 1
                tid = f"chaos-{self._seq}"
                rtt = self.rtt(n)
                items.append(("rtt-predictions", prediction(tid, APP, n, now - 1.0, rtt * 1.05)))
                items.append(("task-completions", {"task_id": tid, "app": APP, "node": n, "submitted_ts": now - 1.1,
                                                   "started_ts": now - 1.0, "finished_ts": now - 1.0 + rtt / 1000,
                                                   "rtt_ms": rtt, "status": "ok", "input_size_mb": 64.0}))
                self.tasks.append(tid)
                self.per_node[n] += 1
        await produce(self.s, items)

    async def run(self, seconds: float, tasks_per_node: int = 2) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            t0 = time.monotonic()
            await self.round(tasks_per_node)
            await asyncio.sleep(max(0.0, 1.0 - (time.monotonic() - t0)))


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


def worker_warnings(stack: Stack, most: int = 40) -> str:
    """The last ``most`` WARNING and ERROR lines of the logs of ``stack``'s workers (``worker*.log``), oldest first."""
    lines: list[str] = []
    for path in sorted(stack.group.log_dir.glob("worker*.log")) if stack.group is not None else ():
        with contextlib.suppress(OSError):
            lines += [f"{path.stem}: {line}" for line in path.read_text(errors="replace").splitlines()
                      if "WARNING" in line or "ERROR" in line]
    return "; workers' warnings:\n" + "\n".join(lines[-most:]) if lines else ""


async def all_counted(errors: Reader, load: Load, timeout_s: float, stack: Stack | None = None) -> None:
    """Wait until prediction-errors counted every task ``load`` produced; else say which nodes are short of
    theirs, whether the reader still reads, which of ``stack``'s processes exited, what its worker joined
    in this life and the WARNING and ERROR lines of its workers' logs (the last 40)."""
    try:
        await wait_for(lambda: counted(errors.values) >= len(load.tasks), timeout_s, "every pair counted")
    except AssertionError as exc:
        got: collections.Counter[str] = collections.Counter()
        for v in errors.values:
            if APP in v["apps"]:
                got[v["node"]] += v["apps"][APP]["n"]
        short = {n: f"{got[n]}/{want}" for n, want in sorted(load.per_node.items()) if got[n] != want}
        joined = ""
        if stack is not None:
            joined = f"; exited: {stack.dead()}"
            with contextlib.suppress(OSError):
                text = scrape(stack.worker_url)
                outcomes = {o: metric(text, "rtt_worker_join_total", outcome=o)
                            for o in ("matched", "duplicate", "no_prediction", "expired")}
                joined += f"; the worker joined {outcomes}"
            joined += worker_warnings(stack)
        raise AssertionError(f"{exc}: {counted(errors.values)} of {len(load.tasks)} in {len(errors.values)} "
                             f"messages (reader {errors.state()}); counted/produced by node: {short}{joined}") from None


def sample_ids(values: list[dict[str, Any]]) -> list[str]:
    return [v["task_id"] for v in values]


async def drained(stack: Stack, produced_snapshots: int) -> None:
    """Wait until the worker processed every snapshot produced so far (and its join caught up)."""
    def done() -> bool:
        text = scrape(stack.worker_url)
        return metric(text, "rtt_worker_messages_in_total", topic="node-metrics") >= produced_snapshots

    await wait_for(done, 60, "the worker reading every snapshot")


async def recreate_topic(s: Settings, contract_name: str) -> None:
    """Delete a contract's topic and create it again, empty (as after the broker lost its data)."""
    admin = AIOKafkaAdminClient(**client_options(s))
    await admin.start()
    try:
        await admin.delete_topics([s.topic(contract_name)])
    finally:
        await admin.close()
    for _ in range(50):
        try:
            await ensure_topics(s)
            return
        except Exception:  # deletion still in progress
            await asyncio.sleep(0.2)
    await ensure_topics(s)
