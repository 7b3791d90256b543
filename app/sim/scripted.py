"""A scripted cluster that drives a running worker from outside, over Kafka (integration tests and benches).

Nodes with a known RTT law (:class:`Node`, :func:`rtt_ms`) and the messages they would cause
(:func:`snapshot`, :func:`task`, :func:`prediction`); :func:`produce` (many items at once, large batches) and
:class:`Sender` (one by one, contract-checked) write them keyed as their contracts say; :class:`Reader`
follows a topic from its beginning; :func:`start_worker` starts ``rttsched worker`` as a child of a
:class:`~app.cli.processes.ProcessGroup`, and :func:`metric_value` reads one figure of its ``/metrics`` page
(:func:`samples`: every sample of a name, by labels, read with a regular expression — never with the code
under test). :func:`nodes_per_partition` names one node per partition.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import random
import re
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Protocol

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.partitioner import murmur2

from app.config import Settings
from app.contracts import contract, encode
from app.kafka.client import client_options
from app.kafka.embedded import free_port


class Children(Protocol):
    """What :func:`start_worker` needs of :class:`app.cli.processes.ProcessGroup`."""

    log_dir: Path

    def start(self, name: str, args: Sequence[str], env: Mapping[str, str] | None = None) -> Any: ...

    def wait_http(self, name: str, url: str, timeout_s: float = 60.0) -> None: ...


def start_worker(group: Children, s: Settings, name: str = "worker", **env: str) -> str:
    """Start ``rttsched worker`` on ``s``'s broker and prefix; its /metrics URL once it runs (``/readyz`` 200, from
    Faust's web server: while the worker waits for Kafka at start its port answers ``/metrics`` too, ``/readyz``
    503)."""
    port = free_port()
    group.start(name, ["worker", "--session-timeout-s", "6", "--datadir", str(group.log_dir / "faust")], env={
        "RTT_KAFKA_BOOTSTRAP": s.bootstrap_servers, "RTT_TOPIC_PREFIX": s.topic_prefix,
        "RTT_METRICS_PORT": str(port), "RTT_FEATURE_EMIT_INTERVAL_S": "0.5", "RTT_MODELS_DIR": s.models_dir,
        "REDIS_URL": s.redis_url, "RTT_ERROR_PERIOD_S": str(s.error_period_s),
        "RTT_RETRAIN_DEBOUNCE_S": str(s.retrain_debounce_s), "RTT_JOIN_TTL_S": str(s.join_ttl_s), **env,
    })
    url = f"http://127.0.0.1:{port}/metrics"
    group.wait_http(name, f"http://127.0.0.1:{port}/readyz", timeout_s=40)
    return url


class Reader:
    """Reads one topic from the beginning (every partition, no group) in the background.

    A tombstone (a key without value: the worker's eviction sends them on node-features and node-weights) is
    not a value: its key goes to :attr:`tombstones`, and reading goes on.
    """

    def __init__(self, s: Settings, topic: str, on_value: Callable[[dict[str, Any]], None] | None = None) -> None:
        self.s, self.topic = s, topic
        self.values: list[dict[str, Any]] = []
        self.tombstones: list[bytes | None] = []
        self.on_value = on_value
        self.poll_ms = 200
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Reader:
        c = AIOKafkaConsumer(**client_options(self.s, auto_offset_reset="earliest", enable_auto_commit=False,
                                              group_id=None, fetch_max_wait_ms=100))
        await c.start()
        name = self.s.topic(self.topic)
        c.assign([TopicPartition(name, p) for p in range(contract(self.topic).partitions)])
        self._task = asyncio.get_running_loop().create_task(self._run(c))
        return self

    async def _run(self, c: AIOKafkaConsumer) -> None:
        try:
            while True:
                batch = await c.getmany(timeout_ms=self.poll_ms)
                for msgs in batch.values():
                    for m in msgs:
                        if m.value is None:
                            self.tombstones.append(m.key)
                            continue
                        v = orjson.loads(m.value)
                        self.values.append(v)
                        if self.on_value is not None:
                            self.on_value(v)
        finally:
            await c.stop()

    def state(self) -> str:
        """``reading``, or how its background read ended (``stopped: <error>``)."""
        task = self._task
        if task is None:
            return "not started"
        if not task.done():
            return "reading"
        return "cancelled" if task.cancelled() else f"stopped: {task.exception()!r}"

    async def __aexit__(self, *exc: object) -> None:
        if self._task is None:
            return
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task

    async def wait(self, done: Callable[[list[dict[str, Any]]], Any], timeout_s: float, what: str = "") -> Any:
        deadline = time.monotonic() + timeout_s
        while not (result := done(self.values)):
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{self.topic}: {what} not seen in {timeout_s}s: {self.values[-3:]}")
            await asyncio.sleep(0.1)
        return result


def key_of(topic: str, value: dict[str, Any]) -> bytes:
    """The message key of ``value`` on ``topic``, as its contract says (the model key or the node)."""
    return str(value["model_key"] if contract(topic).key == "model key" else value["node"]).encode()


async def produce(s: Settings, items: list[tuple[str, dict[str, Any]]]) -> float:
    """Produce many ``(topic, value)`` items fast (large batches, no contract check); seconds taken."""
    p = AIOKafkaProducer(**client_options(s, linger_ms=20, max_batch_size=256 * 1024))
    await p.start()
    t0 = time.perf_counter()
    try:
        for i, (topic, value) in enumerate(items):
            await p.send(s.topic(topic), encode(topic, value, check=False), key=key_of(topic, value))
            if i % 5000 == 0:
                await asyncio.sleep(0)
        await p.flush()
    finally:
        await p.stop()
    return time.perf_counter() - t0


class Sender:
    def __init__(self, s: Settings) -> None:
        self.s = s
        self.p = AIOKafkaProducer(**client_options(s, linger_ms=5))

    async def __aenter__(self) -> Sender:
        await self.p.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.p.stop()

    async def send(self, topic: str, value: dict[str, Any]) -> None:
        await self.p.send(self.s.topic(topic), encode(topic, value), key=key_of(topic, value))

    async def flush(self) -> None:
        await self.p.flush()


@dataclasses.dataclass
class Node:
    name: str
    gpu_model: str
    base_ms: float
    util: float = 20.0  # GPU utilisation, percent


def snapshot(node: Node, ts: float, rng: random.Random) -> dict[str, Any]:
    """One scrape of ``node`` as the bridge sends it: GPU utilisation a fraction (0..1), as the mapping scales it."""
    return {"node": node.name, "ts": ts, "node_class": "gpu", "gpu_model": node.gpu_model,
            "metrics": {"nvidia_smi_utilization_gpu": (node.util + rng.uniform(-2.0, 2.0)) / 100.0,
                        "cpu_iowait": rng.uniform(0.0, 1.0)}}


def rtt_ms(node: Node, rng: random.Random) -> float:
    """The RTT law of the scripted cluster: grows with GPU utilisation (2 % noise)."""
    return node.base_ms * (1.0 + node.util / 40.0) * rng.gauss(1.0, 0.02)


def task(task_id: str, app: str, node: Node, ts: float, rng: random.Random) -> dict[str, Any]:
    rtt = rtt_ms(node, rng)
    return {"task_id": task_id, "app": app, "node": node.name, "submitted_ts": ts - 0.01, "started_ts": ts,
            "finished_ts": ts + rtt / 1000.0, "rtt_ms": rtt, "status": "ok", "input_size_mb": 64.0}


def prediction(task_id: str, app: str, node: str, ts: float, predicted: float,
               version: int | None = None) -> dict[str, Any]:
    return {"task_id": task_id, "app": app, "node": node, "ts": ts, "predicted_rtt_ms": predicted,
            "model_version": version}


def metric_value(text: str, name: str) -> float:
    """A sample's value from a Prometheus exposition (0 if absent)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


_SAMPLE = re.compile(r"^([A-Za-z_:][A-Za-z0-9_:]*)(?:\{(.*)\})?\s+(\S+)(?:\s+\d+)?$")
_LABEL = re.compile(r'([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"')


def parse_line(line: str) -> tuple[str, dict[str, str], float] | None:
    """``(name, labels, value)`` of one sample line; None for comments and blank lines."""
    m = _SAMPLE.match(line.strip())
    if not m or line.startswith("#"):
        return None
    return m.group(1), dict(_LABEL.findall(m.group(2) or "")), float(m.group(3))


def samples(text: str, name: str, **labels: str) -> list[float]:
    """Values of ``name``'s samples whose labels include ``labels``, in the order of the text."""
    out = []
    for line in text.splitlines():
        parsed = parse_line(line)
        if parsed and parsed[0] == name and all(parsed[1].get(k) == v for k, v in labels.items()):
            out.append(parsed[2])
    return out


def nodes_per_partition(partitions: int, prefix: str = "gpu-") -> list[str]:
    """One node name per partition (the default key partitioner's murmur2), in partition order.

    >>> names = nodes_per_partition(8)
    >>> [(murmur2(n.encode()) & 0x7FFFFFFF) % 8 for n in names]
    [0, 1, 2, 3, 4, 5, 6, 7]
    """
    found: dict[int, str] = {}
    i = 0
    while len(found) < partitions:
        name = f"{prefix}{i:03d}"
        found.setdefault((murmur2(name.encode()) & 0x7FFFFFFF) % partitions, name)
        i += 1
    return [found[p] for p in range(partitions)]
