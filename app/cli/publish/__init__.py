"""``rttsched publish``: produce JSON lines to a topic, converting Jaeger / OTLP span JSON on the way.

    rttsched publish task-completions completions.jsonl
    rttsched publish task-completions - --from jaeger < spans.jsonl
    rttsched publish task-completions export.json --from otlp --dead-letters
    rttsched publish task-completions spans.json --from jaeger --node-map nodes.yaml --targets targets.yaml

Invalid lines are reported as ``FILE:LINE: reason: detail`` on stderr and skipped (with ``--dead-letters``
also sent to the dead-letters topic, ``partition`` -1 and the line number as ``offset``); the valid ones
are produced. A line that is not UTF-8 is one such line (``invalid_json: not UTF-8 ...``): the lines after it
are read on; so is a value that would be a message over the contracts' 1 MiB (``too_large``). Exit status 0
when every line was valid and every message published, 1 when some lines were not valid or some messages went
to dead-letters instead (kept, not lost), 3 when Kafka did not take some messages and they are kept nowhere
(:data:`UNSENT`: ``--give-up-after``, or refused for good and not dead-lettered).

A message Kafka refuses for good (larger than it takes, a topic it may not write) is not sent again: it goes to
the dead-letters topic, ``--dead-letters`` or not, with the reason ``refused_by_kafka`` and its input line as
``offset`` (a value too large for a dead letter keeps its first bytes, its size and its sha256). One error line
says so, and the summary line counts them. With no dead-letters topic under the prefix (none is auto-created;
a broker that cannot say, away for a moment, is asked again at the next try, the dead letter held meanwhile), or a
dead letter refused too, the message is not sent: an error line, exit status 3.

What the broker did not take (it restarted, or stalled past the producer's request timeout) is held and sent
again, with a backoff and a new producer, until it does (:class:`~app.cli.publish.delivery.Delivery`): ``publish``
waits, it does not end, and meanwhile reads on only as far as its read-ahead. One WARNING says it waits, one INFO
that it delivers again. ``--give-up-after SECONDS`` bounds the wait: the summary, then how many messages were not
sent and the input line they start at, exit status 3. Delivery is at least once: a send that timed out may have
been stored. Ctrl-C or SIGTERM (both cancel the task, where it waits) gives what was read one more try, unless a
send is under way or failing, then counts what was not delivered and the input line to resume from: every line
before it was. That try and the producer's close take :data:`STOP_S` in all at most (the close at least
:data:`CLOSE_S` of it), however long the broker would hold them; the messages counted that the producer took to
send with no answer (in flight, or a failed try) are said to be maybe on the topic all the same. Reading stopped by
an error (an unreadable file) is no stop: what was read gets its one more try and the close as at the end of the
input, as long as the broker takes (its request timeout at most).

A thread reads the input (:mod:`app.cli.publish.read_ahead`: at most 4,000 records ahead of the producer) while
the records read are converted and produced: they go out in batches of up to :data:`BATCH` while lines keep
coming, and as soon as the input has nothing more for now -- a record never waits for later lines, so ``publish``
can run as a long-lived pipe (``tail -n 0 -F spans.json | rttsched publish task-completions --from otlp -``).

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
import logging
import signal
import sys
from typing import TYPE_CHECKING, Any, BinaryIO

from app.cli.publish.read_ahead import ReadAhead

if TYPE_CHECKING:
    from collections.abc import Coroutine

    from app.bridge.records import Record

HELP = ("produce JSON lines (or Jaeger / OTLP span JSON) to a topic; invalid lines are reported and skipped, a "
        "message Kafka refuses for good goes to dead-letters")
TOPICS = ("task-completions", "node-metrics")
BATCH = 1000  # records produced at most at once (fewer when the input has nothing more for now)
PROGRESS_EVERY = 50_000
NODES_REFRESH_S = 60.0  # the nodes with metrics, read again from Redis this often
NODES_MISS_S = 5.0  # and on a line naming a node not in the set, at most this often
UNSENT = 3  # exit status: messages Kafka did not take (--give-up-after), or refused for good and not dead-lettered
STOP_S = 1.5  # a stop (Ctrl-C, SIGTERM): the last try of what was read and the producer's close take at most this
CLOSE_S = 0.25  # of which the close has at least this (the try gets STOP_S - CLOSE_S at most)

log = logging.getLogger(__name__)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("topic", choices=TOPICS, help="contract the values must satisfy")
    p.add_argument("file", help="JSON-lines file, or - for stdin (a pretty-printed JSON document too, read whole "
                                "once its brackets close)")
    p.add_argument("--from", dest="source", choices=["values", "jaeger", "otlp"], default="values",
                   help="values: each line is a value of TOPIC; jaeger: Jaeger JSON spans; otlp: OTLP JSON exports")
    p.add_argument("--dead-letters", action="store_true",
                   help="also send invalid lines to the dead-letters topic (a message Kafka refuses for good goes "
                        "there without it too)")
    p.add_argument("--node-map", metavar="FILE", help="YAML map of pod or host names (k8s.pod.name, host.name) to "
                                                     "node names, for spans without k8s.node.name")
    p.add_argument("--targets", metavar="FILE", help="bridge targets file: its nodes have metrics (with REDIS_URL, "
                                                    "so do the nodes with node-features in Redis)")
    p.add_argument("--dry-run", action="store_true", help="check and convert only; connect to no broker")
    p.add_argument("--give-up-after", metavar="SECONDS", type=float, default=None,
                   help="stop when Kafka has taken no message for this long, and exit 3 saying how many were not "
                        "sent (default: hold them and wait for the broker however long it takes); checked between "
                        "tries, and one try may last the producer's 10 s request timeout")


def run(args: argparse.Namespace, settings: Any) -> int:
    import asyncio
    import math

    from app.errors import ConfigError
    from app.kafka.quiet import PERIOD_S, quiet_client_errors

    if args.source != "values" and args.topic != "task-completions":
        raise ConfigError("--from", f"span conversion produces task-completions, not {args.topic}")
    give_up = args.give_up_after
    if give_up is not None and not (give_up > 0 and math.isfinite(give_up)):
        raise ConfigError("--give-up-after", f"must be a number of seconds > 0 (got {give_up:g})")
    options, targets = None, ()
    if args.topic == "task-completions":
        options, targets = asyncio.run(_span_options(args, settings))
    name = "<stdin>" if args.file == "-" else args.file
    try:  # bytes, split into lines by read_records: a line that is not UTF-8 is one invalid line, not the end
        stream = _stdin() if args.file == "-" else open(args.file, "rb")  # noqa: SIM115 - closed below
    except OSError as exc:
        raise ConfigError(args.file, f"cannot read: {exc.strerror}") from None
    reader = ReadAhead(stream)
    quiet_client_errors(PERIOD_S)  # aiokafka's per-retry errors while the broker is away: one per 10 s
    level = log.level
    if not log.isEnabledFor(logging.INFO):  # a command's output is warnings only: but "delivering again" is said
        log.setLevel(logging.INFO)
    old_term = signal.signal(signal.SIGTERM, _interrupt)  # stopped by Kubernetes or systemd: as Ctrl-C, it
    try:  # says how many held messages it did not send and from which input line
        code = asyncio.run(_cancelled_by_sigterm(_publish(args, settings, reader, name, options, targets)))
        if code is None:  # SIGTERM: said as Ctrl-C is
            raise KeyboardInterrupt
        return code
    finally:
        signal.signal(signal.SIGTERM, old_term)
        log.setLevel(level)
        ended = reader.stop(wait_s=0.0 if args.file == "-" else 0.2)
        if args.file != "-" and ended:  # a file whose reading thread is still blocked (a FIFO, on Ctrl-C): the exit
            stream.close()


def _interrupt(_signum: int, _frame: Any) -> None:
    """SIGTERM outside the event loop (before ``publish`` reads a line, after its last): as Ctrl-C."""
    raise KeyboardInterrupt


async def _cancelled_by_sigterm(work: Coroutine[Any, Any, int]) -> int | None:
    """``work``'s exit status; None when SIGTERM stopped it. SIGTERM cancels it, as asyncio does on SIGINT: the
    cancellation comes where it waits (a send, the next record), never in the middle of a record's conversion,
    and it alone is cancelled -- the producer's own tasks still serve its last try and its close. Once only: a
    second SIGTERM does not cut short the count of what was not sent."""
    import asyncio

    loop = asyncio.get_running_loop()
    task = asyncio.current_task()
    assert task is not None
    stopped = False

    def stop() -> None:
        nonlocal stopped
        if not stopped:
            stopped = True
            task.cancel()

    loop.add_signal_handler(signal.SIGTERM, stop)
    try:
        return await work
    except asyncio.CancelledError:
        if stopped:
            return None
        raise
    finally:
        loop.remove_signal_handler(signal.SIGTERM)
        signal.signal(signal.SIGTERM, _interrupt)


def _left(loop: Any, by: float | None, keep_s: float = 0.0) -> float | None:
    """The seconds left until ``by`` (a time of ``loop``), less ``keep_s`` kept for what comes after; None: no bound.

    >>> from types import SimpleNamespace
    >>> loop = SimpleNamespace(time=lambda: 10.0)
    >>> _left(loop, 11.5, 0.25), _left(loop, 9.0), _left(loop, None)
    (1.25, 0.0, None)
    """
    return None if by is None else max(0.0, by - keep_s - loop.time())


def _maybe_stored(delivery: Any) -> str:
    """What the line of the messages not sent adds of those among them sent with no answer (a stop cuts a send
    short, or a try failed): Kafka may have stored them, and sending them again may store them twice.

    >>> from types import SimpleNamespace
    >>> _maybe_stored(SimpleNamespace(unanswered=lambda: []))
    ''
    >>> _maybe_stored(SimpleNamespace(unanswered=lambda: [("t-task-completions", b"{}", None)] * 2))
    '; 2 of them were sent and not acknowledged, and may be on t-task-completions all the same (at least once): \
check before sending them again'
    """
    unanswered = delivery.unanswered()
    if not unanswered:
        return ""
    n, topics = len(unanswered), ", ".join(sorted({m[0] for m in unanswered}))
    were, them = ("was", "it") if n == 1 else ("were", "them")
    return (f"; {n} of them {were} sent and not acknowledged, and may be on {topics} all the same (at least once): "
            f"check before sending {them} again")


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
    known = await known_nodes(settings.redis_client_url, settings.topic_prefix, targets, settings.redis_timeout_s,
                              settings=settings)
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
                                      self._targets, self._settings.redis_timeout_s, settings=self._settings)
        except ConfigError as exc:
            if not self._warned:
                print(f"publish: warning: {exc}; checking nodes against the last set read", file=sys.stderr)
                self._warned = True
            return
        self._warned = False
        self.options = dataclasses.replace(self.options, known_nodes=frozenset(known or ()))


async def _publish(args: argparse.Namespace, settings: Any, reader: ReadAhead, name: str, options: Any,
                   targets: tuple[Any, ...] = ()) -> int:
    import collections

    from app.bridge.metrics import BridgeMetrics
    from app.bridge.producer import dead_letter, encode_messages
    from app.bridge.records import Problem, convert
    from app.cli.publish.delivery import Delivery, GaveUp
    from app.errors import ContractError
    from app.kafka.admin import check_reachable

    metrics = BridgeMetrics()
    give_up_s = getattr(args, "give_up_after", None)
    delivery = Delivery(settings, args.topic, give_up_s, metrics, name=name, letters_checked=args.dead_letters)
    if not args.dry_run:  # topics not created yet (or another prefix): one line, not topics auto-created wrong
        await check_reachable(settings, [args.topic, *(["dead-letters"] if args.dead_letters else [])])
        await delivery.start()
    sent = skipped = invalid = 0
    fallbacks: dict[str, int] = {}
    pending: list[Any] = []  # the messages of the topic, encoded as they are read: one too large is invalid
    pending_lines: list[int] = []  # the input line of each
    letters: list[dict[str, Any]] = []
    pending_line = 0  # the input line of the first record in pending or letters

    async def flush(tries: int | None = None) -> None:
        nonlocal sent
        if args.dry_run:
            sent += len(pending)
            messages = []
        else:
            messages = pending + encode_messages(settings, "dead-letters", letters)
        lines = pending_lines + [letter["offset"] for letter in letters]
        pending.clear()
        pending_lines.clear()
        letters.clear()
        if messages:
            sent += await delivery.send(messages, lines, tries=tries)

    async def flush_and_tell() -> None:
        before = sent
        await flush()
        if sent // PROGRESS_EVERY > before // PROGRESS_EVERY:
            print(f"publish: {sent} messages so far", file=sys.stderr, flush=True)

    def unsent() -> tuple[int, int]:
        """The messages read and not delivered, and the input line they start at."""
        n = len(delivery.held) + len(pending) + len(letters)
        return n, (delivery.held_line if delivery.held else pending_line)

    nodes = _Nodes(settings, options, targets)
    async def take_in(record: Record, *, refresh: bool = True) -> None:
        """Convert ``record`` into pending messages (its problems reported, into dead letters with
        ``--dead-letters``); ``refresh``: read the nodes with metrics again when due."""
        nonlocal pending_line, skipped, invalid
        if refresh and nodes.due():
            await nodes.read()
        out = convert(record, args.topic, args.source, nodes.options)
        if (refresh and out.problems and nodes.may_miss()
                and any(p.error.reason == "unknown_node" for p in out.problems)):
            await nodes.read()  # a node that joined since the set was read
            out = convert(record, args.topic, args.source, nodes.options)
        if not (pending or letters):
            pending_line = record.line
        problems = list(out.problems)
        for value in out.values:
            try:  # the contract's bounds on the bytes written too: a value over 1 MiB is too_large
                pending.extend(encode_messages(settings, args.topic, [value]))
            except ContractError as exc:
                problems.append(Problem(record.line, record.raw, exc))
                continue
            pending_lines.append(record.line)
        skipped += out.skipped
        for attribute, n in out.fallbacks.items():
            if attribute not in fallbacks:
                print(f"{name}:{record.line}: warning: node taken from {attribute}, which in Kubernetes "
                      "is the pod's name: set k8s.node.name (span or resource) or give --node-map",
                      file=sys.stderr)
            fallbacks[attribute] = fallbacks.get(attribute, 0) + n
            metrics.node_fallbacks.labels(attribute=attribute).inc(n)
        for p in problems:
            invalid += 1
            metrics.skipped.labels(source=args.source, reason=p.error.reason).inc()
            print(f"{name}:{p.line}: {p.error}", file=sys.stderr)
            if args.dead_letters:
                letters.append(dead_letter(settings, args.topic, p.raw, str(p.error),
                                           reason=p.error.reason, offset=p.line))

    taken: collections.deque[Record] = collections.deque()  # taken from the reader, not converted yet

    async def take_in_read_ahead() -> None:
        """The records taken and not converted yet, then those read and not taken yet (the read-ahead), converted
        too, with no wait: what was read is tried, or counted as not sent."""
        while taken:
            await take_in(taken[0], refresh=False)
            taken.popleft()
        for record in reader.drain():
            await take_in(record, refresh=False)

    gave_up: GaveUp | None = None
    reader.start()
    try:
        while True:
            if (pending or letters) and reader.empty():  # the input has nothing more for now: out it goes
                await flush_and_tell()
            taken.extend(await reader.take())
            if not taken:
                break
            while taken:
                await take_in(taken[0])
                taken.popleft()  # in pending now: nothing is awaited between its conversion and here
                if len(pending) >= BATCH or len(letters) >= BATCH:
                    await flush_and_tell()
        await flush()  # the end of the input: what was read goes out, however long the broker takes
    except GaveUp as exc:
        gave_up = exc
        await take_in_read_ahead()
    except BaseException as exc:  # reading stopped early (an unreadable file), Ctrl-C, SIGTERM: what was read goes
        import asyncio  # out in one more try -- unless a send is under way or failing: its batch is not replaced
        import contextlib

        loop = asyncio.get_running_loop()
        stops = (asyncio.CancelledError, KeyboardInterrupt)  # Ctrl-C, SIGTERM (both cancel the task where it waits)
        # a stop: that try and the producer's close take STOP_S in all, a broker just gone holds neither up; an
        # error (an unreadable file) is no stop: they take what a healthy broker takes, as at the end of the input
        stop_by = loop.time() + STOP_S if isinstance(exc, stops) else None
        try:
            with contextlib.suppress(Exception):
                await take_in_read_ahead()
            if delivery.waiting_since is None and not delivery.held:
                with contextlib.suppress(GaveUp, Exception):  # TimeoutError: cut short, its batch held
                    await asyncio.wait_for(flush(tries=1), timeout=_left(loop, stop_by, CLOSE_S))
        except stops:  # a stop during the last try of an error: the close is bounded as a stop's
            stop_by = loop.time() + CLOSE_S if stop_by is None else stop_by
            raise
        finally:  # said even when a second Ctrl-C cuts the try short
            n, line = unsent()
            if n:
                print(f"publish: {n} message(s) not sent (from {name}:{line} on){_maybe_stored(delivery)}",
                      file=sys.stderr, flush=True)
            await delivery.close(_left(loop, stop_by))
        raise
    finally:
        await delivery.close()
    if skipped:
        metrics.skipped.labels(source=args.source, reason="not_a_task").inc(skipped)
    verb = "checked" if args.dry_run else f"published to {settings.topic(args.topic)}:"
    extra = f", {skipped} span(s) that are no task skipped" if skipped else ""
    extra += "".join(f", {n} node(s) from {a}" for a, n in sorted(fallbacks.items()))
    where = " (sent to dead-letters)" if args.dead_letters and invalid and not args.dry_run else ""
    unchecked = options is not None and options.known_nodes is None
    where += "; nodes not checked (no --targets, no REDIS_URL)" if unchecked else ""
    kept = f", {delivery.kept} refused by Kafka for good (sent to dead-letters)" if delivery.kept else ""
    print(f"publish: {verb} {sent} message(s){extra}, {invalid} invalid record(s){where}{kept}")
    if gave_up is not None:
        n, line = unsent()
        print(f"publish: error: Kafka at {settings.bootstrap_servers} took no message for {gave_up.waited_s:.0f} s "
              f"(--give-up-after {give_up_s:g}; last error {gave_up.error}): {n} message(s) not sent, the input "
              f"from {name}:{line} on is not published", file=sys.stderr, flush=True)
        return UNSENT
    if delivery.refused:
        print(f"publish: error: {delivery.refused} message(s) refused by Kafka for good, not sent",
              file=sys.stderr, flush=True)
        return UNSENT
    return 1 if invalid or delivery.kept else 0
