"""The HTTP face of the extender (aiohttp): verbs, health, metrics, OpenAPI; errors always as JSON.

Routes (kube-scheduler calls ``urlPrefix + "/" + verb``)::

    POST /filter        ExtenderArgs -> ExtenderFilterResult
    POST /prioritize    ExtenderArgs -> HostPriorityList
    GET  /healthz       200 while the process serves
    GET  /readyz        200 once the first snapshot is installed, else 503
    GET  /metrics       Prometheus text format
    GET  /openapi.json  OpenAPI 3 description of all of the above

Failures never leak a traceback: a malformed body is a 400, an oversized one a 413, a body that does not
arrive within ``read_timeout_s`` a 408, an unknown path a 404 — each with ``Error`` set — and anything
unexpected a 500 with ``Error`` set, logged and counted (``rtt_extender_errors_total``).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from app.extender.metrics import CONTENT_TYPE
from app.extender.protocol import ProtocolError, error_result, parse_args
from app.extender.service import ExtenderService

log = logging.getLogger(__name__)

GC_GEN0_THRESHOLD = 20_000  # net container allocations between young collections (CPython default: 700)
OPENAPI_PATH = Path(__file__).with_name("openapi.json")
SERVICE_KEY: web.AppKey[ExtenderService] = web.AppKey("service", ExtenderService)
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class HttpError(Exception):
    """An answer other than 200, with the message that goes into ``Error``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def json_response(body: Any, status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def _error(status: int, message: str) -> web.Response:
    return json_response(error_result(message), status=status)


@web.middleware
async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Time every request per verb and turn every failure into a JSON answer with ``Error`` set."""
    service = request.app[SERVICE_KEY]
    route = request.match_info.route
    verb = (route.name if route is not None else None) or "other"
    t0 = time.perf_counter()
    try:
        response = await handler(request)
    except HttpError as exc:
        response = _error(exc.status, exc.message)
    except web.HTTPException as exc:  # routing: 404, 405
        response = _error(exc.status, exc.reason)
        if exc.status == 405 and "Allow" in exc.headers:
            response.headers["Allow"] = exc.headers["Allow"]
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("unexpected error answering %s %s", request.method, request.path)
        service.metrics.errors.inc()
        response = _error(500, "internal error (logged by the extender)")
    service.metrics.request_seconds.labels(verb).observe(time.perf_counter() - t0)
    service.metrics.requests.labels(verb, str(response.status)).inc()
    return response


async def _body(request: web.Request) -> bytes:
    """The whole body, bounded by ``max_body_bytes`` and ``read_timeout_s``.

    ``asyncio.timeout`` rather than ``wait_for``: no extra task per request, so a body that has already
    arrived is read in the handler's own step instead of waiting a loop turn behind other requests.
    """
    service = request.app[SERVICE_KEY]
    limit = service.options.max_body_bytes
    if request.content_length is not None and request.content_length > limit:
        raise HttpError(413, f"request body of {request.content_length} bytes exceeds the limit of {limit}")
    try:
        async with asyncio.timeout(service.options.read_timeout_s):
            return await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise HttpError(413, f"request body exceeds the limit of {limit} bytes") from None
    except TimeoutError:
        raise HttpError(408, f"request body not received within {service.options.read_timeout_s} s") from None


def _release(*_: object) -> None:
    """Drops the references it was scheduled with (see :func:`_verb`)."""


async def _verb(request: web.Request, run: Callable[[Any], Any]) -> web.Response:
    body = await _body(request)
    try:
        args = parse_args(body)
        response = json_response(run(args))
    except ProtocolError as exc:
        raise HttpError(400, str(exc)) from None
    # A NodeList request is thousands of objects; freeing them is ~0.2 ms. Hold them until the next loop turn,
    # so the answer is written first (the handler's step sends it without suspending).
    asyncio.get_running_loop().call_soon(_release, args, body)
    return response


async def filter_handler(request: web.Request) -> web.Response:
    return await _verb(request, request.app[SERVICE_KEY].filter)


async def prioritize_handler(request: web.Request) -> web.Response:
    return await _verb(request, request.app[SERVICE_KEY].prioritize)


async def healthz(request: web.Request) -> web.Response:
    return json_response({"status": "ok"})


async def readyz(request: web.Request) -> web.Response:
    service = request.app[SERVICE_KEY]
    snap = service.holder.current
    if snap is None:
        return json_response({"ready": False, "Error": "no snapshot yet (warm start or feed catch-up pending)"},
                             status=503)
    return json_response({"ready": True, "generation": snap.generation, "nodes": len(snap.nodes),
                          "models": len(snap.models), "age_s": round(min(snap.age(service.clock.now()), 1e9), 3),
                          "degraded": service.degraded.reasons})


async def metrics_handler(request: web.Request) -> web.Response:
    body = request.app[SERVICE_KEY].metrics.render()
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def openapi_handler(request: web.Request) -> web.Response:
    return web.Response(body=OPENAPI_PATH.read_bytes(), content_type="application/json")


def build_app(service: ExtenderService, *, manage_service: bool = True) -> web.Application:
    """The aiohttp application; with ``manage_service`` it starts and stops the service's background work."""
    app = web.Application(client_max_size=service.options.max_body_bytes, middlewares=[guard])
    app[SERVICE_KEY] = service
    app.router.add_post("/filter", filter_handler, name="filter")
    app.router.add_post("/prioritize", prioritize_handler, name="prioritize")
    app.router.add_get("/healthz", healthz, name="healthz", allow_head=False)
    app.router.add_get("/readyz", readyz, name="readyz", allow_head=False)
    app.router.add_get("/metrics", metrics_handler, name="metrics", allow_head=False)
    app.router.add_get("/openapi.json", openapi_handler, name="openapi", allow_head=False)
    if manage_service:
        app.cleanup_ctx.append(_lifecycle)
    return app


async def _lifecycle(app: web.Application) -> AsyncIterator[None]:
    service = app[SERVICE_KEY]
    await service.start()
    try:
        yield
    finally:
        await service.stop()


def tune_gc(app: web.Application, gen0: int = GC_GEN0_THRESHOLD) -> None:
    """Latency tuning for a serving process: fewer, cheaper collections on the request path.

    A NodeList request parses ~2,000 dicts and lists that reference counting frees when the answer is sent;
    with CPython's default gen0 threshold (700) each one still triggers two or three young collections
    that walk the half-built document. Raising ``gen0`` lets refcounting do that work, and once the service
    has started (models loaded, first snapshot built) everything alive is frozen out of the collector's
    working set, so old-generation passes stay short.
    """
    if gen0 < 1:
        raise ValueError(f"gen0 must be >= 1 (got {gen0})")
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(gen0, gen1, gen2)

    async def freeze(_: web.Application) -> None:
        gc.collect()
        gc.freeze()

    app.on_startup.append(freeze)  # runs after the cleanup context has started the service
