"""A worker, trainer or bridge that waits for Kafka at start answers its ``/metrics`` (``up`` 1), so
``RttschedComponentDown`` cannot see it: ``rtt_kafka_start_waiting`` 1 for 2 min fires ``RttschedWaitingForKafka``
under either job naming, and bridges that all wait (they send nothing) fire ``RttschedNoBridge``
(``promtool test rules``). Before, a wrong RTT_TOPIC_PREFIX or topics never created waited for ever, unalerted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_alert_rules_fire import _annotations, _promtool

WAITING, NO_BRIDGE = "RttschedWaitingForKafka", "RttschedNoBridge"


def _series(name: str, labels: dict[str, str], values: str) -> dict[str, str]:
    return {"series": name + "{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}", "values": values}


def test_a_service_waiting_for_kafka_more_than_2_min_fires_under_either_job_naming(tmp_path: Path) -> None:
    note = _annotations(WAITING)
    assert note["runbook"] == "docs/runbook.md#7-the-broker-lost-its-data-or-topics-were-recreated"
    worker = {"job": "rttsched-worker", "instance": "w:9102"}
    trainer = {"job": "kubernetes-pods", "app_kubernetes_io_name": "rttsched-trainer", "instance": "10.0.0.7:9103"}
    bridge = {"job": "rttsched-bridge", "instance": "b:9101"}

    def fired(labels: dict[str, str], said: str) -> dict[str, Any]:
        summary = note["summary"].replace(note["summary"].split(" has waited")[0], said)
        return {"exp_labels": {"alertname": WAITING, "severity": "warning", **labels},
                "exp_annotations": {**note, "summary": summary}}

    _promtool(tmp_path, [{"interval": "1m", "input_series": [
        _series("rtt_kafka_start_waiting", worker, "1x20"),  # waits for ever (a wrong RTT_TOPIC_PREFIX)
        _series("rtt_kafka_start_waiting", trainer, "1x20"),
        _series("rtt_kafka_start_waiting", bridge, "1 0x20"),  # waited a minute, then ran: quiet
        *(_series("up", labels, "1x20") for labels in (worker, trainer, bridge)),
    ], "alert_rule_test": [
        {"eval_time": "1m", "alertname": WAITING, "exp_alerts": []},
        {"eval_time": "5m", "alertname": WAITING, "exp_alerts": [
            fired(worker, "rttsched-worker w:9102"), fired(trainer, "rttsched-trainer 10.0.0.7:9103")]},
        {"eval_time": "5m", "alertname": "RttschedComponentDown", "exp_alerts": []},  # they answer: up is 1
    ]}])


def test_no_bridge_fires_when_the_only_bridges_wait_for_kafka_and_not_once_one_runs(tmp_path: Path) -> None:
    fired = [{"exp_labels": {"alertname": NO_BRIDGE, "severity": "critical"},
              "exp_annotations": _annotations(NO_BRIDGE)}]
    bridge = {"job": "rttsched-bridge", "instance": "b:9101"}
    pod = {"job": "kubernetes-pods", "app_kubernetes_io_name": "rttsched-bridge", "instance": "10.0.0.5:9101"}
    worker = {"job": "rttsched-worker", "instance": "w:9102"}
    up = [_series("up", labels, "1x20") for labels in (bridge, pod, worker)]
    _promtool(tmp_path, [
        # both bridges answer /metrics but wait for Kafka; the worker runs (its gauge 0 is no bridge's)
        {"interval": "1m", "input_series": [*up, _series("rtt_kafka_start_waiting", bridge, "1x20"),
                                            _series("rtt_kafka_start_waiting", pod, "1x20"),
                                            _series("rtt_kafka_start_waiting", worker, "0x20")],
         "alert_rule_test": [{"eval_time": "5m", "alertname": NO_BRIDGE, "exp_alerts": fired}]},
        # one of them through its wait: quiet
        {"interval": "1m", "input_series": [*up, _series("rtt_kafka_start_waiting", bridge, "1x20"),
                                            _series("rtt_kafka_start_waiting", pod, "1 0x20")],
         "alert_rule_test": [{"eval_time": "5m", "alertname": NO_BRIDGE, "exp_alerts": []}]},
        {"interval": "1m", "input_series": [*up, _series("rtt_kafka_start_waiting", bridge, "0x20")],
         "alert_rule_test": [{"eval_time": "5m", "alertname": NO_BRIDGE, "exp_alerts": []}]},
        # a bridge of a release without the gauge counts as up, as before
        {"interval": "1m", "input_series": up[:1],
         "alert_rule_test": [{"eval_time": "5m", "alertname": NO_BRIDGE, "exp_alerts": []}]},
    ])
