"""What the worker runs without right now, and its ``/readyz`` page.

A dependency that is away does not stop the worker: without Redis it keeps turning node-metrics into
node-features and joining completions, serving the models it has; the model registry and the
extender's cache are retried. While that lasts the worker is *degraded*: :func:`degraded` records a
reason (``model_store``: a model-updates message could not be loaded; ``redis_cache``: the node-weights
cache write failed), ``rtt_worker_degraded{reason}`` is 1, and ``GET /readyz`` lists it::

    {"ready": true, "degraded": {"model_store": "model registry at redis://...: unavailable ..."}}

:func:`recovered` clears a reason once the dependency answers again.
"""

from __future__ import annotations

import logging
from typing import Any

import faust
import orjson
from prometheus_client import Gauge

from app.masking import mask_url

log = logging.getLogger(__name__)

DEGRADED = Gauge("rtt_worker_degraded", "1 while the worker runs without a dependency (by reason), else 0",
                 ["reason"])
REASONS = ("model_store", "redis_cache")
_now: dict[str, str] = {}

for _reason in REASONS:
    DEGRADED.labels(_reason).set(0)


def degraded(reason: str, detail: str) -> None:
    """Record that the worker runs without ``reason`` (one of :data:`REASONS`)."""
    if reason not in REASONS:
        raise ValueError(f"unknown degraded reason {reason!r}")
    if reason not in _now:
        log.warning("degraded (%s): %s", reason, mask_url(detail))
    _now[reason] = mask_url(detail)[:300]
    DEGRADED.labels(reason).set(1)


def recovered(reason: str) -> None:
    if _now.pop(reason, None) is not None:
        log.info("recovered (%s)", reason)
    DEGRADED.labels(reason).set(0)


def status() -> dict[str, Any]:
    return {"ready": True, "degraded": dict(_now)}


def register_health_page(app: faust.App, path: str = "/readyz") -> None:
    """Serve :func:`status` at ``path`` on the app's web server (when web is enabled)."""

    @app.page(path)
    async def readyz(web: Any, request: Any) -> Any:
        return web.bytes(orjson.dumps(status()), content_type="application/json")
