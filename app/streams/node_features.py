"""node-metrics -> per-node windowed aggregates -> node-features (at most once per node per interval).

A :class:`~app.streams.intake.PartitionIntake` reads the node-metrics partitions this worker owns in
batches; each validated snapshot is folded into its node's :class:`~app.features.window.NodeWindow` (a
few numpy operations, no table write), and the component emits the node's features when the node's last emit is at
least ``settings.feature_emit_interval_s`` old; a timer emits the nodes whose last snapshots are still
unsent. A node-features message is sent until the broker has it (:class:`~app.kafka.batches.BatchSender`)
and counted then (``rtt_worker_node_features_emitted_total``). A second timer checkpoints the nodes'
changed ring slots to the changelogged table (:meth:`~app.streams.node_table.NodeStateTable.checkpoint`),
so a restarted worker reads its partitions' state back.

After each recovery the handle notes the nodes whose window rows were read back and that have no state in
memory (:attr:`NodeFeatures.restored`, with the partition of their rows): a node no message names again is
rebuilt by none, and eviction finds, and deletes, its rows through that record
(:meth:`NodeFeatures.forget`, :mod:`app.streams.eviction`).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Collection, Container
from typing import Any

import faust

from app.config import Settings
from app.contracts import contract, encode
from app.kafka.batches import partition_for
from app.streams.context import context_of
from app.streams.intake import PartitionIntake
from app.streams.node_state import META, NodeState, node_of_key, row_key
from app.streams.node_table import NodeStateTable, NodeStore, node_state_table
from app.streams.timers import timer

log = logging.getLogger(__name__)

HANDLE = "node_features"
TABLE_NAME = "node-window"


def clock_went_back(state: NodeState, ts: float, now: float) -> bool:
    """Whether a snapshot the node's window drops as late means the node's clock went back.

    The window keeps ``history_s`` before its newest snapshot. A snapshot older than that is late — unless
    this worker's clock sides with the snapshot: the snapshot is nearer to now than the window's newest
    is. Then the newest was ahead (the node's clock ran fast, within ``RTT_MAX_CLOCK_SKEW_S``) and has come
    back, and the window starts afresh from the snapshot; a message that merely arrives late leaves it.

    >>> s = NodeState.new("n", 0, window_s=10.0, history_s=60.0)
    >>> s.update({"node": "n", "ts": 1200.0, "node_class": "cpu", "metrics": {}}, 0)
    True
    >>> clock_went_back(s, 1000.0, now=1001.0), clock_went_back(s, 1000.0, now=1199.0)
    (True, False)
    """
    return abs(now - ts) < abs(state.newest_ts - now)


def read_back(table: NodeStateTable, states: Container[str], partitions: int) -> dict[str, int]:
    """Nodes with window rows in ``table`` and no state in ``states``: node -> the changelog partition of its rows.

    Faust's memory store records the partition each key was recovered from; a row without one (none is
    expected: the rows this process writes are those of its states) is placed by its node's key, as the
    producers of node-metrics place the node's messages (the changelog is co-partitioned with them).
    """
    recorded = getattr(table.data, "_key_partition", None) or {}
    out: dict[str, int] = {}
    for key in list(table.data.keys()):
        node = node_of_key(key)
        if not node or node in states or node in out:  # "": the read-position rows and checkpoint markers
            continue
        p = recorded.get(key)
        out[node] = int(p) if p is not None else partition_for(node.encode(), partitions)
    return out


@dataclasses.dataclass
class NodeFeatures:
    """What the component registered: its store (per-node windows), table and intake."""

    store: NodeStore
    table: NodeStateTable
    intake: PartitionIntake
    emitted: int = 0  # node-features messages made (handed to the sender; counted on /metrics once delivered)
    # node -> partition: window rows read back by the last recovery, of nodes with no state in memory then
    restored: dict[str, int] = dataclasses.field(default_factory=dict)

    def restored_nodes(self) -> dict[str, int]:
        """Nodes whose window rows were read back from the changelog and that still have no state in memory,
        in the partitions the intake reads: node -> partition. A node rebuilt since (a message named it)
        leaves the record: its state holds the rows now."""
        states, owned = self.store.states, self.intake.owned
        for n in [n for n in self.restored if n in states]:
            del self.restored[n]
        return {n: p for n, p in self.restored.items() if p in owned}

    def forget(self, nodes: Collection[str]) -> int:
        """Evicted ``nodes`` leave: their states, and every window row of theirs — of a state in memory or read
        back from the changelog of a partition the intake reads — from memory and, by tombstones, from the
        changelog; rows deleted."""
        states, owned = self.store.states, self.intake.owned
        where: dict[str, int] = {}
        for n in nodes:
            state, partition = states.pop(n, None), self.restored.pop(n, None)
            if state is not None:
                where[n] = state.partition
            elif partition is not None and partition in owned:
                where[n] = partition
        deleted = self.table.tombstone_nodes(where)
        recorded = getattr(self.table.data, "_key_partition", None)
        if recorded:  # Faust's note of where each recovered row came from, else kept while the partition is held
            slots = self.store.slots()
            for n in where:
                for key in [row_key(n, slot) for slot in range(slots)] + [row_key(n, META)]:
                    recorded.pop(key, None)
        return deleted


def register_node_features(app: faust.App, settings: Settings) -> NodeFeatures:
    """Add the node-metrics intake, its emit timer and its table to ``app``; returns the handle."""
    ctx = context_of(app)
    clock, bounds = ctx.clock, ctx.bounds
    sink_name = settings.topic("node-features")
    sink_partitions = contract("node-features").partitions
    interval = settings.feature_emit_interval_s
    store = NodeStore(settings.feature_window_s, ctx.options, interval)
    table = node_state_table(app, TABLE_NAME, store, ctx.ownership_topic, contract("node-metrics").partitions)
    get_row = table.data.get
    metrics = ctx.metrics
    table.rewinds = metrics.changelog_rewinds.labels(TABLE_NAME)
    metrics.nodes.set_function(lambda: len(store.states))
    late = metrics.late_events.labels("node-metrics")
    age = metrics.event_age.labels("node-metrics")

    def emit(state: NodeState) -> None:
        value = encode("node-features", state.features_value(store.app_names), check=False)
        state.pending = False
        state.last_emit = clock.monotonic()
        handle.emitted += 1
        key = state.node.encode()  # counted once the broker has it (count_delivered below)
        intake.sender.add(sink_name, partition_for(key, sink_partitions), key, value)  # type: ignore[union-attr]

    def on_snapshot(snap: dict[str, Any], partition: int) -> None:
        node = snap["node"]
        bounds.admit_node(node, clock.monotonic(), partition)  # node_cap beyond RTT_WORKER_MAX_NODES
        state = store.state(node, partition, get_row)
        if not state.update(snap, partition):
            if not clock_went_back(state, snap["ts"], clock.now()):
                late.inc()
                return
            log.warning("node %s: its clock went back (snapshot ts %.1f, window newest %.1f, this clock %.1f):"
                        " its window starts afresh", node, snap["ts"], state.newest_ts, clock.now())
            metrics.clock_resets.inc()
            table.tombstone_nodes({node: state.partition})
            store.states.pop(node, None)
            state = store.state(node, partition, get_row)
            state.update(snap, partition)
        if clock.monotonic() - state.last_emit >= interval:
            emit(state)
        age.observe(clock.now() - snap["ts"])

    intake = PartitionIntake(settings, {"node-metrics": on_snapshot}, ctx.dead, name="node-features", clock=clock,
                             metrics=metrics, request_timeout_ms=ctx.options.request_timeout_ms,
                             health=ctx.health)
    intake.count_delivered("node-features", metrics.features_emitted)
    table.intake = intake

    @app.task
    async def node_metrics() -> None:
        await intake.run()

    @timer(app, max(interval, 0.05), "node-features-flush")
    async def flush() -> None:
        if not intake.running:
            return
        for state in store.due(clock.monotonic()):
            emit(state)
        await intake.sender.ship()  # type: ignore[union-attr]

    @timer(app, ctx.options.checkpoint_interval_s, "node-window-checkpoint")
    async def checkpoint() -> None:
        await table.checkpoint()

    handle = NodeFeatures(store, table, intake)

    async def found_restored() -> None:  # after each recovery, once Faust dropped the rows of partitions lost
        handle.restored = read_back(table, store.states, contract("node-metrics").partitions)
        if handle.restored:
            log.info("window rows of %d node(s) with no state here read back: %s", len(handle.restored),
                     sorted(handle.restored)[:10])

    table.on_recover(found_restored)
    ctx.handles[HANDLE] = handle
    return handle


def node_features_of(app: faust.App) -> NodeFeatures:
    """The handle registered on ``app`` (for components that read the windows, e.g. the feedback loop)."""
    return context_of(app).handles[HANDLE]  # type: ignore[no-any-return]
