"""The extender's stale running-pods view (``rtt_extender_degraded{reason="pods_view_stale"}``) alerts with the
running-pods section of the runbook, not the Redis outage one (``promtool test rules``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from test_alert_rules_fire import _annotations, _promtool


def test_a_stale_pods_view_goes_to_the_pods_section_and_no_longer_to_redis(tmp_path: Path) -> None:
    stale_alert, redis_alert = "RttschedExtenderPodsViewStale", "RttschedDegraded"
    stale = {"series": 'rtt_extender_degraded{job="rttsched-extender", instance="e:8888", reason="pods_view_stale"}',
             "values": "0x2 1x10"}
    view = {"series": 'rtt_extender_degraded{job="rttsched-extender", instance="e:8888", reason="running_view"}',
            "values": "1x10"}

    def fired(alert: str, **labels: str) -> dict[str, Any]:
        note = _annotations(alert)
        for name, value in labels.items():
            note["summary"] = note["summary"].replace(f"{{{{ $labels.{name} }}}}", value)
        return {"exp_labels": {"alertname": alert, "severity": "warning", "job": "rttsched-extender", **labels},
                "exp_annotations": note}

    assert _annotations(stale_alert)["runbook"] == "docs/runbook.md#6-running-pods-view-stale-or-empty"
    _promtool(tmp_path, [{"interval": "1m", "input_series": [stale, view], "alert_rule_test": [
        {"eval_time": "2m", "alertname": stale_alert, "exp_alerts": []},
        {"eval_time": "5m", "alertname": stale_alert, "exp_alerts": [fired(stale_alert, instance="e:8888")]},
        {"eval_time": "5m", "alertname": redis_alert,
         "exp_alerts": [fired(redis_alert, instance="e:8888", reason="running_view")]},
    ]}])
