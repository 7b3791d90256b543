"""Silence aiokafka's per-attempt connection errors where the caller reports the outcome itself.

aiokafka logs ``ERROR Unable connect to ...`` on every failed connection attempt. Where a failure is
expected and handled - the embedded broker's readiness probe, a command that turns "no broker" into its
own one-line error - that line is noise before the real message. Inside :func:`handled_connect` those
records are dropped unless debug logging is on (``rttsched -v``).

>>> drop = DropConnectionErrors()
>>> [drop.filter(logging.makeLogRecord({"msg": m})) for m in ('Unable connect to "%s:%s": %s', "Topic missing")]
[False, True]
"""

from __future__ import annotations

import contextlib
import logging
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
