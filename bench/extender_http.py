"""The extender over HTTP as it runs in production, and the load generator, each in its own pinned process.

One run per view size: the embedded broker starts, the topics are created, a model is saved in a local
registry and announced on model-updates, and node-features / node-weights of every node go on their topics.
The server process (pinned to core 0) is an :class:`~app.extender.service.ExtenderService` with its Kafka
feed and its rtt-predictions publisher, served by :func:`app.extender.server.running` with ``tune_gc`` — what
``rttsched extender`` runs once started. It learns the view and the model from Kafka. The client process
(pinned to core 1, with the broker) republishes every node's features once a second while it sends
requests, so the feed, rebuilds and publishing all run during the measurements.

With ``null`` in its settings the server process is instead :func:`_serve_null`: the same HTTP layer
answering at once, so that the same client against it gives the load generator's own floor.

The server adds ``GET /bench/samples``: exact samples since the previous call — seconds inside the verb
handlers, event-loop lag (how late a 2 ms timer fires: the wait of a request arriving while the loop is
busy, including time other processes on the core took), the CPU time of every loop step (what the process
itself held the loop for), and process CPU seconds per request (everything included: decoding, deciding, encoding, HTTP,
publishing, the feed, rebuilds, GC).
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from typing import Any

import numpy as np
import orjson
from extender_setup import features_value, log, node_names, payload, train, view, weights_value, with_input_size

from app.config import Settings

MAX_BODY = 64 * 1024 * 1024  # a 5,000-node NodeList is ~14 MB: RTT_EXTENDER_MAX_BODY_BYTES raised for the bench
SERVER_CORE, CLIENT_CORE = 0, 1


def pin(core: int, pid: int = 0) -> None:
    if hasattr(os, "sched_setaffinity") and (os.cpu_count() or 1) >= 2:
        os.sched_setaffinity(pid, {core})


def prepare(settings: Settings, n: int) -> None:
    """Topics, a registered model announced on model-updates, and the view of ``n`` nodes on Kafka."""
    from aiokafka import AIOKafkaProducer

    from app.contracts.codec import encode
    from app.kafka.admin import ensure_topics
    from app.model.train import booster_to_bytes
    from app.registry.store import open_store

    asyncio.run(ensure_topics(settings))
    store = open_store(settings)
    record = store.save("gCTF:gpu", booster_to_bytes(train()), fmt="ubj", features=list(extender_features()),
                        params={}, metrics={}, n_samples=3000)
    store.promote("gCTF:gpu", record.version)
    update = {"model_key": record.model_key, "version": record.version, "sha256": record.sha256,
              "features": list(record.features), "metrics": {}, "location": record.location, "format": "ubj",
              "ts": time.time()}

    async def send() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, linger_ms=5)
        await producer.start()
        try:
            now = time.time()
            for value in view(n, now):
                node = value["node"].encode()
                await producer.send(settings.topic("node-features"), encode("node-features", value), key=node)
                await producer.send(settings.topic("node-weights"),
                                    encode("node-weights", weights_value(value["node"], now)), key=node)
            await producer.send_and_wait(settings.topic("model-updates"), encode("model-updates", update),
                                         key=b"gCTF:gpu")
        finally:
            await producer.stop()

    asyncio.run(send())


def extender_features() -> tuple[str, ...]:
    from extender_setup import FEATURES

    return FEATURES


# ---------------------------------------------------------------- server process
def serve(cfg: dict[str, Any]) -> None:
    pin(SERVER_CORE)
    if cfg.get("null"):
        asyncio.run(_serve_null(cfg))
        return
    if cfg.get("uvloop"):
        import uvloop

        uvloop.install()
    if cfg.get("profile"):  # the server's CPU profile, written when it stops (pstats format)
        import cProfile

        with cProfile.Profile() as prof:
            asyncio.run(_serve(cfg))
        prof.dump_stats(cfg["profile"])
        return
    asyncio.run(_serve(cfg))


async def _serve(cfg: dict[str, Any]) -> None:
    import dataclasses

    from app.extender.http import HttpProtocol, Request, Response
    from app.extender.options import ExtenderOptions
    from app.extender.server import running, tune_gc
    from app.extender.service import ExtenderService

    settings = Settings.from_env({}, **cfg["settings"])
    options = dataclasses.replace(ExtenderOptions.from_settings(settings), host="127.0.0.1", port=cfg["port"],
                                  max_body_bytes=MAX_BODY)
    service = ExtenderService(settings, options, redis=False)
    tune_gc(service)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    handler_s: list[float] = []
    lag_s: list[float] = []
    step_s: list[float] = []  # loop steps that read or answered requests
    background_s: list[float] = []  # loop steps that read no request (feed, rebuilds, publishing, timers)
    gc_s: list[float] = []  # durations of full (generation 2) collections
    young_s: list[float] = []  # durations of generation 0 and 1 collections
    since = [time.process_time(), 0.0]  # CPU seconds at the last fetch, requests since
    skip = [False]  # set by the step that serialises the samples: that step is not recorded
    served = [0]  # request reads and answers so far: a step that did neither is background work
    read = HttpProtocol.buffer_updated

    def counted(self: HttpProtocol, nbytes: int) -> None:
        served[0] += 1
        read(self, nbytes)

    HttpProtocol.buffer_updated = counted  # type: ignore[method-assign]  # this process only: measurement

    async with running(service) as server:
        for verb in ("filter", "prioritize"):
            inner = server.handler("POST", f"/{verb}")

            def timed(request: Request, inner: Any = inner) -> Response:
                t0 = time.perf_counter()
                response = inner(request)
                handler_s.append(time.perf_counter() - t0)
                served[0] += 1
                since[1] += 1
                return response

            server.route("POST", f"/{verb}", verb, timed)

        def samples(request: Request) -> Response:
            cpu = time.process_time()
            body = orjson.dumps({"loop": type(loop).__module__, "handler_s": handler_s, "lag_s": lag_s,
                                 "step_s": step_s, "background_s": background_s, "gc_s": gc_s, "young_s": young_s,
                                 "cpu_s": cpu - since[0], "requests": since[1]})
            for samples_ in (handler_s, lag_s, step_s, background_s, gc_s, young_s):
                samples_.clear()
            skip[0] = True
            since[:] = [cpu, 0.0]
            return Response(200, body)

        server.route("GET", "/bench/samples", "bench", samples)

        def tick(due: float) -> None:
            now = time.perf_counter()
            lag_s.append(max(0.0, now - due))
            loop.call_later(0.002, tick, now + 0.002)

        loop.call_later(0.002, tick, time.perf_counter() + 0.002)
        watch_steps(loop, step_s, background_s, lambda: served[0], skip)
        watch_gc(gc_s, young_s)
        await stop.wait()


def watch_steps(loop: asyncio.AbstractEventLoop, serving: list[float], background: list[float],
                answered: Any, skip: list[bool]) -> None:
    """Record the CPU time of every loop step (the callbacks run between two waits for I/O), in ``serving``
    when it read or answered requests (``answered()`` grew), else in ``background``.

    A request that arrives while a step runs waits for the rest of it; measured on the thread's CPU clock, a
    step's length is what the process itself did, whatever other processes on the core did meanwhile. A
    step that serves requests holds the others that arrived with it (queueing, as in any server); a
    background step holds requests that arrived during it. asyncio's selector loop only (uvloop has no
    selector to wrap). A step with ``skip[0]`` set is not recorded.
    """
    selector = getattr(loop, "_selector", None)
    if selector is None:
        return
    select = selector.select
    mark = [time.thread_time(), answered()]

    def timed(timeout: float | None = None) -> Any:
        took, count = time.thread_time() - mark[0], answered()
        if skip[0]:
            skip[0] = False
        elif count != mark[1]:
            serving.append(took)
        else:
            background.append(took)
        try:
            return select(timeout)
        finally:
            mark[0], mark[1] = time.thread_time(), answered()

    selector.select = timed


def watch_gc(full: list[float], young: list[float]) -> None:
    """Record how long every collection takes (it runs inside whatever callback allocated): full ones
    (generation 2) in ``full``, the others in ``young``."""
    import gc

    started = [0.0]

    def callback(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.thread_time()
        else:
            (full if info.get("generation") == 2 else young).append(time.thread_time() - started[0])

    gc.callbacks.append(callback)


async def _serve_null(cfg: dict[str, Any]) -> None:
    """The load generator's floor: the same HTTP layer and limits, a handler that answers ``[]`` at once (no
    decoding, no view, no publishing); bursts against it measure how fast the client sends them."""
    from app.extender.http import HttpLimits, HttpProtocol, HttpServerState, Request, Response
    from app.extender.protocol import error_body

    since = [time.process_time(), 0]

    def handle(request: Request) -> Response:
        if request.path == "/readyz":
            return Response(200, b'{"models": 1}')
        if request.path == "/bench/samples":
            cpu = time.process_time()
            body = orjson.dumps({"handler_s": [], "lag_s": [], "step_s": [], "background_s": [], "gc_s": [],
                                 "young_s": [], "cpu_s": cpu - since[0], "requests": since[1]})
            since[:] = [cpu, 0]
            return Response(200, body)
        since[1] += 1
        return Response(200, b"[]")

    state = HttpServerState(HttpProtocol, handle, HttpLimits(max_body_bytes=MAX_BODY), error_body)
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    server = await loop.create_server(state.protocol, "127.0.0.1", cfg["port"])
    try:
        await stop.wait()
    finally:
        server.close()
        state.close_all()


# ---------------------------------------------------------------- client process
def client(cfg: dict[str, Any]) -> dict[str, Any]:
    pin(CLIENT_CORE)
    return asyncio.run(_client(cfg))


async def _client(cfg: dict[str, Any]) -> dict[str, Any]:
    import aiohttp

    n, url = cfg["nodes"], f"http://127.0.0.1:{cfg['port']}"
    settings = Settings.from_env({}, **cfg["settings"])
    feeder = asyncio.ensure_future(feed(settings, n))
    out: dict[str, Any] = {}
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=64)) as session:
            await asyncio.sleep(1.0)  # the feeder's first round
            out["idle"] = await idle(session, url, cfg["idle_s"])  # before any request: nothing left to publish
            for mode in ("nodes", "names"):
                body = payload(n, mode)
                for phase in cfg["phases"]:
                    out[f"{mode}/{phase['name']}"] = await run_phase(session, url, body, phase)
    finally:
        feeder.cancel()
    return out


async def feed(settings: Settings, n: int) -> None:
    """Every node's features again, once a second, spread over the second (what the worker emits)."""
    from aiokafka import AIOKafkaProducer

    from app.contracts.codec import encode

    rng = np.random.default_rng(7)
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, linger_ms=5)
    await producer.start()
    names = node_names(n)
    try:
        while True:
            start = time.perf_counter()
            for i, name in enumerate(names):
                value = features_value(name, i, time.time(), rng)
                await producer.send(settings.topic("node-features"), encode("node-features", value, check=False),
                                    key=name.encode())
                if i % 50 == 49:
                    await asyncio.sleep(max(0.0, start + (i + 1) / n - time.perf_counter()))
            await asyncio.sleep(max(0.0, start + 1.0 - time.perf_counter()))
    finally:
        await producer.stop()


async def samples(session: Any, url: str) -> dict[str, Any]:
    async with session.get(f"{url}/bench/samples") as resp:
        return dict(orjson.loads(await resp.read()))


async def one(session: Any, url: str, body: bytes) -> float:
    t0 = time.perf_counter()
    async with session.post(f"{url}/prioritize", data=body, headers={"Content-Type": "application/json"}) as resp:
        await resp.read()
        if resp.status != 200:
            raise RuntimeError(f"answer {resp.status}: {(await resp.read())[:200]!r}")
    return time.perf_counter() - t0


async def run_phase(session: Any, url: str, body: bytes, phase: dict[str, Any]) -> dict[str, Any]:
    """``rate`` req/s open loop, ``conc`` connections closed loop (rate 0), or ``bursts`` of ``conc`` at once;
    every request a different pod (:func:`extender_setup.with_input_size`)."""
    made = [0]

    def pod() -> bytes:
        made[0] += 1
        return with_input_size(body, made[0])

    for _ in range(phase.get("warmup", 20)):
        await one(session, url, pod())
    await samples(session, url)
    lat: list[float] = []
    start = time.perf_counter()
    if phase.get("bursts"):
        for _ in range(phase["bursts"]):
            bodies = [pod() for _ in range(phase["conc"])]
            lat.extend(await asyncio.gather(*(one(session, url, b) for b in bodies)))
    elif phase.get("rate"):
        rate, total = phase["rate"], int(phase["rate"] * phase["seconds"])
        tasks = []
        for i in range(total):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.ensure_future(one(session, url, pod())))
        lat = list(await asyncio.gather(*tasks))
    else:
        stop = start + phase["seconds"]

        async def worker() -> None:
            while time.perf_counter() < stop:
                request = pod()
                lat.append(await one(session, url, request))

        await asyncio.gather(*(worker() for _ in range(phase["conc"])))
    achieved = len(lat) / (time.perf_counter() - start)
    server = await samples(session, url)
    log(f"  {phase['name']}: {len(lat)} requests, {achieved:.0f}/s")
    return {"client_s": lat, "achieved": achieved, **server}


async def idle(session: Any, url: str, seconds: float) -> dict[str, Any]:
    """The server's CPU with no requests (feed, rebuilds, timers): the background cost per second."""
    await samples(session, url)
    await asyncio.sleep(seconds)
    got = await samples(session, url)
    return {"cpu_per_s": got["cpu_s"] / seconds, "lag_s": got["lag_s"], "step_s": got["background_s"],
            "gc_s": got["gc_s"], "young_s": got["young_s"]}
