"""Protocol codec, options and the prediction publisher's bounded queue."""

from __future__ import annotations

import asyncio

import orjson
import pytest
from extkit import ListSink, fixture

from app.config import Settings
from app.contracts.codec import decode
from app.errors import ConfigError
from app.extender.metrics import ExtenderMetrics
from app.extender.options import ExtenderOptions
from app.extender.protocol import ProtocolError, filter_result, parse_args, priority_list
from app.extender.publisher import PredictionPublisher
from app.scheduler.decide import Decision
from app.scheduler.podinfo import PodInfo


def test_parse_both_modes_and_go_style_case_insensitive_keys() -> None:
    nodes = parse_args(orjson.dumps(fixture("args_nodes_gctf.json")))
    assert nodes.node_names == ["gpu-4090-1", "gpu-m40-1", "gpu-k20-1", "cpu-1"] and nodes.node_items is not None
    names = parse_args(b'{"pod": {}, "nodenames": ["a"]}')
    assert names.node_names == ["a"] and names.node_items is None
    empty = parse_args(b'{"Pod": {}, "Nodes": null, "NodeNames": null}')
    assert empty.node_names == [] and filter_result(empty, {})["NodeNames"] == []
    with pytest.raises(ProtocolError, match="Nodes.metadata"):
        parse_args(b'{"Pod": {}, "Nodes": {"metadata": "x", "items": []}}')


def test_filter_result_keeps_order_and_mode() -> None:
    args = parse_args(orjson.dumps(fixture("args_nodes_gctf.json")))
    out = filter_result(args, {"gpu-m40-1": "why"})
    assert [n["metadata"]["name"] for n in out["Nodes"]["items"]] == ["gpu-4090-1", "gpu-k20-1", "cpu-1"]
    assert out["Nodes"]["metadata"] == {"resourceVersion": "47211"}
    assert (out["NodeNames"], out["FailedNodes"], out["Error"]) == (None, {"gpu-m40-1": "why"}, "")
    assert priority_list([("a", 3)]) == [{"Host": "a", "Score": 3}]


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
    sink, metrics = ListSink(), ExtenderMetrics()
    pub = PredictionPublisher(sink, metrics, max_pending=10)
    pub.start()
    assert pub.offer(decision("uid-1", 3), 1_700_000_000.0)
    await pub.drain()
    assert [k for k, _ in sink.sent] == [b"n0", b"n1", b"n2", b"n3"]
    v = decode("rtt-predictions", sink.sent[2][1])
    assert (v["task_id"], v["predicted_rtt_ms"], v["model_version"], v["model_key"]) == ("uid-1", 102.0, 4, "gCTF:gpu")
    assert decode("rtt-predictions", sink.sent[3][1])["predicted_rtt_ms"] is None  # its features still travel
    assert metrics.published._value.get() == 4
    await pub.stop()


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


async def test_publisher_survives_a_failing_sink() -> None:
    class Broken(ListSink):
        async def send(self, key: bytes, value: bytes) -> None:
            raise OSError("broker gone")

    metrics = ExtenderMetrics()
    pub = PredictionPublisher(Broken(), metrics, max_pending=4)
    pub.start()
    pub.offer(decision("a", 2), 1.0)
    pub.offer(decision("b", 1), 1.0)
    await asyncio.wait_for(pub.drain(), 5)
    assert metrics.dropped._value.get() == 5
    await pub.stop()
