"""The worker's ``rtt_worker_degraded{reason="kafka"}`` (its own clients wait for the broker as they start) fires
``RttschedBrokerUnreachable`` (runbook section 7), not ``RttschedDegraded`` (the Redis section) (``promtool test
rules``)."""

from __future__ import annotations

from pathlib import Path

from test_alert_rules_fire import _annotations, _promtool

BROKER, REDIS = "RttschedBrokerUnreachable", "RttschedDegraded"


def test_the_workers_kafka_reason_goes_to_the_broker_section(tmp_path: Path) -> None:
    series = {"series": 'rtt_worker_degraded{job="rttsched-worker", instance="w:6066", reason="kafka"}',
              "values": "1x10"}
    note = _annotations(BROKER)
    assert note["runbook"] == "docs/runbook.md#7-the-broker-lost-its-data-or-topics-were-recreated"
    note["summary"] = note["summary"].replace("{{ $labels.instance }}", "w:6066").replace("{{ $labels.reason }}",
                                                                                      "kafka")
    _promtool(tmp_path, [{"interval": "1m", "input_series": [series], "alert_rule_test": [
        {"eval_time": "5m", "alertname": BROKER, "exp_alerts": [
            {"exp_labels": {"alertname": BROKER, "severity": "warning", "job": "rttsched-worker", "instance": "w:6066",
                            "reason": "kafka"}, "exp_annotations": note}]},
        {"eval_time": "5m", "alertname": REDIS, "exp_alerts": []},
    ]}])
