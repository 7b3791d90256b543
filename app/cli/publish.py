"""``rttsched publish``: produce JSON lines to a topic, converting Jaeger / OTLP span JSON on the way.

    rttsched publish task-completions completions.jsonl
    rttsched publish task-completions - --from jaeger < spans.jsonl
    rttsched publish task-completions export.json --from otlp --dead-letters

Invalid lines are reported as ``FILE:LINE: reason: detail`` on stderr and skipped (with ``--dead-letters``
also sent to the dead-letters topic, ``partition`` -1 and the line number as ``offset``); the valid ones
are produced. Exit status 0 when every line was valid, 1 when some were not.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

HELP = "produce JSON lines (or Jaeger / OTLP span JSON) to a topic; invalid lines are reported and skipped"
TOPICS = ("task-completions", "node-metrics")
BATCH = 1000
PROGRESS_EVERY = 50_000


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic", choices=TOPICS, help="contract the values must satisfy")
    p.add_argument("file", help="JSON-lines file, or - for stdin")
    p.add_argument("--from", dest="source", choices=["values", "jaeger", "otlp"], default="values",
                   help="values: each line is a value of TOPIC; jaeger: Jaeger JSON spans; otlp: OTLP JSON exports")
    p.add_argument("--dead-letters", action="store_true", help="also send invalid lines to the dead-letters topic")
    p.add_argument("--dry-run", action="store_true", help="check and convert only; connect to no broker")


def run(args: argparse.Namespace, settings: Any) -> int:
    import asyncio

    from app.errors import ConfigError

    if args.source != "values" and args.topic != "task-completions":
        raise ConfigError("--from", f"span conversion produces task-completions, not {args.topic}")
    name = "<stdin>" if args.file == "-" else args.file
    try:
        stream = sys.stdin if args.file == "-" else open(args.file, encoding="utf-8")
    except OSError as exc:
        raise ConfigError(args.file, f"cannot read: {exc.strerror}") from None
    try:
        return asyncio.run(_publish(args, settings, stream, name))
    finally:
        if stream is not sys.stdin:
            stream.close()


async def _publish(args: argparse.Namespace, settings: Any, stream: Any, name: str) -> int:
    from app.bridge.metrics import default_metrics
    from app.bridge.producer import dead_letter, publish, publish_dead_letters, start_producer
    from app.bridge.records import convert, read_records

    metrics = default_metrics()
    producer = None if args.dry_run else await start_producer(settings, client_id="rttsched-publish")
    sent = skipped = invalid = 0
    pending: list[dict[str, Any]] = []
    letters: list[dict[str, Any]] = []

    async def flush() -> None:
        nonlocal sent
        if producer is not None:
            sent += await publish(producer, settings, args.topic, pending, metrics=metrics)
            if letters:
                await publish_dead_letters(producer, settings, letters, metrics=metrics)
        else:
            sent += len(pending)
        pending.clear()
        letters.clear()

    try:
        for record in read_records(stream):
            out = convert(record, args.topic, args.source)
            pending.extend(out.values)
            skipped += out.skipped
            for p in out.problems:
                invalid += 1
                metrics.skipped.labels(source=args.source, reason=p.error.reason).inc()
                print(f"{name}:{p.line}: {p.error}", file=sys.stderr)
                if args.dead_letters:
                    letters.append(dead_letter(settings, args.topic, p.raw, str(p.error), reason=p.error.reason,
                                               offset=p.line))
            if len(pending) >= BATCH:
                before = sent
                await flush()
                if sent // PROGRESS_EVERY > before // PROGRESS_EVERY:
                    print(f"publish: {sent} messages so far", file=sys.stderr, flush=True)
        await flush()
    finally:
        if producer is not None:
            await producer.stop()
    if skipped:
        metrics.skipped.labels(source=args.source, reason="not_a_task").inc(skipped)
    verb = "checked" if args.dry_run else f"published to {settings.topic(args.topic)}:"
    extra = f", {skipped} span(s) that are no task skipped" if skipped else ""
    where = " (sent to dead-letters)" if args.dead_letters and invalid and not args.dry_run else ""
    print(f"publish: {verb} {sent} message(s){extra}, {invalid} invalid record(s){where}")
    return 1 if invalid else 0
