"""``/metrics`` and ``/healthz`` of the processes whose HTTP server runs in a thread: trainer, bridge, pods watcher.

prometheus_client serves ``/metrics`` from a thread of its own, so it answers while the process's event
loop is stuck (a call that blocks it, a task that never yields): a liveness probe on ``/metrics`` never
restarts such a process. Here the same thread also answers ``/healthz``: 200 while a :class:`Heartbeat`
task on the event loop has beaten within ``stale_after_s`` (default 30 s), else 503 naming how long it has
been silent; every other path is ``/metrics`` as before. The worker and the extender serve from their event
loop, so their probes need none of this.

>>> hb = Heartbeat(stale_after_s=30.0, clock=iter([0.0, 10.0, 45.0]).__next__)
>>> hb.healthy(), hb.healthy()
(True, False)
"""

from __future__ import annotations

import asyncio
import socket
import socketserver
import threading
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app

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
        if environ.get("PATH_INFO") != "/healthz":
            return metrics(environ, start_response)  # type: ignore[no-any-return]
        if heartbeat.healthy():
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
