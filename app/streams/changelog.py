"""Writing a table's changelog rows outside stream iteration, in checkpoints.

Both tables of the worker are written by checkpoints (timers, rebalances, a clean stop), with each row's
changelog partition known to the caller (the partition of the node it belongs to). :func:`write_rows`
writes the rows, waits until they are stored, then writes the ``last`` rows (the intake's read
positions) and waits again, so within a partition the log never holds positions ahead of the state they
describe. The table's in-memory data is kept equal to what the changelog holds, for the partitions the
worker holds: Faust's memory store forgets, once a recovery ends, only the keys it read from the changelog
itself, not the rows written here, so on a rebalance each table removes the rows of the partitions it lost
(:func:`drop_partitions`). A partition that comes back is read again from its changelog.

Each checkpoint ends with one marker record alone in its batch on every partition it wrote: the embedded
broker (Tansu) answers a "latest offset" request with the base offset of the last record batch + 1, so
Faust's recovery, which reads a changelog up to that offset, would skip the other records of a last batch
of several. Recovery ignores the marker (it is not a row key of either table).

A write whose rows are stored below the end of what this process wrote before on their partition (the
topic was recreated: a broker that lost its data) calls ``on_rewound`` with those partitions: the caller
marks the state it keeps of them to be written again, or a restart would restore only what changed since.

Rows go out on the intake's producer as whole record batches (:class:`~app.kafka.batches.BatchSender`)
when one is running — thousands of rows per second would cost Faust's per-record path a large share of
the worker — else through Faust's producer (before the intake starts, after it stops). The sender's flush
also delivers what the intake produced on it (training samples, node-features), sending again whatever
the broker did not take, and raises while any of it is undelivered: the positions written after it never
cover a message whose output is not stored. A failed write's rows are written again by the next
checkpoint, behind the sender's own resend of them, so a row's newest value stays the last in its log.

**Recovery of a recreated changelog.** Faust's recovery keeps, for each changelog partition the worker holds,
the offset up to which it has read that partition into the table, across rebalances, and raises
``ConsistencyError`` (the worker ends with a traceback) when the partition's end is below it. A worker that
restored its tables from the changelogs when it started holds such offsets; a memory-only broker that comes
back empty recreates the changelogs below them. :class:`ChangelogTableManager` (the worker's table manager)
runs a recovery that compares the two as soon as it knows the ends: a partition that restarts below what was
read of it is reset to be read from its start (what it holds now was written by this worker, already in the
table: reading it again changes nothing), logged on one line, and, for a partition this worker owns, handed
to the manager's ``on_recreated(table, partitions)``: the caller marks the state kept of them to be written
again, as for a write found rewound. The line says what was done: marked to be written again, nothing kept to
write (a table no writer handles), or, an ERROR, that marking failed (counted,
``rtt_worker_changelog_rewrite_failures_total{table}``; the worker goes on). A recreated standby partition is
sought to its start from the hook as well: Faust seeks the standby partitions before it asks for their ends.
The memory store persists no offsets (``persisted_offset`` is always None): the recovery's own offsets are all
there is to reset.

One wipe is handled once per partition, whichever finds it first: a write found rewound resets the recovery's
offset of the partition when it is beyond the partition's new end (nothing left for the recovery to find), and
the recovery's ``on_recreated`` makes the sender forget the end it recorded there
(:meth:`~app.kafka.batches.BatchSender.forget`), so ``rtt_worker_changelog_rewinds_total`` counts each
recreated partition once and its state is written again once.

What offsets alone cannot tell: a partition whose new log already reaches past the offset read of it before the
wipe (read up to 70, recreated, 120 records written since) looks like one that grew, and the recovery reads it
on from 70. The table's data is still right (this worker holds it in memory, and wrote those 120 records);
the changelog is right too when this process had written to the partition before the wipe, since its first
write after it was found rewound and everything kept of the partition written again. It is not when this
process had restored the partition but written nothing to it before the wipe: the new log holds only what
changed since, and a worker restoring from it (a restart, a rebalance to another worker) starts the nodes of
the rest without their history. A standby copy of such a partition likewise reads on from its old offset and
misses what the owner wrote again below it.

Faust's recovery is extended through private members (``_build_highwaters``, ``_seek_offsets``, the offsets
and ends it keeps), tested with faust-streaming :data:`TESTED_FAUST` (``deploy/constraints.txt``; the unit tests
run Faust's own ``_restart_recovery``): another installed version is named in a WARNING when the recovery is
built.
"""

from __future__ import annotations

import importlib.metadata
import logging
from collections.abc import Callable, Collection, Iterable
from typing import Any

from faust.tables.manager import TableManager
from faust.tables.recovery import Recovery
from faust.types import TP

from app.kafka.batches import BatchSender

log = logging.getLogger(__name__)

MARKER_KEY = b"#checkpoint"
TESTED_FAUST = "0.15.3"  # the faust-streaming release RecreatedChangelogRecovery is tested with

Row = tuple[int, bytes, bytes | None]  # changelog partition, key, value (None: delete)


async def flush_with_markers(table: Any, partitions: Iterable[int]) -> None:
    """Flush the table's changelog writes (Faust's producer), then end each partition with one marker."""
    await table.app.producer.flush()
    for partition in sorted(partitions):
        table.send_changelog(partition, MARKER_KEY, b"1")
    await table.app.producer.flush()


async def write_rows(table: Any, rows: Iterable[Row], *, last: Iterable[Row] = (),
                     sender: BatchSender | None = None, on_rewound: Callable[[set[int]], None] | None = None,
                     held: Callable[[int], bool] | None = None) -> int:
    """Write ``rows``, then ``last`` once ``rows`` are stored, then the markers; how many rows were written.

    Deleting a key the table does not hold writes nothing. The table's data takes each group once it is
    stored: after a write that failed, the same rows (deletions included) are written again. With
    ``sender``, partitions found rewound go to ``on_rewound`` once the write is stored. ``held`` is asked before
    each step (handing a group or the markers over, applying a group) whether a partition is still the writer's:
    a partition revoked meanwhile has nothing more written or applied (its new owner writes it).
    """
    data = table.data
    mine = (lambda _p: True) if held is None else held
    first = [r for r in rows if r[2] is not None or r[1] in data]
    tail = [r for r in last if r[2] is not None or r[1] in data]
    written = {p for p, _, _ in first} | {p for p, _, _ in tail}
    if not written:
        return 0
    if sender is None:
        both = first + tail
        for partition, key, value in both:
            table.send_changelog(partition, key, value)
        await flush_with_markers(table, written)
        for partition, key, value in both:
            if mine(partition):
                _apply(data, key, value)
        return len(both)
    topic = table.changelog_topic.get_topic_name()
    n = 0
    for group in (first, tail):
        group = [r for r in group if mine(r[0])]
        for partition, key, value in group:
            sender.add(topic, partition, key, value)
        n += len(group)
        await sender.flush()
        for partition, key, value in group:
            if mine(partition):
                _apply(data, key, value)
    for partition in sorted(p for p in written if mine(p)):
        sender.add(topic, partition, MARKER_KEY, b"1")
    await sender.flush()
    rewound = sender.take_rewound(topic)
    if rewound:
        log.warning("changelog %s partitions %s restart below what this process wrote there (the topic was "
                    "recreated): %s", topic, sorted(rewound),
                    "the state they held is written again" if on_rewound is not None else "nothing kept to write again")
        recovery = _recovery_of(table)
        if recovery is not None:
            recovery.found_rewound(topic, {p: sender.end(topic, p) for p in rewound})
        if on_rewound is not None:
            on_rewound(rewound)
    return n


def drop_partitions(data: Any, partitions: Collection[int], partition_of: Callable[[Any], int | None]) -> int:
    """Remove from the table's in-memory ``data`` every row whose partition (``partition_of(key)``, None for
    a key of no partition) is in ``partitions``; how many. Nothing is written to the changelog."""
    gone = [key for key in data.keys() if partition_of(key) in partitions]
    for key in gone:
        data.pop(key, None)
    return len(gone)


def found_recreated(offsets: Any, highwaters: Any) -> set[TP]:
    """The partitions whose recorded read offset is beyond their last offset (``highwaters``: the end - 1, -1
    for an empty partition): the topic was recreated below what was read of it.

    >>> sorted(found_recreated({TP("c", 0): 796, TP("c", 1): 5, TP("c", 2): None, TP("c", 3): 4},
    ...                        {TP("c", 0): 263, TP("c", 1): 9, TP("c", 2): 3, TP("c", 3): -1}))
    [TP(topic='c', partition=0), TP(topic='c', partition=3)]
    """
    return {tp for tp, end in highwaters.items()
            if end is not None and (read := offsets.get(tp)) is not None and read > end}


class RecreatedChangelogRecovery(Recovery):
    """Faust's recovery, which reads a changelog partition found recreated below its recorded offset again from
    its start instead of raising ``ConsistencyError`` (module docstring)."""

    async def _build_highwaters(self, consumer: Any, tps: Any, destination: Any, title: str) -> None:
        # the ends are known here: for the active partitions before the offsets to read from are built and checked
        # against them, for the standby ones after Faust sought them (0.15.3)
        await super()._build_highwaters(consumer, tps, destination, title)
        active = destination is self.active_highwaters
        offsets = self.active_offsets if active else self.standby_offsets
        recreated = found_recreated(offsets, destination)
        for topic in sorted({tp.topic for tp in recreated}):
            tps = sorted(tp for tp in recreated if tp.topic == topic)
            read = {tp.partition: offsets[tp] for tp in tps}
            for tp in tps:
                offsets[tp] = -1  # nothing of it read: read from its start
            if active:
                level, done = self._write_again(self.tp_to_table.get(tps[0]), set(read))
            else:  # Faust sought them to the old offsets already
                await self._seek_offsets(consumer, set(tps), offsets, title)
                level, done = logging.WARNING, ""
            log.log(level, "changelog %s partitions %s restart below what this worker read of them (%s; read up to "
                    "%s, the last offsets now %s: the topic was recreated): read again from their start%s",
                    topic, sorted(read), title, read, {tp.partition: destination[tp] for tp in tps}, done)

    def _write_again(self, table: Any, partitions: set[int]) -> tuple[int, str]:
        """Hand the owned ``partitions`` of ``table`` to the manager's ``on_recreated``: the log level and the end
        of the line saying what was done."""
        on_recreated: Callable[[Any, set[int]], bool] | None = getattr(self.tables, "on_recreated", None)
        if table is None or on_recreated is None:
            return logging.WARNING, "; nothing kept of them is written again (no writer for this changelog)"
        try:
            marked = on_recreated(table, partitions)
        except Exception as exc:  # out of the recovery it would end the worker
            failures = getattr(self.tables, "rewrite_failures", None)
            if failures is not None:
                failures.labels(table.name).inc(len(partitions))
            return logging.ERROR, f"; marking the state held of them to be written again failed: {exc!r}"
        if not marked:
            return logging.WARNING, f"; nothing kept of them is written again (table {table.name} keeps none)"
        return logging.WARNING, "; the state held of them is marked to be written again"

    def found_rewound(self, topic: str, ends: dict[int, int | None]) -> None:
        """A write found ``topic``'s partitions rewound, ``ends``: the offset after what it stored there (None:
        unknown). A partition read beyond that end is reset to be read from its start, as the recovery would have:
        the recovery finds nothing more of the same wipe (module docstring)."""
        for partition, end in ends.items():
            tp = TP(topic, partition)
            read = self.active_offsets.get(tp)
            if end is not None and read is not None and read > end - 1:
                self.active_offsets[tp] = -1


def untested_faust(installed: str | None = None) -> str | None:
    """The WARNING to log when the installed faust-streaming is not :data:`TESTED_FAUST`, else None."""
    if installed is None:
        try:
            installed = importlib.metadata.version("faust-streaming")
        except importlib.metadata.PackageNotFoundError:
            installed = "(version unknown)"
    if installed == TESTED_FAUST:
        return None
    return (f"faust-streaming {installed} is installed: the worker's recovery of recreated changelogs extends "
            f"private members of Faust's Recovery and is tested with {TESTED_FAUST} only (deploy/constraints.txt); "
            "run tests/unit/streams/test_recovery_recreated.py against this version")


class ChangelogTableManager(TableManager):
    """Faust's table manager with :class:`RecreatedChangelogRecovery` as its recovery (``TableManager=`` of the
    app). ``on_recreated(table, partitions)`` is called with the owned partitions of a table found recreated and
    returns whether it marked their state to be written again; ``rewrite_failures``, when set, is the labelled
    counter (by table) of partitions for which it raised."""

    on_recreated: Callable[[Any, set[int]], bool] | None = None
    rewrite_failures: Any = None

    @property
    def recovery(self) -> Recovery:
        if self._recovery is None:
            warning = untested_faust()
            if warning is not None:
                log.warning("%s", warning)
            self._recovery = RecreatedChangelogRecovery(self.app, self, beacon=self.beacon, loop=self.loop)
        return self._recovery


def _recovery_of(table: Any) -> RecreatedChangelogRecovery | None:
    """The recovery of ``table``'s app when it is a :class:`RecreatedChangelogRecovery` (else None)."""
    manager = getattr(getattr(table, "app", None), "tables", None)
    if not isinstance(manager, ChangelogTableManager):
        return None
    recovery = manager.recovery
    return recovery if isinstance(recovery, RecreatedChangelogRecovery) else None


def compact(value: bytes) -> bytes:
    """``value`` in a buffer of its own size.

    orjson (3.13) returns its output in a buffer of 4 KB or more; a table keeping hundreds of thousands of
    small rows (the join's entries) would hold 4 KB each — measured: 393 MB for 100,000 rows of 46 bytes,
    8.6 MB once copied. Rows kept in memory are therefore copied.
    """
    return bytes(memoryview(value))


def _apply(data: Any, key: bytes, value: bytes | None) -> None:
    if value is None:
        data.pop(key, None)
    else:
        data[key] = compact(value)
