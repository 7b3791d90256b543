"""node-metrics -> per-node windowed aggregates -> node-features (at most once per node per interval).

The agent folds each validated snapshot into its node's :class:`~app.features.window.NodeWindow` (a
few numpy operations, no table write) and emits the node's features when the node's last emit is at
least ``settings.feature_emit_interval_s`` old; a timer emits the nodes whose last snapshots are still
unsent. A second timer checkpoints the nodes' changed ring slots to the changelogged table
(:meth:`~app.streams.node_table.NodeStateTable.checkpoint`), so a restarted worker reads its partitions'
state back.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any

import faust

from app.config import Settings
from app.contracts import contract, encode
from app.streams.context import context_of
from app.streams.deadletter import validated
from app.streams.metrics import EVENT_AGE, FEATURES_EMITTED, LATE_EVENTS, MESSAGES_OUT, PROCESSING
from app.streams.node_state import NodeState
from app.streams.node_table import NodeStateTable, NodeStore, node_state_table
from app.streams.topics import contract_topic

log = logging.getLogger(__name__)

HANDLE = "node_features"
TABLE_NAME = "node-window"


@dataclasses.dataclass
class NodeFeatures:
    """What the component registered: its store (per-node windows), table, agent and topics."""

    store: NodeStore
    table: NodeStateTable
    agent: Any
    source: faust.TopicT
    sink: faust.TopicT
    emitted: int = 0


def register_node_features(app: faust.App, settings: Settings) -> NodeFeatures:
    """Add the node-metrics agent, its emit timer and its table to ``app``; returns the handle."""
    ctx = context_of(app)
    clock, dead = ctx.clock, ctx.dead
    source = contract_topic(app, settings, "node-metrics")
    sink = contract_topic(app, settings, "node-features")
    interval = settings.feature_emit_interval_s
    store = NodeStore(settings.feature_window_s, ctx.options, interval)
    table = node_state_table(app, TABLE_NAME, store, source.get_topic_name(), contract("node-metrics").partitions)
    get_row = table.data.get
    late = LATE_EVENTS.labels("node-metrics")
    timing = PROCESSING.labels("node-features")
    age = EVENT_AGE.labels("node-metrics")
    out_counter = MESSAGES_OUT.labels("node-features")

    async def emit(state: NodeState) -> None:
        value = encode("node-features", state.features_value(), check=False)
        state.pending = False
        state.last_emit = clock.monotonic()
        handle.emitted += 1
        FEATURES_EMITTED.inc()
        out_counter.inc()
        await sink.send(key=state.node.encode(), value=value)

    async def node_metrics(stream: faust.StreamT) -> None:
        perf = time.perf_counter
        async for event, snap in validated(stream, "node-metrics", dead):
            t0 = perf()
            partition = event.message.partition
            state = store.state(snap["node"], partition, get_row)
            if not state.update(snap, partition):
                late.inc()
                continue
            if clock.monotonic() - state.last_emit >= interval:
                await emit(state)
            timing.observe(perf() - t0)
            age.observe(clock.now() - snap["ts"])

    agent = app.agent(source, name="node-features")(node_metrics)

    @app.timer(max(interval, 0.05), name="node-features-flush")
    async def flush() -> None:
        for state in store.due(clock.monotonic()):
            await emit(state)

    @app.timer(ctx.options.checkpoint_interval_s, name="node-window-checkpoint")
    async def checkpoint() -> None:
        await table.checkpoint()

    handle = NodeFeatures(store, table, agent, source, sink)
    ctx.handles[HANDLE] = handle
    return handle


def node_features_of(app: faust.App) -> NodeFeatures:
    """The handle registered on ``app`` (for components that read the windows, e.g. the feedback loop)."""
    return context_of(app).handles[HANDLE]  # type: ignore[no-any-return]
