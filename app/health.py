"""``/metrics`` and ``/healthz`` of the processes whose HTTP server runs in a thread: trainer, bridge, pods watcher.

prometheus_client serves ``/metrics`` from a thread of its own, so it answers while the process's event
loop is stuck (a call that blocks it, a task that never yields): a liveness probe on ``/metrics`` never
restarts such a process. Here the same thread also answers ``/healthz``: 200 while a :class:`Heartbeat`
task on the event loop has beaten within ``stale_after_s`` (default 30 s), else 503 naming how long it has
been silent; ``/readyz``: 503 naming what the process still waits for (:attr:`Heartbeat.waiting`: ``kafka``, a
service started before its broker) or a stuck loop, else 200; every other path is ``/metrics`` as before. The
worker and the extender serve from their event loop, so their probes need none of this -- but for the worker's
wait for its broker at start, before its web server runs: :func:`answer_while_waiting`.

>>> hb = Heartbeat(stale_after_s=30.0, clock=iter([0.0, 10.0, 45.0]).__next__)
>>> hb.healthy(), hb.healthy()
(True, False)
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import socketserver
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest, make_wsgi_app

from app.listen import listen_error

T = TypeVar("T")
STALE_AFTER_S = 30.0  # /healthz fails when the event loop has not run its heartbeat for this long
BEAT_S = 1.0


class Heartbeat:
    """When the event loop last ran :meth:`run`'s beat (``clock``: ``time.monotonic``)."""

    def __init__(self, stale_after_s: float = STALE_AFTER_S, clock: Callable[[], float] = time.monotonic) -> None:
        if not stale_after_s > 0:
            raise ValueError(f"stale_after_s must be > 0 (got {stale_after_s})")
        self.stale_after_s = stale_after_s
        self.clock = clock
        self.last = clock()
        self.waiting: str | None = None  # what the process waits for before it is ready (/readyz 503 says it)

    def beat(self) -> None:
        self.last = self.clock()

    def silent_s(self) -> float:
        return self.clock() - self.last

    def healthy(self) -> bool:
        return self.silent_s() < self.stale_after_s

    async def run(self, every_s: float = BEAT_S) -> None:
        """Beat every ``every_s`` until cancelled."""
        while True:
            self.beat()
            await asyncio.sleep(every_s)


async def beating(work: Awaitable[T], heartbeat: Heartbeat | None) -> T:
    """Await ``work`` with ``heartbeat`` beating on this event loop meanwhile (nothing more when it is None)."""
    if heartbeat is None:
        return await work
    task = asyncio.ensure_future(heartbeat.run())
    try:
        return await work
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)


class _Quiet(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base class's name
        return None  # a probe every few seconds is no news


class _ThreadingServer(socketserver.ThreadingMixIn, WSGIServer):
    daemon_threads = True


def health_app(registry: CollectorRegistry, heartbeat: Heartbeat) -> Callable[..., Iterable[bytes]]:
    """The WSGI app: ``/healthz`` from ``heartbeat``, anything else ``registry``'s exposition."""
    metrics = make_wsgi_app(registry)

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO")
        if path not in ("/healthz", "/readyz"):
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        if path == "/readyz" and heartbeat.waiting is not None:
            body, status = f"not ready: {heartbeat.waiting}\n".encode(), "503 Service Unavailable"
        elif heartbeat.healthy():
            body, status = b"ok\n", "200 OK"
        else:
            body = f"event loop silent for {heartbeat.silent_s():.0f} s\n".encode()
            status = "503 Service Unavailable"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8"), ("Content-Length", str(len(body)))])
        return [body]

    return app


def serve_metrics_and_health(port: int, addr: str, registry: CollectorRegistry,
                             heartbeat: Heartbeat) -> WSGIServer:
    """Serve ``/metrics`` and ``/healthz`` on ``addr:port`` in a daemon thread; a port that cannot be bound is a
    :class:`~app.errors.ConfigError` naming ``RTT_METRICS_PORT`` (``RTT_METRICS_HOST`` for an address that is
    not this host's or does not resolve)."""
    try:
        family = socket.getaddrinfo(addr or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        server_class = type("_Server", (_ThreadingServer,), {"address_family": family})
        server: WSGIServer = make_server(addr, port, health_app(registry, heartbeat), server_class,
                                         handler_class=_Quiet)
    except OSError as exc:  # socket.gaierror included
        raise listen_error("RTT_METRICS_PORT", addr, port, exc, "RTT_METRICS_HOST") from None
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server


def serve_health(port: int, addr: str, registry: CollectorRegistry) -> Heartbeat | None:
    """:func:`serve_metrics_and_health` with a new :class:`Heartbeat` (for :func:`beating` on the process's event
    loop), or nothing (None) when ``port`` is 0."""
    if port <= 0:
        return None
    heartbeat = Heartbeat()
    serve_metrics_and_health(port, addr, registry, heartbeat)
    return heartbeat


WAITING_PATHS = ("/metrics", "/readyz", "/")  # what the worker's web server serves (Faust's index at /); else 404
READ_S = 5.0  # a connection whose request line and headers have not come within this is closed unanswered
HAND_OVER_S = 2 * READ_S + 1.0  # the longest the hand-over waits for the requests taken to be answered


async def read_line(reader: asyncio.StreamReader) -> bytes:
    """A line of a request, ``READ_S`` at most (not asyncio.wait_for: in Python 3.11 it loses a cancel that comes
    as the line arrives, and the hand-over waited on a connection it had cancelled while its client sent headers)."""
    async with asyncio.timeout(READ_S):
        return await reader.readline()


@contextlib.asynccontextmanager
async def answer_while_waiting(sock: socket.socket | None, waiting: Callable[[], str | None],
                               registry: CollectorRegistry | None = None) -> AsyncIterator[None]:
    """Answer HTTP on the listening ``sock`` (a duplicate of it: ``sock`` itself stays open and listening for the
    server that follows) while the body runs: ``/readyz`` 503 ``not ready: <waiting()>``, ``/metrics`` ``registry``'s
    exposition (the series of the server that follows, ``rtt_kafka_start_waiting`` 1 among them; empty without
    one), ``/`` 200, any other path 404 as the worker's web server answers it -- so a liveness probe does not
    restart a process that waits for its broker at start, and one on a path the worker does not serve fails at once,
    not once Faust's server runs. Nothing when ``sock`` is None.

    The hand-over loses no request: when the body ends it stops taking connections, answers every one it took
    (within :data:`HAND_OVER_S`), and only then returns; a connection still in the kernel's backlog is the next
    server's."""
    if sock is None:
        yield
        return
    async def answer(conn: socket.socket) -> None:
        try:
            reader, writer = await asyncio.open_connection(sock=conn)
        except OSError:
            conn.close()
            return
        try:
            line = await read_line(reader)
            while (await read_line(reader)).strip():
                pass  # the headers
            parts = line.split()
            path = parts[1].decode("latin-1").partition("?")[0] if len(parts) > 1 else ""
            reason = waiting()
            kind = "text/plain; charset=utf-8"
            if path not in WAITING_PATHS:  # as the web server that follows: a probe on it fails now, not later
                status, body = "404 Not Found", b"not found\n"
            elif path == "/readyz" and reason is not None:
                status, body = "503 Service Unavailable", f"not ready: {reason}\n".encode()
            elif path == "/metrics":
                status, body = "200 OK", generate_latest(registry) if registry is not None else b""
                kind = CONTENT_TYPE_LATEST
            else:
                status, body = "200 OK", b"" if path != "/readyz" else b"ok\n"
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: "
                         f"{len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
            await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ValueError):
            pass  # a probe that went away: nothing to answer
        finally:
            writer.close()

    loop = asyncio.get_running_loop()
    listening = sock.dup()
    listening.setblocking(False)
    taken: set[asyncio.Task[None]] = set()

    def take() -> None:  # each connection accepted gets its task at once: none is lost between accept and answer
        while True:
            try:
                conn, _ = listening.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError:  # out of descriptors, a connection reset in the backlog: the next one may do
                return
            conn.setblocking(False)
            task = loop.create_task(answer(conn))
            taken.add(task)
            task.add_done_callback(taken.discard)

    loop.add_reader(listening.fileno(), take)
    try:
        yield
    finally:
        loop.remove_reader(listening.fileno())  # no more taken: the backlog stays for the server that follows
        listening.close()
        if taken:
            _, late = await asyncio.wait(set(taken), timeout=HAND_OVER_S)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)
