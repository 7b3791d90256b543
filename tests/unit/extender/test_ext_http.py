"""The extender over HTTP with realistic kube-scheduler payloads, in both nodeCacheCapable modes."""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import AsyncIterator

import orjson
import pytest
from extender_fixtures import NOW, Client, LinearPredictor, fixture, http_client, make_service

from app.contracts.codec import decode
from app.extender.service import ExtenderService
from app.scheduler.policy import policy_from_dict

NAMES = ["gpu-4090-1", "gpu-m40-1", "gpu-k20-1", "cpu-1"]
EXPECTED = [{"Host": "gpu-4090-1", "Score": 10}, {"Host": "gpu-m40-1", "Score": 7},
            {"Host": "gpu-k20-1", "Score": 4}, {"Host": "cpu-1", "Score": 0}]


@pytest.fixture
def service() -> ExtenderService:
    return make_service()


@pytest.fixture
async def client(service: ExtenderService) -> AsyncIterator[Client]:
    async with http_client(service) as c:
        yield c


async def post(client: Client, verb: str, body: object) -> tuple[int, object]:
    data = body if isinstance(body, bytes) else orjson.dumps(body)
    resp = await client.post(f"/{verb}", data=data, headers={"Content-Type": "application/json"})
    assert resp.content_type == "application/json"
    return resp.status, orjson.loads(await resp.read())


async def test_filter_nodelist_mode_echoes_full_node_objects(client: Client) -> None:
    args = fixture("args_nodes_gctf.json")
    status, result = await post(client, "filter", args)
    assert status == 200
    assert result["NodeNames"] is None and result["Error"] == "" and result["FailedNodes"] == {}
    assert result["FailedAndUnresolvableNodes"] == {}
    assert result["Nodes"] == args["Nodes"]  # every node passes, objects untouched, NodeList metadata kept


async def test_filter_names_mode(client: Client) -> None:
    status, result = await post(client, "filter", fixture("args_names_gctf.json"))
    assert status == 200 and result["Nodes"] is None and result["NodeNames"] == NAMES


async def test_only_prioritize_notes_expected_run_times(client: Client, service: ExtenderService) -> None:
    """kube-scheduler skips prioritize when a single node is feasible: a filter's predictions, kept for an
    assumption that never comes, would pile up (a list per candidate per pod, up to max_pods)."""
    for _ in range(3):
        assert (await post(client, "filter", fixture("args_names_gctf.json")))[0] == 200
    assert service.assumed.hinted == 0 and len(service.assumed) == 0  # four nodes passed: prioritize will come
    assert (await post(client, "prioritize", fixture("args_names_gctf.json")))[0] == 200
    assert service.assumed.hinted == 0  # noted, then used by the assumption: it ends with the prediction
    ttl = service.assumed.ttl_s
    assert [p.placed_at < p.until < p.placed_at + ttl for p in service.assumed.on_node("gpu-4090-1", NOW)] == [True]


async def test_a_pod_placed_nowhere_leaves_no_expected_run_times(client: Client, service: ExtenderService) -> None:
    """Pods of an app no model covers get no winner, so nothing is assumed: what prioritize noted for them
    goes at once (kept, a list per candidate per pod piled up until max_pods: ~30 KB a pod at 300 nodes)."""
    args = fixture("args_names_gctf.json")
    args["Pod"]["metadata"]["labels"]["rttsched.io/app"] = "newapp"
    for i in range(300):
        args["Pod"]["metadata"]["uid"] = f"uid-{i}"
        assert (await post(client, "prioritize", args))[0] == 200
    assert len(service.assumed) == 0 and service.assumed.hinted == 0


async def test_a_filter_that_leaves_one_node_places_the_pod(client: Client, service: ExtenderService) -> None:
    """With a single feasible node kube-scheduler binds it without calling prioritize: the filter assumes
    the pod there and publishes its predictions (else its completion would find no prediction to join)."""
    args = fixture("args_names_gctf.json")
    args["NodeNames"] = ["gpu-m40-1"]
    status, result = await post(client, "filter", args)
    assert status == 200 and result["NodeNames"] == ["gpu-m40-1"]
    placed = service.assumed.on_node("gpu-m40-1", NOW)
    assert [p.app for p in placed] == ["gCTF"] and placed[0].until < placed[0].placed_at + service.assumed.ttl_s
    assert service.publisher is not None
    await service.publisher.drain()
    sent = service.publisher._sink.sent  # type: ignore[attr-defined]
    assert [decode("rtt-predictions", v, strict=True)["node"] for _, v in sent] == ["gpu-m40-1"]
    assert decode("rtt-predictions", sent[0][1], strict=True)["chosen"] is True  # the node it is bound to
    assert service.metrics.single_node.labels("gCTF")._value.get() == 1


@pytest.mark.parametrize("name", ["args_nodes_gctf.json", "args_names_gctf.json"])
async def test_prioritize_both_modes_rank_fast_node_first(client: Client, service: ExtenderService,
                                                          name: str) -> None:
    status, result = await post(client, "prioritize", fixture(name))
    assert status == 200 and result == EXPECTED
    assert [p.node for p in service.assumed.on_node("gpu-4090-1", NOW)] == ["gpu-4090-1"]
    assert service.publisher is not None
    await service.publisher.drain()
    sent = service.publisher._sink.sent  # type: ignore[attr-defined]
    values = [decode("rtt-predictions", v, strict=True) for _, v in sent]
    assert [k for k, _ in sent] == [n.encode() for n in NAMES]
    assert {v["task_id"] for v in values} == {"0b7d3f52-91c4-4a7e-bb0e-2f5e4d6c8a10"}
    by = {v["node"]: v for v in values}
    assert by["gpu-4090-1"]["predicted_rtt_ms"] == pytest.approx(201.2)
    assert (by["gpu-4090-1"]["model_key"], by["gpu-4090-1"]["model_version"]) == ("gCTF:gpu", 2)
    assert (by["cpu-1"]["model_key"], by["cpu-1"]["predicted_rtt_ms"]) == (None, 5000.0)


async def test_one_prediction_per_placed_pod_is_chosen_the_node_it_was_assumed_on(client: Client,
                                                                                   service: ExtenderService) -> None:
    """``chosen: true`` on the node the extender assumed each pod on — its top-scored node, or the node it explores
    (cpu-1: no model covers it) — and on no other candidate; the filter of a pod prioritize follows publishes none."""
    args = fixture("args_names_gctf.json")
    for i in range(40):
        args["Pod"]["metadata"]["uid"] = f"uid-{i}"
        assert (await post(client, "filter", args))[0] == 200
        assert (await post(client, "prioritize", args))[0] == 200
    assert service.publisher is not None
    await service.publisher.drain()
    sent = service.publisher._sink.sent  # type: ignore[attr-defined]
    values = [decode("rtt-predictions", v, strict=True) for _, v in sent]
    assert len(values) == 40 * len(NAMES) and {v.get("chosen", True) for v in values} == {True}  # never false
    chosen: dict[str, list[str]] = {}
    for v in values:
        if v.get("chosen"):
            chosen.setdefault(v["task_id"], []).append(v["node"])
    assumed = {p.task_id: [p.node] for n in NAMES for p in service.assumed.on_node(n, NOW)}
    assert len(assumed) == 40 and chosen == assumed
    assert {nodes[0] for nodes in assumed.values()} >= {"gpu-4090-1", "cpu-1"}  # won, and explored


async def test_pod_without_app_label_is_neutral(client: Client, service: ExtenderService) -> None:
    args = {"Pod": fixture("pod_unlabeled.json"), "Nodes": None, "NodeNames": NAMES}
    assert await post(client, "prioritize", args) == (200, [{"Host": n, "Score": 5} for n in NAMES])
    status, result = await post(client, "filter", args)
    assert result["NodeNames"] == NAMES and result["FailedNodes"] == {}
    assert len(service.assumed) == 0


@pytest.mark.parametrize(("body", "needle"), [
    (b"{not json", "not valid JSON"),
    (b"", "not valid JSON"),
    (b"[1, 2]", "JSON object"),
    (b'{"Nodes": null, "NodeNames": []}', "Pod is required"),
    (b'{"Pod": "x", "NodeNames": []}', "Pod must be an object"),
    (b'{"Pod": {}, "NodeNames": "n1"}', "NodeNames must be an array"),
    (b'{"Pod": {}, "NodeNames": [1]}', "NodeNames[0]"),
    (b'{"Pod": {}, "Nodes": []}', "Nodes must be a NodeList"),
    (b'{"Pod": {}, "Nodes": {"items": [{"metadata": {}}]}}', "Nodes.items[0].metadata.name"),
    (b'{"Pod": {"metadata": {"labels": ["a"]}}, "NodeNames": []}', "Pod.metadata.labels"),
    (b'{"Pod": {"metadata": {"labels": {"rttsched.io/app": 5}}}, "NodeNames": ["n1"]}',
     "Pod.metadata.labels[...] must be a string"),  # label and annotation values are strings in the API
    (b'{"Pod": {"metadata": {"annotations": {"rttsched.io/input-size-mb": 512}}}, "NodeNames": ["n1"]}',
     "Pod.metadata.annotations[...] must be a string"),
    (b'{"Pod": {}, "NodeNames": ["n1", ""]}', "NodeNames[1] must be a non-empty string"),
    (b'{"Pod": {"spec": ' + b"[" * 5000 + b"]" * 5000 + b'}, "NodeNames": ["n1"]}', "nested too deeply"),
])
@pytest.mark.parametrize("verb", ["filter", "prioritize"])
async def test_malformed_body_is_400_with_error(client: Client, verb: str, body: bytes, needle: str) -> None:
    status, result = await post(client, verb, body)
    assert status == 400 and needle in result["Error"] and "Traceback" not in result["Error"]


async def test_oversized_body_is_413_with_error() -> None:
    service = make_service(max_body_bytes=4096)
    async with http_client(service) as client:
        big = orjson.dumps(fixture("args_nodes_gctf.json"))
        assert len(big) > 4096
        status, result = await post(client, "filter", big)
        assert status == 413 and "exceeds the limit" in result["Error"]

        async def chunks():  # no Content-Length: the limit still holds while reading
            for i in range(0, len(big), 1000):
                yield big[i:i + 1000]

        resp = await client.post("/prioritize", data=chunks())
        assert resp.status == 413 and "exceeds the limit" in (await resp.json())["Error"]


async def test_slow_body_times_out_with_408() -> None:
    service = make_service(read_timeout_s=0.2)
    async with http_client(service) as client:
        reader, writer = await asyncio.open_connection("127.0.0.1", client.port)
        writer.write(b"POST /filter HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 100\r\n\r\n{\"Pod\":")
        await writer.drain()
        head = await asyncio.wait_for(reader.read(4096), 5)
        writer.close()
        assert head.startswith(b"HTTP/1.1 408") and b'"Error":"request body not received' in head


async def test_stale_snapshot_answers_neutral_counts_and_logs_once(caplog: pytest.LogCaptureFixture) -> None:
    service = make_service(policy=policy_from_dict({"sla_ms": {"gCTF": 1.0}}))
    service.clock.advance(31.0)  # type: ignore[attr-defined]
    async with http_client(service) as client:
        with caplog.at_level(logging.WARNING, logger="app.extender.service"):
            for _ in range(3):
                status, result = await post(client, "filter", fixture("args_names_gctf.json"))
                assert status == 200 and result["NodeNames"] == NAMES and result["FailedNodes"] == {}
                assert await post(client, "prioritize", fixture("args_names_gctf.json")) == (
                    200, [{"Host": n, "Score": 5} for n in NAMES])
        assert sum("no fresh data" in r.getMessage() for r in caplog.records) == 1
        metrics = await (await client.get("/metrics")).text()
        assert 'rtt_extender_stale_answers_total{reason="stale_snapshot"} 6.0' in metrics
        assert len(service.assumed) == 0


async def test_a_hung_gpu_node_scores_neutral_and_counts_as_a_stale_candidate() -> None:
    """A node whose GPU group the bridge withheld (a hung GPU's zeros) gets the neutral score among fresh
    nodes, and the stale candidates are counted: the whole answer is not neutral, so no stale answer is."""
    service = make_service()
    service.builder.apply_node_features({"node": "gpu-m40-1", "ts": NOW, "node_class": "gpu", "gpu_model": "Tesla M40",
                                         "window_s": 30.0, "count": 30, "features": {"load__mean": 0.0},
                                         "stale": ["gpu"]})
    service.rebuild(force=True)
    async with http_client(service) as client:
        status, result = await post(client, "prioritize", fixture("args_names_gctf.json"))
        assert status == 200 and {r["Host"]: r["Score"] for r in result}["gpu-m40-1"] == 5
        assert max(result, key=lambda r: r["Score"])["Host"] != "gpu-m40-1"
        await post(client, "filter", fixture("args_names_gctf.json"))
        metrics = await (await client.get("/metrics")).text()
        assert f"rtt_extender_candidates_total {2.0 * len(NAMES)}" in metrics
        assert "rtt_extender_stale_candidates_total 2.0" in metrics
        assert "rtt_extender_stale_answers_total{" not in metrics


async def test_sla_and_anti_affinity_filter_with_reasons() -> None:
    policy = policy_from_dict({"sla_ms": {"gCTF": 400.0}, "anti_affinity": [["gCTF", "Motioncor2"]]})
    service = make_service(policy=policy)
    service.builder.apply_running("gpu-m40-1", {"Motioncor2": 1})
    service.rebuild()
    async with http_client(service) as client:
        args = fixture("args_nodes_gctf.json")
        status, result = await post(client, "filter", args)
        assert status == 200
        assert result["FailedNodes"] == {
            "gpu-m40-1": "anti-affinity: gCTF interferes with Motioncor2 already running on this node",
            "gpu-k20-1": "predicted RTT 501 ms exceeds the SLA of gCTF (400 ms)",
            "cpu-1": "predicted RTT 5000 ms exceeds the SLA of gCTF (400 ms)",
        }
        assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["gpu-4090-1"]
        metrics = await (await client.get("/metrics")).text()
        assert 'rtt_extender_failed_nodes_total{reason="sla"} 2.0' in metrics
        assert 'rtt_extender_failed_nodes_total{reason="anti_affinity"} 1.0' in metrics


async def test_health_readiness_metrics_openapi() -> None:
    service = make_service(populate=False)
    async with http_client(service) as client:
        assert (await client.get("/healthz")).status == 200
        resp = await client.get("/readyz")
        assert resp.status == 503 and (await resp.json())["ready"] is False
        status, result = await post(client, "prioritize", fixture("args_names_gctf.json"))
        assert status == 200 and {r["Score"] for r in result} == {5}  # not ready: neutral
        service.rebuild(force=True)
        ready = await (await client.get("/readyz")).json()
        assert ready["ready"] is True and ready["generation"] == 1
        assert ready["age_s"] is None or ready["age_s"] >= 0  # null while no node-features (the metric's -1)
        metrics = await client.get("/metrics")
        text = await metrics.text()
        assert metrics.headers["Content-Type"].startswith("text/plain")
        assert 'rtt_extender_request_seconds_count{verb="prioritize"} 1.0' in text
        assert 'rtt_extender_stale_answers_total{reason="not_ready"} 1.0' in text
        doc = await (await client.get("/openapi.json")).json()
        assert doc["openapi"].startswith("3.") and {"/filter", "/prioritize", "/readyz"} <= set(doc["paths"])


async def test_unknown_path_and_method_answer_json() -> None:
    async with http_client(make_service()) as client:
        resp = await client.get("/nope")
        assert resp.status == 404 and (await resp.json())["Error"]
        resp = await client.get("/filter")
        assert resp.status == 405 and (await resp.json())["Error"] and "POST" in resp.headers["Allow"]


async def test_filter_asks_the_predictor_to_remember_its_rows_and_prioritize_does_not() -> None:
    """kube-scheduler's prioritize follows its filter for the same pod: the rows filter predicted are looked up
    again then; after prioritize no call asks for them."""
    service = make_service()
    model = LinearPredictor({"load__mean": 100.0, "task_input_size_mb": 0.1}, bias=50.0)
    service.builder.set_model("gCTF:gpu", 99, model)
    service.rebuild()
    async with http_client(service) as client:
        assert (await post(client, "filter", fixture("args_names_gctf.json")))[0] == 200
        assert (await post(client, "prioritize", fixture("args_names_gctf.json")))[0] == 200
    assert model.remember == [True, False]


async def test_unexpected_error_is_500_with_error_and_logged(caplog: pytest.LogCaptureFixture) -> None:
    service = make_service()
    service.builder.set_model("gCTF:gpu", 99, LinearPredictor({"load__mean": 1.0}, fail=True))
    service.rebuild()
    async with http_client(service) as client:
        with caplog.at_level(logging.ERROR, logger="app.extender.server"):
            status, result = await post(client, "prioritize", fixture("args_names_gctf.json"))
        assert status == 500 and result["Error"] == "internal error (logged by the extender)"
        assert any("predictor exploded" in (r.exc_text or "") or r.exc_info for r in caplog.records)
        assert "rtt_extender_errors_total 1.0" in await (await client.get("/metrics")).text()


def test_readyz_age_is_null_without_node_features_as_the_metric_is_minus_one() -> None:
    """/readyz said 1e9 s where rtt_extender_snapshot_age_seconds said -1 (no node-features yet)."""
    from app.extender.server import _age

    assert _age(math.inf) is None and _age(2.0004) == 2.0
