"""The HTTP face of the extender: verbs, health, metrics, OpenAPI; errors always as JSON.

Routes (kube-scheduler calls ``urlPrefix + "/" + verb``)::

    POST /filter        ExtenderArgs -> ExtenderFilterResult
    POST /prioritize    ExtenderArgs -> HostPriorityList
    POST /explain       ExtenderArgs (+ Explain options) -> why each candidate gets its score (JSON)
    GET  /healthz       200 while the process serves
    GET  /readyz        200 once the first snapshot is installed, else 503 with the reason
    GET  /metrics       Prometheus text format
    GET  /openapi.json  OpenAPI 3 description of all of the above

Requests are read and answered by :mod:`app.extender.http` inside the event loop's read callback; every
handler here is synchronous, but for the part of ``/explain`` that loads boosters and runs XGBoost's
contributions: that runs in a thread of its own (one explanation at a time), so an operator's exact
explanation over many nodes never holds up ``filter`` and ``prioritize`` on kube-scheduler's timeout. Failures
never leak a traceback: a malformed body is a 400, an oversized one a 413, a header or body that does not
arrive in time a 408, an unknown path a 404 — each with ``Error`` set — and anything unexpected a 500 with
``Error`` set, logged and counted (``rtt_extender_errors_total``).

``rttsched extender`` takes over a listener it already serves (:mod:`app.extender.boot`); :func:`running`
serves a service on a port of its own (tests, benchmarks): the port is bound first, then the service's
background work starts (Kafka feed, Redis warm start, publisher), none of which it waits for.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import logging
import math
import socket
import ssl
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import orjson

from app.extender.explaining import explain_options
from app.extender.http import HttpLimits, HttpProtocol, HttpServerState, Request, Response, tls_context
from app.extender.metrics import CONTENT_TYPE, Children
from app.extender.protocol import ProtocolError, error_body, parse_args
from app.extender.service import ExtenderService
from app.listen import url_host

log = logging.getLogger(__name__)

GC_GEN0_THRESHOLD = 20_000  # net container allocations between young collections (CPython default: 700)
OPENAPI_PATH = Path(__file__).with_name("openapi.json")
Handler = Callable[[Request], "Response | asyncio.Future[Response]"]


def json_response(body: object, status: int = 200) -> Response:
    return Response(status, orjson.dumps(body))


class ExtenderServer:
    """Routes requests to the service and counts them; :meth:`listen` binds a port with :mod:`app.extender.http`."""

    def __init__(self, service: ExtenderService, http: HttpServerState | None = None) -> None:
        """``http``: the state of a listener already serving (:mod:`app.extender.boot`); it is taken over."""
        self.service = service
        self.limits = HttpLimits.from_options(service.options)
        self._routes: dict[tuple[str, str], tuple[str, Handler]] = {}
        self._methods: dict[str, list[str]] = {}
        self._openapi = OPENAPI_PATH.read_bytes()
        metrics = service.metrics
        self._seconds, self._answers = Children(metrics.request_seconds), Children(metrics.requests)
        if http is None:
            http = HttpServerState(HttpProtocol, self.handle, self.limits, error_body)
        http.handle, http.on_error, http.on_reject = self.handle, self._protocol_error, metrics.connections_rejected.inc
        self.http = http
        metrics.connections.set_function(lambda: len(self.http.connections))
        self._server: asyncio.Server | None = None
        self._explainer: concurrent.futures.ThreadPoolExecutor | None = None  # /explain's contributions
        self.port = 0
        self.url = ""  # after listen(): how this machine reaches the server
        self.route("POST", "/filter", "filter", self._filter)
        self.route("POST", "/prioritize", "prioritize", self._prioritize)
        self.route("POST", "/explain", "explain", self._explain)
        self.route("GET", "/healthz", "healthz", lambda r: json_response({"status": "ok"}))
        self.route("GET", "/readyz", "readyz", self._readyz)
        self.route("GET", "/metrics", "metrics", lambda r: Response(200, metrics.render(), CONTENT_TYPE))
        self.route("GET", "/openapi.json", "openapi", lambda r: Response(200, self._openapi))

    def route(self, method: str, path: str, verb: str, handler: Handler) -> None:
        """Answer ``method path`` with ``handler`` (counted and timed under ``verb``); replaces an earlier one."""
        self._routes[(method, path)] = (verb, handler)
        methods = self._methods.setdefault(path, [])
        if method not in methods:
            methods.append(method)

    def handler(self, method: str, path: str) -> Handler:
        return self._routes[(method, path)][1]

    # -- handlers
    def _filter(self, request: Request) -> Response:
        return Response(200, self.service.filter(parse_args(request.body, keep_nodes=True)))

    def _prioritize(self, request: Request) -> Response:
        return Response(200, self.service.prioritize(parse_args(request.body)))

    def _explain(self, request: Request) -> Response | asyncio.Future[Response]:
        top, method = explain_options(request.body)
        prepared = self.service.prepare_explain(parse_args(request.body), top, method)

        def answer() -> Response:
            return Response(200, orjson.dumps(prepared.finish()))

        if not prepared.needs_work:
            return answer()
        if self._explainer is None:
            self._explainer = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="rttsched-explain")
        return asyncio.get_running_loop().run_in_executor(self._explainer, answer)

    def _readyz(self, request: Request) -> Response:
        service = self.service
        ready, reason = service.readiness()
        snap = service.holder.current
        if not ready or snap is None:
            return json_response({"ready": False, "Error": reason}, status=503)
        return json_response({"ready": True, "generation": snap.generation, "nodes": len(snap.nodes),
                              "models": len(snap.models), "age_s": _age(snap.age(service.clock.now())),
                              "degraded": service.degraded.reasons})

    def handle(self, request: Request) -> Response | asyncio.Future[Response]:
        """Answer one request (or return a future of the answer: :meth:`_later`); never raises."""
        t0 = time.perf_counter()
        route = self._routes.get((request.method, request.path))
        if route is None:
            verb = "other"
            allowed = self._methods.get(request.path)
            if allowed:
                response = Response(405, error_body(f"method {request.method} not allowed on {request.path}"),
                                    headers=(("Allow", ", ".join(allowed)),))
            else:
                response = Response(404, error_body(f"no such path: {request.path[:200]}"))
        else:
            verb, handler = route
            try:
                answer = handler(request)
            except Exception as exc:
                response = self._failure(request, exc)
            else:
                if isinstance(answer, asyncio.Future):
                    return self._later(request, verb, t0, answer)
                response = answer
        self._seconds(verb).observe(time.perf_counter() - t0)
        self._answers(verb, str(response.status)).inc()
        return response

    def _failure(self, request: Request, exc: BaseException) -> Response:
        """The answer to a handler's exception: 400 for a malformed request, else 500 (logged and counted)."""
        if isinstance(exc, ProtocolError):
            return Response(400, error_body(str(exc)))
        log.error("unexpected error answering %s %s", request.method, request.path, exc_info=exc)
        self.service.metrics.errors.inc()
        return Response(500, error_body("internal error (logged by the extender)"))

    def _later(self, request: Request, verb: str, t0: float, pending: asyncio.Future[Response],
               ) -> asyncio.Future[Response]:
        """The answer of a handler that finishes off the event loop, counted and timed when it comes."""
        out: asyncio.Future[Response] = asyncio.get_running_loop().create_future()

        def done(f: asyncio.Future[Response]) -> None:
            if f.cancelled():
                response = Response(503, error_body("the extender is stopping"))
            elif (exc := f.exception()) is not None:
                response = self._failure(request, exc)
            else:
                response = f.result()
            self._seconds(verb).observe(time.perf_counter() - t0)
            self._answers(verb, str(response.status)).inc()
            if not out.done():
                out.set_result(response)

        pending.add_done_callback(done)
        return out

    def _protocol_error(self, status: int) -> None:
        self._answers("other", str(status)).inc()

    # -- sockets
    async def listen(self, host: str, port: int, ssl_context: ssl.SSLContext | None = None,
                     sock: socket.socket | None = None) -> int:
        """Bind (or take the already bound ``sock``) and start serving; returns the port (useful with port 0)."""
        loop = asyncio.get_running_loop()
        timeout = self.limits.header_timeout_s if ssl_context is not None else None
        if sock is not None:
            self._server = await loop.create_server(self.http.protocol, sock=sock, ssl=ssl_context,
                                                    backlog=1024, ssl_handshake_timeout=timeout)
        else:
            self._server = await loop.create_server(self.http.protocol, host, port, ssl=ssl_context,
                                                    reuse_address=True, backlog=1024, ssl_handshake_timeout=timeout)
        self.port = int(self._server.sockets[0].getsockname()[1])
        shown = "127.0.0.1" if host in ("", "0.0.0.0") else url_host(host)  # noqa: S104
        self.url = f"{'https' if ssl_context is not None else 'http'}://{shown}:{self.port}"
        return self.port

    def adopt(self, server: asyncio.Server, url: str) -> None:
        """Take over a listener started elsewhere (with :attr:`http`'s protocol) for :meth:`close`."""
        self._server = server
        self.port = int(server.sockets[0].getsockname()[1])
        self.url = url

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            self.http.close_all()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)
            self._server = None
        if self._explainer is not None:  # an explanation still running finishes in its thread, unanswered
            self._explainer.shutdown(wait=False, cancel_futures=True)
            self._explainer = None


def tune_gc(service: ExtenderService, gen0: int = GC_GEN0_THRESHOLD) -> None:
    """Latency tuning for a serving process: fewer, cheaper collections on the request path.

    A NodeList request decodes thousands of short-lived objects; with CPython's default gen0 threshold (700)
    they trigger young collections that walk them. Raising ``gen0`` lets reference counting do that work, and
    once the first snapshot is installed (models loaded, view built) everything alive is frozen out of the
    collector's working set, so old-generation passes stay short.
    """
    if gen0 < 1:
        raise ValueError(f"gen0 must be >= 1 (got {gen0})")
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0, gen1, gen2)
    service.on_ready.append(gc.freeze)


@contextlib.asynccontextmanager
async def running(service: ExtenderService, host: str | None = None, port: int | None = None,
                  start: bool = True, sock: socket.socket | None = None) -> AsyncIterator[ExtenderServer]:
    """Serve ``service`` (port 0: any free port, see :attr:`ExtenderServer.url`) until the block ends.

    The port is bound first (or ``sock``, bound already, is used); then, with ``start``, the service's
    background work starts (not awaited).
    """
    options = service.options
    server = ExtenderServer(service)
    await server.listen(options.host if host is None else host, options.port if port is None else port,
                        tls_context(options), sock=sock)
    try:
        if start:
            await service.start()
        yield server
    finally:
        await server.close()
        if start:
            await service.stop()


def _age(age_s: float) -> float | None:
    """``/readyz``'s ``age_s``: seconds since the newest node-features, None (null) when there are none yet (the
    metric ``rtt_extender_snapshot_age_seconds`` says -1 then)."""
    return None if math.isinf(age_s) else round(age_s, 3)
