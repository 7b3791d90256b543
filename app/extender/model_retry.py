"""Model loads that survive Redis being away: tried again with backoff until loaded or superseded.

:func:`retrying_loader` wraps the extender's :data:`~app.extender.models.ModelLoader`. A load that fails
because the registry is unreachable (:class:`~app.extender.models.ModelLoadError` with ``transient``)
waits (doubling up to ``RTT_RETRY_MAX_BACKOFF_S``) and tries again — until it loads, or until the view
holds that version or a newer one of the key (``superseded``), which ends it quietly. A load that fails
for any other reason (a corrupt blob, a sha256 mismatch) fails at once, as before.

While a load waits, :class:`Degraded` reports the extender degraded: ``rtt_extender_degraded{reason=
"model_store"}`` is 1 and ``/readyz`` lists the reason; the view keeps serving with the models it has
(nodes without one get neutral scores, as for a key never trained).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Gauge

from app.extender.models import ModelLoader, ModelLoadError
from app.masking import mask_url
from app.model.base import Predictor
from app.retry import Backoff

log = logging.getLogger(__name__)

MODEL_STORE = "model_store"
RUNNING_VIEW = "running_view"  # the running-pods view in Redis
PODS_VIEW_STALE = "pods_view_stale"  # the running-pods view not confirmed by the pods watcher lately
KAFKA = "kafka"  # the broker the view is read from, once the view has been read (before: /readyz's reason)


class Degraded:
    """Dependencies the extender runs without right now (reason -> detail), and their gauge."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.gauge = Gauge("rtt_extender_degraded", "1 while the extender runs without a dependency (by reason)",
                           ["reason"], registry=registry)
        self.gauge.labels(MODEL_STORE).set(0)
        self.gauge.labels(RUNNING_VIEW).set(0)
        self.gauge.labels(PODS_VIEW_STALE).set(0)
        self.gauge.labels(KAFKA).set(0)
        self.reasons: dict[str, str] = {}
        self._waiting: dict[str, dict[str, int]] = {}  # reason -> what waits on it -> tries

    def waiting(self, reason: str, key: str, detail: str) -> None:
        """``key`` waits for the dependency of ``reason``: logged (WARNING) when the reason starts, not again."""
        waiting = self._waiting.setdefault(reason, {})
        if not waiting:
            log.warning("degraded (%s): %s", reason, mask_url(detail))
        waiting[key] = waiting.get(key, 0) + 1
        self.reasons[reason] = mask_url(detail)[:300]
        self.gauge.labels(reason).set(1)

    def done(self, reason: str, key: str) -> None:
        waiting = self._waiting.get(reason, {})
        if waiting.pop(key, None) is not None and not waiting:
            del self._waiting[reason]
            self.reasons.pop(reason, None)
            self.gauge.labels(reason).set(0)
            log.info("recovered (%s)", reason)


def retrying_loader(loader: ModelLoader, degraded: Degraded, *, max_backoff_s: float,
                    superseded: Callable[[Mapping[str, Any]], bool],
                    on_wait: Callable[[Mapping[str, Any]], None] | None = None) -> ModelLoader:
    """``loader`` with transient failures retried (see the module doc); ``on_wait`` runs on the first wait."""

    async def load(update: Mapping[str, Any]) -> Predictor:
        key, version = str(update["model_key"]), int(update["version"])
        backoff = Backoff.upto(max_backoff_s)
        token = f"{key}@{version}"
        try:
            while True:
                try:
                    return await loader(update)
                except ModelLoadError as exc:
                    if not exc.transient:
                        raise
                    if superseded(update):
                        raise ModelLoadError(f"{key} v{version}: superseded while Redis was away") from exc
                    if backoff.failures == 0:
                        log.warning("model %s v%d: registry unavailable, retrying with backoff", key, version)
                        if on_wait is not None:
                            on_wait(update)
                    degraded.waiting(MODEL_STORE, token, str(exc))
                    await asyncio.sleep(backoff.next())
        finally:
            degraded.done(MODEL_STORE, token)

    return load
