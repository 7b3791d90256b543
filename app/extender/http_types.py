"""The values of the extender's HTTP layer: limits, requests, answers, protocol errors, the shared server state.

:mod:`app.extender.http` reads requests with them; :func:`tls_context` makes the HTTPS context from the
``RTT_EXTENDER_TLS_CERT`` / ``RTT_EXTENDER_TLS_KEY`` files.
"""

from __future__ import annotations

import asyncio
import dataclasses
import email.utils
import ssl
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from app.errors import ConfigError


class Connection(Protocol):
    """One open connection of a server (:class:`app.extender.http.HttpProtocol`)."""

    def close(self) -> None: ...


@dataclasses.dataclass(frozen=True)
class HttpLimits:
    max_header_bytes: int = 16 * 1024
    max_body_bytes: int = 8 * 1024 * 1024
    header_timeout_s: float = 5.0  # first byte of a request -> end of its header block
    body_timeout_s: float = 5.0  # end of the header block -> end of the body
    idle_timeout_s: float = 75.0  # kept-alive connection without a request in progress
    max_connections: int = 1024

    @classmethod
    def from_options(cls, o: Any) -> HttpLimits:
        """The limits an :class:`~app.extender.options.ExtenderOptions` sets."""
        return cls(max_body_bytes=o.max_body_bytes, header_timeout_s=o.header_timeout_s,
                   body_timeout_s=o.read_timeout_s, idle_timeout_s=o.idle_timeout_s, max_connections=o.max_connections)

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            if not getattr(self, f.name) > 0:
                raise ValueError(f"{f.name} must be > 0 (got {getattr(self, f.name)})")


@dataclasses.dataclass(slots=True)
class Request:
    method: str
    path: str
    headers: dict[str, str]  # lower-case names
    body: bytes | bytearray | memoryview  # a large body is the buffer it was received into


@dataclasses.dataclass(slots=True)
class Response:
    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = ()


class HttpError(Exception):
    """A request the protocol layer refuses: answered with ``status`` and the connection closed."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class BodyBuffers:
    """Arrays that large request bodies are received into, kept for the next ones.

    A fresh 14 MB array (a 5,000-node NodeList) costs the kernel a page fault and a zeroed page every 4 KB as
    the body is written into it: more CPU than receiving the bytes. A body's array comes back with
    :meth:`give` once its request is answered, and is kept (up to ``max_bytes`` in all) unless something
    still holds a view of it (a decoder's zero-copy slice kept beyond the request, say): its reference
    count says so, and such an array is simply left to be freed.

    >>> pool = BodyBuffers(max_bytes=1 << 20)
    >>> a = pool.take(300_000); pool.give(a); pool.kept
    1
    >>> pool.take(200_000) is a, pool.kept
    (True, 0)
    """

    FREE_REFS = 3  # references to an array nobody else holds, as give() sees it: its caller's, its own, getrefcount's

    def __init__(self, max_bytes: int = 64 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._free: list[np.ndarray] = []
        self._returning: list[np.ndarray] = []

    @property
    def kept(self) -> int:
        return len(self._free)

    def take(self, n: int) -> np.ndarray:
        """A uint8 array of at least ``n`` bytes (at most twice that, else a new one), contents undefined."""
        best = -1
        for i, a in enumerate(self._free):
            if n <= a.size <= 2 * n and (best < 0 or a.size < self._free[best].size):
                best = i
        return self._free.pop(best) if best >= 0 else np.empty(n, dtype=np.uint8)

    def give_soon(self, array: np.ndarray) -> None:
        """:meth:`give` ``array`` in the next turn of the running loop: a body is complete inside the read
        callback, while the transport still holds the view it read into."""
        self._returning.append(array)
        if len(self._returning) == 1:
            asyncio.get_running_loop().call_soon(self._give_returned)

    def _give_returned(self) -> None:
        while self._returning:
            array = self._returning.pop()  # the one reference give() expects besides its own
            self.give(array)

    def give(self, array: np.ndarray) -> None:
        """Keep ``array`` for a later body if nothing else refers to it and the pool has room (the largest
        kept arrays make way for it)."""
        if sys.getrefcount(array) > self.FREE_REFS or array.size > self.max_bytes:
            return
        self._free.append(array)
        self._free.sort(key=lambda a: a.size)
        while sum(a.size for a in self._free) > self.max_bytes:
            self._free.pop()


class HttpServerState:
    """What all connections of one listening server share: the handler, limits, the connection count.

    ``connection`` makes the protocol of one connection (:class:`app.extender.http.HttpProtocol`) from this
    state. ``handle`` never raises (the application turns its failures into answers). ``error_body`` makes the
    JSON body of a protocol-level error; ``on_error`` is told its status (for metrics), ``on_reject`` each
    connection refused by the cap.
    """

    def __init__(
        self, connection: Callable[[HttpServerState], asyncio.BaseProtocol], handle: Callable[[Request], Response],
        limits: HttpLimits, error_body: Callable[[str], bytes], on_error: Callable[[int], None] | None = None,
        on_reject: Callable[[], None] | None = None,
    ) -> None:
        self.connection = connection
        self.handle = handle
        self.limits = limits
        self.error_body = error_body
        self.on_error = on_error or (lambda status: None)
        self.on_reject = on_reject or (lambda: None)
        self.connections: set[Connection] = set()
        self.scratch = memoryview(bytearray(256 * 1024))  # every connection reads into it (one at a time)
        self.buffers = BodyBuffers()  # large bodies are received into these
        self._date = (0, "")

    def date(self) -> str:
        now = int(time.time())
        if now != self._date[0]:
            self._date = (now, email.utils.formatdate(now, usegmt=True))
        return self._date[1]

    def protocol(self) -> asyncio.BaseProtocol:
        """The protocol of a new connection (the factory ``loop.create_server`` calls)."""
        return self.connection(self)

    def close_all(self) -> None:
        for conn in list(self.connections):
            conn.close()


def tls_context(options: Any) -> ssl.SSLContext | None:
    """The server's TLS context when ``options.tls_cert`` and ``tls_key`` are set; ConfigError naming a bad file."""
    if not options.tls_cert and not options.tls_key:
        return None
    for var, path in (("RTT_EXTENDER_TLS_CERT", options.tls_cert), ("RTT_EXTENDER_TLS_KEY", options.tls_key)):
        if not path or not Path(path).is_file():
            raise ConfigError(var, f"no such file: {path!r}" if path else "must be set for HTTPS")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        ctx.load_cert_chain(options.tls_cert, options.tls_key)
    except (ssl.SSLError, OSError) as exc:
        raise ConfigError("RTT_EXTENDER_TLS_CERT", f"cannot load certificate {options.tls_cert} with key "
                                                   f"{options.tls_key}: {exc}") from None
    return ctx
