"""``rttsched publish``: produce JSON lines to a topic, converting Jaeger / OTLP span JSON on the way.

    rttsched publish task-completions completions.jsonl
    rttsched publish task-completions - --from jaeger < spans.jsonl
    rttsched publish task-completions export.json --from otlp --dead-letters
    rttsched publish task-completions spans.json --from jaeger --node-map nodes.yaml --targets targets.yaml

Invalid lines are reported as ``FILE:LINE: reason: detail`` on stderr and skipped (with ``--dead-letters``
also sent to the dead-letters topic, ``partition`` -1 and the line number as ``offset``); the valid ones
are produced. A line that is not UTF-8 is one such line (``invalid_json: not UTF-8 ...``): the lines after it
are read on. Exit status 0 when every line was valid, 1 when some were not.

A completion must land on a node that has metrics (the nodes of ``--targets``, and those with node-features
in Redis when ``REDIS_URL`` is set): one on any other node is invalid (``unknown_node``). Redis is read again
every :data:`NODES_REFRESH_S` and, at most every :data:`NODES_MISS_S`, when a line names a node not in the set
(a node that joined while a long stream runs): the line is then checked against the new set; a read that
fails keeps the set it has. Spans find their
node from ``k8s.node.name``, then ``--node-map`` (pod or host name -> node), then ``host.name`` -- counted
and warned about, since in Kubernetes that is the pod's name (:mod:`app.bridge.attribution`).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

HELP = "produce JSON lines (or Jaeger / OTLP span JSON) to a topic; invalid lines are reported and skipped"
TOPICS = ("task-completions", "node-metrics")
BATCH = 1000
PROGRESS_EVERY = 50_000
NODES_REFRESH_S = 60.0  # the nodes with metrics, read again from Redis this often
NODES_MISS_S = 5.0  # and on a line naming a node not in the set, at most this often


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic", choices=TOPICS, help="contract the values must satisfy")
    p.add_argument("file", help="JSON-lines file, or - for stdin")
    p.add_argument("--from", dest="source", choices=["values", "jaeger", "otlp"], default="values",
                   help="values: each line is a value of TOPIC; jaeger: Jaeger JSON spans; otlp: OTLP JSON exports")
    p.add_argument("--dead-letters", action="store_true", help="also send invalid lines to the dead-letters topic")
    p.add_argument("--node-map", metavar="FILE", help="YAML map of pod or host names (k8s.pod.name, host.name) to "
                                                     "node names, for spans without k8s.node.name")
    p.add_argument("--targets", metavar="FILE", help="bridge targets file: its nodes have metrics (with REDIS_URL, "
                                                    "so do the nodes with node-features in Redis)")
    p.add_argument("--dry-run", action="store_true", help="check and convert only; connect to no broker")


def run(args: argparse.Namespace, settings: Any) -> int:
    import asyncio

    from app.errors import ConfigError

    if args.source != "values" and args.topic != "task-completions":
        raise ConfigError("--from", f"span conversion produces task-completions, not {args.topic}")
    options, targets = None, ()
    if args.topic == "task-completions":
        options, targets = asyncio.run(_span_options(args, settings))
    name = "<stdin>" if args.file == "-" else args.file
    try:  # bytes, split into lines by read_records: a line that is not UTF-8 is one invalid line, not the end
        stream = sys.stdin.buffer if args.file == "-" else open(args.file, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise ConfigError(args.file, f"cannot read: {exc.strerror}") from None
    try:
        return asyncio.run(_publish(args, settings, stream, name, options, targets))
    finally:
        if args.file != "-":
            stream.close()


async def _span_options(args: argparse.Namespace, settings: Any) -> tuple[Any, tuple[Any, ...]]:
    from app.bridge.attribution import known_nodes, load_node_map
    from app.bridge.spans import SpanOptions
    from app.bridge.targets import load_targets

    node_map = load_node_map(args.node_map) if args.node_map else {}
    targets = load_targets(args.targets) if args.targets else []
    known = await known_nodes(settings.redis_client_url, settings.topic_prefix, targets, settings.redis_timeout_s)
    return SpanOptions(node_map, frozenset(known) if known is not None else None), tuple(targets)


class _Nodes:
    """Reads the nodes with metrics again (Redis) every :data:`NODES_REFRESH_S`, and on a miss at most every
    :data:`NODES_MISS_S`; a failed read keeps the nodes it has and is said once."""

    def __init__(self, settings: Any, options: Any, targets: tuple[Any, ...]) -> None:
        import time

        self._settings = settings
        self._targets = targets
        self._clock = time.monotonic
        self._read_at = self._clock()
        self.options = options
        self.on = bool(settings.redis_client_url) and options is not None and options.known_nodes is not None
        self._warned = False

    def due(self) -> bool:
        return self.on and self._clock() - self._read_at >= NODES_REFRESH_S

    def may_miss(self) -> bool:
        return self.on and self._clock() - self._read_at >= NODES_MISS_S

    async def read(self) -> None:
        import dataclasses

        from app.bridge.attribution import known_nodes
        from app.errors import ConfigError

        self._read_at = self._clock()
        try:
            known = await known_nodes(self._settings.redis_client_url, self._settings.topic_prefix,
                                      self._targets, self._settings.redis_timeout_s)
        except ConfigError as exc:
            if not self._warned:
                print(f"publish: warning: {exc}; checking nodes against the last set read", file=sys.stderr)
                self._warned = True
            return
        self._warned = False
        self.options = dataclasses.replace(self.options, known_nodes=frozenset(known or ()))


async def _publish(args: argparse.Namespace, settings: Any, stream: Any, name: str, options: Any,
                   targets: tuple[Any, ...] = ()) -> int:
    from app.bridge.metrics import BridgeMetrics
    from app.bridge.producer import dead_letter, publish, publish_dead_letters, start_producer
    from app.bridge.records import convert, read_records

    metrics = BridgeMetrics()
    producer = None if args.dry_run else await start_producer(settings, client_id="rttsched-publish")
    sent = skipped = invalid = 0
    fallbacks: dict[str, int] = {}
    pending: list[dict[str, Any]] = []
    letters: list[dict[str, Any]] = []

    failed = False  # a flush that raised (Kafka away) is not tried again on the way out

    async def flush() -> None:
        nonlocal sent, failed
        failed = True
        if producer is not None:
            sent += await publish(producer, settings, args.topic, pending, metrics=metrics)
            if letters:
                await publish_dead_letters(producer, settings, letters, metrics=metrics)
        else:
            sent += len(pending)
        pending.clear()
        letters.clear()
        failed = False

    nodes = _Nodes(settings, options, targets)
    try:
        try:
            for record in read_records(stream):
                if nodes.due():
                    await nodes.read()
                out = convert(record, args.topic, args.source, nodes.options)
                if (out.problems and nodes.may_miss()
                        and any(p.error.reason == "unknown_node" for p in out.problems)):
                    await nodes.read()  # a node that joined since the set was read
                    out = convert(record, args.topic, args.source, nodes.options)
                pending.extend(out.values)
                skipped += out.skipped
                for attribute, n in out.fallbacks.items():
                    if attribute not in fallbacks:
                        print(f"{name}:{record.line}: warning: node taken from {attribute}, which in Kubernetes is "
                              "the pod's name: set k8s.node.name (span or resource) or give --node-map",
                              file=sys.stderr)
                    fallbacks[attribute] = fallbacks.get(attribute, 0) + n
                    metrics.node_fallbacks.labels(attribute=attribute).inc(n)
                for p in out.problems:
                    invalid += 1
                    metrics.skipped.labels(source=args.source, reason=p.error.reason).inc()
                    print(f"{name}:{p.line}: {p.error}", file=sys.stderr)
                    if args.dead_letters:
                        letters.append(dead_letter(settings, args.topic, p.raw, str(p.error),
                                                   reason=p.error.reason, offset=p.line))
                if len(pending) >= BATCH or len(letters) >= BATCH:
                    before = sent
                    await flush()
                    if sent // PROGRESS_EVERY > before // PROGRESS_EVERY:
                        print(f"publish: {sent} messages so far", file=sys.stderr, flush=True)
        finally:  # what was read goes out, also when reading stops early (an unreadable file, Ctrl-C)
            if not failed:
                await flush()
    finally:
        if producer is not None:
            await producer.stop()
    if skipped:
        metrics.skipped.labels(source=args.source, reason="not_a_task").inc(skipped)
    verb = "checked" if args.dry_run else f"published to {settings.topic(args.topic)}:"
    extra = f", {skipped} span(s) that are no task skipped" if skipped else ""
    extra += "".join(f", {n} node(s) from {a}" for a, n in sorted(fallbacks.items()))
    where = " (sent to dead-letters)" if args.dead_letters and invalid and not args.dry_run else ""
    unchecked = options is not None and options.known_nodes is None
    where += "; nodes not checked (no --targets, no REDIS_URL)" if unchecked else ""
    print(f"publish: {verb} {sent} message(s){extra}, {invalid} invalid record(s){where}")
    return 1 if invalid else 0
