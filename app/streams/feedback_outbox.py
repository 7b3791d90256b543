"""prediction-errors and drift retrain-events delivered across a crash at any moment: an outbox in the
feedback table.

Closing an error period changes two things that must agree: the node trackers (the period's pairs leave
the open period; a drift detector that fired is reset) and the topics (one prediction-errors message per
node reports the pairs; a retrain-event asks for the drift's retrain). A worker killed between the two
either loses them (state closed, message never sent: a drift whose detector was reset is not signalled
again until its excess passes the threshold once more) or counts them twice (message sent, state not
closed: the restarted worker reports them again). So a closed period's messages go through an outbox:

1. **stage** — the messages are kept as rows of the feedback table, written by the same checkpoint as the
   trackers they come from (one record batch per partition): the closed state and the messages to send
   become durable together. A prediction-errors row is ``b"{partition}|e|{node}|{ts}"``, a drift
   retrain-event's ``b"{partition}|e|{node}|{ts}|{model_key}"`` (the node whose detector fired; a model
   key holds a ``:``, a period's time never does);
2. **deliver** — once durable, each message is sent and its acknowledgement awaited; one the broker did
   not acknowledge stays staged and goes out after the next checkpoint: at once if its send raised (it
   never reached the producer; the messages of its topic after it wait too, unsent), once looked for in its topic
   (below) if its acknowledgement was an error (a request that timed out may have been stored). A message
   the leader stored may not be readable yet (acks=all: the in-sync replicas have not caught up), so one
   not found counts as not stored only ``UNACKED_UNREADABLE_S`` after its failure; a broker that makes it
   readable later than that gets a second copy;
3. **clear** — acknowledged messages leave the outbox (tombstones in the next checkpoint).

A restarted worker restores the outbox rows with the trackers. A row may be there because its message
was never sent, or because it was acknowledged but not yet cleared. The worker tells them apart by
reading the message's partition from the offset recorded with the row (the partition's end before that
message could have been sent: a lower bound of where it lands, whoever else writes the partition), or
from the first message stamped up to ``TIME_MARGIN_S`` before the row's period closed where that comes
earlier (a topic recreated after the broker lost its data starts again at 0, so an offset recorded
before can lie past messages sent since), and looking for the message: ``(node, ts)`` of a
prediction-errors message, ``(model_key, reason, ts, cumulative_error)`` of a retrain-event; found →
cleared without sending; not found → sent. So every pair is in exactly one message, and every drift in
one retrain-event, whenever the kill came.

The outbox rows are few (one per node per period not yet acknowledged, one per drift; none in steady state).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable, Iterable
from typing import Any

import orjson
from aiokafka import AIOKafkaConsumer, TopicPartition

from app.clock import Clock, SystemClock
from app.config import Settings
from app.contracts import contract, encode
from app.kafka.batches import DROPPED, partition_for, permanent
from app.kafka.client import client_options
from app.kafka.starting import start_or_close
from app.retry import Backoff
from app.streams.deadletter import kafka_error
from app.streams.metrics import WorkerMetrics

log = logging.getLogger(__name__)

OUTBOX = "e"
TIME_MARGIN_S = 30.0  # clock steps between staging a message and sending it, on one host
UNACKED_LOOK_S = 10.0  # how long a checkpoint reads to look for its messages whose acknowledgement failed
# how long after a failed acknowledgement a message the leader stored may still be unreadable (not yet on the
# in-sync replicas): Kafka's default replica.lag.time.max.ms, after which a lagging follower leaves the ISR
UNACKED_UNREADABLE_S = 30.0
ERRORS, RETRAIN = "prediction-errors", "retrain-events"


def outbox_row_key(partition: int, node: str, ts: float) -> bytes:
    """``b"{partition}|e|{node}|{ts!r}"``.

    >>> outbox_row_key(3, "gpu-1", 1700000000.25)
    b'3|e|gpu-1|1700000000.25'
    """
    return f"{partition}|{OUTBOX}|{node}|{ts!r}".encode()


def retrain_row_key(partition: int, node: str, ts: float, key: str) -> bytes:
    """``b"{partition}|e|{node}|{ts!r}|{model_key}"``: a drift retrain-event of ``node``'s period closed at ``ts``.

    >>> retrain_row_key(3, "gpu-1", 1700000000.25, "gCTF:gpu")
    b'3|e|gpu-1|1700000000.25|gCTF:gpu'
    """
    return outbox_row_key(partition, node, ts) + f"|{key}".encode()


async def _failed(exc: BaseException) -> Any:
    """An acknowledgement that is ``exc`` (a send that raised before it reached the producer)."""
    raise exc


def message_ident(topic: str, value: dict[str, Any]) -> tuple[Any, ...]:
    """What names one message of ``topic`` (``ERRORS`` or ``RETRAIN``) when it is looked for in the topic."""
    if topic == RETRAIN:
        return (str(value["model_key"]), str(value["reason"]), float(value["ts"]), float(value["cumulative_error"]))
    return str(value["node"]), float(value["ts"])


@dataclasses.dataclass
class Entry:
    partition: int  # the node's partition: the row's, and the one whose owner delivers and reconciles it
    value: dict[str, Any]
    floor: int | None  # the message partition's end offset before this message can have been sent
    durable: bool = False
    delivered: bool = False
    checked: bool = True  # False for a restored entry until reconcile looked for it in the topic
    unacked: bool = False  # sent, its acknowledgement an error: unchecked until the outbox looked for it
    failed_at: float = 0.0  # unacked: when its acknowledgement failed (the outbox clock's monotonic seconds)
    topic: str = ERRORS  # the contract: ERRORS or RETRAIN
    node: str = ""  # RETRAIN: the node whose detector fired (it names the row)

    @property
    def ident(self) -> tuple[Any, ...]:
        return message_ident(self.topic, self.value)

    @property
    def message_key(self) -> bytes:
        return str(self.value["model_key" if self.topic == RETRAIN else "node"]).encode()

    @property
    def message_partition(self) -> int:
        """The partition of ``topic`` the message goes to: the node's own for prediction-errors (keyed by node,
        as the sources are), the model key's for a retrain-event (the default partitioner's rule)."""
        if self.topic == RETRAIN:
            return partition_for(self.message_key, contract(RETRAIN).partitions)
        return self.partition

    @property
    def key(self) -> bytes:
        if self.topic == RETRAIN:
            return retrain_row_key(self.partition, self.node, float(self.value["ts"]), str(self.value["model_key"]))
        return outbox_row_key(self.partition, str(self.value["node"]), float(self.value["ts"]))

    def row(self) -> bytes:
        doc: dict[str, Any] = {"value": self.value, "floor": self.floor}
        if self.topic != ERRORS:
            doc.update(topic=self.topic, node=self.node)
        return orjson.dumps(doc)


class ErrorsOutbox:
    """The prediction-errors messages of closed periods, and the drift retrain-events of their detectors, not
    yet known to be acknowledged."""

    def __init__(self, settings: Settings, send: Any = None, *, metrics: WorkerMetrics | None = None,
                 send_retrain: Any = None, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock: Clock = clock or SystemClock()
        metrics = metrics or WorkerMetrics()
        self.sent_counter = metrics.messages_out.labels(ERRORS)
        self._send_failures = metrics.send_failures
        self._retrain_out = metrics.messages_out.labels(RETRAIN)
        self._retrain_events = metrics.feedback.retrain_events
        self.topic = settings.topic(ERRORS)
        self.partitions = contract(ERRORS).partitions
        self.send = send  # async (key: bytes, value: bytes) -> RecordMetadata, set by the errors component
        self.send_retrain = send_retrain  # the same for retrain-events
        self.entries: dict[bytes, Entry] = {}
        self._cleared: set[bytes] = set()
        # next offset after the last acknowledged message, per (topic, partition)
        self._floor: dict[tuple[str, int], int] = {}
        self._lock = asyncio.Lock()

    def __len__(self) -> int:
        return len(self.entries)

    # -- 1. stage (synchronous: between closing the trackers and their checkpoint, nothing else runs)
    async def prepare(self, partitions: set[int]) -> None:
        """Before staging into ``partitions``: know where each one ends, and where every retrain-events
        partition ends (once per partition and life)."""
        if not partitions:
            return
        wanted = {(ERRORS, p) for p in partitions} | {(RETRAIN, p) for p in range(contract(RETRAIN).partitions)}
        await self._ensure_floors(wanted - self._floor.keys())

    def stage(self, partition: int, value: dict[str, Any]) -> None:
        entry = Entry(partition, value, self._floor.get((ERRORS, partition)))
        self.entries[entry.key] = entry

    def stage_retrain(self, partition: int, node: str, value: dict[str, Any]) -> None:
        """Stage the retrain-event ``value`` (checked against its contract already) of a drift that ``node``'s
        detector (in ``partition``) signalled: it goes out once the checkpoint that resets the detector is stored."""
        entry = Entry(partition, value, None, topic=RETRAIN, node=node)
        entry.floor = self._floor.get((RETRAIN, entry.message_partition))
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
    def _sender(self, entry: Entry) -> Any:
        return self.send_retrain if entry.topic == RETRAIN else self.send

    async def deliver(self) -> int:
        """Send every durable entry, wait for the acknowledgements, clear them; messages sent.

        A message the broker did not acknowledge stays in the outbox and goes out after the next checkpoint.
        One whose send raised never reached the producer, and is sent again; such a send raises only after
        waiting up to the producer's request timeout, so the entries of its topic after it are not sent either
        (each would wait as long, under the lock) and wait for the next checkpoint; the other topic's are sent.
        One whose send raised an error no retry can cure (too large, a topic not ours to write) is dropped, with
        one ERROR line, counted in ``rtt_worker_send_failures_total{outcome="dropped"}``, instead of holding
        the entries behind it for good. One whose acknowledgement is
        an error may have been stored all the same (the request timed out, the connection dropped after the
        write): it is unchecked, and looked for in its topic first (:meth:`_look_for_unacked`), like an
        entry restored after a restart; found, it is cleared (and counted) instead of being published twice.
        """
        assert self.send is not None, "ErrorsOutbox.send is set by register_errors"
        async with self._lock:
            await self._look_for_unacked()
            ready = [e for e in self.entries.values()
                     if e.durable and e.checked and not e.delivered and self._sender(e) is not None]
            if not ready:
                return 0
            pending: list[Any] = []
            unsent: set[int] = set()  # positions in ``tried`` whose send raised
            tried: list[Entry] = []
            blocked: dict[str, int] = {}  # topic whose send raised -> its entries after it: kept as they are
            for e in ready:
                if e.topic in blocked:  # each further send of the topic would wait as long: the next checkpoint's
                    blocked[e.topic] += 1
                    continue
                try:
                    pending.append(await self._sender(e)(e.message_key, encode(e.topic, e.value, check=False)))
                except Exception as exc:  # not handed to the producer
                    if permanent(kafka_error(exc) or exc):  # never will be (Faust wraps the client's error)
                        self._drop(e, exc)  # not left to hold the rest for good
                        continue
                    unsent.add(len(tried))  # no metadata, broker away: kept
                    pending.append(_failed(exc))
                    blocked[e.topic] = 0
                tried.append(e)
            ready = tried
            done = await asyncio.gather(*pending, return_exceptions=True)
            sent = 0
            failed: dict[str, tuple[int, BaseException]] = {}
            acked: dict[tuple[str, int], int] = {}
            now = self.clock.monotonic()
            for i, (entry, meta) in enumerate(zip(ready, done, strict=True)):
                if isinstance(meta, BaseException):
                    if i not in unsent and permanent(kafka_error(meta) or meta):  # refused for good: not stored
                        self._drop(entry, meta)
                        continue
                    failed[entry.topic] = (failed.get(entry.topic, (0, meta))[0] + 1, meta)  # kept: sent again
                    if i not in unsent:  # perhaps stored: looked for before it is sent again
                        entry.checked, entry.unacked, entry.failed_at = False, True, now
                    continue
                entry.delivered = True
                self._clear(entry)
                offset = getattr(meta, "offset", None)
                if offset is not None:
                    where = (entry.topic, int(getattr(meta, "partition", entry.message_partition)))
                    acked[where] = max(acked.get(where, 0), int(offset) + 1)
                self._count(entry)
                sent += 1
            # the end after this worker's last acknowledged message, even where it went down: a recreated
            # topic starts again at 0, and a floor kept from before would hide its first messages
            self._floor.update(acked)
            for topic, (n, error) in failed.items():
                log.warning("%s: %d of %d messages not acknowledged (%r); sent again later", topic, n,
                            sum(1 for e in ready if e.topic == topic), error)
            for topic, waiting in blocked.items():
                if waiting:
                    log.warning("%s: a send raised; %d further messages not sent, left to the next checkpoint",
                                topic, waiting)
            return sent

    async def _look_for_unacked(self) -> None:
        """Look for the messages whose acknowledgement failed in their topics: those found are cleared and
        counted, the others may be sent again once ``UNACKED_UNREADABLE_S`` passed since their failure (the
        leader may hold one that its in-sync replicas, and so its readers, do not have yet); until then they
        stay unchecked for a later checkpoint's look. A look that fails (broker away, a partition not read to
        its end within ``UNACKED_LOOK_S``) leaves them unchecked for the next checkpoint."""
        doubtful = [e for e in self.entries.values() if e.unacked]
        if not doubtful:
            return
        try:
            found = await self._look_for(doubtful, UNACKED_LOOK_S)
        except Exception as exc:  # the next checkpoint looks again; nothing of them is sent meanwhile
            log.warning("outbox: %d messages whose acknowledgement failed not looked for yet (%r); not sent"
                        " again until they are", len(doubtful), exc)
            return
        for e in found:
            self._count(e)
        now = self.clock.monotonic()
        young = [e for e in doubtful if not e.delivered and now - e.failed_at < UNACKED_UNREADABLE_S]
        for e in young:  # perhaps stored and not readable yet: looked for again
            e.checked, e.unacked = False, True
        if found or young:
            log.info("outbox: %d of %d messages whose acknowledgement failed found stored, %d not found yet"
                     " (looked for again until %.0f s after the failure); the others are sent again",
                     len(found), len(doubtful), len(young), UNACKED_UNREADABLE_S)

    def _count(self, entry: Entry) -> None:
        if entry.topic == RETRAIN:
            v = entry.value
            self._retrain_events.labels(v["reason"]).inc()
            self._retrain_out.inc()
            log.info("retrain-event %s (%s): cumulative %.3f > %.3f", v["model_key"], v["reason"],
                     v["cumulative_error"], v["threshold"])
        else:
            self.sent_counter.inc()

    def _drop(self, entry: Entry, exc: BaseException) -> None:
        """``entry`` can never be stored (too large, a topic not ours to write): cleared, counted, logged."""
        self._clear(entry)
        self._send_failures.labels(entry.topic, DROPPED).inc()
        log.error("%s: a message the broker can never take (%r): dropped", entry.topic, exc)

    def _clear(self, entry: Entry) -> None:
        self.entries.pop(entry.key, None)
        self._cleared.add(entry.key)

    async def _ensure_floors(self, wanted: set[tuple[str, int]]) -> None:
        """Record a lower bound of each ``(topic, partition)``'s end before anything of it is sent (first send only)."""
        if not wanted:
            return
        tps = [TopicPartition(self.settings.topic(topic), p) for topic, p in sorted(wanted)]
        consumer = AIOKafkaConsumer(**client_options(self.settings, group_id=None, enable_auto_commit=False))
        await start_or_close(consumer)  # a start that fails (broker away: the next tick tries again) leaves none open
        try:
            ends = await consumer.end_offsets(tps)
        finally:
            await consumer.stop()
        for (topic, p), tp in zip(sorted(wanted), tps, strict=True):
            self._floor.setdefault((topic, p), int(ends.get(tp, 0)))
        for e in self.entries.values():
            if e.floor is None:
                e.floor = self._floor.get((e.topic, e.message_partition))

    # -- after a restart
    def restore(self, partition: int, key: bytes, raw: bytes) -> None:
        """Load one outbox row of a recovered partition (durable by definition)."""
        if key in self._cleared or key in self.entries:
            return  # delivered (or being delivered) by this very process: its tombstone is on the way
        doc = orjson.loads(raw)
        self.entries[key] = Entry(partition, doc["value"], doc.get("floor"), durable=True, checked=False,
                                  topic=doc.get("topic", ERRORS), node=doc.get("node", ""))

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
        """Restored entries (of ``partitions``, else all) not yet looked for in the topic: none of them is sent.

        Entries whose acknowledgement failed are unchecked too, but :meth:`deliver` looks for those itself."""
        return sum(1 for e in self.entries.values()
                   if not e.checked and not e.unacked and (partitions is None or e.partition in partitions))

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
        """Clear the restored entries of ``partitions`` whose message is already in its topic; how many."""
        restored = [e for e in self.entries.values() if e.partition in partitions and not e.checked and not e.unacked]
        if not restored:
            return 0
        cleared = len(await self._look_for(restored, timeout_s))
        log.info("outbox of partitions %s: %d restored, %d already delivered, %d to send",
                 sorted(partitions), len(restored), cleared, len(restored) - cleared)
        return cleared

    async def _look_for(self, entries: list[Entry], timeout_s: float) -> list[Entry]:
        """Read the topics for the messages of ``entries``: those found are cleared, the others checked (they
        may be sent); the entries found. Raises when the topics cannot be read to their end (nothing changes)."""
        starts: dict[tuple[str, int], int] = {}
        since: dict[tuple[str, int], float] = {}  # the earliest period close per message partition
        for e in entries:
            where, ts = (e.topic, e.message_partition), float(e.value["ts"])
            floor = e.floor if e.floor is not None else 0
            starts[where] = min(starts.get(where, floor), floor)
            since[where] = min(since.get(where, ts), ts)
        stored = await self._sent_since(starts, since, timeout_s)
        found = []
        for e in entries:
            e.unacked = False
            if (e.topic, e.ident) in stored:
                e.delivered = True
                self._clear(e)
                found.append(e)
            else:
                e.checked = True
        return found

    async def _sent_since(self, starts: dict[tuple[str, int], int], since: dict[tuple[str, int], float],
                          timeout_s: float) -> set[tuple[str, tuple[Any, ...]]]:
        """``(topic, ident)`` of the messages of each ``(topic, partition)`` from ``starts[(topic, partition)]``
        to its end (:func:`message_ident`).

        A partition is read from the first message stamped ``TIME_MARGIN_S`` before ``since[(topic, partition)]``
        (wall-clock seconds) when that comes before its start: a floor recorded before the topic was
        recreated can lie inside the new partition, past messages sent since.
        """
        names = {TopicPartition(self.settings.topic(t), p): (t, p) for t, p in starts}
        tps = {tp: starts[where] for tp, where in names.items()}
        consumer = AIOKafkaConsumer(**client_options(self.settings, group_id=None, enable_auto_commit=False,
                                                     auto_offset_reset="earliest"))
        await start_or_close(consumer)  # closed again if its start fails: the look is tried again later
        found: set[tuple[str, tuple[Any, ...]]] = set()
        try:
            tps = await _earlier_by_time(consumer, tps, {tp: since[where] for tp, where in names.items()})
            consumer.assign(list(tps))
            for tp, off in tps.items():
                consumer.seek(tp, off)
            pending, rewound = set(tps), set()
            loop = asyncio.get_running_loop()
            deadline = loop.time() + timeout_s
            while pending and loop.time() < deadline:
                batch = await consumer.getmany(timeout_ms=300)
                for tp, records in batch.items():
                    topic = names[tp][0]
                    for rec in records:
                        try:
                            found.add((topic, message_ident(topic, orjson.loads(rec.value))))
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
                raise TimeoutError(f"partitions {sorted(f'{tp.topic}[{tp.partition}]' for tp in pending)} "
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
