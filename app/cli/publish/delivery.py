"""``rttsched publish``'s delivery: each batch sent until the broker took it, what it refuses for good
dead-lettered (:class:`Delivery`)."""

from __future__ import annotations

import logging
import sys
from typing import Any

from app.cli.publish.read_ahead import READ_AHEAD

REFUSED = "refused_by_kafka"  # the dead letters' reason for a message Kafka refused for good

log = logging.getLogger(__name__)  # a child of the command's: at the level the command sets


class GaveUp(Exception):
    """Kafka did not take the held messages within ``--give-up-after`` (or the tries allowed)."""

    def __init__(self, error: str, waited_s: float) -> None:
        super().__init__(error)
        self.error, self.waited_s = error, waited_s


def said(exc: BaseException) -> str:
    """An error as one line, its kind named once (aiokafka's name it themselves).

    >>> said(ValueError("bad.")), said(ValueError()), said(RuntimeError("[Error 7] RuntimeError"))
    ('ValueError: bad', 'ValueError', '[Error 7] RuntimeError')
    """
    text, kind = str(exc).strip().rstrip("."), type(exc).__name__
    return text if kind in text else f"{kind}: {text}" if text else kind


class Delivery:
    """Sends each flush's messages until the broker has taken every one.

    What the broker did not take (away, restarting, stalled past the producer's request timeout) is held and
    sent again, with a backoff and through a new producer, until it does -- or for at most ``give_up_s``, then
    :class:`GaveUp`. The first failed try logs one WARNING, the try that delivers what was held one INFO.
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
        self._sent: set[int] = set()  # the messages of the flush under way a producer took to send (by id)
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

    async def close(self, wait_s: float | None = None) -> bool:
        """Stop the producer: what it still holds goes out first, for at most ``wait_s`` (None: as long as it takes,
        up to its 10 s request timeout with a broker just gone); whether it stopped within that -- else it is
        stopped without it, and Kafka may or may not have stored what it held."""
        import asyncio

        producer, self.producer = self.producer, None
        if producer is None:
            return True
        stopping = asyncio.ensure_future(producer.stop())
        done, _ = await asyncio.wait({stopping}, timeout=wait_s)
        if stopping not in done:
            stopping.cancel()
        await asyncio.gather(stopping, return_exceptions=True)  # its error, if any, is no news: it is stopped
        return stopping in done

    def unanswered(self) -> list[Any]:
        """The messages held that were sent at least once with no answer that Kafka took them (a send cut short,
        or one that failed, perhaps by a timeout): Kafka may have stored them all the same."""
        return [m for m in self.held if id(m) in self._sent]

    async def send(self, messages: list[Any], lines: list[int], *, tries: int | None = None) -> int:
        """Send ``messages`` (read from input lines ``lines``, one each) until the broker took each, or ``tries``
        tries failed (:class:`GaveUp`); how many of the topic's it took."""
        import asyncio
        import collections
        import time

        from app.bridge.errors import BridgeError
        from app.bridge.producer import send_messages
        from app.kafka.batches import permanent

        self.held = list(messages)
        self._lines = {id(m): n for m, n in zip(messages, lines, strict=True)}
        self._of_refused, self._made, self._sent = set(), [], set()
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
                failed = await send_messages(self.producer, self.held, handed=lambda m: self._sent.add(id(m)))
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
                            self._settings.bootstrap_servers, len(self.held), said(error), bound, READ_AHEAD)
            waited = time.monotonic() - self.waiting_since
            if tries is not None:
                tries -= 1
                if tries <= 0:
                    raise GaveUp(said(error), waited)
            if self._give_up_s is not None and waited >= self._give_up_s:
                raise GaveUp(said(error), waited)
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
            head = f"publish: error: Kafka refused {len(mine)} message(s) for good ({said(mine[0][1])}), " \
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
                later = f" once Kafka says it has that topic (it could not be asked: {said(unsure)})" if unsure else ""
                print(f"{head}: they go to dead-letters (reason {REFUSED}){later}", file=sys.stderr, flush=True)
            else:
                self.refused += len(mine)
                print(f"{head}; not sent again, nor dead-lettered: {where}", file=sys.stderr, flush=True)
        if lost:
            self.refused += len(lost)
            print(f"publish: error: Kafka refused {len(lost)} dead letter(s) for good ({said(lost[0][1])}), from "
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

    text = f"{REFUSED}: refused for good ({said(exc)})"
    if len(value) > MAX_RAW_BYTES:
        text += f"; sha256 of the whole value {hashlib.sha256(value).hexdigest()}"
    return text
