"""The pods watcher against a real HTTP server speaking the Kubernetes pods API and a real redis-server.

The server lists pods page by page (``limit``/``continue``) and streams watch events, from realistic
Pod JSON (tests/fixtures/pods). It does not apply the selectors itself, so the watcher's own filtering
(unbound, finished, unlabelled pods; pending and terminating ones counted but not started) is what keeps
the view right; the selectors it sends are checked separately. Like the API server it closes each watch
after its ``timeoutSeconds``, may send BOOKMARKs, and can be made to stall its watches: headers and then
nothing, never closed, or no answer at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import logging
import os
import signal
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import redis.asyncio as aioredis
from aiohttp import ClientSession, web

from app.extender.podwatch import PodWatcher, PodWatchOptions
from app.extender.podwatch_api import KubeAccess, KubeApiError, PodsApi
from app.kafka.embedded import free_port
from app.scheduler.cache import CacheKeys, load_running, store_running

pytestmark = pytest.mark.integration

PODS = Path(__file__).resolve().parents[1] / "fixtures" / "pods"
STARTED = {"gpu-4090-1": {"gCTF": 2, "Motioncor2": 1}, "gpu-m40-1": {"Motioncor2": 1}, "cpu-1": {"upload": 1}}
EXPECTED = {**STARTED, "gpu-m40-1": {"Motioncor2": 1, "gCTF": 1}}  # gctf-run-m9n0p is terminating: still counts
SELECTOR = "spec.nodeName!=,status.phase!=Succeeded,status.phase!=Failed"
UPLOAD_POD = "upload-run-q1r2s"  # the only pod on cpu-1


class KubeApiStub:
    """``GET /api/v1/pods``: a paginated PodList, or a stream of WatchEvents with ``watch=true``."""

    def __init__(self) -> None:
        doc = json.loads((PODS / "podlist.json").read_text())
        self.pods: list[dict[str, Any]] = doc["items"]
        self.version = int(doc["metadata"]["resourceVersion"])
        self.queries: list[dict[str, str]] = []
        self.streams: list[asyncio.Queue[dict[str, Any]]] = []
        self.fail: int | None = None  # answer every request with this status
        self.retry_after = ""  # the Retry-After header of those answers, when set
        self.times: list[float] = []  # when each request came (monotonic)
        self.garbage = False  # answer 200 with something that is not JSON
        self.token = ""  # when set, the bearer token every request must carry
        self.bookmark_every_s = 0.0  # when set, a watch with nothing to send sends a BOOKMARK this often
        self.stall = ""  # "headers": watches answer headers, then nothing, never closed; "request": no answer
        self.url = ""
        self._runner: web.AppRunner | None = None
        self._released = asyncio.Event()  # ends stalled watches, at stop

    async def start(self) -> KubeApiStub:
        app = web.Application()
        app.router.add_get("/api/v1/pods", self._pods)
        self._runner = web.AppRunner(app, shutdown_timeout=0.1)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}"
        return self

    async def stop(self) -> None:
        self._released.set()
        for q in self.streams:
            q.put_nowait({})  # end open watches
        if self._runner is not None:
            await self._runner.cleanup()

    def lists(self) -> list[dict[str, str]]:
        return [q for q in self.queries if "watch" not in q]

    # -- changes, as the API server would announce them
    def _announce(self, kind: str, pod: dict[str, Any]) -> None:
        self.version += 1
        pod["metadata"]["resourceVersion"] = str(self.version)
        for q in self.streams:
            q.put_nowait({"type": kind, "object": pod})

    def delete(self, name: str) -> None:
        (pod,) = [p for p in self.pods if p["metadata"]["name"] == name]
        self.pods.remove(pod)
        self._announce("DELETED", pod)

    def add(self, pod: dict[str, Any]) -> None:
        self.pods.append(pod)
        self._announce("ADDED", pod)

    def modify(self, pod: dict[str, Any]) -> None:
        self.pods = [p for p in self.pods if p["metadata"]["uid"] != pod["metadata"]["uid"]] + [pod]
        self._announce("MODIFIED", pod)

    def stall_watches(self, how: str = "headers") -> None:
        """Stall every watch from now on (see ``stall``), the open ones included: they send nothing more."""
        self.stall = how
        for q in self.streams:
            q.put_nowait({"type": "STALL"})  # wakes the stream, which then goes silent

    def expire_watches(self) -> None:
        for q in self.streams:
            q.put_nowait({"type": "ERROR", "object": {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                                      "message": "too old resource version", "reason": "Expired",
                                                      "code": 410}})

    async def _pods(self, request: web.Request) -> web.StreamResponse:
        query = dict(request.query)
        self.queries.append(query)
        self.times.append(time.monotonic())
        if self.token and request.headers.get("Authorization") != f"Bearer {self.token}":
            return web.json_response({"kind": "Status", "code": 401, "reason": "Unauthorized"}, status=401)
        if self.fail:
            headers = {"Retry-After": self.retry_after} if self.retry_after else None
            return web.json_response({"kind": "Status", "code": self.fail, "message": "etcdserver: request timed out"},
                                     status=self.fail, headers=headers)
        if self.garbage:
            return web.Response(body=b"<html><body>502 Bad Gateway</body></html>", content_type="text/html")
        if query.get("watch") == "true":
            return await self._watch(request, float(query.get("timeoutSeconds", "30")))
        start = int(query.get("continue") or 0)
        limit = int(query.get("limit") or len(self.pods))
        end = start + limit
        meta: dict[str, Any] = {"resourceVersion": str(self.version)}
        if end < len(self.pods):
            meta["continue"] = str(end)
        return web.json_response({"kind": "PodList", "apiVersion": "v1", "metadata": meta,
                                  "items": self.pods[start:end]})

    async def _watch(self, request: web.Request, timeout_s: float) -> web.StreamResponse:
        if self.stall == "request":
            await self._released.wait()  # the connection accepted and the request read, never answered
            return web.Response()
        resp = web.StreamResponse(headers={"Content-Type": "application/json"})
        await resp.prepare(request)
        if not self.stall:
            await self._stream(resp, timeout_s)
        if self.stall:
            await self._released.wait()  # silent: no events, no bookmarks, never closed
        return resp

    async def _stream(self, resp: web.StreamResponse, timeout_s: float) -> None:
        """Send the changes announced until ``timeout_s`` has passed (then close), or until stalled."""
        queue: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self.streams.append(queue)
        try:
            async with asyncio.timeout(timeout_s):
                while not self.stall:
                    try:
                        async with asyncio.timeout(self.bookmark_every_s or None):
                            event = await queue.get()
                    except TimeoutError:
                        event = {"type": "BOOKMARK", "object": {
                            "kind": "Pod", "apiVersion": "v1", "spec": {"containers": None}, "status": {},
                            "metadata": {"resourceVersion": str(self.version), "creationTimestamp": None}}}
                    if not event or self.stall:
                        break
                    await resp.write(orjson.dumps(event) + b"\n")
        except (TimeoutError, ConnectionError):
            pass
        finally:
            self.streams.remove(queue)


@pytest.fixture
async def api() -> AsyncIterator[KubeApiStub]:
    stub = await KubeApiStub().start()
    yield stub
    await stub.stop()


@pytest.fixture
async def redis_client(redis_url: str) -> AsyncIterator[Any]:
    client = aioredis.from_url(redis_url)
    yield client
    await client.aclose()


@pytest.fixture
async def run_watcher(api: KubeApiStub, redis_client: Any) -> AsyncIterator[Callable[..., Any]]:
    tasks: list[asyncio.Task[None]] = []
    sessions: list[ClientSession] = []

    async def start(keys: CacheKeys | None = None, token_file: str = "", client: Any = None,
                    request_timeout_s: float = 2, **options: Any) -> PodWatcher:
        session = ClientSession()
        sessions.append(session)
        opts = PodWatchOptions(**{"backoff_initial_s": 0.05, "backoff_max_s": 0.2, **options})
        access = KubeAccess.from_url(api.url, token_file)
        watcher = PodWatcher(PodsApi(session, access, page_limit=4, request_timeout_s=request_timeout_s),
                             client or redis_client, keys or CacheKeys(f"t{uuid.uuid4().hex[:8]}-"), opts)
        tasks.append(asyncio.ensure_future(watcher.run()))
        return watcher

    yield start
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    for session in sessions:
        await session.close()


async def eventually(check: Callable[[], Any], timeout_s: float = 5.0) -> Any:
    deadline = time.monotonic() + timeout_s
    while True:
        result = check()
        if asyncio.iscoroutine(result):
            result = await result
        if result or time.monotonic() > deadline:
            return result
        await asyncio.sleep(0.02)


def view_is(client: Any, keys: CacheKeys, expected: dict[str, dict[str, int]]) -> Callable[[], Any]:
    async def check() -> bool:
        return await load_running(client, keys) == expected
    return check


def started_is(client: Any, keys: CacheKeys, expected: dict[str, dict[str, int]]) -> Callable[[], Any]:
    async def check() -> bool:
        return await load_running(client, keys, started=True) == expected
    return check


def new_pod() -> dict[str, Any]:
    return json.loads((PODS / "pod_gctf_k20.json").read_text())


async def test_view_is_listed_page_by_page_then_follows_the_watch(api, redis_client, run_watcher):
    watcher = await run_watcher(resync_s=30)  # no relist within this test: changes come by the watch
    keys = watcher.keys
    assert await eventually(view_is(redis_client, keys, EXPECTED))
    lists = api.lists()
    assert [q.get("continue") for q in lists[:3]] == [None, "4", "8"]
    assert all(q["labelSelector"] == "rttsched.io/app" and q["fieldSelector"] == SELECTOR for q in api.queries)
    assert all(q["limit"] == "4" for q in lists)
    ttl = await redis_client.pttl(keys.running("cpu-1"))
    assert 0 < ttl <= 90_000

    assert await eventually(lambda: api.streams)
    api.delete(UPLOAD_POD)
    api.add(new_pod())
    changed = {**{n: a for n, a in EXPECTED.items() if n != "cpu-1"}, "gpu-k20-1": {"gCTF": 1}}
    assert await eventually(view_is(redis_client, keys, changed))
    assert await redis_client.exists(keys.running("cpu-1")) == 0
    assert len(api.lists()) == 3  # one list of 3 pages; the rest came by the watch
    assert watcher.metrics.events.labels("DELETED")._value.get() == 1

    api.delete(new_pod()["metadata"]["name"])
    assert await eventually(view_is(redis_client, keys, {n: a for n, a in changed.items() if n != "gpu-k20-1"}))


async def test_expired_watch_relists_and_stale_keys_of_an_earlier_run_are_deleted(api, redis_client, run_watcher):
    keys = CacheKeys(f"t{uuid.uuid4().hex[:8]}-")
    await store_running(redis_client, keys, "gone-node", {"gCTF": 3}, 1.0)
    watcher = await run_watcher(keys, resync_s=30)
    assert await eventually(view_is(redis_client, keys, EXPECTED))
    assert await eventually(lambda: api.streams)
    api.pods = [p for p in api.pods if p["metadata"]["name"] != UPLOAD_POD]  # a change the watch never saw
    api.expire_watches()
    expected = {n: a for n, a in EXPECTED.items() if n != "cpu-1"}
    assert await eventually(view_is(redis_client, keys, expected))
    assert watcher.metrics.api_errors.labels("gone")._value.get() >= 1
    assert len(api.lists()) == 3 + 2  # the relist: 8 pods in 2 pages


async def test_polling_mode_lists_every_period_and_renews_vanished_keys(api, redis_client, run_watcher):
    watcher = await run_watcher(resync_s=0.2, watch=False)
    keys = watcher.keys
    assert await eventually(view_is(redis_client, keys, EXPECTED))
    await redis_client.delete(keys.running("gpu-m40-1"))  # e.g. a Redis restart
    api.pods = [p for p in api.pods if p["metadata"]["name"] != UPLOAD_POD]
    expected = {n: a for n, a in EXPECTED.items() if n != "cpu-1"}
    assert await eventually(view_is(redis_client, keys, expected))
    assert not any("watch" in q for q in api.queries)
    assert watcher.metrics.last_sync._value.get() > time.time() - 5


async def test_api_errors_and_garbage_are_counted_and_the_watcher_recovers(api, redis_client, run_watcher, caplog):
    caplog.set_level(logging.INFO, logger="app.extender.podwatch")
    api.fail = 500
    watcher = await run_watcher(resync_s=0.3, watch=False)
    errors = watcher.metrics.api_errors
    assert await eventually(lambda: errors.labels("http_500")._value.get() >= 3)
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "http_500" in warnings[0].getMessage()  # once per kind, not per retry
    assert not any(r.exc_info for r in caplog.records)
    api.fail, api.garbage = None, True
    assert await eventually(lambda: errors.labels("decode")._value.get() >= 1)
    assert await load_running(redis_client, watcher.keys) == {}
    api.garbage = False
    api.pods.append({"metadata": {"uid": "bad", "labels": {"rttsched.io/app": "gCTF"}}, "spec": "gpu-k20-1"})
    assert await eventually(view_is(redis_client, watcher.keys, EXPECTED))
    assert watcher.metrics.malformed._value.get() >= 1
    assert watcher.last_sync is not None
    assert any("in sync again" in r.getMessage() and "decode" in r.getMessage() for r in caplog.records)


async def test_a_rotated_token_is_picked_up_without_a_restart(api, redis_client, run_watcher, tmp_path):
    token = tmp_path / "token"
    token.write_text("old-token\n")
    api.token = "new-token"
    watcher = await run_watcher(token_file=str(token), resync_s=0.2, watch=False)
    assert await eventually(lambda: watcher.metrics.api_errors.labels("http_401")._value.get() >= 1)
    token.write_text("new-token\n")
    assert await eventually(view_is(redis_client, watcher.keys, EXPECTED))


async def test_an_unreachable_redis_is_counted_and_never_stops_the_watcher(api, run_watcher):
    dead = aioredis.from_url(f"redis://127.0.0.1:{free_port()}/0", socket_connect_timeout=1)
    try:
        watcher = await run_watcher(client=dead, resync_s=0.2, watch=False)
        assert await eventually(lambda: watcher.metrics.redis_errors._value.get() >= 2)
        assert watcher.written == {} and watcher.last_sync is None
    finally:
        await dead.aclose()


async def test_watch_events_split_across_chunks_and_error_events_are_read_as_the_api_sends_them():
    pod = new_pod()
    added = orjson.dumps({"type": "ADDED", "object": pod}) + b"\n"
    bookmark = orjson.dumps({"type": "BOOKMARK", "object": {"kind": "Pod", "metadata": {"resourceVersion": "9"}}})
    failure = orjson.dumps({"type": "ERROR", "object": {"kind": "Status", "code": 500, "message": "internal",
                                                        "details": {"retryAfterSeconds": 2}}})

    async def stream(request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse()
        await resp.prepare(request)
        for chunk in (added[:100], added[100:] + bookmark[:10], bookmark[10:] + b"\n", failure + b"\n"):
            await resp.write(chunk)
            await asyncio.sleep(0.01)
        return resp

    app = web.Application()
    app.router.add_get("/api/v1/pods", stream)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    batches: list[list[dict[str, Any]]] = []
    try:
        async with ClientSession() as session:
            api = PodsApi(session, KubeAccess.from_url(f"http://{host}:{port}"))
            with pytest.raises(KubeApiError) as err:
                async for batch in api.watch("1", 5):
                    batches.append(batch)
    finally:
        await runner.cleanup()
    assert err.value.kind == "watch_error" and err.value.retry_after_s == 2.0
    events = [e for b in batches for e in b]
    assert batches[0] == [] and [e["type"] for e in events] == ["ADDED", "BOOKMARK"]
    assert events[0]["object"] == pod


def _cli(*args: str, api_url: str) -> list[str]:
    return [sys.executable, "-m", "app.cli.main", "pods", "--api-url", api_url, *args]


async def test_cli_writes_the_view_and_stops_cleanly_on_sigterm(api, redis_client, redis_url):
    prefix = f"t{uuid.uuid4().hex[:8]}-"
    keys = CacheKeys(prefix)
    metrics_port = free_port()
    env = {**os.environ, "REDIS_URL": redis_url, "RTT_TOPIC_PREFIX": prefix, "RTT_PODS_RESYNC_S": "30",
           "RTT_METRICS_PORT": str(metrics_port)}
    once = await asyncio.create_subprocess_exec(*_cli("--once", api_url=api.url),
                                                env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(once.communicate(), 60)
    assert once.returncode == 0, err.decode()
    lines = out.decode().splitlines()
    assert lines[0].split() == ["NODE", "APP", "PODS", "STARTED"], lines
    rows = [line.split() for line in lines[1:-1]]
    assert all(len(r) == 4 for r in rows), lines
    assert {n: {a: int(p) for nn, a, p, _ in rows if nn == n} for n, *_ in rows} == EXPECTED
    assert {n: {a: int(s) for nn, a, _, s in rows if nn == n and int(s)} for n, *_ in rows} == STARTED
    widths = {len(line) for line in lines[:-1]}
    assert len(widths) == 1, lines  # aligned: the counts right-aligned under their headers
    assert lines[-1] == "rttsched pods: 6 pods (5 started) on 3 nodes written", lines
    assert await load_running(redis_client, keys) == EXPECTED

    await redis_client.delete(keys.running("cpu-1"))
    proc = await asyncio.create_subprocess_exec(*_cli(api_url=api.url), env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        assert await eventually(view_is(redis_client, keys, EXPECTED), timeout_s=30)
        assert await eventually(lambda: api.streams, timeout_s=10)
        async with ClientSession() as http, http.get(f"http://127.0.0.1:{metrics_port}/metrics") as resp:
            exposed = await resp.text()
        assert "rtt_pods_seen 6.0" in exposed and "rtt_pods_started 5.0" in exposed
        assert "rtt_pods_nodes 3.0" in exposed
        assert "rtt_pods_last_sync_timestamp_seconds" in exposed
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode == 0, err.decode()
    assert "stopped" in out.decode() and "Traceback" not in err.decode()


async def test_cli_once_with_redis_away_says_so_in_one_line_naming_redis_url(api):
    """The API answers, Redis does not: it used to end with ``error: ConnectionError: ...`` and exit 1."""
    port = free_port()
    env = {**os.environ, "REDIS_URL": f"redis://127.0.0.1:{port}/0"}
    once = await asyncio.create_subprocess_exec(*_cli("--once", api_url=api.url), env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(once.communicate(), 60)
    assert once.returncode == 2, err.decode()
    (line,) = err.decode().splitlines()
    assert line.startswith(f"rttsched pods: error: REDIS_URL: cannot use Redis at redis://127.0.0.1:{port}/0: "), line
    assert out == b""


async def test_bound_pending_and_terminating_pods_count_for_the_scheduler_but_only_started_ones_for_the_bridge(
        api, redis_client, run_watcher):
    watcher = await run_watcher(resync_s=30)
    keys = watcher.keys
    assert await eventually(view_is(redis_client, keys, EXPECTED))
    assert await eventually(started_is(redis_client, keys, STARTED))  # the terminating gctf-run-m9n0p: not started
    assert await eventually(lambda: api.streams)

    pulling = new_pod()  # bound by the scheduler, its image still being pulled
    pulling["status"] = {"phase": "Pending", "containerStatuses": [
        {"name": "gctf", "ready": False, "state": {"waiting": {"reason": "ContainerCreating"}}}]}
    api.add(pulling)
    assert await eventually(view_is(redis_client, keys, {**EXPECTED, "gpu-k20-1": {"gCTF": 1}}))
    assert await load_running(redis_client, keys, started=True) == {**STARTED, "gpu-k20-1": {}}

    api.modify(new_pod())  # its containers started
    assert await eventually(started_is(redis_client, keys, {**STARTED, "gpu-k20-1": {"gCTF": 1}}))

    terminating = new_pod()  # deleted: its containers run until the grace period ends
    terminating["metadata"]["deletionTimestamp"] = "2024-05-14T09:40:00Z"
    api.modify(terminating)
    assert await eventually(started_is(redis_client, keys, {**STARTED, "gpu-k20-1": {}}))
    assert await load_running(redis_client, keys) == {**EXPECTED, "gpu-k20-1": {"gCTF": 1}}

    finished = copy.deepcopy(terminating)
    finished["status"]["phase"] = "Succeeded"
    api.modify(finished)
    assert await eventually(view_is(redis_client, keys, EXPECTED))
    assert await redis_client.exists(keys.running("gpu-k20-1")) == 0
    assert watcher.metrics.seen._value.get() == 6 and watcher.metrics.started._value.get() == 5


def watches(api: KubeApiStub) -> list[dict[str, str]]:
    return [q for q in api.queries if q.get("watch") == "true"]


async def ts_of(client: Any, keys: CacheKeys, node: str) -> float:
    return float(orjson.loads(await client.get(keys.running(node)))["ts"])


async def test_a_healthy_watch_is_never_relisted_while_keys_and_ts_are_renewed(api, redis_client, run_watcher):
    began = time.time()
    watcher = await run_watcher(resync_s=1, ttl_s=1.5)  # the server closes each watch after 1 s
    keys = watcher.keys
    assert await eventually(view_is(redis_client, keys, EXPECTED))
    first_ts = await ts_of(redis_client, keys, "gpu-4090-1")
    assert await eventually(lambda: api.streams)
    api.delete(UPLOAD_POD)
    await asyncio.sleep(2.5)  # 2 renewal periods, longer than the keys' TTL
    expected = {n: a for n, a in EXPECTED.items() if n != "cpu-1"}
    assert await load_running(redis_client, keys) == expected
    assert len(api.lists()) == 3  # the first list's 3 pages, nothing since
    assert await ts_of(redis_client, keys, "gpu-4090-1") > first_ts + 1.5  # last confirmed
    assert watcher.last_sync is not None and watcher.last_sync > began + 1.5
    assert all(q["timeoutSeconds"] == "1" for q in watches(api))  # the server closes each at the period's end
    assert len(watches(api)) >= 3 and watches(api)[-1]["resourceVersion"] == str(api.version)  # resumed
    assert "limit" not in watches(api)[-1]


async def heartbeat_of(client: Any, keys: CacheKeys) -> float | None:
    raw = await client.get(keys.running_sync())
    return None if raw is None else float(orjson.loads(raw)["ts"])


async def test_the_heartbeat_is_written_with_every_list_and_is_not_a_node(api, redis_client, run_watcher):
    watcher = await run_watcher(resync_s=30)  # no renewal within this test
    keys = watcher.keys
    assert await eventually(view_is(redis_client, keys, EXPECTED))  # not a node: the view is the pods' nodes
    listed = await heartbeat_of(redis_client, keys)
    assert listed is not None and listed == watcher.last_sync == await ts_of(redis_client, keys, "gpu-4090-1")
    assert 85_000 < await redis_client.pttl(keys.running_sync()) <= 90_000  # the values' TTL
    assert await eventually(lambda: api.streams)
    api.add(new_pod())  # a change: its node written at once, the whole view not confirmed
    assert await eventually(lambda: redis_client.exists(keys.running("gpu-k20-1")))
    assert await heartbeat_of(redis_client, keys) == listed < await ts_of(redis_client, keys, "gpu-k20-1")
    api.expire_watches()  # the relist deletes the running:* keys of nodes it does not know, not the heartbeat
    assert await eventually(lambda: len(api.lists()) > 3)
    assert await eventually(lambda: watcher.last_sync > listed)
    assert await heartbeat_of(redis_client, keys) == watcher.last_sync
    assert await load_running(redis_client, keys) == {**EXPECTED, "gpu-k20-1": {"gCTF": 1}}


async def test_an_empty_view_is_confirmed_by_the_heartbeat_renewed_with_every_renewal(api, redis_client, run_watcher):
    keys = CacheKeys(f"t{uuid.uuid4().hex[:8]}-")
    await store_running(redis_client, keys, "gone-node", {"gCTF": 3}, 1.0)  # an earlier run's
    api.pods = []  # none of our pods anywhere
    watcher = await run_watcher(keys, resync_s=1, ttl_s=1.5)
    assert await eventually(lambda: watcher.last_sync is not None)
    assert await load_running(redis_client, keys) == {}
    first = await heartbeat_of(redis_client, keys)
    assert first is not None and 0 < await redis_client.pttl(keys.running_sync()) <= 1500
    await asyncio.sleep(2.5)  # renewals of an empty view, longer than the TTL
    last = await heartbeat_of(redis_client, keys)
    assert last is not None and last > first + 1.5
    assert await load_running(redis_client, keys) == {} and len(api.lists()) == 1  # renewed, not relisted


async def test_a_watch_answered_only_with_bookmarks_is_kept_and_resumed_from_the_last_one(
        api, redis_client, run_watcher):
    api.bookmark_every_s = 0.2
    watcher = await run_watcher(resync_s=1, ttl_s=1.5)
    keys = watcher.keys
    assert await eventually(view_is(redis_client, keys, EXPECTED))
    assert await eventually(lambda: api.streams)
    api.version += 7  # objects outside our selection changed: only bookmarks say so
    await asyncio.sleep(2.5)
    assert await load_running(redis_client, keys) == EXPECTED
    assert len(api.lists()) == 3
    assert watcher.metrics.events.labels("BOOKMARK")._value.get() >= 5
    assert watches(api)[-1]["resourceVersion"] == str(api.version)
    assert not [s for m in watcher.metrics.api_errors.collect() for s in m.samples if s.name.endswith("_total")]


async def test_a_watch_that_goes_silent_is_dropped_and_the_relist_brings_the_changes_made_meanwhile(
        api, redis_client, run_watcher):
    watcher = await run_watcher(resync_s=1, request_timeout_s=0.5)
    keys = watcher.keys
    assert await eventually(view_is(redis_client, keys, EXPECTED))
    assert await eventually(lambda: api.streams)
    api.stall_watches()  # the open watch and every new one: headers, then nothing, never closed
    api.delete(UPLOAD_POD)
    api.add(new_pod())  # neither reaches a watch
    assert await eventually(lambda: len(api.lists()) > 3, timeout_s=5)  # given up after 1 s + 0.5 s, relisted
    changed = {**{n: a for n, a in EXPECTED.items() if n != "cpu-1"}, "gpu-k20-1": {"gCTF": 1}}
    assert await eventually(view_is(redis_client, keys, changed))
    assert watcher.metrics.api_errors.labels("timeout")._value.get() >= 1


async def test_keys_are_not_renewed_while_the_watch_is_silent(api, redis_client, run_watcher):
    watcher = await run_watcher(resync_s=1, request_timeout_s=1)
    keys = watcher.keys
    assert await eventually(view_is(redis_client, keys, EXPECTED))
    opened = len(watches(api))
    assert await eventually(lambda: len(watches(api)) > opened and api.streams, timeout_s=3)  # a fresh watch
    api.stall_watches()
    stalled_at = time.monotonic()
    confirmed = (await ts_of(redis_client, keys, "gpu-4090-1"), watcher.last_sync)
    seen = set()
    while len(api.lists()) == 3 and time.monotonic() - stalled_at < 5:
        now = (await ts_of(redis_client, keys, "gpu-4090-1"), watcher.last_sync)
        if len(api.lists()) == 3:  # read before the relist
            seen.add(now)
        await asyncio.sleep(0.05)
    assert time.monotonic() - stalled_at > 1.5  # silent for longer than a resync period: 1 s + 1 s, then relisted
    assert seen == {confirmed}
    assert await eventually(lambda: watcher.last_sync > confirmed[1])  # the relist confirms the view again
    assert await ts_of(redis_client, keys, "gpu-4090-1") > confirmed[0]


async def test_a_watch_the_server_accepts_but_never_answers_is_given_up_and_relisted(api, redis_client, run_watcher):
    api.stall = "request"
    watcher = await run_watcher(resync_s=1, request_timeout_s=0.5)
    assert await eventually(lambda: len(api.lists()) > 3, timeout_s=5)
    assert watcher.metrics.api_errors.labels("timeout")._value.get() >= 1
    assert await load_running(redis_client, watcher.keys) == EXPECTED


async def test_a_watch_is_read_until_the_server_closes_it_and_no_longer_than_its_timeout_plus_the_request_timeout(
        api):
    async with ClientSession() as session:
        pods = PodsApi(session, KubeAccess.from_url(api.url), request_timeout_s=0.3)
        began = time.monotonic()
        async with contextlib.aclosing(pods.watch("1", 0.2)) as stream:
            assert [batch async for batch in stream] == [[]]  # closed by the server, after a whole second
        assert watches(api)[-1]["timeoutSeconds"] == "1" and time.monotonic() - began >= 0.9

        api.stall_watches()  # headers, then nothing, never closed: given up at timeoutSeconds + request timeout
        began = time.monotonic()
        with pytest.raises(KubeApiError) as err:
            async for _ in pods.watch("1", 0.2):
                pass
        took = time.monotonic() - began
        # timeoutSeconds (1 s) + the request timeout (0.3 s). Given up after the 0.2 s asked for plus the request
        # timeout (0.5 s) fails the lower bound; a hung watch kept longer fails the upper one: read until the
        # server closes it (this one never does), for aiohttp's default total of 5 minutes, or with the default
        # request timeout (10 s) in place of the configured one
        assert err.value.kind == "timeout" and 1.2 <= took < 5.0, (err.value.kind, took)


async def test_retry_after_of_a_throttled_api_is_waited_before_the_next_try(api, redis_client, run_watcher):
    api.fail, api.retry_after = 429, "1"
    watcher = await run_watcher(resync_s=30)  # backoff 0.05 s doubling to 0.2 s
    errors = watcher.metrics.api_errors
    assert await eventually(lambda: errors.labels("http_429")._value.get() >= 3, timeout_s=6)
    gaps = [b - a for a, b in zip(api.times, api.times[1:], strict=False)]
    assert gaps and min(gaps) >= 0.95, gaps
    api.fail = None
    assert await eventually(view_is(redis_client, watcher.keys, EXPECTED), timeout_s=3)
