"""POST /explain on the served extender: a real XGBoost model from the directory registry, its booster loaded on
demand for pred_contribs; the same body as /prioritize; nothing about scheduling changes."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import numpy as np
import orjson
import pytest
import xgboost

from app.clock import ManualClock
from app.config import Settings
from app.extender.boosters import BoosterCache, BoosterUnavailable
from app.extender.options import ExtenderOptions
from app.extender.server import running
from app.extender.service import ExtenderService
from app.model.train import booster_to_bytes
from app.registry.directory import DirectoryModelStore
from app.registry.store import load_predictor
from app.scheduler.policy import policy_from_dict

NOW = 1_715_678_500.0
NAMES = ["load__mean", "task_input_size_mb"]
LOADS = {"gpu-a": 0.5, "gpu-b": 2.0, "gpu-c": 4.0}


def _store(tmp: Path) -> DirectoryModelStore:
    rng = np.random.default_rng(3)
    X = np.column_stack([rng.uniform(0, 5, 2000), rng.uniform(100, 900, 2000)]).astype(np.float32)
    y = 30.0 * np.exp(0.5 * X[:, 0]) * (1 + 0.001 * X[:, 1]) * rng.gamma(40, 1 / 40, 2000)
    b = xgboost.train({"objective": "reg:gamma", "max_depth": 4, "eta": 0.1, "nthread": 1},
                      xgboost.DMatrix(X, label=y, feature_names=NAMES), 50)
    store = DirectoryModelStore(str(tmp), keep=3)
    record = store.save("gCTF:gpu", booster_to_bytes(b), fmt="ubj", features=NAMES, params={}, metrics={},
                        n_samples=2000)
    store.promote("gCTF:gpu", record.version)
    return store


def _service(tmp: Path) -> ExtenderService:
    store = _store(tmp)
    settings = Settings.from_env({"RTT_MODELS_DIR": str(tmp)})
    policy = policy_from_dict({"anti_affinity": [["gCTF", "Motioncor2"]], "exploration": {"share": 0.0}})
    service = ExtenderService(settings, ExtenderOptions.from_settings(settings), policy=policy,
                              clock=ManualClock(NOW), publish=False, kafka=False, redis=False)
    for node, load in LOADS.items():
        service.builder.apply_node_features({"node": node, "ts": NOW - 1, "node_class": "gpu", "gpu_model": "RTX 4090",
                                             "window_s": 30.0, "count": 30, "features": {"load__mean": load}})
        service.builder.apply_node_weights({"node": node, "ts": NOW - 1, "weight": 1.0, "predicted_rtt_ms": {},
                                            "stale": False})
    predictor, record = load_predictor(store, "gCTF:gpu")
    service.builder.set_model("gCTF:gpu", record.version, predictor)
    service.rebuild(force=True)
    return service


def _body(uid: str = "uid-1", **extra: object) -> bytes:
    pod = {"metadata": {"name": "gctf-1", "namespace": "em", "uid": uid, "labels": {"rttsched.io/app": "gCTF"},
                        "annotations": {"rttsched.io/input-size-mb": "512"}}}
    return orjson.dumps({"Pod": pod, "NodeNames": list(LOADS), **extra})


async def test_explain_over_http_loads_the_booster_once_and_changes_nothing(tmp_path: Path) -> None:
    import aiohttp

    service = _service(tmp_path)
    service.assumed.assume("uid-0", "Motioncor2", "gpu-a", now=NOW - 0.5)  # just placed: anti-affinity on gpu-a
    async with running(service, "127.0.0.1", 0, start=False) as server:
        async with aiohttp.ClientSession(base_url=server.url) as http:
            before = await (await http.post("/prioritize", data=_body("uid-9"))).read()
            assumed = len(service.assumed)
            resp = await http.post("/explain", data=_body(Explain={"top": 2}))
            assert resp.status == 200
            answer = orjson.loads(await resp.read())
            again = await http.post("/explain", data=_body(Explain={"contributions": "exact"}))
            exact = orjson.loads(await again.read())
            bad = await http.post("/explain", data=_body(Explain={"contributions": "shapley"}))
            bad_text = (await bad.read()).decode()
            after = await (await http.post("/prioritize", data=_body("uid-9"))).read()
    assert service.boosters.loads == 1  # loaded on the first explanation, kept for the next
    assert len(service.assumed) == assumed and before == after  # explain placed nothing, moved no score
    by = {n["node"]: n for n in answer["nodes"]}
    assert by["gpu-a"]["anti_affinity"].startswith("anti-affinity: gCTF interferes with Motioncor2")
    assert answer["best"] == "gpu-b" and answer["nodes"][0]["node"] == "gpu-b"
    for n in answer["nodes"]:
        assert len(n["contributions"]) == 2 and n["link"] == "log"
        assert np.exp(n["contributions_sum"]) == pytest.approx(n["model_rtt_ms"], rel=1e-4)
    assert {n["contributions"][0]["feature"] for n in exact["nodes"]} == {"load__mean"}
    assert exact["contributions_method"] == "exact"
    assert bad.status == 400 and "Explain.contributions" in bad_text


def _held_boosters(service: ExtenderService) -> tuple[threading.Event, threading.Event]:
    """Make the service's booster loads wait for ``release`` (set ``started`` first): an explanation that is slow."""
    started, release = threading.Event(), threading.Event()
    real = service.boosters

    def load(key: str, version: int) -> object:
        started.set()
        assert release.wait(20)
        return real.get(key, version)

    service.boosters = BoosterCache(load)
    return started, release


async def test_an_explanation_in_progress_holds_up_no_scheduling_verb(tmp_path: Path) -> None:
    import aiohttp

    service = _service(tmp_path)
    started, release = _held_boosters(service)
    async with running(service, "127.0.0.1", 0, start=False) as server:
        async with aiohttp.ClientSession(base_url=server.url) as http:
            explaining = asyncio.ensure_future(http.post("/explain", data=_body(Explain={"contributions": "exact"})))
            assert await asyncio.to_thread(started.wait, 10)
            try:  # the loop answers while the explanation's thread waits
                scores = await asyncio.wait_for(http.post("/prioritize", data=_body("uid-9")), 5)
                filtered = await asyncio.wait_for(http.post("/filter", data=_body("uid-8")), 5)
                assert scores.status == 200 and filtered.status == 200
                assert not explaining.done()
            finally:
                release.set()
            answer = await asyncio.wait_for(explaining, 20)
            assert answer.status == 200
            nodes = orjson.loads(await answer.read())["nodes"]
            assert all(n["contributions"] for n in nodes)
    assert 'verb="explain"' in service.metrics.render().decode()


async def _read_answer(reader: asyncio.StreamReader) -> tuple[int, bytes]:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    length = next(int(h.split(":", 1)[1]) for h in lines if h.lower().startswith("content-length:"))
    return int(lines[0].split(" ")[1]), await reader.readexactly(length)


async def test_pipelined_requests_behind_an_explanation_are_answered_in_order(tmp_path: Path) -> None:
    service = _service(tmp_path)
    started, release = _held_boosters(service)
    async with running(service, "127.0.0.1", 0, start=False) as server:
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port)
        try:
            requests = b""
            for path, body in (("/explain", _body()), ("/prioritize", _body("uid-9")), ("/readyz", b"")):
                method = "GET" if path == "/readyz" else "POST"
                requests += (f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: {len(body)}\r\n\r\n"
                             .encode() + body)
            writer.write(requests)  # all three at once, on one connection
            await writer.drain()
            assert await asyncio.to_thread(started.wait, 10)
            with pytest.raises(asyncio.TimeoutError):  # nothing answered before the explanation
                await asyncio.wait_for(reader.read(1), 0.3)
            release.set()
            answers = [await asyncio.wait_for(_read_answer(reader), 20) for _ in range(3)]
        finally:
            release.set()
            writer.close()
    assert [status for status, _ in answers] == [200, 200, 200]
    explained, scores, ready = (orjson.loads(body) for _, body in answers)
    assert "contributions_method" in explained and [h["Host"] for h in scores] == list(LOADS)
    assert ready["ready"] is True


def test_a_booster_that_cannot_be_loaded_is_not_retried_at_once() -> None:
    calls: list[int] = []
    t = [0.0]

    def load(key: str, version: int) -> object:
        calls.append(version)
        raise OSError("registry unreachable")

    cache = BoosterCache(load, retry_after_s=10.0, clock=lambda: t[0])
    for _ in range(3):
        with pytest.raises(BoosterUnavailable, match="registry unreachable"):
            cache.get("gCTF:gpu", 1)
    assert calls == [1]
    t[0] = 11.0
    with pytest.raises(BoosterUnavailable):
        cache.get("gCTF:gpu", 1)
    assert calls == [1, 1]


def test_the_cache_keeps_the_most_recently_used() -> None:
    cache = BoosterCache(lambda key, version: object(), keep=2)
    a = cache.get("a", 1)
    cache.get("b", 1)
    assert cache.get("a", 1) is a  # a used again: b is now the oldest
    cache.get("c", 1)
    assert cache.get("a", 1) is a and cache.loads == 3
    cache.get("b", 1)
    assert cache.loads == 4  # b was dropped


def test_rttsched_explain_prints_a_table_within_100_columns_and_json(tmp_path: Path, capsys) -> None:
    import asyncio
    import threading

    from app.cli.main import main

    service = _service(tmp_path)
    service.assumed.assume("uid-0", "Motioncor2", "gpu-a", now=NOW - 0.5)
    loop = asyncio.new_event_loop()
    urls: list[str] = []
    ready, stop = threading.Event(), None

    async def serve() -> None:
        nonlocal stop
        stop = asyncio.Event()
        async with running(service, "127.0.0.1", 0, start=False) as server:
            urls.append(server.url)
            ready.set()
            await stop.wait()

    thread = threading.Thread(target=lambda: loop.run_until_complete(serve()), daemon=True)
    thread.start()
    assert ready.wait(10)
    try:
        nodes = ",".join(LOADS)
        assert main(["explain", "--url", urls[0], "--app", "gCTF", "--input-mb", "512", "--nodes", nodes]) == 0
        table = capsys.readouterr().out.splitlines()
        assert main(["explain", "--url", urls[0], "--app", "gCTF", "--nodes", nodes, "--json", "--top", "1"]) == 0
        answer = orjson.loads(capsys.readouterr().out)
        assert main(["explain", "--url", urls[0], "--app", "gCTF", "--nodes", nodes, "--top", "99"]) == 2
        assert "--top" in capsys.readouterr().err
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
    assert max(map(len, table)) <= 100
    assert table[1] == "best: gpu-b" and table[2].split()[:3] == ["node", "hardware", "score"]
    row = next(i for i, line in enumerate(table) if line.startswith("gpu-a "))
    assert "filtered out: anti-affinity: gCTF interferes with Motioncor2" in table[row + 1]
    assert any(line.strip().startswith("moved by: load__mean=") for line in table)
    assert [len(n["contributions"]) for n in answer["nodes"]] == [1, 1, 1]


def test_rttsched_explain_without_an_extender_is_one_line(capsys) -> None:
    from app.cli.main import main
    from app.kafka.embedded import free_port

    assert main(["explain", "--url", f"http://127.0.0.1:{free_port()}", "--app", "gCTF", "--nodes", "a"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "cannot reach the extender" in err and "Traceback" not in err
