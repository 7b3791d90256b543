"""A models directory (the registry without Redis) that cannot be used is waited out like Redis away.

Each outage is real: the directory replaced by a file (every read and write fails with ``Not a directory``), a
file size limit of the process (``RLIMIT_FSIZE``: a write that does not fit fails mid-file, as on a full disk;
``File too large``), or the directory made read-only (only where permissions bind: not as root). The store names
the directory and the OS error in a :class:`RegistryUnavailableError`; the trainer logs one WARNING line without a
traceback, counts the retry, reports itself degraded, does not train again while the model has no room, and
saves the model once the directory takes it.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from trainer_samples import KEY, AtTheEnd, samples

from app.config import Settings
from app.contracts import decode
from app.model.errors import IntegrityError, RegistryUnavailableError
from app.registry.directory import DirectoryModelStore
from app.registry.store import load_predictor
from app.trainer.registry import ModelRegistry
from app.trainer.service import TrainerService

FAST = {"n_estimators": 60, "max_depth": 6}
LIMIT_BYTES = 4096  # the file size limit of the size-limit outage: below every blob these tests train


class ReplacedByFile:
    """The models directory moved away and a plain file put at its path."""

    error = "Not a directory"

    def __init__(self, root: Path) -> None:
        self.root = root
        self.aside = root.with_name(root.name + ".aside")

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.root.rename(self.aside)
        self.root.write_text("not a directory\n")

    def end(self) -> None:
        self.root.unlink()
        self.aside.rename(self.root)


class FileSizeLimit:
    """Files of this process may not grow past :data:`LIMIT_BYTES` (``SIGXFSZ`` ignored, so a write fails)."""

    error = "File too large"

    def __init__(self, root: Path) -> None:
        self.root = root
        self._limits = resource.getrlimit(resource.RLIMIT_FSIZE)
        self._handler: Any = None

    def start(self) -> None:
        self._handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (LIMIT_BYTES, self._limits[1]))

    def end(self) -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, self._limits)
        signal.signal(signal.SIGXFSZ, self._handler)


Outage = ReplacedByFile | FileSizeLimit  # a read-only directory binds no root process, and tests may run as root
OUTAGES = [ReplacedByFile, FileSizeLimit]


class Producer:
    """A Kafka producer that takes every message (the model-updates sent, decoded, in ``sent``)."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []

    async def send_and_wait(self, topic: str, value: bytes, key: bytes | None = None) -> None:
        self.sent.append(decode("model-updates", value, strict=True))


def trainer(root: Path) -> tuple[TrainerService, Producer]:
    """A trainer on the directory store at ``root`` with 300 samples of :data:`KEY` and Kafka that answers."""
    settings = Settings.from_env({}, models_dir=str(root), retry_max_backoff_s=0.05)
    service = TrainerService(settings, registry=ModelRegistry(store=DirectoryModelStore(root)), selector=None,
                             train_params=FAST, registry_check_s=0)
    for sample in samples(300):
        service.history.add(sample)
    producer = Producer()
    service._samples = service._updates = AtTheEnd()  # type: ignore[assignment]
    service._producer = producer  # type: ignore[assignment]
    return service, producer


def value(service: TrainerService, name: str, labels: dict[str, str] | None = None) -> float:
    return service.metrics.registry.get_sample_value(name, labels or {}) or 0.0


async def until(done: Callable[[], bool], timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, "timed out"
        await asyncio.sleep(0.01)


@pytest.mark.parametrize("outage", OUTAGES)
def test_the_store_names_the_directory_and_the_os_error(tmp_path: Path, outage: type[Outage]) -> None:
    root = tmp_path / "models"
    store = DirectoryModelStore(root)
    blob = os.urandom(4 * LIMIT_BYTES)  # larger than the size limit
    fields: dict[str, Any] = {"fmt": "ubj", "features": ["a"], "params": {}, "metrics": {}, "n_samples": 1}
    broken = outage(root)
    broken.start()
    try:
        with pytest.raises(RegistryUnavailableError, match=f"^models directory {root}: {broken.error}"):
            store.save(KEY, blob, **fields)
        with pytest.raises(RegistryUnavailableError, match=broken.error):
            store.check_writable(KEY, len(blob))
    finally:
        broken.end()
    assert not [p for p in root.rglob("*") if p.name.endswith(".tmp")]  # nothing half-written left behind
    store.check_writable(KEY, len(blob))
    record = store.save(KEY, blob, **fields)
    store.promote(KEY, record.version)
    assert store.load(KEY) == (blob, record)
    (root / KEY / f"{record.version}.ubj").write_bytes(b"tampered")
    with pytest.raises(IntegrityError):  # a broken model is no directory condition: it stays what it was
        store.load(KEY)


@pytest.mark.parametrize("outage", OUTAGES)
def test_a_retrain_waits_for_the_models_directory_then_saves_the_model(
        tmp_path: Path, outage: type[Outage], caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "models"
    service, producer = trainer(root)
    caplog.set_level(logging.INFO)
    broken = outage(root)

    async def go() -> Any:
        broken.start()
        try:
            task = service.submit({"model_key": KEY, "reason": "drift", "ts": time.time(), "onset_ts": None})
            assert task is not None
            await until(lambda: value(service, "rtt_trainer_retrain_retries_total", {"step": "registry"}) >= 1)
            trained = value(service, "rtt_trainer_training_seconds_count")
            await asyncio.sleep(0.5)  # ten backoff waits and more
            assert not task.done()
            assert value(service, "rtt_trainer_degraded", {"reason": "model_store"}) == 1.0
            assert value(service, "rtt_trainer_retrain_retries_total", {"step": "registry"}) == 1.0
            assert value(service, "rtt_trainer_training_seconds_count") == trained  # no training without room
        finally:
            broken.end()
        return await asyncio.wait_for(task, 60)

    outcome = asyncio.run(go())
    service._executor.shutdown(wait=True)

    loud = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert [r.exc_info for r in loud] == [None] * len(loud)  # no traceback
    assert not [r for r in loud if r.levelno >= logging.ERROR]
    waits = [r.getMessage() for r in loud if r.name == "app.trainer.service"]
    assert len(waits) == 1 and f"retrain of {KEY}: models directory {root}: {broken.error}" in waits[0]

    assert (outcome.outcome, outcome.version) == ("promoted", 1)
    assert value(service, "rtt_trainer_retrains_total", {"reason": "drift", "outcome": "failed"}) == 0.0
    assert value(service, "rtt_trainer_degraded", {"reason": "model_store"}) == 0.0
    predictor, record = load_predictor(service.registry.store, KEY)  # saved, current, and served
    assert [u["version"] for u in producer.sent] == [1] and producer.sent[0]["sha256"] == record.sha256
    assert len(service.registry.store.load(KEY)[0]) > LIMIT_BYTES  # the size limit did stop this blob
    assert np.isfinite(predictor.predict(np.zeros((1, len(record.features)), np.float32))).all()
