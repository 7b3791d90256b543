"""A small HTTP/1.1 server for the extender's few routes: requests answered inside the read callback.

Every scheduling route of the extender answers from memory without awaiting anything, so a request needs no
task, no stream reader and no response object: :class:`HttpProtocol` parses a request from the bytes it
received, calls the synchronous handler and writes the answer, all in one ``data_received`` call. A handler may
instead return a future of its answer (work done in another thread): the connection then reads nothing more
until the answer is written, so pipelined requests are still answered in order. What it accepts:
``Content-Length`` or ``chunked`` bodies, ``Expect: 100-continue``, keep-alive (HTTP/1.1 default, HTTP/1.0 on
request) and pipelined requests, in order.

Bounds, each answered with a JSON ``Error`` (see :class:`HttpLimits`):

* the header block must arrive within ``header_timeout_s`` of the request's first byte (408), and be at
  most ``max_header_bytes`` (431) — a client sending one byte every few seconds is cut off;
* the body must arrive within ``body_timeout_s`` of the header block (408) and be at most
  ``max_body_bytes`` (413, from ``Content-Length`` before reading, or while reading a chunked body);
* a connection idle between requests for ``idle_timeout_s`` is closed;
* beyond ``max_connections`` open connections a new one is answered 503 and closed.

A body larger than :data:`LARGE_BODY` is received straight into an array, taken from and given back to the
server's :class:`~app.extender.http_types.BodyBuffers` (a fresh 14 MB array costs more page faults than
receiving the bytes). Such bodies are received a few at a time, in the order their headers arrived
(:class:`~app.extender.http_types.BodyTurns`): a connection waiting for its turn is not read, and its body
timeout starts with its turn.

After an error answer the connection is half-closed and what the client still sends is read and dropped
for a moment, so that it sees the answer instead of a reset.
"""

from __future__ import annotations

import asyncio
import logging
from http import HTTPStatus

import numpy as np

from app.extender.http_types import (
    HttpError,
    HttpLimits,
    HttpServerState,
    Request,
    Response,
    tls_context,
)

__all__ = ["HttpError", "HttpLimits", "HttpProtocol", "HttpServerState", "Request", "Response", "tls_context"]

log = logging.getLogger(__name__)

LINGER_S = 2.0  # after an error answer: how long unread input is drained before the socket closes
LARGE_BODY = 256 * 1024  # a Content-Length body above this is received in place, into its own buffer


_IDLE, _HEAD, _BODY, _CHUNKED, _DRAIN, _WAIT = range(6)  # _WAIT: an answer computed elsewhere
_REASONS = {s.value: s.phrase for s in HTTPStatus}


class HttpProtocol(asyncio.BufferedProtocol):
    """One client connection (see the module docstring)."""

    def __init__(self, shared: HttpServerState) -> None:
        self._shared = shared
        self._limits = shared.limits
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._state = _IDLE
        self._deadline = 0.0
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0
        self._counted = False
        # the request being read
        self._method = self._path = ""
        self._headers: dict[str, str] = {}
        self._need = 0  # Content-Length still to come, or the size of the current chunk
        self._body: memoryview | None = None  # a large body being received in place (see get_buffer)
        self._base: np.ndarray | None = None  # the array under it (from the server's pool, back there after)
        self._have = 0
        self._chunks = bytearray()
        self._keep_alive = True
        self._head_only = False
        self._waiting = False  # a large body waiting for its turn (BodyTurns): not read meanwhile
        self._turn_given = False  # its turn came: received in place from the next read on

    # -- connection
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]  # a stream transport (asyncio's or uvloop's)
        if len(self._shared.connections) >= self._limits.max_connections:
            self._shared.on_reject()
            self._send(503, self._shared.error_body(
                f"too many connections (limit {self._limits.max_connections}); retry later"), close=True)
            transport.close()
            return
        self._shared.connections.add(self)
        self._counted = True
        self._arm(self._limits.idle_timeout_s)

    def connection_lost(self, exc: Exception | None) -> None:
        if self._counted:
            self._shared.connections.discard(self)
            self._counted = False
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._transport = None
        self._buf.clear()
        self._body = self._base = None
        self._turn_given = False
        self._shared.turns.done(self)

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def pause_writing(self) -> None:  # the client does not read its answers: stop reading its requests
        if self._transport is not None:
            self._transport.pause_reading()

    def resume_writing(self) -> None:
        if self._transport is not None and not self._waiting and self._state != _WAIT:
            self._transport.resume_reading()

    # -- timers: one handle, re-armed lazily (a request that arrives whole never touches it)
    def _arm(self, seconds: float) -> None:
        self._deadline = deadline = self._loop.time() + seconds
        if self._timer is None or self._timer_at > deadline:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._timer_at = self._loop.call_at(deadline, self._on_timer), deadline

    def _on_timer(self) -> None:
        self._timer = None
        if self._transport is None:
            return
        if self._loop.time() < self._deadline:
            self._timer, self._timer_at = self._loop.call_at(self._deadline, self._on_timer), self._deadline
            return
        state = self._state
        if state == _WAIT:  # no time limit on our own answer; the timer is armed again once it is sent
            return
        if self._waiting:  # the body's time starts with its turn
            self._arm(self._limits.body_timeout_s)
            return
        if state == _HEAD:
            self._fail(HttpError(408, f"request header not received within {self._limits.header_timeout_s:g} s"))
        elif state in (_BODY, _CHUNKED):
            self._fail(HttpError(408, f"request body not received within {self._limits.body_timeout_s:g} s"))
        else:  # idle keep-alive, or the drain after an error answer
            self._transport.close()

    # -- reading
    def get_buffer(self, sizehint: int) -> memoryview:
        """Where the next bytes go: straight into a large body's own buffer, else a scratch buffer."""
        if self._body is not None:
            return self._body[self._have:]  # exactly what is missing: nothing of a next request
        if self._turn_given:  # the array is taken with the first bytes: by then the last body's is back
            self._turn_given = False
            self._receive_in_place()
            return self._body[self._have:]  # type: ignore[index]
        return self._shared.scratch

    def buffer_updated(self, nbytes: int) -> None:
        if self._body is None:
            self.data_received(self._shared.scratch[:nbytes])
            return
        self._have += nbytes
        if self._have < self._need:
            self._shared.turns.progress(self)
            return
        self._shared.turns.done(self)  # the next large body is read while this one is answered
        body, self._body = self._body, None
        base, self._base = self._base, None
        self._dispatch(body)
        if base is not None:  # given back once the transport has dropped its view of it (after this callback)
            self._shared.buffers.give_soon(base)

    def data_received(self, data: bytes | memoryview) -> None:
        if self._state == _DRAIN:
            return
        self._buf += data
        if self._state == _IDLE:
            self._state = _HEAD
            self._arm(self._limits.header_timeout_s)
        try:
            self._process()
        except HttpError as exc:
            self._fail(exc)

    def eof_received(self) -> bool:
        return False  # the transport closes itself; a half-read request is abandoned

    def _process(self) -> None:
        buf = self._buf
        while self._transport is not None and not self._transport.is_closing():
            state = self._state
            if state == _HEAD:
                while buf[:2] == b"\r\n":  # stray empty lines before a request line are allowed
                    del buf[:2]
                end = buf.find(b"\r\n\r\n")
                if end < 0:
                    if len(buf) > self._limits.max_header_bytes:
                        raise HttpError(431, f"request header larger than {self._limits.max_header_bytes} bytes")
                    if not buf:
                        self._state = _IDLE
                        self._arm(self._limits.idle_timeout_s)
                    return
                if end > self._limits.max_header_bytes:
                    raise HttpError(431, f"request header larger than {self._limits.max_header_bytes} bytes")
                head = bytes(buf[:end])
                del buf[:end + 4]
                self._start_request(head)
            elif state == _BODY:
                if len(buf) < self._need:
                    return
                body = bytes(buf[:self._need])
                del buf[:self._need]
                self._dispatch(body)
            elif state == _CHUNKED:
                if not self._read_chunks():
                    return
                body, self._chunks = bytes(self._chunks), bytearray()
                self._dispatch(body)
            else:
                return

    def _start_request(self, head: bytes) -> None:
        try:
            text = head.decode("latin-1")
        except UnicodeDecodeError:  # pragma: no cover - latin-1 decodes any byte
            raise HttpError(400, "malformed request header") from None
        lines = text.split("\r\n")
        parts = lines[0].split(" ")
        if len(parts) != 3 or not parts[0] or not parts[1]:
            raise HttpError(400, "malformed request line")
        method, target, version = parts
        if version not in ("HTTP/1.1", "HTTP/1.0"):
            raise HttpError(505, f"HTTP version {version[:16]!r} not supported")
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, sep, value = line.partition(":")
            if not sep or not name or name[-1] in " \t" or name[0] in " \t":
                raise HttpError(400, "malformed header line")
            key = name.lower()
            value = value.strip(" \t")
            if key in headers:
                if key == "content-length" and headers[key] != value:
                    raise HttpError(400, "conflicting Content-Length headers")
                if key != "content-length":
                    headers[key] = f"{headers[key]}, {value}"
                continue
            headers[key] = value
        if target.startswith("/"):
            path = target.split("?", 1)[0]
        elif target.startswith(("http://", "https://")):
            rest = target.split("://", 1)[1]
            path = "/" + rest.split("/", 1)[1].split("?", 1)[0] if "/" in rest else "/"
        else:
            path = target
        connection = headers.get("connection", "").lower()
        self._keep_alive = "close" not in connection if version == "HTTP/1.1" else "keep-alive" in connection
        self._method, self._path, self._headers = method, path, headers
        self._head_only = method == "HEAD"
        te = headers.get("transfer-encoding")
        cl = headers.get("content-length")
        if te is not None:
            if cl is not None:
                raise HttpError(400, "both Transfer-Encoding and Content-Length")
            if te.lower() != "chunked":
                raise HttpError(501, f"transfer coding {te[:32]!r} not supported (only chunked)")
            self._state, self._need = _CHUNKED, -1
            self._chunks = bytearray()
        elif cl is not None:
            if not cl.isdigit():
                raise HttpError(400, "Content-Length must be a number")
            if len(cl) > 18:  # beyond any limit, before int() of an unbounded string
                raise HttpError(413, f"request body of {cl[:24]} bytes exceeds the limit of "
                                     f"{self._limits.max_body_bytes}")
            self._need = int(cl)
            if self._need > self._limits.max_body_bytes:
                raise HttpError(413, f"request body of {self._need} bytes exceeds the limit of "
                                     f"{self._limits.max_body_bytes}")
            self._state = _BODY
        else:
            self._need, self._state = 0, _BODY
        if self._need and headers.get("expect", "").lower() == "100-continue" and len(self._buf) < max(self._need, 1):
            assert self._transport is not None
            self._transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        self._arm(self._limits.body_timeout_s)
        if self._state == _BODY and self._need > LARGE_BODY and len(self._buf) < self._need:
            if self._shared.turns.ask(self):
                self._receive_in_place()
            else:
                assert self._transport is not None
                self._waiting = True
                self._transport.pause_reading()

    def _receive_in_place(self) -> None:
        """The rest of a large body goes straight into an array of the pool (see :meth:`get_buffer`)."""
        # left uninitialised, as every byte of it is written before it is read: zero-filling 14 MB (a NodeList
        # of 5,000 nodes) cost more than receiving it
        self._base = self._shared.buffers.take(self._need)
        self._body = self._base.data[:self._need]
        self._body[:len(self._buf)] = self._buf
        self._have = len(self._buf)
        self._buf.clear()

    def take_turn(self) -> None:
        """Called by the server's :class:`~app.extender.http_types.BodyTurns`: this body may be received now."""
        self._waiting = False
        if self._transport is None or self._state != _BODY:
            self._shared.turns.done(self)
            return
        self._turn_given = True
        self._arm(self._limits.body_timeout_s)
        self._transport.resume_reading()

    def _read_chunks(self) -> bool:
        """Move complete chunks from the buffer into the body; True once the last chunk and trailers are in."""
        buf = self._buf
        while True:
            if self._need == -1:  # expecting a chunk-size line
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > 1024:
                        raise HttpError(400, "malformed chunk size line")
                    return False
                size_text = bytes(buf[:end]).split(b";", 1)[0].strip()
                try:
                    size = int(size_text, 16)
                except ValueError:
                    raise HttpError(400, "malformed chunk size line") from None
                if size < 0:
                    raise HttpError(400, "malformed chunk size line")
                del buf[:end + 2]
                if size == 0:
                    self._need = -2
                else:
                    if len(self._chunks) + size > self._limits.max_body_bytes:
                        raise HttpError(413, f"request body exceeds the limit of {self._limits.max_body_bytes} bytes")
                    self._need = size
            if self._need == -2:  # trailers up to an empty line
                end = buf.find(b"\r\n")
                if end < 0:
                    if len(buf) > self._limits.max_header_bytes:
                        raise HttpError(431, "chunked trailers too large")
                    return False
                del buf[:end + 2]
                if end == 0:
                    return True
                continue
            if len(buf) < self._need + 2:
                return False
            if buf[self._need:self._need + 2] != b"\r\n":
                raise HttpError(400, "malformed chunk")
            self._chunks += buf[:self._need]
            del buf[:self._need + 2]
            self._need = -1

    # -- answering
    def _dispatch(self, body: bytes | bytearray | memoryview) -> None:
        request = Request(self._method, self._path, self._headers, body)
        self._state = _HEAD if self._buf else _IDLE
        try:
            answer = self._shared.handle(request)
        except Exception:  # the application promises not to raise; never let it kill the connection silently
            log.exception("unhandled error answering %s %s", self._method, self._path)
            answer = Response(500, self._shared.error_body("internal error (logged by the extender)"))
        if isinstance(answer, asyncio.Future):
            self._state = _WAIT
            assert self._transport is not None
            self._transport.pause_reading()
            answer.add_done_callback(self._answered)
            return
        self._answer(answer)

    def _answered(self, future: asyncio.Future[Response]) -> None:
        """A future answer came: written, then what the client sent meanwhile is read on."""
        if self._transport is None or self._transport.is_closing():
            return
        try:
            response = future.result()
        except BaseException:  # the application promises an answer; never leave the client waiting for none
            log.exception("unhandled error answering %s %s", self._method, self._path)
            response = Response(500, self._shared.error_body("internal error (logged by the extender)"))
        self._state = _HEAD if self._buf else _IDLE
        self._answer(response)
        if self._transport is None or self._transport.is_closing():
            return
        self._transport.resume_reading()
        if self._buf:
            try:
                self._process()
            except HttpError as exc:
                self._fail(exc)

    def _answer(self, response: Response) -> None:
        close = not self._keep_alive
        self._send(response.status, response.body, response.content_type, response.headers, close=close)
        if close:
            assert self._transport is not None
            self._transport.close()
            return
        self._arm(self._limits.header_timeout_s if self._buf else self._limits.idle_timeout_s)

    def _send(self, status: int, body: bytes, content_type: str = "application/json",
              headers: tuple[tuple[str, str], ...] = (), close: bool = False) -> None:
        extra = "".join(f"{k}: {v}\r\n" for k, v in headers)
        head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Unknown')}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(body)}\r\nDate: {self._shared.date()}\r\n{extra}"
                f"{'Connection: close' + chr(13) + chr(10) if close else ''}\r\n").encode("latin-1")
        assert self._transport is not None
        if self._head_only:
            self._transport.write(head)
        elif len(body) < 65536:
            self._transport.write(head + body)
        else:
            self._transport.writelines((head, body))

    def _fail(self, exc: HttpError) -> None:
        """Answer a protocol-level error, half-close, and drain what the client still sends for a moment."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return
        self._shared.on_error(exc.status)
        self._head_only = False
        self._body = self._base = None
        self._turn_given = False
        self._shared.turns.done(self)
        if self._waiting:
            self._waiting = False
            transport.resume_reading()  # the drain reads what the client still sends
        self._send(exc.status, self._shared.error_body(exc.message), close=True)
        self._buf.clear()
        self._state = _DRAIN
        try:
            if transport.can_write_eof():
                transport.write_eof()
        except OSError:  # the client is gone already
            transport.close()
            return
        self._arm(LINGER_S)
