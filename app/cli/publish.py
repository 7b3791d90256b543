"""``rttsched publish``: produce JSON lines to a topic, converting Jaeger / OTLP span JSON on the way.

    rttsched publish task-completions completions.jsonl
    rttsched publish task-completions - --from jaeger < spans.jsonl
    rttsched publish task-completions export.json --from otlp --dead-letters
    rttsched publish task-completions spans.json --from jaeger --node-map nodes.yaml --targets targets.yaml

Invalid lines are reported as ``FILE:LINE: reason: detail`` on stderr and skipped (with ``--dead-letters``
also sent to the dead-letters topic, ``partition`` -1 and the line number as ``offset``); the valid ones
are produced. A line that is not UTF-8 is one such line (``invalid_json: not UTF-8 ...``): the lines after it
are read on. Exit status 0 when every line was valid, 1 when some were not.

A thread reads the input (at most :data:`READ_AHEAD` records ahead of the producer) while the records read are
converted and produced: they go out in batches of up to :data:`BATCH` while lines keep coming, and as soon as the
input has nothing more for now -- a record never waits for later lines, so ``publish`` can run as a long-lived
pipe (``tail -n 0 -F spans.json | rttsched publish task-completions --from otlp -``).

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
import threading
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Iterator

    from app.bridge.records import Record

HELP = "produce JSON lines (or Jaeger / OTLP span JSON) to a topic; invalid lines are reported and skipped"
TOPICS = ("task-completions", "node-metrics")
BATCH = 1000  # records produced at most at once (fewer when the input has nothing more for now)
READ_AHEAD = 4 * BATCH  # records read and not yet taken, at most: the reading thread waits while there are this many
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
        stream = _stdin() if args.file == "-" else open(args.file, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise ConfigError(args.file, f"cannot read: {exc.strerror}") from None
    reader = _ReadAhead(stream)
    try:
        return asyncio.run(_publish(args, settings, reader, name, options, targets))
    finally:
        ended = reader.stop(wait_s=0.0 if args.file == "-" else 0.2)
        if args.file != "-" and ended:  # a file whose reading thread is still blocked (a FIFO, on Ctrl-C): the exit
            stream.close()


def _stdin() -> BinaryIO:
    """Standard input as bytes, through a reader of its own: ``sys.stdin`` is closed at the exit, which a thread
    still blocked reading it (Ctrl-C on an open pipe) would turn into a fatal error of the interpreter."""
    try:
        return open(sys.stdin.fileno(), "rb", closefd=False)  # noqa: SIM115 - the process's stdin, never closed
    except (OSError, ValueError):  # no file descriptor (stdin replaced in-process)
        return sys.stdin.buffer


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


class _End:
    """Put after the last record; ``error``: what stopped the reading, raised again where records are taken."""

    def __init__(self, error: BaseException | None) -> None:
        self.error = error


class _ReadAhead:
    """The records of a stream (:func:`~app.bridge.records.read_records`), read by a daemon thread at most
    :data:`READ_AHEAD` ahead of the event loop, which can tell when the input has nothing more for now
    (:meth:`empty`). The thread wakes the loop once per run of records, not once per record. A daemon thread, since
    a blocking read of a pipe cannot be interrupted: Ctrl-C still ends the process."""

    def __init__(self, stream: BinaryIO) -> None:
        import collections

        self._stream = stream
        self._items: collections.deque[Record | _End] = collections.deque()  # appended there, taken here
        self._room = threading.Event()  # set when there is room again after the thread found none
        self._full = False  # the thread found no room and waits for some
        self._stopped = False
        self._waking = False  # a wake-up of the loop is on its way
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._arrived: asyncio.Event | None = None
        self._end: _End | None = None  # taken: no record comes after it

    def start(self) -> None:
        import asyncio

        from app.bridge import records  # looked up now, not at import

        self._loop, self._arrived = asyncio.get_running_loop(), asyncio.Event()
        self._thread = threading.Thread(target=self._read, args=(records.read_records,),
                                        name="rttsched-publish-read", daemon=True)
        self._thread.start()

    def _read(self, read_records: Callable[[BinaryIO], Iterator[Record]]) -> None:
        end = _End(None)
        try:
            for record in read_records(self._stream):
                if not self._put(record):
                    return
        except BaseException as exc:  # what stopped the reading (an unreadable file): raised again by take()
            end = _End(exc)
        self._put(end)

    def _put(self, item: Record | _End) -> bool:
        """Hand ``item`` over, once there is room; False when nothing takes records any more."""
        assert self._loop is not None
        while len(self._items) >= READ_AHEAD and not self._stopped:
            self._room.clear()
            self._full = True
            if len(self._items) >= READ_AHEAD:  # still none, now that take() knows to make some
                self._room.wait()
        if self._stopped:
            return False
        self._items.append(item)
        if not self._waking:
            self._waking = True
            try:
                self._loop.call_soon_threadsafe(self._wake)
            except RuntimeError:  # the loop is closed
                return False
        return True

    def _wake(self) -> None:  # in the loop
        assert self._arrived is not None
        self._waking = False
        self._arrived.set()

    def empty(self) -> bool:
        """Whether every record read so far has been taken."""
        return not self._items

    async def take(self) -> list[Record]:
        """The records read and not yet taken, waiting for one; [] after the last; raises what stopped the
        reading once the records read before it have been taken."""
        assert self._arrived is not None and self._thread is not None
        if self._end is None:
            while not self._items:
                self._arrived.clear()
                if not self._items:  # an item put from now on sets it again (or a wake-up on its way does)
                    await self._arrived.wait()
            out: list[Record] = []
            for _ in range(len(self._items)):  # those there now: the thread appends on meanwhile
                item = self._items.popleft()
                if isinstance(item, _End):
                    self._end = item
                    break
                out.append(item)
            if self._full and len(self._items) <= READ_AHEAD // 2:
                self._full = False
                self._room.set()
            if out:
                return out
        assert self._end is not None
        self._thread.join()  # its last act was to put the end
        if self._end.error is not None:
            raise self._end.error
        return []

    def stop(self, wait_s: float) -> bool:
        """Tell the thread to read no further (it ends at its next record); whether it has ended within
        ``wait_s`` -- not while blocked in a read of a pipe that has nothing to say."""
        if self._thread is None:
            return True
        self._stopped = True
        self._room.set()  # a thread waiting for room wakes up, and ends
        self._thread.join(wait_s)
        return not self._thread.is_alive()


async def _publish(args: argparse.Namespace, settings: Any, reader: _ReadAhead, name: str, options: Any,
                   targets: tuple[Any, ...] = ()) -> int:
    from app.bridge.metrics import BridgeMetrics
    from app.bridge.producer import dead_letter, publish, publish_dead_letters, start_producer
    from app.bridge.records import convert
    from app.kafka.admin import check_reachable

    metrics = BridgeMetrics()
    if not args.dry_run:  # topics not created yet (or another prefix): one line, not topics auto-created wrong
        await check_reachable(settings, [args.topic, *(["dead-letters"] if args.dead_letters else [])])
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

    async def flush_and_tell() -> None:
        before = sent
        await flush()
        if sent // PROGRESS_EVERY > before // PROGRESS_EVERY:
            print(f"publish: {sent} messages so far", file=sys.stderr, flush=True)

    nodes = _Nodes(settings, options, targets)
    reader.start()
    try:
        try:
            while True:
                if (pending or letters) and reader.empty():  # the input has nothing more for now: out it goes
                    await flush_and_tell()
                records = await reader.take()
                if not records:
                    break
                for record in records:
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
                            print(f"{name}:{record.line}: warning: node taken from {attribute}, which in Kubernetes "
                                  "is the pod's name: set k8s.node.name (span or resource) or give --node-map",
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
                        await flush_and_tell()
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
