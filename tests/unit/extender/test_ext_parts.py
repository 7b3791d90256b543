"""Protocol codec, options and the prediction publisher's bounded queue."""

from __future__ import annotations

import asyncio
import gc

import orjson
import pytest
from extender_fixtures import ListSink, fixture
from hypothesis import given
from hypothesis import strategies as st

from app.config import Settings
from app.contracts.codec import decode
from app.errors import ConfigError
from app.extender.metrics import ExtenderMetrics
from app.extender.options import ExtenderOptions
from app.extender.predictions import decision_values, encode_decision
from app.extender.protocol import (
    ProtocolError,
    filter_body,
    parse_args,
    priority_body,
    priority_body_of,
    priority_list,
)
from app.extender.publisher import KafkaSink, PredictionPublisher
from app.scheduler.decide import Decision
from app.scheduler.podinfo import PodInfo


def test_parse_both_modes_and_go_style_case_insensitive_keys() -> None:
    nodes = parse_args(orjson.dumps(fixture("args_nodes_gctf.json")))
    assert nodes.node_names == ["gpu-4090-1", "gpu-m40-1", "gpu-k20-1", "cpu-1"] and nodes.node_list
    names = parse_args(b'{"pod": {"metadata": {"labels": {"rttsched.io/app": "gCTF"}}}, "nodenames": ["a"]}')
    assert names.node_names == ["a"] and not names.node_list and names.pod.app == "gCTF"
    empty = parse_args(b'{"Pod": {}, "Nodes": null, "NodeNames": null}')
    assert empty.node_names == [] and orjson.loads(filter_body(empty, {}))["NodeNames"] == []
    with pytest.raises(ProtocolError, match="Nodes.metadata"):
        parse_args(b'{"Pod": {}, "Nodes": {"metadata": "x", "items": []}}')


def test_filter_result_keeps_order_mode_and_node_objects() -> None:
    sent = fixture("args_nodes_gctf.json")
    args = parse_args(orjson.dumps(sent), keep_nodes=True)
    out = orjson.loads(filter_body(args, {"gpu-m40-1": "why"}))
    assert out["Nodes"]["items"] == [it for it in sent["Nodes"]["items"] if it["metadata"]["name"] != "gpu-m40-1"]
    assert out["Nodes"]["metadata"] == {"resourceVersion": "47211"}
    assert (out["NodeNames"], out["FailedNodes"], out["Error"]) == (None, {"gpu-m40-1": "why"}, "")
    assert orjson.loads(filter_body(args, {}))["Nodes"] == sent["Nodes"]  # nothing failed: echoed as received
    with pytest.raises(ValueError, match="keep_nodes"):
        filter_body(parse_args(orjson.dumps(sent)), {})
    assert priority_list([("a", 3)]) == [{"Host": "a", "Score": 3}]


@given(st.lists(st.tuples(st.text(), st.integers(-(2**40), 2**40) | st.integers(0, 10))))
def test_priority_body_is_the_json_of_the_priority_list(scores: list[tuple[str, int]]) -> None:
    body = priority_body(scores)
    assert body == orjson.dumps(priority_list(scores))
    assert priority_body(scores) == body  # again, from the node parts kept
    nodes, values = tuple(h for h, _ in scores), [v for _, v in scores]
    assert priority_body_of(nodes, values) == body == priority_body_of(nodes, values)  # and the list's parts kept


def test_options_from_settings_env_and_errors() -> None:
    s = Settings.from_env({"RTT_EXTENDER_PORT": "9999", "RTT_EXTENDER_POLICY_FILE": "/etc/p.yaml"})
    o = ExtenderOptions.from_settings(s)
    assert (o.port, o.policy_file, o.publish_queue) == (9999, "/etc/p.yaml", 10_000)
    with pytest.raises(ConfigError) as exc:
        Settings.from_env({"RTT_EXTENDER_PUBLISH_QUEUE": "many"})
    assert exc.value.field == "RTT_EXTENDER_PUBLISH_QUEUE"


def decision(task_id: str, n: int) -> Decision:
    """n scored candidates, then one without a prediction (published with a null one), all fresh."""
    rtt = [100.0 + i for i in range(n)] + [float("nan")]
    return Decision(PodInfo(task_id, "ns", task_id, "gCTF", 1.0), tuple(f"n{i}" for i in range(n + 1)),
                    [10] * (n + 1), rtt, ["gCTF:gpu"] * (n + 1), [4] * (n + 1), [1.0] * (n + 1),
                    [None] * (n + 1), [True] * (n + 1))


async def test_publisher_sends_one_valid_message_per_candidate() -> None:
    metrics = ExtenderMetrics()
    sink = ListSink(metrics)
    pub = PredictionPublisher(sink, metrics, max_pending=10)
    pub.start()
    assert pub.offer(decision("uid-1", 3), 1_700_000_000.0)
    await pub.drain()
    assert [k for k, _ in sink.sent] == [b"n0", b"n1", b"n2", b"n3"]
    v = decode("rtt-predictions", sink.sent[2][1], strict=True)
    assert (v["task_id"], v["predicted_rtt_ms"], v["model_version"], v["model_key"]) == ("uid-1", 102.0, 4, "gCTF:gpu")
    assert decode("rtt-predictions", sink.sent[3][1], strict=True)["predicted_rtt_ms"] is None  # features still travel
    assert metrics.published._value.get() == 4
    await pub.stop()


async def test_the_publisher_leaves_counting_published_to_the_sink() -> None:
    """Handed to the sink is not published: the sink counts what the broker acknowledged."""
    metrics = ExtenderMetrics()
    pub = PredictionPublisher(ListSink(), metrics, max_pending=10)  # a sink that never confirms anything
    pub.start()
    assert pub.offer(decision("uid-1", 3), 1_700_000_000.0)
    await pub.drain()
    assert metrics.published._value.get() == 0 and metrics.dropped._value.get() == 0
    await pub.stop()


async def test_the_kafka_sink_counts_a_batch_published_once_acknowledged_and_dropped_if_not() -> None:
    metrics = ExtenderMetrics()
    sink = KafkaSink(Settings(), metrics)
    loop = asyncio.get_running_loop()
    stored, lost, cancelled = loop.create_future(), loop.create_future(), loop.create_future()
    stored.set_result(object())
    lost.set_exception(TimeoutError("request timed out"))
    cancelled.cancel()
    sink._delivered(stored, 5)
    sink._delivered(lost, 3)
    sink._delivered(cancelled, 2)
    assert metrics.published._value.get() == 5 and metrics.dropped._value.get() == 5


async def test_publisher_drops_and_counts_when_full() -> None:
    sink, metrics = ListSink(), ExtenderMetrics()
    pub = PredictionPublisher(sink, metrics, max_pending=2)  # not started: nothing drains
    assert pub.offer(decision("a", 4), 1.0) and pub.offer(decision("b", 4), 1.0)
    assert not pub.offer(decision("c", 5), 1.0)
    assert metrics.dropped._value.get() == 6 and pub.pending == 2
    pub.start()
    await pub.drain()
    assert len(sink.sent) == 10
    await pub.stop()
    assert pub.pending == 0


def untracked_after_passes(obj: object) -> bool:
    """Whether the collector no longer traverses ``obj`` nor anything it holds, after two full passes (a pass
    untracks a tuple once everything in it is untracked; an inner tuple met later in the same pass waits
    for the next)."""
    gc.collect()
    gc.collect()
    todo, seen = [obj], set()
    while todo:
        o = todo.pop()
        if id(o) in seen:
            continue
        seen.add(id(o))
        if gc.is_tracked(o):
            return False
        todo.extend(gc.get_referents(o))
    return True


async def test_queued_requests_hold_nothing_the_collector_traverses() -> None:
    """A publisher behind a burst holds thousands of requests: as decisions (a dozen lists each) they made
    every collector pass walk all of them; prepared, the collector drops them after its first passes."""
    metrics = ExtenderMetrics()
    pub = PredictionPublisher(ListSink(), metrics, max_pending=10)  # not started: everything stays queued
    busy = {"running_pods_gCTF": 2.0}
    mixed = Decision(PodInfo("m", "ns", "m", "gCTF", 1.0), ("a", "b", "c"), [10, 5, 1], [100.0, 200.0, 300.0],
                     ["gCTF:gpu", None, "gCTF:gpu:c"], [4, None, 1], [1.0] * 3, [None] * 3, [True, True, False],
                     features=[busy, {}, {}], correction=[2.0, 1.0, 1.0])
    assert pub.offer(decision("a", 3), 1.0) and pub.offer(mixed, 1.0)
    queued = list(pub._queue._queue)  # type: ignore[attr-defined]
    assert len(queued) == 2 and all(untracked_after_passes(q) for q in queued)
    assert not untracked_after_passes(mixed)  # what used to wait in the queue


async def test_publisher_survives_a_failing_sink() -> None:
    class Broken(ListSink):
        async def send_many(self, records: object) -> None:
            raise OSError("broker gone")

    metrics = ExtenderMetrics()
    pub = PredictionPublisher(Broken(), metrics, max_pending=4)
    pub.start()
    pub.offer(decision("a", 2), 1.0)
    pub.offer(decision("b", 1), 1.0)
    await asyncio.wait_for(pub.drain(), 5)
    assert metrics.dropped._value.get() == 5
    await pub.stop()


def test_encoded_records_are_the_contract_values_of_the_decision() -> None:
    idle = {"running_pods_gCTF": 0.0}
    busy = {"running_pods_gCTF": 2.0, "running_pods_upload": 1.0}
    d = Decision(PodInfo("p", "ns", 'uid-"1"', "gCTF", 1.0), ("n0", "n1", "n2", "n3"), [10, 5, 5, 1],
                 [100.0, float("nan"), 250.5, 1e6], ["gCTF:gpu", None, None, "gCTF:gpu:n3"], [4, None, None, 1],
                 [1.0] * 4, [None] * 4, [True, True, True, False], [120.0, float("nan"), 250.5, 9e5],
                 [idle, idle, busy, {}], correction=[1.0, 1.0, 2.0, 1.0])
    parts = list(encode_decision(d, 1_700_000_000.25, chunk=2))
    records = [r for part in parts for r in part]
    assert [len(p) for p in parts] == [2, 1]  # the three fresh candidates (n3 is stale: not published)
    expected = list(decision_values(d, 1_700_000_000.25))
    assert [k for k, _ in records] == [b"n0", b"n1", b"n2"] == [v["node"].encode() for v in expected]
    assert [decode("rtt-predictions", v, strict=True) for _, v in records] == expected
    assert expected[0]["predicted_rtt_ms"] == 120.0 and expected[2]["features"] == busy
    assert expected[1]["predicted_rtt_ms"] is None  # no model covers n1 yet: its features still make a sample
    assert expected[2]["correction"] == 2.0 and "correction" not in expected[0]


def test_encoded_records_of_one_shared_model_and_map_are_the_contract_values() -> None:
    """The usual request (one model, one feature map, no correction) takes the shared-parts path; NaN and
    infinite predictions still become null."""
    idle = {"running_pods_gCTF": 0.0}
    rtts = [120.0, float("nan"), 1e-7, float("inf"), 123456789.125, 2e13]
    nodes = tuple(f"n{i}" for i in range(len(rtts)))
    n = len(rtts)
    d = Decision(PodInfo("p", "ns", "uid-2", "gCTF", 1.0), nodes, [5] * n, rtts, ["gCTF:gpu"] * n, [4] * n,
                 [1.0] * n, [None] * n, [True] * n, rtts, [idle] * n, correction=[1.0] * n)
    records = [r for part in encode_decision(d, 1_700_000_000.5, chunk=3) for r in part]
    expected = list(decision_values(d, 1_700_000_000.5))
    assert [decode("rtt-predictions", v, strict=True) for _, v in records] == expected
    assert [v["predicted_rtt_ms"] for v in expected] == [120.0, None, 1e-7, None, 123456789.125, 1e12]  # at the bound


@pytest.mark.parametrize("shared", [True, False])
@pytest.mark.parametrize(("chosen", "marked"), [("n2", "n2"), ("n0", "n0"), ("n1", None), ("n9", None), (None, None)])
def test_the_chosen_candidate_s_record_alone_is_marked(shared: bool, chosen: str | None, marked: str | None) -> None:
    """Whichever way the records are written (shared parts or not, a stale candidate before the chosen one), only
    the chosen node's value has ``chosen: true``; a stale (unpublished) or unknown node marks none."""
    n = 4
    d = Decision(PodInfo("p", "ns", "uid-3", "gCTF", 1.0), tuple(f"n{i}" for i in range(n)), [5] * n,
                 [100.0, 110.0, 120.0, float("nan")], ["gCTF:gpu"] * n, [4] * n, [1.0] * n, [None] * n,
                 [True, False, True, True], correction=[1.0, 1.0, 1.0 if shared else 1.5, 1.0], winner=0)
    records = [r for part in encode_decision(d, 1_700_000_000.5, chunk=2, chosen=chosen) for r in part]
    expected = list(decision_values(d, 1_700_000_000.5, chosen))
    assert [decode("rtt-predictions", v, strict=True) for _, v in records] == expected
    assert [v["node"] for v in expected if v.get("chosen")] == ([marked] if marked else [])
    assert all("chosen" not in v for v in expected if v["node"] != marked)


async def test_the_publisher_marks_the_node_it_is_told() -> None:
    sink = ListSink()
    pub = PredictionPublisher(sink, ExtenderMetrics(), max_pending=10)
    pub.start()
    assert pub.offer(decision("uid-1", 3), 1.0, "n1") and pub.offer(decision("uid-2", 3), 1.0)
    await pub.drain()
    values = [decode("rtt-predictions", v, strict=True) for _, v in sink.sent]
    assert [(v["task_id"], v["node"]) for v in values if v.get("chosen")] == [("uid-1", "n1")]
    await pub.stop()


def test_records_appended_past_the_batch_layer_read_back_as_appended() -> None:
    from aiokafka.producer.message_accumulator import BatchBuilder
    from aiokafka.record.default_records import DefaultRecordBatch

    from app.extender.kafka_sink import _append

    records = [(f"n{i}".encode(), b'{"v":%d}' % i) for i in range(200)]
    batch = BatchBuilder(1024, 0)
    appended = 0
    for key, value in records:
        if not _append(batch, key, value, 1_700_000_000_123):
            break
        appended += 1
    assert 5 < appended < len(records)  # 1 KB holds some of them: the first that does not fit says so
    batch.close()
    read = list(DefaultRecordBatch(bytes(batch._build())))
    assert [(r.key, r.value, r.offset, r.timestamp) for r in read] == \
        [(k, v, i, 1_700_000_000_123) for i, (k, v) in enumerate(records[:appended])]
