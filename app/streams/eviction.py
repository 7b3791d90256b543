"""Nodes and apps that went silent leave the worker: state, changelog rows, metric series, compacted views.

Every ``min(RTT_NODE_EVICT_AFTER_S / 4, 30 s)`` the worker looks for nodes no message named for
``RTT_NODE_EVICT_AFTER_S`` (default 10 min, by arrival on this worker's clock:
:class:`~app.streams.bounds.Bounds`). For each it

* drops the node's window and tracker from memory, and deletes their changelog rows (tombstones), so a
  restarted worker does not bring them back and the compacted changelogs stay the size of the live nodes —
  the window rows by key, whether a window state in memory holds them or they were read back from the
  changelog and no node-metrics message rebuilt them (a node named since only by predictions or completions);
* removes its ``rtt_worker_node_weight{node}`` series;
* sends a tombstone (key = node, no value) on node-features and node-weights, so the extenders and any
  compacted reader forget the node as well — each on the producer that sends that topic's values, so
  the tombstone is the last word of its partition.

A node the worker holds state of that no message has named since this process started — its window rows,
tracker or join entries read back from the changelogs after a restart or a rebalance
(:attr:`~app.streams.node_features.NodeFeatures.restored`, ``FeedbackLoop.partitions``) — is evicted the same
way once none has named it for ``RTT_NODE_EVICT_AFTER_S``, counted from when the worker found it so (a node
that left the cluster shortly before a restart would otherwise keep its state, rows and compacted values for
ever). The state of a partition being revoked is not, nor is a node whose window state is of one
(:attr:`~app.streams.node_table.NodeStore.leaving`, while the revoke's last checkpoint of it is written), nor a
node whose tracker or join entries are of a partition the feedback loop no longer holds (``FeedbackLoop.held``:
Faust revokes the node table first, and the feedback table's revoke, after it, can wait long for its
checkpoint): its new owner holds it, and its tombstones would go to a changelog partition the new owner writes,
or tell node-features and node-weights to forget a node the new owner holds.

The node-features tombstone goes out with the intake's records, sent again until the broker acknowledges
it. A node-weights tombstone the broker did not acknowledge (the broker away past the producer's request
timeout) is kept and sent again by the next tick, and the ones after, until one is acknowledged; the failure
is counted in ``rtt_worker_send_failures_total{topic="node-weights", outcome="retried"}`` (``dropped``,
and not sent again, for an error sending again cannot cure: :func:`app.kafka.batches.permanent`). A node
heard of again before that (a message named it, or it has state here again) is not sent its tombstone:
its new values supersede it. Tombstones are checked and sent under ``WorkerContext.weights_lock``, the lock
the node-weights timer sends its values under, so a tombstone never follows a newer value of its node.

An app no completion or prediction named for as long is retired: it leaves the app cap, its
``rtt_worker_prediction_rmse_ms`` / ``rtt_worker_prediction_mape`` series go, and so does everything the
feedback loop keeps of it (:meth:`~app.streams.feedback_state.FeedbackLoop.forget_apps`): its state in every
node's tracker and their changelog rows (rewritten without it), its DWA windows, sample counts and per-key
retrain bookkeeping, its entries in the next node-weights values (``predicted_rtt_ms``, ``correction``,
``samples``), and its models, unloaded (no more predictions every period). The announced version of each
of its model keys is kept; the app's next message loads them again from the registry
(:meth:`~app.streams.feedback_state.FeedbackLoop.app_heard`). An app the worker holds state of without it
being named — restored from a checkpoint, or a model read from model-updates at start — is retired the
same way once no message has named it for ``RTT_NODE_EVICT_AFTER_S``.
Nodes a rebalance moved to another worker leave the caps' count here without tombstones (their new owner
holds them). Evictions are counted in ``rtt_worker_evicted_total{kind}`` (``node``, ``app``).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import faust

from app.config import Settings
from app.contracts import contract
from app.kafka.batches import DROPPED, RETRIED, partition_for, permanent
from app.streams.context import context_of
from app.streams.node_features import node_features_of
from app.streams.timers import timer
from app.streams.topics import contract_topic, track_delivery

log = logging.getLogger(__name__)

NODE_CLASSES = ("cpu", "gpu")


def _remove(metric: object, *labels: str) -> None:
    try:
        metric.remove(*labels)  # type: ignore[attr-defined]
    except KeyError:
        pass


def register_eviction(app: faust.App, settings: Settings) -> None:
    """Add the eviction timer to ``app`` (after the node-features and feedback components)."""
    ctx = context_of(app)
    clock, bounds, after = ctx.clock, ctx.bounds, settings.node_evict_after_s
    nodes = node_features_of(app)
    loop = ctx.handles.get("feedback")
    fm, evicted = ctx.metrics.feedback, ctx.metrics.evicted
    features_topic, features_partitions = settings.topic("node-features"), contract("node-features").partitions
    weights_topic = contract_topic(app, settings, "node-weights")
    retried = ctx.metrics.send_failures.labels("node-weights", RETRIED)
    dropped = ctx.metrics.send_failures.labels("node-weights", DROPPED)
    owed: set[str] = set()  # evicted nodes whose node-weights tombstone is to be sent (again)
    apps_unheard: dict[str, float] = {}  # app held by the loop but not admitted -> when first found so
    nodes_unheard: dict[str, float] = {}  # node held here but not admitted -> when first found so

    def evict_now() -> tuple[set[str], list[str]]:
        now = clock.monotonic()
        states, leaving = nodes.store.states, nodes.store.leaving
        # a window state, not of a partition being revoked (its new owner holds it), or its rows read back (of a
        # partition held)
        window = {n for n, s in states.items() if s.partition not in leaving} | nodes.restored_nodes().keys()
        feedback = loop.partitions if loop is not None else {}  # node -> partition: a tracker or join entries
        owned = nodes.intake.owned
        # a node no longer held here whose messages come on a partition this worker no longer reads is its new
        # owner's: forgotten, never evicted (its tombstones would go out for a node the new owner holds)
        bounds.forget_nodes([n for n in bounds.nodes if n not in window and n not in feedback and (
            now - bounds.nodes[n] < after or ((p := bounds.partitions.get(n)) is not None and p not in owned))])
        # held here; not the nodes of a partition being revoked: its new owner holds them
        held = window | {n for n, p in feedback.items() if loop is not None and p in loop.held}
        silent = set(bounds.silent_nodes(now, after)) | held_unheard_nodes(now, held)
        if leaving:  # a node heard of whose state is being checkpointed for its new owner stays until it goes
            silent = {n for n in silent if (s := states.get(n)) is None or s.partition not in leaving}
        if loop is not None:  # nor a node of a partition the feedback loop lets go (its revoke may still wait)
            silent = {n for n in silent if (p := feedback.get(n)) is None or p in loop.held}
        apps = set(bounds.silent_apps(now, after)) | held_unheard_apps(now)  # before their nodes' trackers go
        sender = nodes.intake.live_sender
        if silent:
            nodes.forget(silent)  # states, and window rows of a state or read back from the changelog
            for n in silent:
                nodes_unheard.pop(n, None)
                _remove(fm.node_weight, n)
                if sender is not None:  # node-features go out on the intake's producer
                    key = n.encode()
                    sender.add(features_topic, partition_for(key, features_partitions), key, None)
            if loop is not None:
                loop.forget_nodes(silent)
            bounds.forget_nodes(silent)
            evicted.labels("node").inc(len(silent))
            log.info("evicted %d node(s) silent for %.0f s: %s", len(silent), after, sorted(silent)[:10])
        if apps:
            for a in apps:
                for cls in NODE_CLASSES:
                    _remove(fm.prediction_rmse, a, cls)
                    _remove(fm.prediction_mape, a, cls)
            bounds.forget_apps(apps)
            released = loop.forget_apps(apps) if loop is not None else {}
            evicted.labels("app").inc(len(apps))
            log.info("evicted %d app(s) silent for %.0f s: %s; released %s", len(apps), after, sorted(apps)[:10],
                     released)
        return silent, sorted(apps)

    def unheard_for(since: dict[str, float], unheard: set[str], now: float) -> set[str]:
        """Those of ``unheard`` first found so (noted in ``since``, which forgets the others) ``after`` ago."""
        for k in [k for k in since if k not in unheard]:
            del since[k]
        for k in unheard:
            since.setdefault(k, now)
        return {k for k in unheard if now - since[k] >= after}

    def held_unheard_nodes(now: float, held: set[str]) -> set[str]:
        """Nodes of ``held`` that no message has named for ``after``: read back from the changelogs (a restart, a
        partition taken over) — window rows, a tracker, join entries — and not named since."""
        return unheard_for(nodes_unheard, held - bounds.nodes.keys(), now)

    def held_unheard_apps(now: float) -> set[str]:
        """Apps the feedback loop holds that no message has named for ``after`` (restored, or models at start)."""
        if loop is None:
            return set()
        return unheard_for(apps_unheard, loop.apps() - bounds.apps.keys(), now)

    def back(node: str) -> bool:
        """Whether ``node`` was heard of again, or has state here again, since its eviction."""
        return node in nodes.store.states or node in bounds.nodes

    def tombstone_failed(node: str) -> Callable[[BaseException], None]:
        def failed(exc: BaseException) -> None:
            if permanent(exc):
                dropped.inc()
            else:  # the next tick sends it again, unless the node is back by then
                retried.inc()
                owed.add(node)
        return failed

    async def send_tombstones() -> None:
        """Send the node-weights tombstones owed, each unless its node is back (checked under the lock)."""
        async with ctx.weights_lock:  # never between a period's check of a node and its send
            for n in sorted(owed):  # node-weights go out on Faust's producer, like the weights timer's
                if not back(n):
                    track_delivery(await weights_topic.send(key=n.encode(), value=None),
                                   f"node-weights tombstone of {n}", on_failed=tombstone_failed(n))
                owed.discard(n)  # handed over (a failure owes it again) or superseded by the node's new values

    @timer(app, max(0.5, min(after / 4, 30.0)), "evict-silent")
    async def evict() -> None:
        if nodes.intake.running:
            owed.difference_update([n for n in owed if back(n)])  # before evict_now forgets nodes moved away
            silent, _ = evict_now()
            owed.update(silent)
            await nodes.intake.sender.ship()  # type: ignore[union-attr]
            if owed:
                await send_tombstones()
            if silent:
                writers = loop.handles.get("redis_writer") if loop is not None else None
                if writers:  # the cached copies go too: a restarted extender would warm up with the node
                    await writers[0].forget(sorted(silent))

    ctx.handles["evict"] = evict_now
