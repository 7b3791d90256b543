"""Faust topics built from the contracts in ``topics/``: name (prefixed), partitions, compaction.

Values and keys travel as raw bytes; agents decode them with :mod:`app.contracts` so that validation
happens at the edge and failures reach dead-letters with their reason.
"""

from __future__ import annotations

import faust

from app.config import Settings
from app.contracts import contract


def contract_topic(app: faust.App, settings: Settings, name: str) -> faust.TopicT:
    """The Faust topic of contract ``name`` (raw key and value)."""
    c = contract(name)
    config = {"cleanup.policy": c.cleanup_policy}
    if c.retention_ms >= 0:
        config["retention.ms"] = str(c.retention_ms)
    return app.topic(
        settings.topic(name), partitions=c.partitions, replicas=settings.replicas(c.replication_factor),
        key_serializer="raw", value_serializer="raw", compacting=c.compacted, config=config,
        internal=False,
    )
