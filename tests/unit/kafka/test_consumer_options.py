"""Consumers that must see messages soon after they are produced read with RTT_KAFKA_FETCH_MAX_WAIT_MS."""

from __future__ import annotations

import inspect

from app.config import Settings
from app.kafka.client import client_options, consumer_options


def test_consumer_options_carry_the_fetch_wait_and_the_connection():
    s = Settings.from_env({"RTT_KAFKA_BOOTSTRAP": "k:9092", "RTT_KAFKA_FETCH_MAX_WAIT_MS": "80"})
    opts = consumer_options(s, group_id=None, enable_auto_commit=False)
    assert opts["fetch_max_wait_ms"] == 80
    assert opts["group_id"] is None and opts["enable_auto_commit"] is False
    assert {k: v for k, v in opts.items() if k in client_options(s)} == client_options(s)


def test_the_extender_view_and_the_worker_intakes_use_them():
    from app.extender import feed
    from app.streams import intake

    for module in (feed, intake):
        source = inspect.getsource(module)
        assert "AIOKafkaConsumer(**consumer_options(" in source, module.__name__
        assert "fetch_max_wait_ms=" not in source, module.__name__
