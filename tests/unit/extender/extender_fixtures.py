"""Helpers of the extender tests: a linear predictor, an in-memory prediction sink, a populated service."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from app.clock import ManualClock
from app.config import Settings
from app.extender.metrics import ExtenderMetrics
from app.extender.options import ExtenderOptions
from app.extender.server import ExtenderServer, running
from app.extender.service import ExtenderService
from app.scheduler.policy import Policy

KUBE = Path(__file__).resolve().parents[2] / "fixtures" / "kube"
NOW = 1_715_678_500.0
# fixture nodes -> load (linear model: rtt = 50 + 100 * load + 0.1 * input MB)
LOADS = {"gpu-4090-1": 1.0, "gpu-m40-1": 2.0, "gpu-k20-1": 4.0}
GPU_MODELS = {"gpu-4090-1": "NVIDIA GeForce RTX 4090", "gpu-m40-1": "Tesla M40", "gpu-k20-1": "Tesla K20c"}


def fixture(name: str) -> Any:
    return json.loads((KUBE / name).read_text())


class LinearPredictor:
    def __init__(self, weights: dict[str, float], bias: float = 0.0, fail: bool = False) -> None:
        self._names = tuple(weights)
        self._w = np.array(list(weights.values()), dtype=np.float64)
        self.bias = bias
        self.fail = fail
        self.remember: list[bool] = []  # each call's ``remember``

    @property
    def feature_names(self) -> tuple[str, ...]:
        return self._names

    def predict(self, X: np.ndarray, remember: bool = True) -> np.ndarray:
        self.remember.append(remember)
        if self.fail:
            raise RuntimeError("predictor exploded")
        return self.bias + np.nan_to_num(X.astype(np.float64)) @ self._w


class ListSink:
    """Collects (key, value) pairs; stands in for Kafka only in unit tests of the HTTP layer (with ``metrics``,
    counts them published at once, as the Kafka sink does once the broker acknowledges them)."""

    def __init__(self, metrics: ExtenderMetrics | None = None) -> None:
        self.sent: list[tuple[bytes, bytes]] = []
        self.metrics = metrics

    async def start(self) -> None:
        return None

    async def send_many(self, records: Sequence[tuple[bytes, bytes]]) -> None:
        self.sent.extend(records)
        if self.metrics is not None:
            self.metrics.published.inc(len(records))

    async def close(self) -> None:
        return None


@contextlib.asynccontextmanager
async def http_client(service: ExtenderService, start: bool = True) -> AsyncIterator[Client]:
    """The service served on a free port (background work started), and an HTTP client for it."""
    async with running(service, "127.0.0.1", 0, start=start) as server:
        async with aiohttp.ClientSession(base_url=server.url) as session:
            yield Client(session, server)


class Client:
    """An aiohttp session on the served extender; ``port`` for raw-socket tests."""

    def __init__(self, session: aiohttp.ClientSession, server: ExtenderServer) -> None:
        self.session = session
        self.server = server
        self.port = server.port

    async def get(self, path: str) -> aiohttp.ClientResponse:
        resp = await self.session.get(path)
        await resp.read()
        return resp

    async def post(self, path: str, **kwargs: Any) -> aiohttp.ClientResponse:
        resp = await self.session.post(path, **kwargs)
        await resp.read()
        return resp


def make_service(policy: Policy | None = None, populate: bool = True, **options: Any) -> ExtenderService:
    """A service without Kafka or Redis; the fixture cluster's view installed unless ``populate`` is False."""
    settings = Settings.from_env({})
    opts = ExtenderOptions.from_settings(settings)
    opts = ExtenderOptions(**{**opts.__dict__, "stale_after_s": 30.0, **options})
    service = ExtenderService(settings, opts, policy=policy or Policy(), clock=ManualClock(NOW),
                              sink=ListSink(), kafka=False, redis=False)
    if populate:
        b = service.builder
        for node, load in LOADS.items():
            b.apply_node_features({"node": node, "ts": NOW - 1, "node_class": "gpu", "gpu_model": GPU_MODELS[node],
                                   "window_s": 30.0, "count": 30, "features": {"load__mean": load}})
            b.apply_node_weights({"node": node, "ts": NOW - 1, "weight": 1.0, "predicted_rtt_ms": {}, "stale": False})
        b.apply_node_features({"node": "cpu-1", "ts": NOW - 1, "node_class": "cpu", "gpu_model": None,
                               "window_s": 30.0, "count": 30, "features": {"load__mean": 1.0}})
        b.apply_node_weights({"node": "cpu-1", "ts": NOW - 1, "weight": 1.0,
                              "predicted_rtt_ms": {"gCTF": 5000.0, "Motioncor2": 9000.0}, "stale": False})
        predictor = LinearPredictor({"load__mean": 100.0, "task_input_size_mb": 0.1}, bias=50.0)
        b.set_model("gCTF:gpu", 2, predictor)
        b.set_model("Motioncor2:gpu", 1, predictor)
        service.rebuild(force=True)
    return service


async def until(check: Callable[[], bool], tries: int = 100, step_s: float = 0.01) -> bool:
    """Poll ``check`` every ``step_s`` until it holds (True) or ``tries`` polls have passed (False)."""
    for _ in range(tries):
        await asyncio.sleep(step_s)
        if check():
            return True
    return False


async def start_served(service: ExtenderService) -> None:
    """Start ``service`` and wait for its first snapshot (a forced build)."""
    await service.start()
    service.request_rebuild(force=True)
    assert await until(lambda: service.holder.ready), "no snapshot served"
