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


def test_every_consumer_on_the_way_from_a_completion_to_a_serving_model_uses_them():
    """The extender's view, the worker's intakes and its model-updates, and the trainer's three consumers
    (samples, retrain-events, model-updates): with aiokafka's default 500 ms, a broker that holds a fetch
    to its bound (Tansu) kept a retrain-event, the samples' catch-up and the trainer's model-updates
    catch-up waiting up to half a second each before a model was announced."""
    import re

    from app.extender import feed
    from app.streams import feedback_models, intake
    from app.trainer import service

    for module, consumers in ((feed, 1), (intake, 1), (feedback_models, 1), (service, 3)):
        source = inspect.getsource(module)
        made = re.findall(r"AIOKafkaConsumer\(([^*]*\*\*\w+)\(", source)
        assert len(made) == consumers, (module.__name__, made)
        assert all(m.endswith("**consumer_options") for m in made), (module.__name__, made)
        assert "fetch_max_wait_ms=" not in source, module.__name__
