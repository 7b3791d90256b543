"""Watch what the real system says during a live run: predictions, errors, weights, retrains, new models.

:class:`FeedbackWatcher` reads every partition of the feedback topics from the beginning (no consumer
group; the run's topics are fresh under its own prefix) in a background thread, and keeps what the live
report needs: the extender's predicted RTT per ``(task_id, node)`` (rtt-predictions), per node × app error
per period (prediction-errors), node credibility (node-weights), retrain-events and model-updates. Readers
in the simulator's thread only read counters and append-only lists.

Its read positions are checked as every consumer's are (:class:`~app.kafka.positions.PositionGuard`): a broker
that lost its data during the run (the embedded broker is memory-only), or a topic recreated under it, would
otherwise leave the watcher past the partition's new end, where the broker answers with nothing (Tansu) and
the first messages after the wipe would be skipped without a word; the partition is read again from its start
(``resets``; one WARNING each). A broker error is waited out.

A message is taken as the production consumers take it: one that breaks its contract, or whose key is not
its node (or model key) or missing, is counted in ``rejected``; a tombstone (no value: the worker's eviction
on node-weights; on model-updates a model is never deleted) in ``tombstones``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import OffsetOutOfRangeError
from prometheus_client import CollectorRegistry

from app.config import Settings
from app.contracts import contract, decode
from app.contracts.admission import check_key
from app.errors import ContractError
from app.kafka.client import client_options
from app.kafka.positions import PositionGuard
from app.sim.kafka_sink import LoopThread, SinkError

log = logging.getLogger(__name__)

WATCHED = ("rtt-predictions", "prediction-errors", "node-weights", "retrain-events", "model-updates")


class FeedbackWatcher:
    """Collect the feedback topics of one run; times are unix seconds as the messages carry them."""

    def __init__(self, settings: Settings, topics: tuple[str, ...] = WATCHED) -> None:
        self.settings = settings
        self.topics = topics
        self.predictions: dict[tuple[str, str], float] = {}  # (task_id, node) -> predicted RTT ms
        self.errors: list[tuple[float, str, float]] = []  # (ts, "node:app", mape)
        self.weights: list[tuple[float, str, float]] = []  # (ts, node, credibility)
        self.retrains: list[tuple[float, str, str]] = []  # (ts, model key, reason)
        self.models: list[tuple[float, str, int]] = []  # (ts, model key, version)
        self.rejected = 0
        self.tombstones = 0
        self._loop: LoopThread | None = None
        self._task: asyncio.Future[None] | None = None
        self._consumer: Any = None
        self._guard: PositionGuard | None = None

    def start(self, timeout_s: float = 20.0) -> FeedbackWatcher:
        if self._loop is not None:
            return self
        self._loop = LoopThread("feedback-watcher")
        try:
            self._loop.call(self._start(), timeout_s)
        except Exception as exc:
            self._loop.stop()
            self._loop = None
            raise SinkError(f"cannot consume from Kafka at {self.settings.bootstrap_servers}: {exc}") from exc
        return self

    async def _start(self) -> None:
        # "none": a position the broker calls out of range is reset by the guard, logged and counted
        consumer = AIOKafkaConsumer(**client_options(self.settings, group_id=None, enable_auto_commit=False,
                                                     auto_offset_reset="none"))
        await consumer.start()
        self._consumer = consumer
        self._guard = PositionGuard(consumer, "feedback-watcher", registry=CollectorRegistry())
        tps = [TopicPartition(self.settings.topic(t), p) for t in self.topics for p in range(contract(t).partitions)]
        consumer.assign(tps)
        await consumer.seek_to_beginning(*tps)
        self._task = asyncio.ensure_future(self._run())

    @property
    def resets(self) -> int:
        """Read positions found outside their partition and moved to its start."""
        return self._guard.resets if self._guard is not None else 0

    async def _run(self) -> None:
        names = {self.settings.topic(t): t for t in self.topics}
        guard = self._guard
        assert guard is not None
        while True:
            try:
                batches = await self._consumer.getmany(timeout_ms=200, max_records=5000)
                guard.note(batches)
            except OffsetOutOfRangeError as exc:  # before the log start, or (Kafka) beyond its end
                await self._check(guard.out_of_range(exc.args[0]))
                continue
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.warning("feedback watcher: %s", exc)
                await asyncio.sleep(0.5)
                continue
            for tp, messages in batches.items():
                for msg in messages:
                    self.apply(names.get(tp.topic, tp.topic), msg.key, msg.value)
            await self._check(guard.after_fetch())  # beyond the end (Tansu answers such a fetch with nothing)

    @staticmethod
    async def _check(check: Any) -> None:
        """A position check; a broker error is logged and waited out (the next fetch checks again)."""
        try:
            await check
        except Exception as exc:
            log.warning("feedback watcher: read positions not checked: %s", exc)
            await asyncio.sleep(0.5)

    def apply(self, topic: str, key: bytes | None, raw: bytes | None) -> None:
        """Record one message of ``topic`` (contract name); tombstones and invalid ones are counted and skipped."""
        if raw is None:
            self.tombstones += 1
            return
        try:
            v = decode(topic, raw)
            check_key(topic, key, v)
        except ContractError:
            self.rejected += 1
            return
        if topic == "rtt-predictions":
            if v["predicted_rtt_ms"] is not None:
                self.predictions[(v["task_id"], v["node"])] = float(v["predicted_rtt_ms"])
        elif topic == "prediction-errors":
            for app, stats in v["apps"].items():
                if stats["n"] > 0:
                    self.errors.append((v["ts"], f"{v['node']}:{app}", float(stats["mape"])))
        elif topic == "node-weights":
            if "weight" in v:
                self.weights.append((v["ts"], v["node"], float(v["weight"])))
        elif topic == "retrain-events":
            self.retrains.append((v["ts"], v["model_key"], v["reason"]))
        elif topic == "model-updates":
            self.models.append((v["ts"], v["model_key"], int(v["version"])))

    def close(self, timeout_s: float = 10.0) -> None:
        loop, self._loop = self._loop, None
        if loop is None:
            return
        try:
            loop.call(self._stop(), timeout_s)
        except Exception as exc:
            log.warning("feedback watcher did not stop cleanly: %s", exc)
        finally:
            loop.stop()

    async def _stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self._consumer is not None:
            await self._consumer.stop()
