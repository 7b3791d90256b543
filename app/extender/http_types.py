"""The values of the extender's HTTP layer: limits, requests, answers, protocol errors, the shared server state.

:mod:`app.extender.http` reads requests with them; :func:`tls_context` makes the HTTPS context from the
``RTT_EXTENDER_TLS_CERT`` / ``RTT_EXTENDER_TLS_KEY`` files.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
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


GRANULE = 64 * 1024  # new body arrays are a multiple of this


class BodyBuffers:
    """Arrays that large request bodies are received into, kept for the next ones.

    A fresh 14 MB array (a 5,000-node NodeList) costs the kernel a page fault and a zeroed page every 4 KB as
    the body is written into it: more CPU than receiving the bytes. A body's array comes back with
    :meth:`give` once its request is answered, and is kept unless something still holds a view of it (a
    decoder's zero-copy slice kept beyond the request, say): its reference count says so, and such an array
    is simply left to be freed.

    Only arrays that were in use come back, so the pool never holds more than the most bodies received at
    once lately (twenty concurrent 5,000-node NodeLists: 280 MB), at most ``max_bytes``; an array not taken
    again within ``idle_s`` is dropped, so the memory of a burst is not held once requests are small again.

    >>> pool = BodyBuffers(max_bytes=1 << 20)
    >>> a = pool.take(300_000); pool.give(a); pool.kept
    1
    >>> pool.take(200_000) is a, pool.kept
    (True, 0)
    """

    FREE_REFS = 3  # references to an array nobody else holds, as give() sees it: its caller's, its own, getrefcount's

    def __init__(self, max_bytes: int = 512 * 1024 * 1024, idle_s: float = 30.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.max_bytes = max_bytes
        self.idle_s = idle_s
        self._clock = clock
        self._free: list[tuple[np.ndarray, float]] = []  # (array, when given back), smallest first
        self._returning: list[np.ndarray] = []
        self._trim_timer: asyncio.TimerHandle | None = None

    @property
    def kept(self) -> int:
        return len(self._free)

    @property
    def kept_bytes(self) -> int:
        return sum(a.size for a, _ in self._free)

    def take(self, n: int) -> np.ndarray:
        """A uint8 array of at least ``n`` bytes (at most twice that, else a new one), contents undefined.

        A new array has an eighth more room than asked for: the next bodies of a kind (the same NodeList
        for another pod) differ by a few bytes, and one a byte longer would not fit an array of exact size.
        """
        best = -1
        for i, (a, _) in enumerate(self._free):
            if n <= a.size <= 2 * n and (best < 0 or a.size < self._free[best][0].size):
                best = i
        if best >= 0:
            return self._free.pop(best)[0]
        return np.empty(-(-(n + n // 8) // GRANULE) * GRANULE, dtype=np.uint8)

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
        if self._trim_timer is None:
            self._arm_trim()

    def give(self, array: np.ndarray) -> None:
        """Keep ``array`` for a later body if nothing else refers to it and the pool has room (the largest
        kept arrays make way for it)."""
        if sys.getrefcount(array) > self.FREE_REFS or array.size > self.max_bytes:
            return
        self._free.append((array, self._clock()))
        self._free.sort(key=lambda kept: kept[0].size)
        while self.kept_bytes > self.max_bytes:
            self._free.pop()

    def trim(self) -> None:
        """Drop the arrays not taken again within ``idle_s``."""
        if self._free:
            since = self._clock() - self.idle_s
            self._free = [kept for kept in self._free if kept[1] > since]

    def _arm_trim(self) -> None:
        """Drop idle arrays by a timer, without waiting for another request: when the oldest kept one is due."""
        if self._free:
            oldest = min(given for _, given in self._free)
            wait = max(0.0, oldest + self.idle_s - self._clock()) + 0.01
            self._trim_timer = asyncio.get_running_loop().call_later(wait, self._timed_trim)

    def _timed_trim(self) -> None:
        self._trim_timer = None
        self.trim()
        self._arm_trim()

    def close(self) -> None:
        """Forget every array and the pending trim (the server is closing)."""
        if self._trim_timer is not None:
            self._trim_timer.cancel()
            self._trim_timer = None
        self._free.clear()
        self._returning.clear()


class Receiver(Protocol):
    """A connection waiting for its turn to receive a large body (:class:`BodyTurns`)."""

    def take_turn(self) -> None: ...


class BodyTurns:
    """Large bodies received a few at a time, in the order their headers arrived.

    Twenty 14 MB NodeLists sent at once and read side by side all finish at about the same time, after the
    last byte of all twenty, and need twenty arrays in memory at once. Received ``turns`` at a time, the
    first is answered after its own bytes and the arrays of the first are reused by the next: the slowest
    answer is no later, every other one is earlier, and the memory is that of ``turns`` bodies. The other
    connections are not read meanwhile (their bytes wait in the kernel, the client's sends are slowed by
    TCP). A body that stalls (no bytes for ``stall_s``) loses its turn to the next one, so a slow sender
    never holds the others back: it goes on being received beside them.
    """

    def __init__(self, turns: int = 2, stall_s: float = 0.05) -> None:
        self.turns = turns
        self.stall_s = stall_s
        self._holders: dict[Receiver, float] = {}  # receiving now -> when its last bytes came
        self._waiting: collections.deque[Receiver] = collections.deque()
        self._timer: asyncio.TimerHandle | None = None

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def receiving(self) -> int:
        return len(self._holders)

    def ask(self, who: Receiver) -> bool:
        """True: ``who`` may receive its body now; False: it waits, and ``who.take_turn()`` is called later."""
        if len(self._holders) < self.turns and not self._waiting:
            self._holders[who] = time.monotonic()
            return True
        self._waiting.append(who)
        if self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self.stall_s, self._check)
        return False

    def progress(self, who: Receiver) -> None:
        """``who`` received bytes of its body."""
        if who in self._holders:
            self._holders[who] = time.monotonic()

    def done(self, who: Receiver) -> None:
        """``who`` has its whole body, failed, or closed: the next in line gets its turn."""
        if self._holders.pop(who, None) is None:
            with contextlib.suppress(ValueError):
                self._waiting.remove(who)
            return
        self._admit()

    def _admit(self) -> None:
        while self._waiting and len(self._holders) < self.turns:
            who = self._waiting.popleft()
            self._holders[who] = time.monotonic()
            who.take_turn()

    def _check(self) -> None:
        self._timer = None
        stalled = time.monotonic() - self.stall_s
        for who, last in list(self._holders.items()):
            if last < stalled:  # received on beside the others, without a turn
                del self._holders[who]
        self._admit()
        if self._waiting:
            self._timer = asyncio.get_running_loop().call_later(self.stall_s, self._check)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._holders.clear()
        self._waiting.clear()


Handle = Callable[["Request"], "Response | asyncio.Future[Response]"]


class HttpServerState:
    """What all connections of one listening server share: the handler, limits, the connection count.

    ``connection`` makes the protocol of one connection (:class:`app.extender.http.HttpProtocol`) from this
    state. ``handle`` never raises (the application turns its failures into answers); it returns the answer, or
    a future of it for a request answered off the event loop (the connection reads nothing more meanwhile, so
    pipelined answers stay in order). ``error_body`` makes the
    JSON body of a protocol-level error; ``on_error`` is told its status (for metrics), ``on_reject`` each
    connection refused by the cap.
    """

    def __init__(
        self, connection: Callable[[HttpServerState], asyncio.BaseProtocol], handle: Handle,
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
        self.turns = BodyTurns()  # ... a few at a time
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
        self.buffers.close()
        self.turns.close()


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
