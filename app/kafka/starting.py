"""A Kafka client started, or closed again when its start does not pass.

``AIOKafkaConsumer.start()`` / ``AIOKafkaProducer.start()`` / ``AIOKafkaAdminClient.start()`` that raise (the broker
gone as they start) or are cancelled (a SIGTERM as they start) leave the client open: dropped so, it logs asyncio's
``ERROR Unclosed AIOKafkaConsumer`` (or ``…Producer``), and whatever its start had opened (connections, its metadata
task) is left behind. :func:`start_or_close` closes it before the error goes on, so a caller that tries again
(a timer's next tick, a retry loop) leaves nothing behind per try.
"""

from __future__ import annotations

import contextlib
from typing import Any, Protocol


class Startable(Protocol):
    async def start(self) -> Any: ...


async def start_or_close(client: Startable) -> None:
    """Start ``client``; when its start raises or is cancelled, close it (``stop()``, or an admin client's
    ``close()``) and let the error go on. A failure of that close is not the caller's: it is left out."""
    try:
        await client.start()
    except BaseException:
        close = getattr(client, "stop", None) or getattr(client, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()
        raise
