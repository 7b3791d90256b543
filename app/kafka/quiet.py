"""Keep aiokafka's per-attempt connection errors from drowning what the caller reports itself.

aiokafka logs ``ERROR Unable connect to ...`` on every failed connection attempt. Where a failure is
expected and handled - the embedded broker's readiness probe, a command that turns "no broker" into its
own one-line error - that line is noise before the real message: inside :func:`handled_connect` those
records are dropped unless debug logging is on (``rttsched -v``). A service that retries for as long as
the broker is away (the extender's feed) lets one through per period instead (:func:`quiet_client_errors`).

>>> drop = DropConnectionErrors()
>>> [drop.filter(logging.makeLogRecord({"msg": m})) for m in ('Unable connect to "%s:%s": %s', "Topic missing")]
[False, True]
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Iterator

AIOKAFKA_LOGGERS = ("aiokafka", "aiokafka.conn", "aiokafka.client")


class DropConnectionErrors(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith(("Unable connect", "Unable to connect"))


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


class _EveryFew(logging.Filter):
    """Let a recurring library error through at most once per ``period_s`` (the same broker, down, each retry)."""

    def __init__(self, period_s: float, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.period_s = period_s
        self._prefixes = prefixes
        self._last: dict[str, float] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        msg = str(record.msg)
        prefix = next((p for p in self._prefixes if msg.startswith(p)), None)
        if prefix is None:
            return True
        now = time.monotonic()
        if now - self._last.get(prefix, -1e9) < self.period_s:
            return False
        self._last[prefix] = now
        return True


def quiet_client_errors(period_s: float) -> None:
    """aiokafka logs an error on every failed connection attempt: keep one per ``period_s`` (installed once)."""
    logger = logging.getLogger("aiokafka")
    if not any(isinstance(f, _EveryFew) for f in logger.filters):
        logger.addFilter(_EveryFew(period_s, ("Unable connect to", "Unable to update metadata")))
