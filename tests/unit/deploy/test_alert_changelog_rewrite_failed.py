"""A recovery that could not mark a recreated changelog partition's state to be written again
(``rtt_worker_changelog_rewrite_failures_total{table}``) alerts on its own: the rewind before it is counted in
``rtt_worker_changelog_rewinds_total`` either way, so ``RttschedBrokerDataLost`` cannot tell the operator that
restarting that worker now would restore its tables without their history (``promtool test rules``)."""

from __future__ import annotations

from pathlib import Path

from test_alert_rules_fire import _annotations, _promtool

ALERT = "RttschedChangelogRewriteFailed"
SECTION = "7-the-broker-lost-its-data-or-topics-were-recreated"


def _series(metric: str, instance: str, values: str) -> dict[str, str]:
    return {"series": f'{metric}{{job="rttsched-worker", instance="{instance}", table="node-window"}}',
            "values": values}


def test_rewrite_failed_fires_for_the_worker_whose_marking_failed_and_not_for_a_rewind_written_again(
        tmp_path: Path) -> None:
    assert _annotations(ALERT)["runbook"] == f"docs/runbook.md#{SECTION}"
    note = _annotations(ALERT)
    note["summary"] = note["summary"].replace("{{ $labels.instance }}", "w1:6066").replace(
        "{{ $labels.table }}", "node-window")
    fired = {"exp_labels": {"alertname": ALERT, "severity": "warning", "instance": "w1:6066", "table": "node-window"},
             "exp_annotations": note}
    # both workers find two partitions recreated at 10 min (the counter's child of each appears then); only w1's
    # marking fails, its failures child appearing at the same time and never growing again
    rewinds_w1 = _series("rtt_worker_changelog_rewinds_total", "w1:6066", "_x10 2x90")
    rewinds_w2 = _series("rtt_worker_changelog_rewinds_total", "w2:6066", "_x10 2x90")
    failed_w1 = _series("rtt_worker_changelog_rewrite_failures_total", "w1:6066", "_x10 2x90")
    _promtool(tmp_path, [{"interval": "1m", "input_series": [rewinds_w1, rewinds_w2, failed_w1], "alert_rule_test": [
        {"eval_time": "9m", "alertname": ALERT, "exp_alerts": []},
        {"eval_time": "11m", "alertname": ALERT, "exp_alerts": [fired]},
        {"eval_time": "60m", "alertname": ALERT, "exp_alerts": [fired]},  # an hour to let the windows refill
        {"eval_time": "80m", "alertname": ALERT, "exp_alerts": []},
    ]}, {"interval": "1m", "input_series": [
        # a worker whose marking failed long ago (quiet by now) and fails again at 120 min: the child grows
        _series("rtt_worker_changelog_rewrite_failures_total", "w1:6066", "2x119 3x30"),
    ], "alert_rule_test": [
        {"eval_time": "100m", "alertname": ALERT, "exp_alerts": []},
        {"eval_time": "122m", "alertname": ALERT, "exp_alerts": [fired]},
    ]}])
