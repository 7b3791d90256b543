"""What the trainer's unit tests share: gCTF samples with a learnable RTT, a Kafka consumer at its end, a Kafka
producer that takes every message, and a trainer with both."""

from __future__ import annotations

from typing import Any

import numpy as np

from app.config import Settings
from app.contracts import decode
from app.registry.base import ModelStore
from app.trainer.registry import ModelRegistry
from app.trainer.service import TrainerService

KEY = "gCTF:gpu"


def samples(n: int, seed: int = 0) -> list[dict[str, Any]]:
    """gCTF samples whose RTT follows GPU utilisation (plus 2 % noise)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        util = float(rng.uniform(0, 100))
        out.append({"model_key": KEY, "task_id": f"task-{i}", "app": "gCTF", "node": f"gpu-{i % 3}",
                    "node_class": "gpu", "gpu_model": "Tesla M40", "started_ts": 1_700_000_000.0 + i,
                    "rtt_ms": (300.0 + 6.0 * util) * float(rng.normal(1.0, 0.02)), "input_size_mb": 64.0,
                    "window_s": 30.0, "features": {"nvidia_smi_utilization_gpu__mean": util,
                                                   "cpu_iowait__mean": float(rng.uniform(0, 5))}})
    return out


class AtTheEnd:
    """A Kafka consumer with nothing left to read: the trainer's catch-up returns at once."""

    async def end_offsets(self, tps: list[Any]) -> dict[Any, int]:
        return {}


class Producer:
    """A Kafka producer that takes every message (the model-updates sent, decoded, in ``sent``)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_and_wait(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.sent.append(decode("model-updates", value, strict=True))


def trainer(settings: Settings, store: ModelStore, train_params: dict[str, Any]) -> TrainerService:
    """A trainer on ``store`` (no registry check of its own) with 700 samples of :data:`KEY`, Kafka that answers at
    once: nothing left to read (:class:`AtTheEnd`), a :class:`Producer` for what it sends."""
    svc = TrainerService(settings, registry=ModelRegistry(store=store), selector=None,
                         train_params=train_params, registry_check_s=0)
    for sample in samples(700):
        svc.history.add(sample)
    svc._samples = svc._updates = AtTheEnd()  # type: ignore[assignment]
    svc._producer = Producer()  # type: ignore[assignment]
    return svc
