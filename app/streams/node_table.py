"""The node states of the partitions this worker owns, and the changelogged table that persists them.

:class:`NodeStateTable` is a Faust table whose changelog partition of a row is the node-metrics partition
its node came from (so a worker that takes over a partition recovers exactly those nodes' rows), which
also lets rows be written outside stream iteration (the checkpoint timer). On a rebalance, the states of
revoked partitions are checkpointed and dropped from memory; a node seen again is rebuilt from the
recovered rows. A clean stop checkpoints too.

Each checkpoint ends with the producer flushed and one marker record alone in its batch on every
partition it wrote: the embedded broker (Tansu) answers a "latest offset" request with the base offset
of the last record batch + 1, so Faust's recovery, which reads a changelog up to that offset, would skip
the other records of a last batch of several.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from typing import Any

import faust

from app.streams.metrics import NODES
from app.streams.node_state import NodeState, node_of_key
from app.streams.options import WorkerOptions

log = logging.getLogger(__name__)

MARKER_KEY = b"#checkpoint"


async def flush_with_markers(table: Any, partitions: Iterable[int]) -> None:
    """Flush the table's changelog writes, then end each written partition with one marker record.

    The embedded broker reports a partition's end as the base offset of its last batch + 1, so a recovering
    worker would skip the rest of that batch; a lone marker record after the batch keeps every row readable.
    """
    await table.app.producer.flush()
    for partition in sorted(partitions):
        table.send_changelog(partition, MARKER_KEY, b"1")
    await table.app.producer.flush()


class NodeStore:
    """In-memory :class:`NodeState` per node, created or rebuilt on a node's first message."""

    def __init__(self, window_s: float, options: WorkerOptions, emit_interval_s: float) -> None:
        self.window_s = window_s
        self.options = options
        self.emit_interval_s = emit_interval_s
        self.states: dict[str, NodeState] = {}

    def state(self, node: str, partition: int, get: Callable[[bytes], bytes | None]) -> NodeState:
        s = self.states.get(node)
        if s is None:
            o = self.options
            s = NodeState.restore(node, partition, get, window_s=min(self.window_s, o.history_s),
                                  history_s=o.history_s, bucket_s=o.bucket_s, max_metrics=o.max_metrics)
            if s.window.newest >= 0:
                log.info("node %s: window rebuilt from the changelog (%d metrics)", node, len(s.window.names))
            self.states[node] = s
            NODES.set(len(self.states))
        return s

    def due(self, now: float) -> list[NodeState]:
        """States with unsent changes whose last emit is at least the emit interval old."""
        limit = now - self.emit_interval_s
        return [s for s in self.states.values() if s.pending and s.last_emit <= limit]

    def partition_of(self, node: str) -> int | None:
        s = self.states.get(node)
        return s.partition if s is not None else None

    def drop_partitions(self, partitions: set[int]) -> int:
        gone = [n for n, s in self.states.items() if s.partition in partitions]
        for n in gone:
            del self.states[n]
        NODES.set(len(self.states))
        return len(gone)


class NodeStateTable(faust.Table):
    """Changelogged rows of node states; the row's partition follows its node's source partition."""

    store: NodeStore
    source_topic: str

    def partition_for_key(self, key: Any) -> int | None:
        p = self.store.partition_of(node_of_key(key))
        return p if p is not None else super().partition_for_key(key)

    async def checkpoint(self, states: Iterable[NodeState] | None = None) -> int:
        """Write the changed rows of ``states`` (default: all), flush, mark each written partition."""
        written: set[int] = set()
        n = 0
        for state in list(self.store.states.values()) if states is None else states:
            for key, row in state.take_rows():
                self[key] = row
                written.add(state.partition)
                n += 1
        if written:
            await flush_with_markers(self, written)
        return n

    async def on_rebalance(self, assigned: Any, revoked: Any, newly_assigned: Any, generation_id: int = 0) -> None:
        lost = {tp.partition for tp in revoked if tp.topic == self.source_topic}
        if lost:
            await self.checkpoint([s for s in self.store.states.values() if s.partition in lost])
            log.info("partitions %s revoked: dropped %d node states", sorted(lost), self.store.drop_partitions(lost))
        await super().on_rebalance(assigned, revoked, newly_assigned, generation_id)

    async def on_stop(self) -> None:
        try:
            n = await self.checkpoint()
            log.info("stopping: checkpointed %d node window rows", n)
        except Exception as exc:  # the producer may be gone already; a restart then re-reads less
            log.warning("stopping: checkpoint failed: %r", exc)
        await super().on_stop()


def node_state_table(app: faust.App, name: str, store: NodeStore, source_topic: str, partitions: int) -> NodeStateTable:
    """Create and register the table on ``app``."""
    table = NodeStateTable(
        app, name=name, default=None, beacon=app.tables.beacon, partitions=partitions,
        key_type=bytes, value_type=bytes, help="node window rows: b'{node}#{slot}' and b'{node}#meta'",
    )
    table.store = store
    table.source_topic = source_topic
    return app.tables.add(table)  # type: ignore[return-value]
