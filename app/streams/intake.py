"""Reading the worker's source topics in batches, for the partitions this worker owns.

The worker's busy paths — node-metrics (every scrape of every node) and the join (every completion and
every candidate's prediction) — do not go through Faust's per-event machinery, which costs more than
the work itself. A :class:`PartitionIntake` reads its topics with one aiokafka consumer assigned by hand,
in batches (``getmany``), and hands each valid value to a synchronous handler; what the handlers write
goes out on one producer as whole record batches (:class:`~app.kafka.batches.BatchSender`): features,
training samples and the tables' changelog rows. A batch the broker does not acknowledge is sent again
until it is (the sender keeps it), and a record is counted as sent — ``rtt_worker_messages_out_total`` and
what :meth:`PartitionIntake.count_delivered` adds — only once acknowledged; a failure is counted in
``rtt_worker_send_failures_total{topic, outcome}`` (``retried`` | ``dropped``: an error sending again cannot
cure, such as a record too large).
While more than ``HELD_MAX`` (20,000) records wait for the broker — producing fails while fetching works,
say an output topic deleted — the intake reads nothing more and only tries to send them, once per producer
request timeout: its memory stays bounded, and it reads on from where it stopped once the broker takes them.
Likewise while its sender holds more than ``DEAD_HELD_MAX_BYTES`` (64 MiB) of dead letters the broker has not
taken (sent, in flight or to be sent again) — the dead-letters partition unavailable while the source topics
are readable — the intake reads nothing more and waits for the sender (a flush, then again after ``RETRY_S``
when it fails); one WARNING line when it pauses, one INFO line when it reads on, once they are back within the
bound. It holds that bound and one batch's dead letters at most.

Ownership comes from the Faust group (:mod:`app.streams.ownership`). Every source topic and changelog
of the worker has the same partition count and is keyed by node, so partition *p* of each belongs to the
worker that Faust's co-partitioning assignor gives partition *p* of the ownership topic and of the
tables' changelogs:

* after a table's recovery, :meth:`PartitionIntake.assign` adds the restored partitions, each topic read
  from the position the last checkpoint recorded (the beginning when none);
* on a rebalance, :meth:`PartitionIntake.release` stops reading lost partitions at once, before their
  last checkpoint, so nothing is processed that the new owner will not see.

What an intake has processed is recorded by its table's checkpoint together with the state it produced:
the rows first, then the read positions (:meth:`PartitionIntake.positions_of`). A restarted worker
restores both and reads on from the recorded positions, so a message is either in the restored state or
read again — never both. The positions are written only after a flush of the intake's sender, so never
ahead of an output of the messages they cover (a training sample, node-features) that the broker does not
have yet. ``rtt_worker_messages_in_total`` counts a message only once its effect is durable: when the
checkpoint that records a read position past it is stored (:meth:`PartitionIntake.positions_stored`), the
messages processed since the last one are added. A message read again after a crash (a SIGKILL between two
checkpoints), or by a partition's new owner after a rebalance, is counted once: by the process whose
checkpoint stored it. The counter therefore moves in steps, once per checkpoint
(``RTT_WORKER_CHECKPOINT_INTERVAL_S``, 1 s by default), and not while checkpoints fail (the broker away);
meanwhile a partition holds at most ``UNCOUNTED_MAX`` pending entries (the newest merged, never across a read
position a checkpoint in flight has taken: that checkpoint, once stored, counts all it covers). The messages are
counted as soon as the read positions are stored, even when the markers written after them fail
(:meth:`PartitionIntake.positions_held`): those positions are what the partitions' next owner reads on from.

Dead letters keep that rule (:meth:`PartitionIntake.process`): the dead letter of a message that fails its
contract, or that its handler refuses, is handed to the intake's sender in the same step as the handlers'
effects and the read positions past the batch, with no wait in between, so a checkpoint, which flushes the
sender before it writes the positions, never stores positions past a message whose dead letter the broker
does not have. Dead letters are at least once: a worker that stops between a batch and the next stored
checkpoint reads the batch again and sends its dead letters again (its effects are not in the restored
state, so they are applied once).
"""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, TypeVar

import orjson
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, OffsetOutOfRangeError

from app.clock import Clock, SystemClock
from app.config import Settings
from app.contracts.admission import check_key, check_order, check_time
from app.contracts.edge import EdgeDecoder
from app.errors import ContractError
from app.kafka.admin import START_REMIND_S
from app.kafka.batches import DROPPED, BatchSender
from app.kafka.client import client_options, consumer_options
from app.kafka.positions import PositionGuard
from app.kafka.starting import start_or_close
from app.streams.changelog import Row
from app.streams.deadletter import TOPIC as DEAD_LETTERS
from app.streams.deadletter import Bad, DeadLetters
from app.streams.health import KAFKA, Health
from app.streams.metrics import WorkerMetrics

log = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any], int], None]
T = TypeVar("T")
MAX_RECORDS = 10_000
HELD_MAX = 2 * MAX_RECORDS  # records waiting for the broker beyond which the intake reads no more
RETRY_S = 1.0
REQUEST_TIMEOUT_MS = 40_000  # aiokafka's default
DEAD_HELD_MAX_BYTES = 64 << 20  # undelivered dead-letter bytes on the sender beyond which the intake reads no more
UNCOUNTED_MAX = 64  # pending (offset, count) entries per partition beyond which the newest two are merged


class Countable(Protocol):
    def inc(self, amount: float = 1) -> None: ...


def decode_positions(raw: bytes, partition: int) -> dict[tuple[str, int], int]:
    """``{(contract, partition): offset}`` of a row written by :meth:`PartitionIntake.position_rows`."""
    return {(name, partition): int(off) for name, off in orjson.loads(raw).items()}


def revoke_timeout_s(intake: Any) -> float:
    """How long a revoke's checkpoint may take in all (:meth:`CheckpointTurns.revoke`): one request timeout of
    ``intake``'s producer (None, or one that names none: aiokafka's default)."""
    return getattr(intake, "request_timeout_ms", REQUEST_TIMEOUT_MS) / 1000


class CheckpointFailed(Exception):
    """The checkpoint a revoke waited for failed: the revoke writes none of its own (the broker is away)."""


class CheckpointTurns:
    """The checkpoints of one table's state, one at a time; a revoke's waits for the one in flight, but not long.

    With the broker away each checkpoint's flush fails only after the producer's request timeout, so a revoke
    that waited for the checkpoint in flight and then wrote its own would hold the rebalance up for two of them
    (some 80 s, past the group's session and rebalance timeouts). :meth:`revoke` takes at most ``timeout_s``
    (one request timeout) all told, and writes nothing when the checkpoint it waited for failed
    (:class:`CheckpointFailed`): either way its caller takes the revoke-failed path, the new owner reading on from
    the positions last stored. A revoke's checkpoint cut short is handled like any failed write (its changes
    taken back, the positions it stored counted: :meth:`PartitionIntake.positions_held`).

    A revoke that did not wait for the checkpoint in flight to end fences it: once :meth:`revoke` returns (or
    raises), a checkpoint that started before asks :meth:`holder`'s answer whether a partition is still its to
    write, and for the revoked ones it is not. That checkpoint writes nothing more of them after the step it was
    in (its rows already handed to the producer may still land), applies none of their rows to the table's data,
    counts none of their messages, and takes none of their changes back when it fails: the partitions' new owner
    writes and counts them from the positions last stored.
    """

    def __init__(self) -> None:
        self.lock = asyncio.Lock()
        self.failures = 0  # checkpoints failed so far
        self.error: BaseException | None = None  # the last one's error
        self.generation = 0  # revokes returned so far
        self._fenced: dict[int, int] = {}  # partition -> the generation of the last revoke of it

    def holder(self) -> Callable[[int], bool]:
        """For a checkpoint starting now: whether a partition is still its to write, apply or take back — false
        once a revoke of it has returned (another worker's from then on, though this one may get it back)."""
        since, fenced = self.generation, self._fenced
        return lambda partition: fenced.get(partition, 0) <= since

    def fence(self, lost: Iterable[int]) -> None:
        """``lost`` is revoked: no checkpoint started before now writes anything more of it (:meth:`holder`)."""
        self.generation += 1
        for partition in lost:
            self._fenced[partition] = self.generation

    async def take(self, write: Callable[[], Awaitable[T]]) -> T:
        """Run ``write`` (one checkpoint) once no other is in flight."""
        async with self.lock:
            return await self._run(write)

    async def revoke(self, write: Callable[[], Awaitable[T]], timeout_s: float, lost: Iterable[int] = ()) -> T:
        """Run ``write`` (a revoke's checkpoint of ``lost``) after the checkpoint in flight, if any, and if that one
        did not fail; all within ``timeout_s``, else raise :class:`TimeoutError` (``write`` is then cancelled).
        Either way ``lost`` is fenced (:meth:`fence`) before it returns: a checkpoint still in flight leaves it be."""
        in_flight, failures = self.lock.locked(), self.failures

        async def turn() -> T:
            async with self.lock:
                if in_flight and self.failures != failures:
                    raise CheckpointFailed(f"the checkpoint in flight failed ({self.error!r}): none written again")
                return await self._run(write)

        try:
            async with asyncio.timeout(timeout_s) as deadline:
                return await turn()
        except TimeoutError:
            if deadline.expired():
                raise TimeoutError(f"the revoke's checkpoint was not done within {timeout_s:g} s") from None
            raise
        finally:
            self.fence(lost)

    async def _run(self, write: Callable[[], Awaitable[T]]) -> T:
        try:
            return await write()
        except BaseException as exc:
            self.failures += 1
            self.error = exc
            raise


class PartitionIntake:
    """Reads some contract topics of the owned partitions and hands each valid value to its handler.

    Parameters
    ----------
    settings
        Broker and topic prefix.
    handlers
        ``{contract name: handler(value, partition)}``; a handler is synchronous (it runs between two
        batches' awaits, so a checkpoint sees whole messages only).
    dead
        Where undecodable or invalid messages go, with their reason.
    metrics
        The worker's series (messages in and out, send failures, processing time, lag, position resets); a
        fresh registry by default.
    request_timeout_ms
        How long the producer tries a batch before it fails it (the sender then keeps it to send again).
    health
        The worker's degraded reasons: ``kafka`` names this intake while its clients' start waits for the broker.
    """

    def __init__(self, settings: Settings, handlers: dict[str, Handler], dead: DeadLetters,
                 name: str = "intake", clock: Clock | None = None, metrics: WorkerMetrics | None = None,
                 request_timeout_ms: int = REQUEST_TIMEOUT_MS, health: Health | None = None) -> None:
        self.settings = settings
        self.health = health
        self.request_timeout_ms = request_timeout_ms
        self.metrics = metrics if metrics is not None else WorkerMetrics()
        self.clock = clock or SystemClock()
        self.name = name
        self.handlers = handlers
        self.dead = dead
        self.topics = {settings.topic(name): name for name in handlers}
        self.decoders = {name: EdgeDecoder(name) for name in handlers}
        self.owned: set[int] = set()
        self.positions: dict[TopicPartition, int] = {}
        # messages processed whose read position no stored checkpoint holds yet: (next offset after them, how many)
        self._uncounted: dict[TopicPartition, collections.deque[tuple[int, int]]] = {}
        # read positions taken by checkpoints in flight (position_rows, until positions_stored or _held)
        self._taken: dict[TopicPartition, collections.Counter[int]] = {}
        self._assignment_changed = False
        self._consumer: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self.sender: BatchSender | None = None
        self.guard: PositionGuard | None = None
        self.started = asyncio.Event()
        self._counted: dict[str, tuple[str, tuple[Countable, ...]]] = {}  # topic -> (contract, more counters)
        self._dead_topic = settings.topic(DEAD_LETTERS)
        # (source, reason, bytes) of each dead letter on the sender, in order; and those bytes in all
        self._dead_staged: collections.deque[tuple[str, str, int]] = collections.deque()
        self._dead_bytes = 0
        self._dead_paused = False

    def count_delivered(self, contract_name: str, *also: Countable) -> None:
        """Count each record of ``contract_name``'s topic that the broker acknowledged in
        ``rtt_worker_messages_out_total{topic=contract_name}`` and in ``also``."""
        self._counted[self.settings.topic(contract_name)] = (contract_name, also)

    def _delivered(self, topic: str, records: int) -> None:
        if topic == self._dead_topic:
            for source, reason in self._take_staged(records):
                self.dead.stored(source, reason)
            return
        counted = self._counted.get(topic)
        if counted is not None:
            self.metrics.messages_out.labels(counted[0]).inc(records)
            for counter in counted[1]:
                counter.inc(records)

    def _failed(self, topic: str, records: int, _exc: BaseException, outcome: str) -> None:
        if topic == self._dead_topic:
            if outcome == DROPPED:  # logged by the sender; never counted as stored
                self._take_staged(records)
            self.metrics.send_failures.labels(DEAD_LETTERS, outcome).inc(records)
            return
        counted = self._counted.get(topic)  # a changelog: its topic's name (one per table)
        self.metrics.send_failures.labels(counted[0] if counted is not None else topic, outcome).inc(records)

    def _take_staged(self, records: int) -> list[tuple[str, str]]:
        """The labels of the next ``records`` dead letters handed to the sender (settled in that order); their
        bytes are no longer counted as held."""
        out = []
        for _ in range(min(records, len(self._dead_staged))):
            source, reason, size = self._dead_staged.popleft()
            self._dead_bytes -= size
            out.append((source, reason))
        return out

    # -- ownership (called by the feedback table's recovery and rebalance hooks) --------------------
    def assign(self, partitions: set[int], offsets: dict[tuple[str, int], int]) -> None:
        """Read ``partitions`` from now on, from ``offsets[(contract name, partition)]`` (else the beginning)."""
        for p in partitions:
            for topic, name in self.topics.items():
                tp = TopicPartition(topic, p)
                if p not in self.owned or tp not in self.positions:
                    off = offsets.get((name, p))
                    self._uncounted.pop(tp, None)  # read from its stored position: counted when read again
                    if off is not None:
                        self.positions[tp] = int(off)
                    else:
                        self.positions.pop(tp, None)
        self.owned |= set(partitions)
        self._assignment_changed = True

    def release(self, partitions: set[int]) -> None:
        """Stop reading ``partitions`` now (their positions stay readable until :meth:`forget`)."""
        self.owned -= set(partitions)
        self._assignment_changed = True

    def forget(self, partitions: set[int]) -> None:
        """Drop the positions (and lag gauges) of released ``partitions``."""
        for tp in [tp for tp in self.positions if tp.partition in partitions and tp.partition not in self.owned]:
            del self.positions[tp]
            self._uncounted.pop(tp, None)  # not stored by this worker: the new owner reads and counts them
            self._taken.pop(tp, None)
            try:
                self.metrics.intake_lag.remove(self.topics[tp.topic], str(tp.partition))
            except KeyError:
                pass

    def _report_lag(self, batch: dict[TopicPartition, list[Any]]) -> None:
        assert self._consumer is not None
        for tp in batch:
            high, pos = self._consumer.highwater(tp), self.positions.get(tp)
            if high is not None and pos is not None:
                self.metrics.intake_lag.labels(self.topics[tp.topic], str(tp.partition)).set(max(0, high - pos))

    def positions_of(self, partitions: set[int] | None = None) -> dict[int, dict[str, int]]:
        """``{partition: {contract name: next offset}}`` of what has been processed (all partitions held)."""
        out: dict[int, dict[str, int]] = {}
        for tp, off in self.positions.items():
            if partitions is None or tp.partition in partitions:
                out.setdefault(tp.partition, {})[self.topics[tp.topic]] = off
        return out

    # -- running -----------------------------------------------------------------------------------
    async def start(self) -> None:
        """Start the producer (unless it runs already: a start again after the consumer's failed), then the consumer.

        A client whose start fails or is cancelled is closed before the error goes on (:meth:`run` tries again)."""
        s = self.settings
        if self._producer is None:
            producer = AIOKafkaProducer(**client_options(s, linger_ms=5, acks="all", max_batch_size=512 * 1024,
                                                         max_request_size=4 * 1024 * 1024,
                                                         request_timeout_ms=self.request_timeout_ms))
            await start_or_close(producer)
            self._producer = producer
            self.sender = BatchSender(producer, on_delivered=self._delivered, on_failed=self._failed)
            self._dead_staged.clear()  # what an earlier sender left is not this one's to settle
            self._dead_bytes = 0
        # auto_offset_reset="none": a position the broker calls out of range is reset here, logged and counted
        consumer = AIOKafkaConsumer(**consumer_options(s, group_id=None, enable_auto_commit=False,
                                                       auto_offset_reset="none", max_partition_fetch_bytes=4 << 20))
        await start_or_close(consumer)
        self._consumer = consumer
        self.guard = PositionGuard(consumer, self.name, topic_label=lambda t: self.topics.get(t, t),
                                   registry=self.metrics.registry)
        self.started.set()
        log.info("%s: its consumer and producer started", self.name)

    @property
    def live_sender(self) -> BatchSender | None:
        """The sender while the producer is up (a checkpoint ships its rows on it), else None."""
        return self.sender if self._producer is not None else None

    @property
    def running(self) -> bool:
        return self.live_sender is not None

    def position_rows(self, key: Callable[[int], bytes], partitions: set[int] | None = None) -> list[Row]:
        """One changelog row per partition: ``(partition, key(partition), {contract: next offset})``.

        Once a checkpoint has stored them, hand them to :meth:`positions_stored`; once its write failed, to
        :meth:`positions_held`. Until then the pending counts are never merged across these positions."""
        for tp, off in self.positions.items():
            if partitions is None or tp.partition in partitions:
                self._taken.setdefault(tp, collections.Counter())[off] += 1
        return [(p, key(p), orjson.dumps(pos)) for p, pos in self.positions_of(partitions).items()]

    def positions_stored(self, rows: list[Row]) -> int:
        """Rows of :meth:`position_rows` that a checkpoint has stored: count the messages they cover in
        ``rtt_worker_messages_in_total``; how many. A checkpoint a revoke fenced hands over none of the revoked
        partitions' rows (:meth:`CheckpointTurns.holder`): :meth:`forget` dropped what they would count and settle,
        and their new owner counts those messages.

        A message is counted once its effect and the read position past it are durable: the messages processed
        since the last stored checkpoint wait here, and one read again after a crash was never counted before.
        """
        self._settle(rows)
        return self._count(rows)

    def positions_held(self, rows: list[Row], data: Any) -> int:
        """After a checkpoint's write of ``rows`` raised: count (:meth:`positions_stored`) the messages covered by
        those of ``rows`` that the table's ``data`` holds, that is, stored (the table takes a row once the broker
        has it), a later step of the write failing: the markers' flush. Their read positions are in the changelog:
        the partitions' next owner reads on from there and never counts those messages."""
        self._settle(rows)
        return self._count([r for r in rows if r[2] is not None and data.get(r[1]) == r[2]])

    def _positions_in(self, rows: list[Row]) -> list[tuple[str, TopicPartition, int]]:
        return [(name, TopicPartition(self.settings.topic(name), p), off)
                for partition, _key, value in rows if value is not None
                for (name, p), off in decode_positions(value, partition).items()]

    def _settle(self, rows: list[Row]) -> None:
        """The checkpoint that took ``rows`` (:meth:`position_rows`) is over: their positions may be merged past."""
        for _name, tp, off in self._positions_in(rows):
            taken = self._taken.get(tp)
            if taken is not None and off in taken:
                taken[off] -= 1
                if taken[off] <= 0:
                    del taken[off]
                if not taken:
                    del self._taken[tp]

    def _count(self, rows: list[Row]) -> int:
        counted = 0
        for name, tp, off in self._positions_in(rows):
            held = self._uncounted.get(tp)
            if not held:
                continue
            n = 0
            while held and held[0][0] <= off:
                n += held.popleft()[1]
            if not held:
                del self._uncounted[tp]
            if n:
                self.metrics.messages_in.labels(name).inc(n)
                counted += n
        return counted

    def _hold(self, tp: TopicPartition, offset: int, n: int) -> None:
        """``n`` messages before ``offset`` processed, to count once a stored position covers them.

        Past ``UNCOUNTED_MAX`` entries (checkpoints failing while reading goes on) two neighbours become one, at
        the later offset: the newest two whose earlier offset no checkpoint in flight has taken. Their messages
        are then counted together, with the first checkpoint storing a position past both; every position a
        checkpoint has taken stays a boundary, so once stored it counts all the messages it covers (merging
        past it would leave them to a later checkpoint, and a revoke before that would drop them while the new
        owner reads on from the stored position). The entries a partition holds stay bounded; a count is
        delayed, never made early, so never twice."""
        held = self._uncounted.setdefault(tp, collections.deque())
        held.append((offset, n))
        if len(held) <= UNCOUNTED_MAX:
            return
        taken = self._taken.get(tp) or collections.Counter()
        for i in range(len(held) - 2, -1, -1):
            if held[i][0] not in taken:
                (_, n1), (off2, n2) = held[i], held[i + 1]
                held[i + 1] = (off2, n1 + n2)
                del held[i]
                return

    def _moved(self, tp: TopicPartition, offset: int) -> None:
        """The read position of ``tp`` moved to ``offset`` other than by reading (reset or checked): the messages
        processed there and not counted yet are counted with the first checkpoint that stores a position from
        ``offset`` on (their effects are in the state it stores)."""
        held = self._uncounted.get(tp)
        if held:
            self._uncounted[tp] = collections.deque([(offset, sum(n for _, n in held))])

    async def stop(self) -> None:
        """Deliver what was collected, then stop the consumer and the producer."""
        if self._consumer is not None:
            await self._consumer.stop()
            self._consumer = None
        if self._producer is not None:
            sender, self.sender = self.sender, None
            try:
                if sender is not None:
                    await sender.flush()
            finally:
                await self._producer.stop()
                self._producer = None

    async def run(self) -> None:
        """Start (:meth:`start`, again every ``RETRY_S`` while a Kafka error ends it: the broker away as the clients
        start; :class:`StartWait` says so), then read and process batches until cancelled."""
        try:
            wait = StartWait(self.name, "clients", health=self.health)
            while self._consumer is None:
                try:
                    await self.start()
                except KafkaError as exc:  # as in a step: try again (never die), saying so now and then
                    wait.failed(exc)
                    await asyncio.sleep(RETRY_S)
            wait.done()
            assert self.sender is not None
            while True:
                try:
                    await self._step()
                except KafkaError as exc:  # broker away: keep what we have, try again (never die)
                    log.warning("%s: %r; retrying in %.0f s", self.name, exc, RETRY_S)
                    await asyncio.sleep(RETRY_S)
        finally:
            await self.stop()

    async def _step(self) -> None:
        assert self._consumer is not None and self.sender is not None
        if self._assignment_changed:
            await self._apply_assignment()
        if not self.owned:
            await asyncio.sleep(0.05)
            return
        if len(self.sender) >= HELD_MAX:  # the broker takes none of it: read no more until it does
            log.warning("%s: %d records wait for the broker; reading paused until it takes them", self.name,
                        len(self.sender))
            await self.sender.ship()  # raises while it cannot: run() waits and comes back here
            return
        if self._dead_bytes > DEAD_HELD_MAX_BYTES:  # dead letters the broker does not take: read no more
            await self._wait_for_dead_letters()
            return
        if self._dead_paused:
            self._dead_paused = False
            log.info("%s: the dead letters it holds are back within %d bytes; reading resumed", self.name,
                     DEAD_HELD_MAX_BYTES)
        try:
            batch = await self._consumer.getmany(timeout_ms=100, max_records=MAX_RECORDS)
        except OffsetOutOfRangeError as exc:
            self._reset(await self._guard().out_of_range(exc.args[0]))
            return
        if batch:
            await self.process(batch)
            await self.sender.ship()
            self._report_lag(batch)
        self._reset(await self._guard().after_fetch(self._owned_positions()))

    async def _wait_for_dead_letters(self) -> None:
        """Wait for the sender to deliver what it holds (an error it met is logged by the sender: try again
        after ``RETRY_S``)."""
        assert self.sender is not None
        if not self._dead_paused:
            self._dead_paused = True
            log.warning("%s: %d dead letters (%d bytes) wait for the broker; reading paused until it takes them",
                        self.name, len(self._dead_staged), self._dead_bytes)
        try:
            await self.sender.flush()
        except KafkaError:
            await asyncio.sleep(RETRY_S)

    def _guard(self) -> PositionGuard:
        assert self.guard is not None
        return self.guard

    def _owned_positions(self) -> dict[TopicPartition, int]:
        return {tp: off for tp, off in self.positions.items() if tp.partition in self.owned}

    def _reset(self, new: dict[TopicPartition, int]) -> None:
        """Positions the guard moved: read on from there (and record them with the next checkpoint)."""
        for tp, off in new.items():
            if tp.partition in self.owned:
                self.positions[tp] = off
                self._moved(tp, off)

    async def _apply_assignment(self) -> None:
        assert self._consumer is not None
        tps = [TopicPartition(t, p) for t in self.topics for p in sorted(self.owned)]
        self._consumer.assign(tps)
        self._guard().forget([tp for tp in list(self._guard().next_offsets) if tp not in tps])
        stored = await self._guard().on_assigned({tp: self.positions[tp] for tp in tps if tp in self.positions})
        self._assignment_changed = False
        for tp in tps:
            if tp in stored:
                if stored[tp] != self.positions.get(tp):
                    self._moved(tp, stored[tp])
                self.positions[tp] = stored[tp]
                self._consumer.seek(tp, stored[tp])
            else:
                await self._consumer.seek_to_beginning(tp)
        log.info("%s reads partitions %s", self.name, sorted(self.owned))

    def refuse(self, bad: list[Bad]) -> None:
        """Dead letters for what a handler or timer made but may not send (a training sample that breaks its contract:
        :class:`~app.streams.deadletter.Unsent`), handed to the running intake's sender now, bounded and counted as
        a batch's are."""
        assert self.sender is not None, "refuse() is for handlers and timers of a running intake"
        self._stage_dead(self.sender, bad)

    def _stage_dead(self, sender: BatchSender, bad: list[Bad]) -> None:
        staged = self.dead.stage(sender, bad)
        self._dead_staged.extend(staged)
        self._dead_bytes += sum(size for _, _, size in staged)

    async def process(self, batch: dict[TopicPartition, list[Any]]) -> int:
        """Process one fetched batch; messages processed.

        Each message in turn is decoded and checked, then handed to its handler. One that fails its contract,
        whose key is not its node or whose time is out of range (:mod:`app.contracts.admission`), that its
        handler refuses (a cap) or whose handling fails has a dead letter with the reason, handed to the
        intake's sender (:meth:`DeadLetters.stage`) like the handlers' outputs; then the read positions move past
        the batch. Nothing in between awaits: a checkpoint sees none of the batch (effects, dead letters,
        positions) or all of it, and it flushes the sender before it writes the positions, so those never pass
        a message whose dead letter the broker does not have.

        An intake not started has no sender: it waits until the broker has the dead letters
        (:meth:`DeadLetters.send_all`) before the positions move.
        """
        owned, topics = self.owned, self.topics
        bad: list[Bad] = []
        done: list[tuple[TopicPartition, int, int]] = []
        n = 0
        t0 = time.perf_counter()
        now, skew, age = self.clock.now(), self.settings.max_clock_skew_s, self.settings.max_event_age_s
        for tp, records in batch.items():
            if tp.partition not in owned:
                continue  # released while this batch was in flight: the new owner reads it
            name = topics[tp.topic]
            decode, handle, p = self.decoders[name], self.handlers[name], tp.partition
            for rec in records:
                try:
                    value = decode(rec.value)
                    check_key(name, rec.key, value)
                    check_time(name, value, now=now, max_skew_s=skew, max_age_s=age)
                    check_order(name, value)
                except ContractError as exc:
                    bad.append((rec, name, exc))
                    continue
                try:
                    handle(value, p)
                except ContractError as exc:  # a handler's own refusal (a cap), with its reason
                    bad.append((rec, name, exc))
                except Exception as exc:
                    log.exception("%s[%d]@%d: processing failed", name, p, rec.offset)
                    bad.append((rec, name, ContractError("processing_failed", f"{type(exc).__name__}: {exc}")))
            done.append((tp, records[-1].offset + 1, len(records)))
            n += len(records)
        if bad and self.sender is not None:
            self._stage_dead(self.sender, bad)
        spent = time.perf_counter() - t0
        if bad and self.sender is None:  # not started: stored before the positions move past them
            await self.dead.send_all(bad)
        for tp, off, k in done:
            if tp.partition in self.owned:
                self.positions[tp] = off
                self._hold(tp, off, k)  # counted once stored
        if n:
            self.metrics.processing.labels(self.name).observe(spent / n)
        return n


class StartWait:
    """What one reader says while its clients' start waits out a broker gone (tried again every ``RETRY_S``): one
    WARNING at the first failed try, another every ``remind_s`` while the tries fail (how long, how many), and
    one INFO once they started after failing, with how long it waited. A broker away for an hour is some 120
    lines per reader, not one a second. With ``health``, the worker is degraded (``kafka``, ``/readyz``) from the first
    failed try until the start passed: ``<name>: its <clients> not started for <s> s (<tries> tries): <last error>``.

    >>> t = [0.0]
    >>> w = StartWait("node-features", "clients", remind_s=30.0, clock=lambda: t[0])
    >>> for t[0] in (0.0, 1.0, 29.0, 30.5, 31.5):
    ...     w.failed(ConnectionError("down"))
    >>> w.tries, w.said
    (5, 2)
    """

    def __init__(self, name: str, clients: str, remind_s: float = START_REMIND_S,
                 clock: Callable[[], float] = time.monotonic, health: Health | None = None) -> None:
        self.name = name
        self.health = health
        self.clients = clients  # what starts: "clients", "consumer"
        self.remind_s = remind_s
        self.clock = clock
        self.tries = 0  # failed tries so far
        self.said = 0  # WARNING lines logged so far
        self._since: float | None = None  # the first failed try
        self._last = 0.0  # the last WARNING

    def failed(self, exc: BaseException) -> None:
        """A try failed with ``exc`` (the caller tries again after ``RETRY_S``)."""
        now = self.clock()
        self.tries += 1
        if self.health is not None:
            since = now if self._since is None else self._since
            self.health.waiting(KAFKA, self.name, f"{self.name}: its {self.clients} not started for {now - since:.0f} s"
                                f" ({self.tries} {'try' if self.tries == 1 else 'tries'}): {exc!r}")
        if self._since is None:
            self._since = self._last = now
            log.warning("%s: %r as its %s started; retrying every %g s until the broker answers (said again every"
                        " %g s while it lasts)", self.name, exc, self.clients, RETRY_S, self.remind_s)
        elif now - self._last >= self.remind_s:
            self._last = now
            log.warning("%s: its %s still not started after %.0f s (%d tries): %r; retrying", self.name, self.clients,
                        now - self._since, self.tries, exc)
        else:
            return
        self.said += 1

    def done(self) -> None:
        """The start passed: one INFO line when tries failed before it (and ``kafka`` no longer names it)."""
        if self.health is not None:
            self.health.done(KAFKA, self.name)
        if self._since is not None:
            log.info("%s: its %s started after %.0f s waiting for the broker (%d tries failed)", self.name,
                     self.clients, self.clock() - self._since, self.tries)
