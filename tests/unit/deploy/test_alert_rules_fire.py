"""deploy/prometheus/rules.yml evaluated by Prometheus' own rule engine (``promtool test rules``, Debian's
``prometheus`` package): alerts fire on the series the code exports, and stay quiet when all is well.

A counter's label child exists only once it has been incremented, so an alert that compares against one
(retrains *promoted*) must hold when that child was never created — the very case it is there for.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import yaml
from test_alerts import RULES, RULES_FILE


def _annotations(alert: str) -> dict[str, str]:
    (rule,) = [r for r in RULES if r.get("alert") == alert]
    return dict(rule["annotations"])


def _promtool(tmp_path: Path, tests: list[dict[str, Any]]) -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        raise RuntimeError("promtool not found: apt-get install prometheus (bash .ci/run does)")
    spec = tmp_path / "rules_test.yml"
    spec.write_text(yaml.safe_dump({"rule_files": [str(RULES_FILE)], "evaluation_interval": "1m", "tests": tests}))
    done = subprocess.run([promtool, "test", "rules", str(spec)], capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stdout + done.stderr


def test_retrains_rejected_fires_before_any_promotion_and_not_while_promotions_keep_pace(tmp_path: Path) -> None:
    alert = "RttschedRetrainsRejected"
    fired = {"exp_labels": {"alertname": alert, "severity": "info"}, "exp_annotations": _annotations(alert)}
    rejected = {"series": 'rtt_trainer_retrains_total{reason="drift", outcome="rejected"}', "values": "0+2x120"}
    promoted = {"series": 'rtt_trainer_retrains_total{reason="drift", outcome="promoted"}', "values": "0+2x120"}
    _promtool(tmp_path, [
        # nothing ever promoted: the `promoted` child was never created, the alert must still fire
        {"interval": "1m", "input_series": [rejected],
         "alert_rule_test": [{"eval_time": "10m", "alertname": alert, "exp_alerts": []},
                             {"eval_time": "90m", "alertname": alert, "exp_alerts": [fired]}]},
        # as many promotions as rejections: quiet
        {"interval": "1m", "input_series": [rejected, promoted],
         "alert_rule_test": [{"eval_time": "90m", "alertname": alert, "exp_alerts": []}]},
    ])


def test_gpu_hang_fires_for_the_node_whose_readings_are_withheld(tmp_path: Path) -> None:
    """The trouble counter's child of a node appears at its first hung scrape and grows every scrape after."""
    alert = "RttschedGpuHangOrReset"
    note = _annotations(alert)
    note["summary"] = note["summary"].replace("{{ $labels.node }}", "gpu-1")
    hung = {"series": 'rtt_bridge_exporter_trouble_total{node="gpu-1", exporter="dcgm", kind="gpu_hang"}',
            "values": "_x10 1+60x5"}
    healthy = {"series": 'rtt_bridge_exporter_trouble_total{node="gpu-2", exporter="dcgm", kind="no_data"}',
               "values": "0+60x15"}
    _promtool(tmp_path, [{"interval": "1m", "input_series": [hung, healthy], "alert_rule_test": [
        {"eval_time": "5m", "alertname": alert, "exp_alerts": []},
        {"eval_time": "13m", "alertname": alert,
         "exp_alerts": [{"exp_labels": {"alertname": alert, "severity": "warning", "node": "gpu-1"},
                         "exp_annotations": note}]},
    ]}])


def test_a_broker_reason_goes_to_the_broker_section_and_a_registry_reason_to_redis(tmp_path: Path) -> None:
    broker, redis = "RttschedBrokerUnreachable", "RttschedDegraded"
    kafka = {"series": 'rtt_extender_degraded{job="rttsched-extender", instance="e:8888", reason="kafka"}',
             "values": "1x10"}
    outbox = {"series": 'rtt_worker_degraded{job="rttsched-worker", instance="w:6066", reason="errors_outbox"}',
              "values": "1x10"}
    cache = {"series": 'rtt_worker_degraded{job="rttsched-worker", instance="w:6066", reason="redis_cache"}',
             "values": "1x10"}
    models = {"series": 'rtt_trainer_degraded{job="rttsched-trainer", instance="t:6067", reason="model_store"}',
              "values": "1x10"}
    trainer_kafka = {"series": 'rtt_trainer_degraded{job="rttsched-trainer", instance="t:6067", reason="kafka"}',
                     "values": "1x10"}

    def fired(alert: str, series: dict[str, str], job: str, instance: str, reason: str) -> dict[str, Any]:
        note = _annotations(alert)
        note["summary"] = note["summary"].replace("{{ $labels.instance }}", instance).replace(
            "{{ $labels.reason }}", reason)
        return {"exp_labels": {"alertname": alert, "severity": "warning", "job": job, "instance": instance,
                               "reason": reason}, "exp_annotations": note}

    _promtool(tmp_path, [{"interval": "1m", "input_series": [kafka, outbox, cache, models, trainer_kafka],
                          "alert_rule_test": [
        {"eval_time": "5m", "alertname": broker, "exp_alerts": [
            fired(broker, kafka, "rttsched-extender", "e:8888", "kafka"),
            fired(broker, outbox, "rttsched-worker", "w:6066", "errors_outbox"),
            fired(broker, trainer_kafka, "rttsched-trainer", "t:6067", "kafka")]},
        {"eval_time": "5m", "alertname": redis, "exp_alerts": [
            fired(redis, cache, "rttsched-worker", "w:6066", "redis_cache"),
            fired(redis, models, "rttsched-trainer", "t:6067", "model_store")]},
    ]}])


def test_two_hosts_behind_a_target_fires_for_its_node_and_not_for_other_trouble(tmp_path: Path) -> None:
    alert = "RttschedExporterTwoHosts"
    note = _annotations(alert)
    note["summary"] = note["summary"].replace("{{ $labels.node }}", "cpu-3")
    turns = {"series": 'rtt_bridge_exporter_trouble_total{node="cpu-3", exporter="node_exporter", kind="two_hosts"}',
             "values": "_x10 1+60x5"}
    other = {"series": 'rtt_bridge_exporter_trouble_total{node="cpu-4", exporter="node", kind="scrape_failed"}',
             "values": "0+60x15"}
    _promtool(tmp_path, [{"interval": "1m", "input_series": [turns, other], "alert_rule_test": [
        {"eval_time": "5m", "alertname": alert, "exp_alerts": []},
        {"eval_time": "13m", "alertname": alert,
         "exp_alerts": [{"exp_labels": {"alertname": alert, "severity": "warning", "node": "cpu-3"},
                         "exp_annotations": note}]},
    ]}])


def test_predictions_off_fires_for_the_app_whose_predictions_stay_off_not_for_a_spike(tmp_path: Path) -> None:
    """A model promoted at minute 10 that predicts badly (MAPE 0.8 from then on); another app's model spikes to 0.9
    for three periods and comes back; a third predicts well."""
    alert = "RttschedPredictionsOff"
    note = _annotations(alert)
    note["summary"] = note["summary"].replace("{{ $labels.app }}", "gCTF").replace("{{ $labels.node_class }}", "gpu")
    bad = {"series": 'rtt_worker_prediction_mape{instance="w:6066", app="gCTF", node_class="gpu"}',
           "values": "0.1x10 0.8x40"}
    spike = {"series": 'rtt_worker_prediction_mape{instance="w:6066", app="Motioncor2", node_class="gpu"}',
             "values": "0.1x20 0.9x3 0.1x27"}
    good = {"series": 'rtt_worker_prediction_mape{instance="w:6066", app="upload", node_class="cpu"}',
            "values": "0.05x50"}
    _promtool(tmp_path, [{"interval": "1m", "input_series": [bad, spike, good], "alert_rule_test": [
        {"eval_time": "16m", "alertname": alert, "exp_alerts": []},
        {"eval_time": "40m", "alertname": alert,
         "exp_alerts": [{"exp_labels": {"alertname": alert, "severity": "warning", "app": "gCTF", "node_class": "gpu"},
                         "exp_annotations": note}]},
    ]}])


def test_gpu_lost_fires_at_once_for_its_node_and_not_for_other_gpu_trouble(tmp_path: Path) -> None:
    """One lost GPU counts once per scrape from the first page that shows it; a hung GPU elsewhere is not one."""
    alert = "RttschedGpuLost"
    note = _annotations(alert)
    note["summary"] = note["summary"].replace("{{ $labels.node }}", "gpu-1")
    lost = {"series": 'rtt_bridge_exporter_trouble_total{node="gpu-1", exporter="dcgm_exporter", kind="gpu_lost"}',
            "values": "_x10 1+60x5"}
    hung = {"series": 'rtt_bridge_exporter_trouble_total{node="gpu-2", exporter="dcgm_exporter", kind="gpu_hang"}',
            "values": "0+60x15"}
    _promtool(tmp_path, [{"interval": "1m", "input_series": [lost, hung], "alert_rule_test": [
        {"eval_time": "5m", "alertname": alert, "exp_alerts": []},
        {"eval_time": "11m", "alertname": alert,
         "exp_alerts": [{"exp_labels": {"alertname": alert, "severity": "warning", "node": "gpu-1"},
                         "exp_annotations": note}]},
    ]}])


def test_gpu_node_read_as_cpu_fires_for_a_node_with_gpu_capacity_the_bridge_reads_as_a_cpu_node(tmp_path: Path) -> None:
    alert = "RttschedGpuNodeReadAsCpu"
    note = _annotations(alert)
    note["summary"] = note["summary"].replace("{{ $labels.node }}", "gpu-1")
    capacity = [{"series": f'kube_node_status_capacity{{node="{n}", resource="nvidia_com_gpu", unit="integer"}}',
                 "values": f"{g}x30"} for n, g in (("gpu-1", 2), ("gpu-2", 1))]
    cores = {"series": 'kube_node_status_capacity{node="cpu-1", resource="cpu", unit="core"}', "values": "16x30"}
    read = [{"series": f'rtt_bridge_node_gpu{{node="{n}", job="rttsched-bridge", instance="{n}:9101"}}',
             "values": f"{v}x30"} for n, v in (("gpu-1", 0), ("gpu-2", 1), ("cpu-1", 0))]
    _promtool(tmp_path, [
        {"interval": "1m", "input_series": [*capacity, cores, *read], "alert_rule_test": [
            {"eval_time": "5m", "alertname": alert, "exp_alerts": []},
            {"eval_time": "11m", "alertname": alert,
             "exp_alerts": [{"exp_labels": {"alertname": alert, "severity": "warning", "node": "gpu-1"},
                             "exp_annotations": note}]}]},
        # without kube-state-metrics there is nothing to compare with: quiet
        {"interval": "1m", "input_series": read,
         "alert_rule_test": [{"eval_time": "20m", "alertname": alert, "exp_alerts": []}]},
    ])


def test_component_down_fires_under_either_job_naming_and_names_the_component(tmp_path: Path) -> None:
    """prometheus.yml and the PodMonitor name the job after the component; a `kubernetes-pods` job that honours
    the prometheus.io/* annotations keeps its own job name and maps the pod's labels."""
    alert = "RttschedComponentDown"
    note = _annotations(alert)
    cases = [({"job": "rttsched-worker", "instance": "w:9102"}, "rttsched-worker w:9102"),
             ({"job": "kubernetes-pods", "app_kubernetes_io_name": "rttsched-worker", "instance": "10.0.0.7:9102"},
              "rttsched-worker 10.0.0.7:9102")]
    tests = []
    for labels, said in cases:
        series = "up{" + ", ".join(f'{k}="{v}"' for k, v in labels.items()) + "}"
        other = {"job": "kubernetes-pods", "app_kubernetes_io_name": "someone-else", "instance": "10.0.0.9:80"}
        tests.append({"interval": "1m", "input_series": [
            {"series": series, "values": "1x5 0x10"},
            {"series": "up{" + ", ".join(f'{k}="{v}"' for k, v in other.items()) + "}", "values": "0x15"}],
            "alert_rule_test": [
                {"eval_time": "5m", "alertname": alert, "exp_alerts": []},
                {"eval_time": "9m", "alertname": alert, "exp_alerts": [
                    {"exp_labels": {"alertname": alert, "severity": "warning", **labels},
                     "exp_annotations": {**note, "summary": note["summary"].replace(
                         note["summary"].split(" does not")[0], said)}}]}]})
    _promtool(tmp_path, tests)


def test_no_bridge_fires_only_when_no_bridge_is_up_under_either_job_naming(tmp_path: Path) -> None:
    alert = "RttschedNoBridge"
    fired = [{"exp_labels": {"alertname": alert, "severity": "critical"},
              "exp_annotations": _annotations(alert)}]
    worker = {"series": 'up{job="rttsched-worker", instance="w:9102"}', "values": "1x15"}
    _promtool(tmp_path, [
        {"interval": "1m", "input_series": [worker],
         "alert_rule_test": [{"eval_time": "5m", "alertname": alert, "exp_alerts": fired}]},
        {"interval": "1m", "input_series": [worker, {"series": 'up{job="rttsched-bridge", instance="b:9101"}',
                                                     "values": "1x15"}],
         "alert_rule_test": [{"eval_time": "5m", "alertname": alert, "exp_alerts": []}]},
        {"interval": "1m", "input_series": [worker, {
            "series": 'up{job="kubernetes-pods", app_kubernetes_io_name="rttsched-bridge", instance="10.0.0.5:9101"}',
            "values": "1x15"}],
         "alert_rule_test": [{"eval_time": "5m", "alertname": alert, "exp_alerts": []}]},
    ])


def test_revoke_checkpoints_lost_fires_for_the_table_whose_checkpoint_failed_until_it_is_an_hour_old(
        tmp_path: Path) -> None:
    """Each table's child exists from the worker's start at 0 (created with the table); two partitions of
    node-window leave without their checkpoint at 10 min: the alert names that table, not feedback, whose
    checkpoints were all stored, and is quiet again once the failure is more than an hour old."""
    alert = "RttschedRevokeCheckpointsLost"
    note = _annotations(alert)
    note["summary"] = note["summary"].replace("{{ $labels.table }}", "node-window")
    failed = {"series": 'rtt_worker_revoke_checkpoint_failures_total{table="node-window"}', "values": "0x10 2x120"}
    stored = {"series": 'rtt_worker_revoke_checkpoint_failures_total{table="feedback"}', "values": "0x130"}
    fired = {"exp_labels": {"table": "node-window", "severity": "info"}, "exp_annotations": note}
    _promtool(tmp_path, [{"interval": "1m", "input_series": [failed, stored], "alert_rule_test": [
        {"eval_time": "9m", "alertname": alert, "exp_alerts": []},
        {"eval_time": "11m", "alertname": alert, "exp_alerts": [fired]},
        {"eval_time": "60m", "alertname": alert, "exp_alerts": [fired]},
        {"eval_time": "75m", "alertname": alert, "exp_alerts": []},
    ]}])
