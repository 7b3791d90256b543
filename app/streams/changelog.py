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
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable
from typing import Any

from app.kafka.batches import BatchSender

log = logging.getLogger(__name__)

MARKER_KEY = b"#checkpoint"

Row = tuple[int, bytes, bytes | None]  # changelog partition, key, value (None: delete)


async def flush_with_markers(table: Any, partitions: Iterable[int]) -> None:
    """Flush the table's changelog writes (Faust's producer), then end each partition with one marker."""
    await table.app.producer.flush()
    for partition in sorted(partitions):
        table.send_changelog(partition, MARKER_KEY, b"1")
    await table.app.producer.flush()


async def write_rows(table: Any, rows: Iterable[Row], *, last: Iterable[Row] = (),
                     sender: BatchSender | None = None, on_rewound: Callable[[set[int]], None] | None = None) -> int:
    """Write ``rows``, then ``last`` once ``rows`` are stored, then the markers; how many rows were written.

    Deleting a key the table does not hold writes nothing. The table's data takes each group once it is
    stored: after a write that failed, the same rows (deletions included) are written again. With
    ``sender``, partitions found rewound go to ``on_rewound`` once the write is stored.
    """
    data = table.data
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
        for _, key, value in both:
            _apply(data, key, value)
        return len(both)
    topic = table.changelog_topic.get_topic_name()
    for group in (first, tail):
        for partition, key, value in group:
            sender.add(topic, partition, key, value)
        await sender.flush()
        for _, key, value in group:
            _apply(data, key, value)
    for partition in sorted(written):
        sender.add(topic, partition, MARKER_KEY, b"1")
    await sender.flush()
    rewound = sender.take_rewound(topic)
    if rewound:
        log.warning("changelog %s partitions %s restart below what this process wrote there (the topic was "
                    "recreated): the state they held is written again", topic, sorted(rewound))
        if on_rewound is not None:
            on_rewound(rewound)
    return len(first) + len(tail)


def drop_partitions(data: Any, partitions: Collection[int], partition_of: Callable[[Any], int | None]) -> int:
    """Remove from the table's in-memory ``data`` every row whose partition (``partition_of(key)``, None for
    a key of no partition) is in ``partitions``; how many. Nothing is written to the changelog."""
    gone = [key for key in data.keys() if partition_of(key) in partitions]
    for key in gone:
        data.pop(key, None)
    return len(gone)


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
