"""RTT_TRAINER_MAX_KEYS: a producer inventing model keys no longer makes the trainer hold a history and a metric series
per key. 20,000 invented keys used to leave 20,000 histories and ``rtt_trainer_key_samples_total`` series (/metrics
5 KB -> 2.8 MB) until each was idle a day; now the trainer holds at most its bound, refuses (counts, dead-letters,
logs once per period) the samples of new keys beyond it, and a key with a model still gets in, in the place of the
key without a model idle longest -- whose series goes with it."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from prometheus_client import generate_latest
from trainer_samples import AtTheEnd, samples

from app.clock import ManualClock
from app.config import Settings
from app.contracts import encode
from app.errors import ConfigError
from app.trainer.service import TrainerService

INVENTED = 20_000


class Samples:
    """A training-samples consumer that hands out ``batches`` one per fetch, then nothing (``drained`` set)."""

    def __init__(self, batches: list[list[dict[str, Any]]], clock: ManualClock) -> None:
        self.batches = batches
        self.clock = clock
        self.offset = 0
        self.drained = asyncio.Event()

    async def getmany(self, **kw: Any) -> dict[Any, list[Any]]:
        if not self.batches:
            self.drained.set()
            await asyncio.sleep(0.01)
            return {}
        self.clock.advance(1.0)  # each batch a second after the one before
        records = []
        for sample in self.batches.pop(0):
            records.append(SimpleNamespace(topic="training-samples", partition=0, offset=self.offset,
                                           key=sample["model_key"].encode(), value=encode("training-samples", sample),
                                           timestamp=-1))
            self.offset += 1
        return {TopicPartition("training-samples", 0): records}


class Guard:
    client = "trainer-samples"

    def note(self, batches: Any) -> None:
        pass

    async def after_fetch(self) -> dict[Any, int]:
        return {}


def of(key: str, n: int = 1, start: int = 0) -> list[dict[str, Any]]:
    app, node_class = key.split(":")
    return [{**s, "model_key": key, "app": app, "node_class": node_class, "task_id": f"{key}-{start + i}",
             "started_ts": 1_700_000_000.0 + i} for i, s in enumerate(samples(n))]


def consume(service: TrainerService, batches: list[list[dict[str, Any]]]) -> None:
    """Run the trainer's samples loop over ``batches`` until it has taken them all."""
    consumer = Samples(batches, service.clock)  # type: ignore[arg-type]
    service._samples = consumer  # type: ignore[assignment]
    service._sample_guard = Guard()  # type: ignore[assignment]

    async def go() -> None:
        task = asyncio.create_task(service._consume_samples())
        drained = asyncio.create_task(consumer.drained.wait())
        await asyncio.wait([task, drained], timeout=120, return_when=asyncio.FIRST_COMPLETED)
        assert drained.done(), task.exception() if task.done() else "not drained in 120 s"
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(go())


@pytest.fixture
def service(tmp_path: Path) -> TrainerService:
    svc = TrainerService(Settings.from_env({}, models_dir=str(tmp_path / "models")), registry_check_s=0,
                         clock=ManualClock(1_700_000_100.0))
    svc._updates = AtTheEnd()  # type: ignore[assignment]
    svc.dead_lettered = []  # type: ignore[attr-defined]
    svc.dead_letter_later = lambda source, bad: svc.dead_lettered.extend(bad)  # type: ignore[method-assign,attr-defined]
    for key in ("gCTF:gpu", "Motioncor2:gpu"):  # keys with a model, as model-updates announced them
        svc._note_announced({"model_key": key, "version": 1, "sha256": "ab" * 32})
    return svc


def value(service: TrainerService, name: str, labels: dict[str, str] | None = None) -> float | None:
    return service.metrics.registry.get_sample_value(name, labels or {})


def test_invented_keys_beyond_the_bound_are_refused_and_a_key_with_a_model_still_gets_in(
        service: TrainerService, caplog: pytest.LogCaptureFixture) -> None:
    bound = 1_000  # RTT_TRAINER_MAX_KEYS's default
    invented = [s for i in range(INVENTED) for s in of(f"invented{i}:cpu")]
    consume(service, [of("gCTF:gpu", 5) + of("upload:cpu", 5),  # a key with a model, one without (cold start)
                      *[invented[i:i + 5_000] for i in range(0, INVENTED, 5_000)],
                      of("upload:cpu", 1, start=5)])  # the key without a model goes on: it stays

    kept = service.history.keys()
    assert len(kept) == bound and {"gCTF:gpu", "upload:cpu"} <= set(kept)
    assert service.history.count("upload:cpu") == 6
    refused = INVENTED - (bound - 2)
    assert value(service, "rtt_trainer_keys") == bound
    assert value(service, "rtt_trainer_bad_messages_total",
                 {"topic": "training-samples", "reason": "model_keys_full"}) == refused
    letters = service.dead_lettered  # type: ignore[attr-defined]
    assert len(letters) == refused and {exc.reason for _, exc in letters} == {"model_keys_full"}
    assert "'invented19999:cpu' refused" in str(letters[-1][1])
    page = generate_latest(service.metrics.registry)
    series = [line for line in page.splitlines() if line.startswith(b"rtt_trainer_key_samples_total{")]
    assert len(series) == bound
    # 153 KB measured (1,000 series, about 150 bytes each); 2.8 MB with a series for each of the 20,000 keys
    assert len(page) < 200_000, len(page)
    said = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(said) <= 4 and "refused: model_keys_full: the trainer holds" in said[0], said[:5]  # not 19,000 lines

    # a key with a model arrives at the bound: it takes the place of the key without a model idle longest
    consume(service, [of("Motioncor2:gpu", 2)])
    assert service.history.count("Motioncor2:gpu") == 2 and service.history.n_keys == bound
    assert "invented0:cpu" not in service.history.keys() and "upload:cpu" in service.history.keys()
    assert value(service, "rtt_trainer_key_samples_total", {"model_key": "invented0:cpu"}) is None  # went with it
    assert value(service, "rtt_trainer_key_samples_total", {"model_key": "Motioncor2:gpu"}) == 2.0
    assert value(service, "rtt_trainer_keys_evicted_total") == 1.0


@pytest.mark.parametrize("bad", ["0", "-5", "many", "1.5"])
def test_the_bound_on_keys_is_checked_at_start_naming_its_field(bad: str) -> None:
    assert Settings.from_env({}).trainer_max_keys == 1_000
    assert Settings.from_env({"RTT_TRAINER_MAX_KEYS": "50"}).trainer_max_keys == 50
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"RTT_TRAINER_MAX_KEYS": bad})
    assert info.value.field == "RTT_TRAINER_MAX_KEYS"
