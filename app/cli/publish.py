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
the dead-letters topic, ``--dead-letters`` or not, with the reason :data:`REFUSED` and its input line as
``offset`` (a value too large for a dead letter keeps its first bytes, its size and its sha256). One error line
says so, and the summary line counts them. With no dead-letters topic under the prefix (none is auto-created;
a broker that cannot say, away for a moment, is asked again at the next try, the dead letter held meanwhile), or a
dead letter refused too, the message is not sent: an error line, exit status 3.

What the broker did not take (it restarted, or stalled past the producer's request timeout) is held and sent
again, with a backoff and a new producer, until it does (:class:`_Delivery`): ``publish`` waits, it does not
end, and meanwhile reads on only as far as its read-ahead. One WARNING says it waits, one INFO that it delivers
again. ``--give-up-after SECONDS`` bounds the wait: the summary, then how many messages were not sent and the
input line they start at, exit status 3. Delivery is at least once: a send that timed out may have been stored.
Ctrl-C or SIGTERM (both cancel the task, where it waits) gives what was read one more try, unless a send is under
way or failing, then counts what was not delivered and the input line to resume from: every line before it was.

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
import logging
import signal
import sys
import threading
from typing import TYPE_CHECKING, Any, BinaryIO

if TYPE_CHECKING:
    import asyncio
    from collections.abc import Callable, Coroutine, Iterator

    from app.bridge.records import Record

HELP = ("produce JSON lines (or Jaeger / OTLP span JSON) to a topic; invalid lines are reported and skipped, a "
        "message Kafka refuses for good goes to dead-letters")
TOPICS = ("task-completions", "node-metrics")
BATCH = 1000  # records produced at most at once (fewer when the input has nothing more for now)
READ_AHEAD = 4 * BATCH  # records read and not yet taken, at most: the reading thread waits while there are this many
PROGRESS_EVERY = 50_000
NODES_REFRESH_S = 60.0  # the nodes with metrics, read again from Redis this often
NODES_MISS_S = 5.0  # and on a line naming a node not in the set, at most this often
UNSENT = 3  # exit status: messages Kafka did not take (--give-up-after), or refused for good and not dead-lettered
REFUSED = "refused_by_kafka"  # the dead letters' reason for a message Kafka refused for good

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
    reader = _ReadAhead(stream)
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

    def drain(self) -> list[Record]:
        """The records read and not yet taken, without waiting (what the thread appends meanwhile stays)."""
        out: list[Record] = []
        for _ in range(len(self._items) if self._end is None else 0):
            item = self._items.popleft()
            if isinstance(item, _End):
                self._end = item
                break
            out.append(item)
        return out

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


class _GaveUp(Exception):
    """Kafka did not take the held messages within ``--give-up-after`` (or the tries allowed)."""

    def __init__(self, error: str, waited_s: float) -> None:
        super().__init__(error)
        self.error, self.waited_s = error, waited_s


def _said(exc: BaseException) -> str:
    """An error as one line, its kind named once (aiokafka's name it themselves).

    >>> _said(ValueError("bad.")), _said(ValueError()), _said(RuntimeError("[Error 7] RuntimeError"))
    ('ValueError: bad', 'ValueError', '[Error 7] RuntimeError')
    """
    text, kind = str(exc).strip().rstrip("."), type(exc).__name__
    return text if kind in text else f"{kind}: {text}" if text else kind


class _Delivery:
    """Sends each flush's messages until the broker has taken every one.

    What the broker did not take (away, restarting, stalled past the producer's request timeout) is held and
    sent again, with a backoff and through a new producer, until it does -- or for at most ``give_up_s``, then
    :class:`_GaveUp`. The first failed try logs one WARNING, the try that delivers what was held one INFO.
    A message refused for good (too large for the broker, a topic it may not write) is not sent again: it goes to
    the dead-letters topic (reason :data:`REFUSED`, its input line as ``offset``), counted in :attr:`kept` once
    stored, and one error line says so. Where it cannot (no dead-letters topic under the prefix, or the dead
    letter refused for good too), it is counted in :attr:`refused`, not sent. At least once: a message whose
    send timed out may have been stored, and is sent again."""

    def __init__(self, settings: Any, topic: str, give_up_s: float | None, metrics: Any, *, name: str = "<input>",
                 letters_checked: bool = False) -> None:
        from app.retry import Backoff

        self._settings = settings
        self._contract = topic
        self._topic = settings.topic(topic)  # what ``sent`` counts (not the dead letters)
        self._give_up_s = give_up_s
        self._metrics = metrics
        self._name = name
        self._letters_ok = letters_checked  # the dead-letters topic is known to exist
        self._backoff = Backoff.upto(settings.retry_max_backoff_s)
        self._lines: dict[int, int] = {}  # the input line of each message of the flush under way (by id)
        self._of_refused: set[int] = set()  # the dead letters of refused messages among them (by id)
        self._made: list[Any] = []  # those dead letters, kept while their ids are used
        self.producer: Any = None
        self.held: list[Any] = []  # the messages of the flush under way not taken yet
        self.held_line = 0  # the input line of the first of them
        self.waiting_since: float | None = None  # the start of the first try that failed, while it fails
        self.refused = 0  # refused for good and not kept anywhere
        self.kept = 0  # refused for good and stored on dead-letters

    async def start(self) -> None:
        """The first producer: an unreachable broker is an error (:class:`~app.bridge.errors.BridgeError`)."""
        from app.bridge.producer import start_producer

        self.producer = await start_producer(self._settings, client_id="rttsched-publish")

    async def close(self) -> None:
        import contextlib

        producer, self.producer = self.producer, None
        if producer is not None:
            with contextlib.suppress(Exception):
                await producer.stop()

    async def send(self, messages: list[Any], lines: list[int], *, tries: int | None = None) -> int:
        """Send ``messages`` (read from input lines ``lines``, one each) until the broker took each, or ``tries``
        tries failed (:class:`_GaveUp`); how many of the topic's it took."""
        import asyncio
        import collections
        import time

        from app.bridge.errors import BridgeError
        from app.bridge.producer import send_messages
        from app.kafka.batches import permanent

        self.held = list(messages)
        self._lines = {id(m): n for m, n in zip(messages, lines, strict=True)}
        self._of_refused, self._made = set(), []
        self.held_line = lines[0] if lines else 0
        sent = 0
        while self.held:
            began = time.monotonic()
            error: BaseException | None = None
            if self.producer is None:
                try:
                    await self.start()
                except BridgeError as exc:
                    error = exc
            if self.producer is not None:
                error = await self._check_letters()
            if self.producer is not None and error is None:
                failed = await send_messages(self.producer, self.held)
                failed_ids = {id(m) for m, _ in failed}
                taken = [m for m in self.held if id(m) not in failed_ids]
                for name, n in collections.Counter(m[0] for m in taken).items():
                    self._metrics.messages.labels(topic=name).inc(n)
                    sent += n if name == self._topic else 0
                self.kept += sum(id(m) in self._of_refused for m in taken)
                letters = await self._dead_letter([(m, e) for m, e in failed if permanent(e)])
                self.held = [m for m, e in failed if not permanent(e)] + letters
                if self.held:
                    self.held_line = min(self._lines[id(m)] for m in self.held)
                error = next((e for m, e in failed if not permanent(e)), None)
                if error is None:  # every one taken, or only the dead letters of refused ones to send: at once
                    continue
                await self.close()  # a new producer for the next try: fresh metadata, fresh connections
            assert error is not None
            if self.waiting_since is None:
                self.waiting_since = began
                bound = f", for at most {self._give_up_s:g} s (--give-up-after)" if self._give_up_s else ""
                log.warning("Kafka at %s did not take %d message(s) (%s): holding them and sending them again "
                            "until it does%s; input is read at most %d records ahead meanwhile",
                            self._settings.bootstrap_servers, len(self.held), _said(error), bound, READ_AHEAD)
            waited = time.monotonic() - self.waiting_since
            if tries is not None:
                tries -= 1
                if tries <= 0:
                    raise _GaveUp(_said(error), waited)
            if self._give_up_s is not None and waited >= self._give_up_s:
                raise _GaveUp(_said(error), waited)
            await asyncio.sleep(self._backoff.next())
        if self.waiting_since is not None:
            log.info("Kafka at %s takes messages again after %.0f s: the held messages are delivered, publishing "
                     "goes on", self._settings.bootstrap_servers, time.monotonic() - self.waiting_since)
            self.waiting_since = None
        self._backoff.reset()
        return sent

    async def _dead_letter(self, for_good: list[tuple[Any, BaseException]]) -> list[Any]:
        """The dead letters of the messages of the topic Kafka refused for good (one error line says so); the
        others -- dead letters refused themselves, or any where there is no dead-letters topic -- are counted
        in :attr:`refused`, with one error line."""
        from app.bridge.producer import dead_letter, encode_messages

        if not for_good:
            return []
        mine = [(m, e) for m, e in for_good if m[0] == self._topic]
        lost = [(m, e) for m, e in for_good if m[0] != self._topic]
        letters: list[Any] = []
        if mine:
            from app.kafka.admin import TopicError

            unsure: TopicError | None = None
            try:
                where = await self._letters_topic()
            except TopicError as exc:  # Kafka cannot say now: the dead letters are made, held, and it is asked again
                where, unsure = None, exc
            line = min(self._lines[id(m)] for m, _ in mine)
            said = f"publish: error: Kafka refused {len(mine)} message(s) for good ({_said(mine[0][1])}), " \
                   f"from {self._name}:{line} on"
            if where is None:
                values = [dead_letter(self._settings, self._contract, m[1], _refusal(e, m[1]), reason=REFUSED,
                                      key=m[2].decode("utf-8", "replace") if m[2] is not None else None,
                                      offset=self._lines[id(m)]) for m, e in mine]
                letters = encode_messages(self._settings, "dead-letters", values)
                for (m, _), letter in zip(mine, letters, strict=True):
                    self._lines[id(letter)] = self._lines[id(m)]
                    self._of_refused.add(id(letter))
                self._made.extend(letters)
                later = f" once Kafka says it has that topic (it could not be asked: {_said(unsure)})" if unsure else ""
                print(f"{said}: they go to dead-letters (reason {REFUSED}){later}", file=sys.stderr, flush=True)
            else:
                self.refused += len(mine)
                print(f"{said}; not sent again, nor dead-lettered: {where}", file=sys.stderr, flush=True)
        if lost:
            self.refused += len(lost)
            print(f"publish: error: Kafka refused {len(lost)} dead letter(s) for good ({_said(lost[0][1])}), from "
                  f"{self._name}:{min(self._lines[id(m)] for m, _ in lost)} on; not sent again",
                  file=sys.stderr, flush=True)
        return letters

    async def _check_letters(self) -> BaseException | None:
        """Before a try that sends dead letters of refused messages to a dead-letters topic not known to exist yet
        (Kafka could not be asked when they were made): whether it does. The error when Kafka still cannot say
        (the try fails, they stay held); a missing topic takes them out, counted in :attr:`refused`."""
        from app.kafka.admin import TopicError

        letters = [m for m in self.held if id(m) in self._of_refused]
        if self._letters_ok or not letters:
            return None
        try:
            where = await self._letters_topic()
        except TopicError as exc:
            return exc
        if where is not None:
            self.refused += len(letters)
            print(f"publish: error: Kafka refused {len(letters)} message(s) for good, from {self._name}:"
                  f"{min(self._lines[id(m)] for m in letters)} on; not sent again, nor dead-lettered: {where}",
                  file=sys.stderr, flush=True)
            self.held = [m for m in self.held if id(m) not in self._of_refused]
            if self.held:
                self.held_line = min(self._lines[id(m)] for m in self.held)
        return None

    async def _letters_topic(self) -> str | None:
        """None when the dead-letters topic exists (listed once, the first time it is needed, unless checked at
        the start), else why not: a topic the broker would auto-create is not written to. Only a listing without
        it is final: :class:`~app.kafka.admin.TopicError` when Kafka cannot be asked now (away for a moment)."""
        from app.kafka.admin import missing_topics, no_topics

        if self._letters_ok:
            return None
        missing = await missing_topics(self._settings, ["dead-letters"])  # TopicError: Kafka cannot be asked
        if missing:
            return no_topics(self._settings, missing)
        self._letters_ok = True
        return None


def _refusal(exc: BaseException, value: bytes) -> str:
    """The dead letter's error for a message Kafka refused for good; with the whole value's sha256 when the
    dead letter keeps only its first bytes (:data:`~app.contracts.dead.MAX_RAW_BYTES`).

    >>> from aiokafka.errors import MessageSizeTooLargeError
    >>> _refusal(MessageSizeTooLargeError("too big"), b"{}")
    'refused_by_kafka: refused for good ([Error 10] MessageSizeTooLargeError: too big)'
    >>> _refusal(MessageSizeTooLargeError(), b"x" * 70_000)
    'refused_by_kafka: refused for good (...); sha256 of the whole value bca09f4a757d5571c7d9f3341d4...'
    """
    import hashlib

    from app.contracts.dead import MAX_RAW_BYTES

    text = f"{REFUSED}: refused for good ({_said(exc)})"
    if len(value) > MAX_RAW_BYTES:
        text += f"; sha256 of the whole value {hashlib.sha256(value).hexdigest()}"
    return text


async def _publish(args: argparse.Namespace, settings: Any, reader: _ReadAhead, name: str, options: Any,
                   targets: tuple[Any, ...] = ()) -> int:
    import collections

    from app.bridge.metrics import BridgeMetrics
    from app.bridge.producer import dead_letter, encode_messages
    from app.bridge.records import Problem, convert
    from app.errors import ContractError
    from app.kafka.admin import check_reachable

    metrics = BridgeMetrics()
    give_up_s = getattr(args, "give_up_after", None)
    delivery = _Delivery(settings, args.topic, give_up_s, metrics, name=name, letters_checked=args.dead_letters)
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

    gave_up: _GaveUp | None = None
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
    except _GaveUp as exc:
        gave_up = exc
        await take_in_read_ahead()
    except BaseException:  # reading stopped early (an unreadable file), Ctrl-C, SIGTERM: what was read goes out
        import contextlib  # in one more try -- unless a send is under way or failing: its batch is not replaced

        try:
            with contextlib.suppress(Exception):
                await take_in_read_ahead()
            if delivery.waiting_since is None and not delivery.held:
                with contextlib.suppress(_GaveUp, Exception):
                    await flush(tries=1)
        finally:  # said even when a second Ctrl-C cuts the try short
            n, line = unsent()
            if n:
                print(f"publish: {n} message(s) not sent (from {name}:{line} on)", file=sys.stderr, flush=True)
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
