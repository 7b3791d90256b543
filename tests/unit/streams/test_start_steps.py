"""The worker app's start has a step right after its producer and one right after its consumer
(:class:`app.streams.app.StartStep`): ``rttsched worker`` goes back to waiting for Kafka only when a failed start had
not reached the first (the web server, on the port the worker held, and the consumer come after it), and aiokafka's
connection-failure records are left to it until the second."""

from __future__ import annotations

from pathlib import Path

from faust.app.base import BootStrategy

from app.config import Settings
from app.streams.app import create_app, start_steps
from app.streams.options import WorkerOptions


def test_the_steps_follow_the_producer_and_the_consumer_before_the_web_server_and_the_assignors(tmp_path: Path) -> None:
    settings = Settings.from_env({"RTT_METRICS_PORT": "9"})  # web enabled: its server is in the order
    app = create_app(settings, id="steps", options=WorkerOptions.from_settings(settings, datadir=str(tmp_path)))
    steps = start_steps(app)
    order = list(app.boot_strategy.server())
    producer, consumer = order.index(app.producer), order.index(app.consumer)
    assert order[producer + 1] is steps.after_producer
    assert order.index(app.web) > producer + 1
    assert order[consumer + 1] is steps.after_consumer
    assert not steps.after_producer.reached and not steps.after_consumer.reached
    assert steps.after_producer.label == "StartStep(after producer)"


def test_the_order_is_fausts_own_with_the_two_steps_added(tmp_path: Path) -> None:
    settings = Settings.from_env({"RTT_METRICS_PORT": "9"})
    app = create_app(settings, id="order", options=WorkerOptions.from_settings(settings, datadir=str(tmp_path)))
    steps = start_steps(app)
    ours = list(app.boot_strategy.server())
    fausts = list(BootStrategy(app).server())
    assert [s for s in ours if s not in (steps.after_producer, steps.after_consumer)] == fausts
    assert len(ours) == len(fausts) + 2
