"""Each worker app counts on a Prometheus registry of its own; nothing lands on the process-wide default."""

from __future__ import annotations

from pathlib import Path

from prometheus_client import REGISTRY

from app.config import Settings
from app.streams.app import create_app
from app.streams.context import context_of
from app.streams.metrics import WorkerMetrics
from app.streams.options import WorkerOptions


def build(tmp_path: Path, name: str, metrics: WorkerMetrics | None = None):
    settings = Settings.from_env({"RTT_METRICS_PORT": "0"})
    options = WorkerOptions.from_settings(settings, datadir=str(tmp_path / name))
    return create_app(settings, id=f"registry-{name}", options=options, metrics=metrics)


def test_two_apps_in_one_process_count_apart_and_never_on_the_default_registry(tmp_path: Path) -> None:
    a, b = context_of(build(tmp_path, "a")), context_of(build(tmp_path, "b"))
    assert a.metrics.registry is not b.metrics.registry
    a.metrics.messages_in.labels("node-metrics").inc(7)
    a.metrics.feedback.join.labels("matched").inc()
    a.health.degraded("redis_cache", "redis://cache:6379: connection refused")
    assert a.metrics.value("rtt_worker_messages_in_total", topic="node-metrics") == 7
    assert a.metrics.value("rtt_worker_join_total", outcome="matched") == 1
    assert a.metrics.value("rtt_worker_degraded", reason="redis_cache") == 1  # the health gauge is on the app's page
    assert b.metrics.value("rtt_worker_messages_in_total", topic="node-metrics") == 0
    assert b.metrics.value("rtt_worker_degraded", reason="redis_cache") == 0 and b.health.status()["degraded"] == {}
    page = a.metrics.exposition().decode()
    assert 'rtt_worker_messages_in_total{topic="node-metrics"} 7.0' in page and "rtt_worker_join_total" in page
    assert not [m for m in REGISTRY.collect() if m.name.startswith(("rtt_worker", "rtt_kafka", "rtt_bridge"))]


def test_the_process_injects_its_registry_and_the_intakes_count_on_it(tmp_path: Path) -> None:
    mine = WorkerMetrics()
    ctx = context_of(build(tmp_path, "c", mine))
    assert ctx.metrics is mine and ctx.dead.metrics is mine
    nodes = ctx.handles["node_features"]
    assert nodes.intake.metrics is mine and ctx.handles["feedback"].metrics is mine
    assert ctx.handles["feedback"].models.metrics is mine and ctx.handles["feedback"].models.health is ctx.health
    nodes.store.states["n1"] = object()
    assert mine.value("rtt_worker_nodes") == 1  # read from the store when the page is served


def test_the_worker_s_topics_carry_the_configured_replication_factor(tmp_path: Path) -> None:
    from app.streams.topics import contract_topic

    settings = Settings.from_env({"RTT_METRICS_PORT": "0", "RTT_TOPIC_REPLICATION_FACTOR": "3"})
    options = WorkerOptions.from_settings(settings, datadir=str(tmp_path / "rf"))
    app = create_app(settings, id="registry-rf", options=options)
    assert app.conf.topic_replication_factor == 3  # the tables' changelogs, should Faust declare them
    assert contract_topic(app, settings, "node-metrics").replicas == 3
    default = Settings.from_env({"RTT_METRICS_PORT": "0"})
    assert contract_topic(app, default, "node-metrics").replicas == 1  # the contract's
