"""The trainer refusing a new model key's samples at ``RTT_TRAINER_MAX_KEYS`` (``model_keys_full``) alerts: the
app of that key gets no model until another key is idle a day, and nothing else says so (``promtool test rules``)."""

from __future__ import annotations

from pathlib import Path

from test_alert_rules_fire import _annotations, _promtool

ALERT = "RttschedTrainerKeysFull"


def _bad(reason: str, values: str) -> dict[str, str]:
    return {"series": f'rtt_trainer_bad_messages_total{{job="rttsched-trainer", instance="t:9103",'
                      f' topic="training-samples", reason="{reason}"}}', "values": values}


def test_keys_full_fires_while_a_new_key_s_samples_are_refused_and_not_for_other_bad_samples(tmp_path: Path) -> None:
    fired = {"exp_labels": {"alertname": ALERT, "severity": "warning"}, "exp_annotations": _annotations(ALERT)}
    section = "11-a-new-app-gets-no-model-the-trainers-model-keys-are-full"
    assert _annotations(ALERT)["runbook"] == f"docs/runbook.md#{section}"
    # the counter's child appears with the first refusal (at 10 min) and grows with each sample of the key until
    # 30 min (its app stopped, or the cap raised); a schema refusal all along is another alert's matter
    refused = _bad("model_keys_full", "_x10 1+3x20 61x40")
    schema = _bad("schema", "0+5x70")
    _promtool(tmp_path, [{"interval": "1m", "input_series": [refused, schema], "alert_rule_test": [
        {"eval_time": "9m", "alertname": ALERT, "exp_alerts": []},
        {"eval_time": "12m", "alertname": ALERT, "exp_alerts": [fired]},
        {"eval_time": "40m", "alertname": ALERT, "exp_alerts": [fired]},  # the last refusal within 15 min
        {"eval_time": "50m", "alertname": ALERT, "exp_alerts": []},
    ]}])
