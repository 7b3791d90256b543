"""Read positions checked against their partitions: a wiped or recreated topic is read from its start.

A consumer that keeps its own read positions (the worker's intakes, restored from checkpoints) or
simply keeps reading (every consumer) can hold a position its partition no longer has: after the
broker lost its data (the embedded broker is memory-only) or a topic was deleted and recreated, a
partition starts again at offset 0, and a consumer at offset 500 would silently skip the first 500
new messages. :class:`PositionGuard` catches both sides of the range:

* **below the log start** (retention deleted what the position points at): checked on every
  assignment against the partition's earliest offset (:meth:`PositionGuard.on_assigned`; a consumer group's
  committed offsets: :meth:`PositionGuard.check_committed`), and by the broker on fetch
  (``OffsetOutOfRange``; :meth:`PositionGuard.out_of_range`);
* **beyond the log end** (the partition was wiped): after every fetch, a position above the
  partition's high watermark in the fetch response (:meth:`PositionGuard.after_fetch`). A watermark can
  dip for a moment when leadership moves between Kafka brokers, so the position is reset only when it
  is still above the end ``confirm_s`` later and the broker's end offset says so too. The fetch's high
  watermark is the authority: the embedded broker's ListOffsets answer can lie below the true end (the
  last batch's first offset + 1), which only ever confirms a position beyond it, never makes one so.

Either way the position goes to the partition's **start** (its earliest offset): the documented reset,
which reads everything the partition holds again (duplicates are recognised downstream: the join
counts a pair once, the trainer keeps one row per task, compacted views only move forward). Each reset
logs one WARNING naming the consumer, topic, partition, old and new position, and counts
``rtt_kafka_position_resets_total{client, topic, reason}`` (``before_start`` | ``beyond_end``).

What it cannot see: if a wiped partition receives more new messages than the old position before the
consumer's first fetch after the wipe, the old position looks valid and those first messages are
skipped (docs/runbook.md, "Broker lost its data").
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from aiokafka import TopicPartition
from prometheus_client import CollectorRegistry, Counter

log = logging.getLogger(__name__)

BEFORE_START, BEYOND_END = "before_start", "beyond_end"
_COUNTERS: weakref.WeakKeyDictionary[CollectorRegistry, Counter] = weakref.WeakKeyDictionary()


def resets_counter(registry: CollectorRegistry) -> Counter:
    """``rtt_kafka_position_resets_total`` in ``registry`` (the process's), created once per registry."""
    reg = registry
    counter = _COUNTERS.get(reg)
    if counter is None:
        counter = _COUNTERS[reg] = Counter(
            "rtt_kafka_position_resets_total",
            "Read positions found outside their partition (before its start or beyond its end) and reset to its start",
            ["client", "topic", "reason"], registry=reg)
    return counter


class PositionGuard:
    """Checks one consumer's read positions; resets an invalid one to the partition's start.

    Parameters
    ----------
    consumer
        A started ``AIOKafkaConsumer``.
    client
        The consumer's name in logs and in the counter's ``client`` label.
    topic_label
        Topic name -> ``topic`` label (the contract name, so the label stays bounded); identity by default.
    registry
        The process's Prometheus registry, where ``rtt_kafka_position_resets_total`` counts the resets.
    confirm_s
        How long a position must stay above the fetch high watermark before it is reset.
    """

    def __init__(self, consumer: Any, client: str, *, topic_label: Callable[[str], str] | None = None,
                 registry: CollectorRegistry, confirm_s: float = 1.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.consumer = consumer
        self.client = client
        self.topic_label = topic_label or (lambda t: t)
        self.counter = resets_counter(registry)
        self.confirm_s = confirm_s
        self.clock = clock
        self.next_offsets: dict[TopicPartition, int] = {}
        self._suspect: dict[TopicPartition, float] = {}
        self._series: set[str] = set()
        self.resets = 0

    # -- positions the guard knows
    def note(self, batch: Mapping[TopicPartition, list[Any]]) -> None:
        """Record the next offset of every partition in a ``getmany`` result."""
        for tp, records in batch.items():
            if records:
                self.next_offsets[tp] = records[-1].offset + 1

    def forget(self, tps: Iterable[TopicPartition]) -> None:
        for tp in tps:
            self.next_offsets.pop(tp, None)
            self._suspect.pop(tp, None)

    # -- checks
    async def on_assigned(self, positions: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """The positions to seek to: ``positions`` with those before their partition's start moved to it."""
        if not positions:
            return {}
        self._zero(positions)
        starts = await self.consumer.beginning_offsets(list(positions))
        out = dict(positions)
        for tp, pos in positions.items():
            start = int(starts.get(tp, 0))
            if pos < start:
                out[tp] = start
                self._report(tp, pos, start, BEFORE_START)
        self.next_offsets.update(out)
        return out

    async def check_committed(self, tps: Iterable[TopicPartition],
                              ) -> tuple[dict[TopicPartition, int], list[TopicPartition]]:
        """Seek a group consumer's newly assigned partitions (call it from ``on_partitions_assigned``): each to
        the group's committed offset, or to the partition's start where the group has none or the committed
        offset lies before the start; the positions sought, and the partitions among them that were reset.

        A committed offset beyond the end is left to the first fetch: Kafka answers it ``OffsetOutOfRange``
        (:meth:`out_of_range`), a broker that answers with nothing gives its high watermark (:meth:`after_fetch`).
        The end a ListOffsets request answers is not asked here: the embedded broker answers one below the true
        end whenever a partition's last batch holds more than one record (the last batch's first offset + 1),
        and a group that had read everything would be reset to the start and read it all again."""
        tps = list(tps)
        if not tps:
            return {}, []
        self._zero(tps)
        committed = {tp: await self.consumer.committed(tp) for tp in tps}
        starts = await self.consumer.beginning_offsets(tps)
        out: dict[TopicPartition, int] = {}
        reset: list[TopicPartition] = []
        for tp, pos in committed.items():
            start = int(starts.get(tp, 0))
            if pos is None:  # a new group: from the start
                out[tp] = start
            elif pos >= start:  # beyond the end or not: the first fetch's high watermark says (after_fetch)
                out[tp] = pos
            else:
                out[tp] = start
                reset.append(tp)
                self._report(tp, pos, start, BEFORE_START)
            self.consumer.seek(tp, out[tp])
        self._suspect = {tp: t for tp, t in self._suspect.items() if tp not in out}
        self.next_offsets.update(out)
        return out, reset

    async def out_of_range(self, offsets: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """Reset the partitions of an ``OffsetOutOfRangeError`` (``{tp: fetch offset}``); their new positions."""
        starts = await self.consumer.beginning_offsets(list(offsets))
        out = {}
        for tp, pos in offsets.items():
            start = int(starts.get(tp, 0))
            out[tp] = start
            self.consumer.seek(tp, start)
            self.next_offsets[tp] = start
            self._report(tp, pos, start, BEFORE_START if pos < start else BEYOND_END)
        return out

    async def after_fetch(self, positions: Mapping[TopicPartition, int] | None = None) -> dict[TopicPartition, int]:
        """Reset every partition whose position stayed beyond its end for ``confirm_s``; their new positions.

        ``positions`` are the caller's next offsets (default: what :meth:`note` recorded, and for an assigned
        partition a fetch answered without records, the consumer's own position: a partition read from a
        committed offset that no check saw, answered with nothing because it lies beyond the end).
        """
        assigned = self.consumer.assignment()
        self._zero(assigned)
        if positions is None:
            for tp in assigned:
                if tp not in self.next_offsets and self.consumer.highwater(tp) is not None:
                    self.next_offsets[tp] = await self.consumer.position(tp)
        known = self.next_offsets if positions is None else positions
        now = self.clock()
        confirm: list[TopicPartition] = []
        for tp, pos in known.items():
            if tp not in assigned:
                continue
            high = self.consumer.highwater(tp)
            if high is None or pos <= high:
                self._suspect.pop(tp, None)
                continue
            first = self._suspect.setdefault(tp, now)
            if now - first >= self.confirm_s:
                confirm.append(tp)
        if not confirm:
            return {}
        ends = await self.consumer.end_offsets(confirm)
        beyond = [tp for tp in confirm if known[tp] > int(ends.get(tp, 0))]
        for tp in confirm:
            self._suspect.pop(tp, None)
        if not beyond:
            return {}
        starts = await self.consumer.beginning_offsets(beyond)
        out = {}
        for tp in beyond:
            start = int(starts.get(tp, 0))
            old = known[tp]
            self.consumer.seek(tp, start)
            self.next_offsets[tp] = start
            out[tp] = start
            self._report(tp, old, start, BEYOND_END)
        return out

    def _zero(self, tps: Iterable[TopicPartition]) -> None:
        """Create the counter's series of each topic read, at 0, before any reset: a series that first appears
        at its final value (one wipe resets every partition at once) shows no ``increase()`` to an alert."""
        for tp in tps:
            topic = self.topic_label(tp.topic)
            if topic not in self._series:
                self._series.add(topic)
                for reason in (BEFORE_START, BEYOND_END):
                    self.counter.labels(self.client, topic, reason)

    def _report(self, tp: TopicPartition, old: int, new: int, reason: str) -> None:
        self.resets += 1
        self.counter.labels(self.client, self.topic_label(tp.topic), reason).inc()
        where = "before the partition's start" if reason == BEFORE_START else "beyond the partition's end"
        log.warning("%s: read position of %s[%d] was %d, %s: reset to its start %d (the partition is read again"
                    " from there)", self.client, tp.topic, tp.partition, old, where, new)
