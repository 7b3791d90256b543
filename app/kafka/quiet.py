"""Keep aiokafka's per-attempt connection errors from drowning what the caller reports itself.

aiokafka logs ``ERROR Unable connect to ...`` on every failed connection attempt (``WARNING Unable to request
metadata ...`` when the connection was made and closed at the first request: a SASL listener to a client without
SASL). Where a failure is expected and handled - the embedded broker's readiness probe, a command that turns
"no broker" into its own one-line error - that line is noise before the real message: inside
:func:`handled_connect` those records are dropped unless debug logging is on (``rttsched -v``).

A service that goes on while the broker is away (the worker, the trainer, the extender's feed) lets each
of aiokafka's per-retry errors (:data:`RECURRING`: connect, metadata, fetch, produce, coordinator) through
once per period, saying how many like it it held back (:func:`quiet_client_errors`): a worker logged about
310 such lines a second with its broker away, the trainer 160. The worker's own delivery failures (a record
batch sent again, a node-weights message lost) and the extender's (a batch of predictions dropped: 914 lines
in one second after its broker came back from a hang) are kept to one per period the same way.

>>> drop = DropConnectionErrors()
>>> [drop.filter(logging.makeLogRecord({"msg": m})) for m in ('Unable connect to "%s:%s": %s', "Topic missing",
...                                                          'Unable to request metadata from "%s:%s": %s')]
[False, True, False]
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

AIOKAFKA_LOGGERS = ("aiokafka", "aiokafka.conn", "aiokafka.client")
PERIOD_S = 10.0  # the worker's and the trainer's period for RECURRING errors (the extender's: RTT_EXTENDER_REPORT_S)


class DropConnectionErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(("Unable connect", "Unable to connect", "Unable to request metadata"))


@contextlib.contextmanager
def handled_connect() -> Iterator[None]:
    """Within the block, aiokafka's connection-failure records are not logged (kept with debug logging)."""
    if logging.getLogger().isEnabledFor(logging.DEBUG):
        yield
        return
    drop = DropConnectionErrors()
    loggers = [logging.getLogger(name) for name in AIOKAFKA_LOGGERS]
    for lg in loggers:
        lg.addFilter(drop)
    try:
        yield
    finally:
        for lg in loggers:
            lg.removeFilter(drop)


RECURRING: dict[str, tuple[str, ...]] = {  # logger -> the messages it repeats on every retry while the broker is away
    "aiokafka": ("Unable connect to", "Unable to update metadata", "Unable to request metadata"),
    "aiokafka.consumer.fetcher": ("Failed fetch messages from", "Failed fetch offsets from"),
    "aiokafka.producer.sender": ("Got error produce response",),
    "aiokafka.consumer.group_coordinator": ("Group Coordinator Request failed", "Error sending %s to node",
                                            "Marking the coordinator dead"),
    # the worker's own: a batch or message the broker did not acknowledge (app.kafka.batches, app.streams.topics)
    "app.kafka.batches": ("delivery to %s[%d] failed (", "delivery to %s[%d] failed for good"),
    "app.streams.topics": ("not delivered: ",),
    # the extender's predictions the broker did not acknowledge (each batch; a broker hung or restarting)
    "app.extender.kafka_sink": ("rtt-predictions delivery of %d records failed",),
}


class _EveryFew(logging.Filter):
    """Let a recurring library error through at most once per ``period_s`` (the same broker, down, each retry);
    the one let through after others were held back says how many.

    >>> f = _EveryFew(60.0, ("Failed fetch",))
    >>> recs = [logging.makeLogRecord({"msg": "Failed fetch messages from %s: %s", "args": (1, "down")})
    ...         for _ in range(4)]
    >>> [f.filter(r) for r in recs[:3]], f.held
    ([True, False, False], {'Failed fetch': 2})
    >>> f._last["Failed fetch"] -= 61.0; f.filter(recs[3]), recs[3].getMessage()
    (True, 'Failed fetch messages from 1: down (2 more like it in the last 61 s, not logged)')
    """

    def __init__(self, period_s: float, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.period_s = period_s
        self._prefixes = prefixes
        self._last: dict[str, float] = {}
        self.held: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        prefix = next((p for p in self._prefixes if msg.startswith(p)), None)
        if prefix is None:
            return True
        now = time.monotonic()
        last = self._last.get(prefix)
        if last is not None and now - last < self.period_s:
            self.held[prefix] = self.held.get(prefix, 0) + 1
            return False
        held = self.held.pop(prefix, 0)
        if held and last is not None:
            record.msg = f"{msg} ({held} more like it in the last {now - last:.0f} s, not logged)"  # no % added
        self._last[prefix] = now
        return True


def quiet_client_errors(period_s: float) -> None:
    """Keep one of each of aiokafka's per-retry errors (:data:`RECURRING`) per ``period_s`` (installed once)."""
    for name, prefixes in RECURRING.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _EveryFew) for f in logger.filters):
            logger.addFilter(_EveryFew(period_s, prefixes))
