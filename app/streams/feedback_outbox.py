"""prediction-errors delivered exactly once across a crash at any moment: an outbox in the feedback table.

Closing an error period changes two things that must agree: the node trackers (the period's pairs leave
the open period) and the prediction-errors topic (one message per node reports them). A worker killed
between the two either loses the period's pairs (state closed, message never sent) or counts them twice
(message sent, state not closed: the restarted worker reports them again). So a closed period's messages
go through an outbox:

1. **stage** — the messages are kept as rows ``b"{partition}|e|{node}|{ts}"`` of the feedback table,
   written by the same checkpoint as the trackers they come from (one record batch per partition): the
   closed state and the messages to send become durable together;
2. **deliver** — once durable, each message is sent and its acknowledgement awaited;
3. **clear** — acknowledged messages leave the outbox (tombstones in the next checkpoint).

A restarted worker restores the outbox rows with the trackers. A row may be there because its message
was never sent, or because it was acknowledged but not yet cleared. The worker tells them apart by
reading its prediction-errors partition from the offset recorded with the row (the partition's end
before that message was sent: only this worker writes its nodes' partition), or from the first message
stamped up to ``TIME_MARGIN_S`` before the row's period closed where that comes earlier (a topic
recreated after the broker lost its data starts again at 0, so an offset recorded before can lie past
messages sent since), and looking for ``(node, ts)``: found → cleared without sending; not found → sent.
So every pair is in exactly one message, whenever the kill came.

The outbox rows are few (one per node per period not yet acknowledged; none in steady state).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from app.config import Settings
from app.contracts import contract, encode
from app.kafka.client import client_options
from app.retry import Backoff
from app.streams.metrics import WorkerMetrics

log = logging.getLogger(__name__)

OUTBOX = "e"
TIME_MARGIN_S = 30.0  # clock steps between staging a message and sending it, on one host


def outbox_row_key(partition: int, node: str, ts: float) -> bytes:
    """``b"{partition}|e|{node}|{ts!r}"``.

    >>> outbox_row_key(3, "gpu-1", 1700000000.25)
    b'3|e|gpu-1|1700000000.25'
    """
    return f"{partition}|{OUTBOX}|{node}|{ts!r}".encode()


@dataclasses.dataclass
class Entry:
    partition: int
    value: dict[str, Any]
    floor: int | None  # the partition's end offset before this message can have been sent
    durable: bool = False
    delivered: bool = False
    checked: bool = True  # False for a restored entry until reconcile looked for it in the topic

    @property
    def ident(self) -> tuple[str, float]:
        return str(self.value["node"]), float(self.value["ts"])

    @property
    def key(self) -> bytes:
        return outbox_row_key(self.partition, *self.ident)

    def row(self) -> bytes:
        return orjson.dumps({"value": self.value, "floor": self.floor})


class ErrorsOutbox:
    """The prediction-errors messages of closed periods not yet known to be acknowledged."""

    def __init__(self, settings: Settings, send: Any = None, *, metrics: WorkerMetrics | None = None) -> None:
        self.settings = settings
        self.sent_counter = (metrics or WorkerMetrics()).messages_out.labels("prediction-errors")
        self.topic = settings.topic("prediction-errors")
        self.partitions = contract("prediction-errors").partitions
        self.send = send  # async (key: bytes, value: bytes) -> RecordMetadata, set by the errors component
        self.entries: dict[bytes, Entry] = {}
        self._cleared: set[bytes] = set()
        self._floor: dict[int, int] = {}  # next offset after the last acknowledged message, per partition
        self._lock = asyncio.Lock()

    def __len__(self) -> int:
        return len(self.entries)

    # -- 1. stage (synchronous: between closing the trackers and their checkpoint, nothing else runs)
    async def prepare(self, partitions: set[int]) -> None:
        """Before staging into ``partitions``: know where each one ends (once per partition and life)."""
        await self._ensure_floors({p for p in partitions if p not in self._floor})

    def stage(self, partition: int, value: dict[str, Any]) -> None:
        entry = Entry(partition, value, self._floor.get(partition))
        self.entries[entry.key] = entry

    def take_rows(self) -> list[tuple[bytes, bytes | None]]:
        """Rows for the next checkpoint: entries not durable yet, tombstones of cleared ones."""
        rows: list[tuple[bytes, bytes | None]] = [(e.key, e.row()) for e in self.entries.values() if not e.durable]
        rows += [(key, None) for key in self._cleared]
        return rows

    def written(self, rows: Iterable[tuple[bytes, bytes | None]]) -> None:
        """The checkpoint holding ``rows`` is stored: their entries may be delivered, their tombstones are done."""
        for key, value in rows:
            if value is None:
                self._cleared.discard(key)
            elif key in self.entries:
                self.entries[key].durable = True

    # -- 2. deliver, 3. clear
    async def deliver(self) -> int:
        """Send every durable entry, wait for the acknowledgements, clear them; messages sent."""
        assert self.send is not None, "ErrorsOutbox.send is set by register_errors"
        async with self._lock:
            ready = [e for e in self.entries.values() if e.durable and e.checked and not e.delivered]
            if not ready:
                return 0
            futures = [await self.send(e.ident[0].encode(), encode("prediction-errors", e.value, check=False))
                       for e in ready]
            done = await asyncio.gather(*futures, return_exceptions=True)
            sent, failed = 0, None
            acked: dict[int, int] = {}
            for entry, meta in zip(ready, done, strict=True):
                if isinstance(meta, BaseException):
                    failed = meta  # kept: sent again after the next checkpoint
                    continue
                entry.delivered = True
                self._clear(entry)
                offset = getattr(meta, "offset", None)
                if offset is not None:
                    acked[entry.partition] = max(acked.get(entry.partition, 0), int(offset) + 1)
                self.sent_counter.inc()
                sent += 1
            # the end after this worker's last acknowledged message, even where it went down: a recreated
            # topic starts again at 0, and a floor kept from before would hide its first messages
            self._floor.update(acked)
            if failed is not None:
                log.warning("prediction-errors: %d of %d messages not acknowledged (%r); sent again later",
                            len(ready) - sent, len(ready), failed)
            return sent

    def _clear(self, entry: Entry) -> None:
        self.entries.pop(entry.key, None)
        self._cleared.add(entry.key)

    async def _ensure_floors(self, partitions: set[int]) -> None:
        """Record a lower bound of each partition's end before anything of it is sent (first send only)."""
        if not partitions:
            return
        tps = [TopicPartition(self.topic, p) for p in partitions]
        consumer = AIOKafkaConsumer(**client_options(self.settings, group_id=None, enable_auto_commit=False))
        await consumer.start()
        try:
            ends = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
        for tp in tps:
            self._floor.setdefault(tp.partition, int(ends.get(tp, 0)))
        for e in self.entries.values():
            if e.floor is None:
                e.floor = self._floor.get(e.partition)

    # -- after a restart
    def restore(self, partition: int, key: bytes, raw: bytes) -> None:
        """Load one outbox row of a recovered partition (durable by definition)."""
        if key in self._cleared or key in self.entries:
            return  # delivered (or being delivered) by this very process: its tombstone is on the way
        doc = orjson.loads(raw)
        self.entries[key] = Entry(partition, doc["value"], doc.get("floor"), durable=True, checked=False)

    def rewrite(self, partitions: set[int]) -> None:
        """Entries of ``partitions`` not delivered yet are stored again before they are sent (their changelog
        topic was recreated empty)."""
        for e in self.entries.values():
            if e.partition in partitions and not e.delivered:
                e.durable = False

    def drop(self, partitions: set[int]) -> None:
        """Forget the entries of revoked partitions (their new owner restores and reconciles them)."""
        for key in [k for k, e in self.entries.items() if e.partition in partitions]:
            del self.entries[key]

    def unchecked(self, partitions: set[int] | None = None) -> int:
        """Restored entries (of ``partitions``, else all) not yet looked for in the topic: none of them is sent."""
        return sum(1 for e in self.entries.values()
                   if not e.checked and (partitions is None or e.partition in partitions))

    async def reconcile_until_done(self, partitions: Callable[[], set[int]], backoff: Backoff, *,
                                   on_failure: Callable[[int, BaseException], None] | None = None,
                                   timeout_s: float = 30.0) -> int:
        """:meth:`reconcile` the partitions ``partitions()`` names (those still held) until a try succeeds.

        A restored entry is only sent once it was looked for, so a try that failed (broker away, partition
        not read to its end in time) is tried again after ``backoff.next()`` seconds — one that gave up
        would keep its pairs out of every message. ``on_failure(tries, exc)`` is told of each failure.
        Returns the entries cleared.
        """
        while True:
            held = partitions()
            if not self.unchecked(held):
                return 0
            try:
                return await self.reconcile(held, timeout_s)
            except Exception as exc:  # any failure is tried again; the entries wait meanwhile
                wait_s = backoff.next()  # counts the failure: backoff.failures is the tries that failed
                if on_failure is not None:
                    on_failure(backoff.failures, exc)
                await asyncio.sleep(wait_s)

    async def reconcile(self, partitions: set[int], timeout_s: float = 30.0) -> int:
        """Clear the restored entries of ``partitions`` whose message is already in the topic; how many."""
        restored = [e for e in self.entries.values() if e.partition in partitions and not e.checked]
        if not restored:
            return 0
        starts: dict[int, int] = {}
        since: dict[int, float] = {}  # the earliest period close per partition
        for e in restored:
            floor, ts = e.floor if e.floor is not None else 0, e.ident[1]
            starts[e.partition] = min(starts.get(e.partition, floor), floor)
            since[e.partition] = min(since.get(e.partition, ts), ts)
        found = await self._sent_since(starts, since, timeout_s)
        cleared = 0
        for e in restored:
            if e.ident in found:
                self._clear(e)
                cleared += 1
            else:
                e.checked = True
        log.info("prediction-errors outbox of partitions %s: %d restored, %d already delivered, %d to send",
                 sorted(partitions), len(restored), cleared, len(restored) - cleared)
        return cleared

    async def _sent_since(self, starts: dict[int, int], since: dict[int, float],
                          timeout_s: float) -> set[tuple[str, float]]:
        """``(node, ts)`` of the prediction-errors messages from ``starts[partition]`` to each partition's end.

        A partition is read from the first message stamped ``TIME_MARGIN_S`` before ``since[partition]``
        (wall-clock seconds) when that comes before its start: a floor recorded before the topic was
        recreated can lie inside the new partition, past messages sent since.
        """
        tps = {TopicPartition(self.topic, p): off for p, off in starts.items()}
        consumer = AIOKafkaConsumer(**client_options(self.settings, group_id=None, enable_auto_commit=False,
                                                     auto_offset_reset="earliest"))
        await consumer.start()
        found: set[tuple[str, float]] = set()
        try:
            tps = await _earlier_by_time(consumer, tps, {TopicPartition(self.topic, p): ts for p, ts in since.items()})
            consumer.assign(list(tps))
            for tp, off in tps.items():
                consumer.seek(tp, off)
            pending, rewound = set(tps), set()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while pending and loop.time() < deadline:
                batch = await consumer.getmany(timeout_ms=300)
                for records in batch.values():
                    for rec in records:
                        try:
                            v = orjson.loads(rec.value)
                            found.add((str(v["node"]), float(v["ts"])))
                        except (orjson.JSONDecodeError, KeyError, TypeError, ValueError):
                            continue
                for tp in list(pending):
                    high = consumer.highwater(tp)
                    if high is None:
                        continue
                    position = await consumer.position(tp)
                    if position > high and tp not in rewound:  # the topic was recreated: all of it is new
                        rewound.add(tp)
                        await consumer.seek_to_beginning(tp)
                    elif position >= high and not batch.get(tp):
                        pending.discard(tp)
            if pending:
                raise TimeoutError(f"prediction-errors partitions {sorted(tp.partition for tp in pending)} "
                                   f"not read to their end within {timeout_s:.0f} s")
        finally:
            await consumer.stop()
        return found


async def _earlier_by_time(consumer: AIOKafkaConsumer, starts: dict[TopicPartition, int],
                           since: dict[TopicPartition, float]) -> dict[TopicPartition, int]:
    """``starts`` moved back to the first offset stamped at or after ``since[tp] - TIME_MARGIN_S``, if earlier.

    A message is stamped when it is sent (CreateTime, the contract's default), after it was staged.
    Brokers that find no such message answer None (Kafka) or a timestamp of -1 (Tansu): ``starts`` stays.
    """
    query = {tp: max(0, int((ts - TIME_MARGIN_S) * 1000)) for tp, ts in since.items()}
    found = await consumer.offsets_for_times(query) if query else {}
    out = dict(starts)
    for tp, hit in found.items():
        if hit is not None and hit.timestamp >= 0 and hit.offset < out[tp]:
            out[tp] = int(hit.offset)
    return out
