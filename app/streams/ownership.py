"""Which partitions this worker owns: an empty internal topic that holds the Faust group's assignment.

The worker reads its source topics itself (:mod:`app.streams.intake`), so Faust subscribes to none of
them. Ownership still has to come from one place, the consumer group, so that workers split the
partitions and tables recover where their data is read: every worker subscribes, through a Faust agent
that never receives a message, to ``{app id}-partitions``, a topic with the source topics' partition
count. Faust's assignor hands out topics of one partition count that all members subscribe to as one
co-partitioned group, so whoever gets partition *p* of this topic also gets partition *p* of the
tables' changelogs — and reads partition *p* of node-metrics, task-completions and rtt-predictions.

A table's rebalance hook finds the partitions it lost among the revoked partitions of this topic
(:func:`lost_partitions`).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import faust

from app.contracts import contract

HANDLE = "ownership"


def ownership_topic_name(app_id: str) -> str:
    """``{app id}-partitions``.

    >>> ownership_topic_name("rttsched-worker")
    'rttsched-worker-partitions'
    """
    return f"{app_id}-partitions"


def register_ownership(app: faust.App) -> str:
    """Subscribe ``app`` to its ownership topic (created by Faust with the source partition count); its name."""
    name = ownership_topic_name(app.conf.id)
    topic = app.topic(name, partitions=contract("node-metrics").partitions, internal=True,
                      key_serializer="raw", value_serializer="raw")

    async def partitions(stream: faust.StreamT) -> None:
        async for _ in stream:  # nothing is ever sent here: the subscription is what counts
            pass

    app.agent(topic, name="partitions")(partitions)
    return name


def lost_partitions(revoked: Iterable[Any], topic: str) -> set[int]:
    """Partition numbers of ``topic`` among ``revoked`` topic-partitions."""
    return {tp.partition for tp in revoked if tp.topic == topic}
