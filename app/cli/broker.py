"""``rttsched broker``: run the embedded Kafka-protocol broker (Tansu) until Ctrl-C / SIGTERM / SIGHUP.

A Tansu that ends on its own ends the command too, with one line and exit code 2 (docker-compose and Kubernetes
start it again): a process left running with no broker behind it looked healthy.
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from app.cli.output import say
from app.config import EMBEDDED_BROKER_PORT

CHECK_S = 0.2  # how often it looks whether Tansu still runs (a waitpid that does not wait)

HELP = ("run the embedded Kafka-protocol broker (Tansu; memory-only unless --storage-engine) and create all "
        "topics")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=EMBEDDED_BROKER_PORT,
                   help=f"listen port (default {EMBEDDED_BROKER_PORT}; 0: a free one, printed)")
    p.add_argument("--no-topics", action="store_true", help="do not create the topics from topics/")
    p.add_argument("--storage-engine", default=None, metavar="URL",
                   help="where Tansu keeps its data: memory:// (default: a restart loses every topic, message and"
                        " consumer group) or s3://BUCKET/ on an S3-compatible store (AWS_ENDPOINT,"
                        " AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_DEFAULT_REGION, AWS_ALLOW_HTTP=true for"
                        " http); this Tansu build has no postgres:// or sqlite://. For a broker that keeps its"
                        " data, run Apache Kafka (docker-compose.yml, docs/deploy.md)")


def run(args: argparse.Namespace, settings: Any) -> int:
    import asyncio

    from app.errors import ConfigError
    from app.kafka.admin import ensure_topics
    from app.kafka.embedded import EmbeddedBroker, storage_problem
    from app.listen import check_host, check_listen

    if not 0 <= args.port <= 65535:
        raise ConfigError("--port", f"must be a port between 0 and 65535 (got {args.port})")
    problem = storage_problem(args.storage_engine) if args.storage_engine is not None else None
    if problem:
        raise ConfigError("--storage-engine", problem)
    check_host(args.host, "--host")  # a host that does not resolve, or is not this machine's: named, at once
    check_listen(args.host, args.port, "--port", "--host")  # a port taken (0: one Tansu is given free)
    stop = threading.Event()
    # SIGHUP: the terminal or SSH session closed. Tansu, in a session of its own, does not get it: stopped here, it
    # does not stay behind holding the port
    for sig in (signal.SIGINT, signal.SIGTERM, getattr(signal, "SIGHUP", None)):
        if sig is not None:
            signal.signal(sig, lambda *_: stop.set())
    with EmbeddedBroker(args.port or None, args.host, storage_engine=args.storage_engine) as broker:
        say(f"embedded broker listening on {broker.bootstrap} (pid {broker.pid})")
        if not args.no_topics:
            from dataclasses import replace

            from app.streams.app import worker_topics

            local = replace(settings, kafka_bootstrap=broker.bootstrap)
            in_memory = (args.storage_engine or "memory://").startswith("memory://")
            try:
                results = asyncio.run(ensure_topics(local, worker_topics(local), recreate=in_memory))
            except Exception:
                if (ended := broker.ended()) is not None:  # the cause, not the client's error that followed
                    raise ended from None
                raise
            say(f"{sum(r.created for r in results)} topics created, {len(results)} in all")
        while not stop.wait(CHECK_S):
            if (ended := broker.ended()) is not None:
                raise ended
    say("embedded broker stopped")
    return 0
