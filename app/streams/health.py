"""What the worker runs without right now, and its ``/readyz`` page.

A dependency that is away does not stop the worker: without Redis it keeps turning node-metrics into
node-features and joining completions, serving the models it has; the model registry and the
extender's cache are retried. While that lasts the worker is *degraded*: :meth:`Health.degraded` records
a reason (``model_store``: a model-updates message could not be loaded; ``redis_cache``: the node-weights
cache write failed; ``errors_outbox``: prediction-errors messages restored after a restart could not be
looked for in their topic yet, so they wait unsent; ``kafka``: one of the worker's own Kafka clients, the intakes'
or the model-updates reader's, waits out a broker gone as it starts, :meth:`Health.waiting` naming which and for how
long), ``rtt_worker_degraded{reason}`` is 1, and ``GET /readyz`` lists it::

    {"ready": true, "degraded": {"model_store": "model registry at redis://...: unavailable ..."}}

It answers so once the worker's Kafka consumer has started (its producer starts before it): Faust's web server runs
from before the consumer's start, and until that has finished ``/readyz`` answers 503 ``not ready: kafka: its consumer
starting`` (:data:`CONSUMER_STARTING`), as the worker's wait for its broker answers ``not ready: kafka: …`` before
Faust runs (:func:`app.health.answer_while_waiting`). From the start of the worker's stop (SIGTERM), or once it
crashed, it answers 503 ``not ready: the worker is stopping`` (:data:`STOPPING`) until the web server stops: Faust
stops the tables, the agents and the consumer before it.

:meth:`Health.recovered` clears a reason once the dependency answers again. Each worker app has its own
:class:`Health`, its gauge in the app's registry.

>>> from prometheus_client import CollectorRegistry
>>> h = Health(CollectorRegistry())
>>> h.degraded("redis_cache", "redis://:secret@cache:6379: connection refused")
>>> h.status()["degraded"]["redis_cache"], h.gauge.labels("redis_cache")._value.get()
('redis://:***@cache:6379: connection refused', 1.0)
>>> h.recovered("redis_cache"); h.status()
{'ready': True, 'degraded': {}}
>>> h.waiting("kafka", "a", "a: down"); h.waiting("kafka", "b", "b: down"); h.status()["degraded"]
{'kafka': 'a: down; b: down'}
>>> h.done("kafka", "a"); h.status()["degraded"], h.done("kafka", "b"), h.status()["degraded"]
({'kafka': 'b: down'}, None, {})
"""

from __future__ import annotations

import logging
from typing import Any

import faust
import orjson
from prometheus_client import CollectorRegistry, Gauge

from app.masking import mask_url

log = logging.getLogger(__name__)

KAFKA = "kafka"  # the worker's own clients (intakes, model-updates reader) wait for the broker as they start
REASONS = ("model_store", "redis_cache", "errors_outbox", KAFKA)
CONSUMER_STARTING = "kafka: its consumer starting"  # /readyz 503 says it until the worker's consumer has started
STOPPING = "the worker is stopping"  # /readyz 503 says it once the worker stops or crashed, until its web server stops


class Health:
    """The reasons one worker runs degraded now, and ``rtt_worker_degraded{reason}`` in ``registry``."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.gauge = Gauge("rtt_worker_degraded", "1 while the worker runs without a dependency (by reason), else 0",
                           ["reason"], registry=registry if registry is not None else CollectorRegistry())
        self._now: dict[str, str] = {}
        self._waiting: dict[str, dict[str, str]] = {}  # reason -> what waits on it -> its detail
        for reason in REASONS:
            self.gauge.labels(reason).set(0)

    def degraded(self, reason: str, detail: str) -> None:
        """Record that the worker runs without ``reason`` (one of :data:`REASONS`)."""
        if reason not in REASONS:
            raise ValueError(f"unknown degraded reason {reason!r}")
        if reason not in self._now:
            log.warning("degraded (%s): %s", reason, mask_url(detail))
        self._now[reason] = mask_url(detail)[:300]
        self.gauge.labels(reason).set(1)

    def recovered(self, reason: str) -> None:
        if self._now.pop(reason, None) is not None:
            log.info("recovered (%s)", reason)
        self.gauge.labels(reason).set(0)

    def waiting(self, reason: str, key: str, detail: str) -> None:
        """``key`` waits for the dependency of ``reason``: the reason's detail is each waiting key's (300 characters at
        most), joined with ``; ``. Not logged here: what waits says so itself (:class:`~app.streams.intake.StartWait`).
        """
        if reason not in REASONS:
            raise ValueError(f"unknown degraded reason {reason!r}")
        waiting = self._waiting.setdefault(reason, {})
        waiting[key] = mask_url(detail)[:300]
        self._now[reason] = "; ".join(waiting.values())
        self.gauge.labels(reason).set(1)

    def done(self, reason: str, key: str) -> None:
        """``key`` no longer waits for ``reason``'s dependency: the reason is cleared once nothing waits on it."""
        waiting = self._waiting.get(reason, {})
        if waiting.pop(key, None) is None:
            return
        if waiting:
            self._now[reason] = "; ".join(waiting.values())
            return
        del self._waiting[reason]
        self._now.pop(reason, None)
        self.gauge.labels(reason).set(0)

    def status(self) -> dict[str, Any]:
        return {"ready": True, "degraded": dict(self._now)}


def register_health_page(app: faust.App, health: Health, path: str = "/readyz") -> None:
    """Serve ``health.status()`` at ``path`` on the app's web server (when web is enabled) once the app's consumer
    has started (the step after it in its boot, :class:`app.streams.app.WorkerBoot`, reached); until then 503
    ``not ready: kafka: its consumer starting``, and from the start of the app's stop (or its crash) 503 ``not
    ready: the worker is stopping``. Two attribute reads per request."""
    after_consumer = getattr(app.boot_strategy, "after_consumer", None)  # none: an app not built by create_app

    @app.page(path)
    async def readyz(web: Any, request: Any) -> Any:
        if after_consumer is not None:
            if not after_consumer.reached:
                return web.text(f"not ready: {CONSUMER_STARTING}\n", status=503)  # text/plain; charset=utf-8
            if app.should_stop:  # stopping (SIGTERM) or crashed: its consumer stops before the web server does
                return web.text(f"not ready: {STOPPING}\n", status=503)
        return web.bytes(orjson.dumps(health.status()), content_type="application/json")
