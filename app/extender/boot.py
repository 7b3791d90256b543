"""``rttsched extender`` start-up: the port answers within a fraction of a second, whatever else is missing.

1. The command binds the listening socket before importing anything heavy.
2. :func:`boot` serves it at once with a *starting* handler that needs only the wire protocol: ``/healthz``
   200, ``/readyz`` 503 ("starting"), ``filter`` / ``prioritize`` neutral (every node passes with score 5 —
   what the extender answers whenever it has no view), ``/explain``, ``/metrics`` and ``/openapi.json`` 503
   ("starting"); an unknown path 404, a method a path does not take 405 -- each as JSON, as the full server.
3. Meanwhile the service (numpy, the scheduler, metrics, the model layer's interface) is imported in a worker
   thread and built; the full :class:`~app.extender.server.ExtenderServer` then takes over the listener.
4. Only then does the background work start — Redis warm start, Kafka feed, publisher — none of which is
   awaited: Kafka, Redis or topics that are missing are reported and retried while the port serves.

This module imports nothing heavier than the HTTP layer and the protocol decoder.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import signal
import socket
from collections.abc import Callable
from typing import Any

import orjson

from app.extender.http import HttpLimits, HttpProtocol, HttpServerState, Request, Response, tls_context
from app.extender.options import ExtenderOptions
from app.extender.protocol import ProtocolError, error_body, filter_body, parse_args, priority_body
from app.listen import url_host

STARTING = "starting: loading the scheduler"
# path -> methods: the routes of the full server (app.extender.server.ExtenderServer, held to it by a test); each
# gets a starting answer, never the 404 of an unknown path, and a method it does not take the server's 405
ROUTES: dict[str, tuple[str, ...]] = {
    "/filter": ("POST",), "/prioritize": ("POST",), "/explain": ("POST",),
    "/healthz": ("GET",), "/readyz": ("GET",), "/metrics": ("GET",), "/openapi.json": ("GET",),
}


def starting_handler(request: Request) -> Response:
    """What the port answers while the service is being imported and built (never raises): as the full server
    answers without a view where the wire protocol suffices, else 503 ``starting`` (``/explain``, ``/metrics``,
    ``/openapi.json``); an unknown path 404 and a method a path does not take 405, as the full server."""
    path, method = request.path, request.method
    allowed = ROUTES.get(path)
    if allowed is None:
        return Response(404, error_body(f"no such path: {path[:200]}"))
    if method not in allowed:
        return Response(405, error_body(f"method {method} not allowed on {path}"),
                        headers=(("Allow", ", ".join(allowed)),))
    try:
        if path == "/filter":
            args = parse_args(request.body, keep_nodes=True)
            return Response(200, filter_body(args, {}))
        if path == "/prioritize":
            return Response(200, priority_body([(n, 5) for n in parse_args(request.body).node_names]))
    except ProtocolError as exc:
        return Response(400, error_body(str(exc)))
    if path == "/healthz":
        return Response(200, orjson.dumps({"status": "ok"}))
    if path == "/readyz":
        return Response(503, orjson.dumps({"ready": False, "Error": STARTING}))
    return Response(503, error_body(STARTING))  # /explain, /metrics, /openapi.json: nothing to answer from yet


async def boot(
    settings: Any, options: ExtenderOptions, sock: socket.socket, *, publish: bool = True, redis: bool = True,
    announce: Callable[[str], object] = print, stop: asyncio.Event | None = None, tune_gc: bool = True,
    policy: Any = None,
) -> None:
    """Serve ``sock`` until SIGINT/SIGTERM (or ``stop``), as described in the module docstring.

    ``policy``: the policy, already loaded and checked (None: read from ``options.policy_file``).
    """
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError, RuntimeError):
            loop.add_signal_handler(sig, stop.set)
    state = HttpServerState(HttpProtocol, starting_handler, HttpLimits.from_options(options), error_body)
    ctx = tls_context(options)
    listener = await loop.create_server(state.protocol, sock=sock, ssl=ctx, backlog=1024,
                                        ssl_handshake_timeout=options.header_timeout_s if ctx else None)
    port = int(sock.getsockname()[1])
    scheme = "https" if ctx else "http"
    announce(f"rttsched extender: listening on {scheme}://{url_host(options.host)}:{port} "
             f"(kafka {settings.bootstrap_servers}, redis {'on' if settings.redis_url else 'off'})")
    try:
        server_mod = await asyncio.to_thread(importlib.import_module, "app.extender.server")
        service = server_mod.ExtenderService(settings, options, policy=policy, publish=publish, redis=redis)
        if tune_gc:  # fewer young collections per request; what is alive once ready is frozen
            server_mod.tune_gc(service)
        server = server_mod.ExtenderServer(service, state)  # takes over the listener's handler
        server.adopt(listener, f"{scheme}://127.0.0.1:{port}")
    except BaseException:
        listener.close()
        state.close_all()
        raise
    try:
        await service.start()
        await stop.wait()
    finally:
        await server.close()
        await service.stop()
