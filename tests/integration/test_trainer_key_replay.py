"""A restarted trainer on the real broker holds the keys a trainer running all along would: a retained sample is as
old as its record's timestamp, not as new as the restart (RTT_TRAINER_MAX_KEYS, RTT_TRAINER_KEY_IDLE_S)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer

from app.config import Settings
from app.contracts import encode
from app.trainer.service import TrainerService

pytestmark = pytest.mark.integration

DAY = 86_400.0


def sample(key: str, i: int) -> dict[str, object]:
    app, node_class = key.split(":")
    return {"model_key": key, "task_id": f"{key}-{i}", "app": app, "node": "cpu-0", "node_class": node_class,
            "gpu_model": None, "started_ts": 1_700_000_000.0 + i, "rtt_ms": 100.0 + i, "input_size_mb": 8.0,
            "window_s": 30.0, "features": {"cpu_iowait__mean": float(i)}}


async def test_the_keys_of_the_retained_samples_are_idle_as_long_as_their_records_say(
        kafka_settings: Settings, tmp_path: Path) -> None:
    """Three keys without a model, two days before a fourth (upload:cpu, 20 samples an hour ago) took their place at
    RTT_TRAINER_MAX_KEYS=3: a trainer starting on that log holds upload:cpu and refuses none of its samples. It used
    to take every sample as new, held the first three keys of the log and dead-lettered upload:cpu's 20."""
    settings = dataclasses.replace(kafka_settings, models_dir=str(tmp_path / "models"))
    now = time.time()
    log = [(sample(f"invented{i}:cpu", 0), now - 2 * DAY - 3_600.0) for i in range(3)]
    log += [(sample("upload:cpu", i), now - 3_600.0 + 60.0 * i) for i in range(20)]
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers)
    await producer.start()
    try:
        for value, produced in log:
            await producer.send(settings.topic("training-samples"), encode("training-samples", value),
                                key=str(value["model_key"]).encode(), timestamp_ms=round(produced * 1000))
        await producer.flush()
    finally:
        await producer.stop()

    async with TrainerService(settings, registry_check_s=0, max_keys=3, catch_up_timeout_s=10.0) as service:
        assert await service.catch_up()
        assert service.history.keys() == ["upload:cpu"] and service.history.count("upload:cpu") == 20
        reg = service.metrics.registry
        assert reg.get_sample_value("rtt_trainer_bad_messages_total",
                                    {"topic": "training-samples", "reason": "model_keys_full"}) is None
        assert reg.get_sample_value("rtt_trainer_keys_dropped_total") == 3.0
