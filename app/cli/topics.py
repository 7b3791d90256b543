"""``rttsched topics``: create (idempotently) or list the topics of ``topics/``."""

from __future__ import annotations

import argparse
from typing import Any

HELP = "create every topic from topics/ on the configured broker (idempotent), or list the contracts"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=["create", "list"], nargs="?", default="create")
    p.add_argument("--worker-id", action="append", default=None, metavar="ID",
                   help="also create the internal topics of this worker group (default: the default group,"
                        " {RTT_TOPIC_PREFIX}rttsched-worker; repeat for several)")
    p.add_argument("--recreate", action="store_true",
                   help="delete and create again a topic whose partition count or cleanup policy is not its"
                        " contract's, dropping its messages (default: refuse, naming it); needs --yes")
    p.add_argument("--yes", action="store_true", help="with --recreate: do drop those topics' messages")


def named(v: str) -> str | None:
    """An empty ``--worker-id`` is refused, not taken for the default group (leaving the flag out gives that)."""
    return None if v else "must not be empty"


def run(args: argparse.Namespace, settings: Any) -> int:
    from app.cli.output import table
    from app.config import check_flag, topic_name_part
    from app.contracts import load_contracts
    from app.errors import ConfigError

    for worker_id in args.worker_id or ():  # a part of topic names, as RTT_TOPIC_PREFIX is
        check_flag("--worker-id", worker_id, named, topic_name_part)
    if args.recreate and not args.yes:
        raise ConfigError("--recreate", "drops every message of each topic it recreates: run `rttsched topics "
                                        "create` first to see which it names, then add --yes")
    if args.action == "list":
        rows = [(settings.topic(c.name), c.key, str(c.partitions), c.cleanup_policy, str(c.retention_ms))
                for c in load_contracts().values()]
        print("\n".join(table(("topic", "key", "parts", "cleanup", "retention_ms"), rows, right=frozenset({2, 4}))))
        return 0
    import asyncio

    from app.kafka.admin import TopicError, TopicResult, ensure_topics
    from app.streams.app import worker_topics

    def show(results: list[TopicResult]) -> None:
        done = [(r.topic, str(r.partitions), r.cleanup_policy, r.status) for r in results]
        print("\n".join(table(("topic", "parts", "cleanup", "status"), done, right=frozenset({1}))), flush=True)

    internal = [t for wid in (args.worker_id or [None]) for t in worker_topics(settings, wid)]
    try:
        results = asyncio.run(ensure_topics(settings, internal, recreate=args.recreate))
    except TopicError as exc:  # a refusal: what it did before (the topics created), then why
        if exc.results:
            show(exc.results)
        raise
    show(results)
    return 0
