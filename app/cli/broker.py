"""``rttsched broker``: run the embedded Kafka-protocol broker (Tansu) until Ctrl-C / SIGTERM."""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from app.config import EMBEDDED_BROKER_PORT

HELP = ("run the embedded Kafka-protocol broker (Tansu; memory-only unless --storage-engine) and create all "
        "topics")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=EMBEDDED_BROKER_PORT)
    p.add_argument("--no-topics", action="store_true", help="do not create the topics from topics/")
    p.add_argument("--storage-engine", default=None, metavar="URL",
                   help="where Tansu keeps its data, e.g. postgres://user:pass@host/db (default memory://: a"
                        " restart loses every topic, message and consumer group)")


def run(args: argparse.Namespace, settings: Any) -> int:
    import asyncio

    from app.kafka.admin import ensure_topics
    from app.kafka.embedded import EmbeddedBroker

    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    with EmbeddedBroker(args.port, args.host, storage_engine=args.storage_engine) as broker:
        print(f"embedded broker listening on {broker.bootstrap} (pid {broker.pid})", flush=True)
        if not args.no_topics:
            from dataclasses import replace

            from app.streams.app import worker_topics

            local = replace(settings, kafka_bootstrap=broker.bootstrap)
            results = asyncio.run(ensure_topics(local, worker_topics(local)))
            print(f"{sum(r.created for r in results)} topics created, {len(results)} in all", flush=True)
        stop.wait()
    print("embedded broker stopped", flush=True)
    return 0
