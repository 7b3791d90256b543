"""RTT_TRAINER_MAX_KEYS: a producer inventing model keys no longer makes the trainer hold a history and a metric series
per key. 20,000 invented keys used to leave 20,000 histories and ``rtt_trainer_key_samples_total`` series (/metrics
5 KB -> 2.8 MB) until each was idle a day; now the trainer holds at most its bound, refuses (counts, dead-letters,
logs once per period) the samples of new keys beyond it, and a key with a model still gets in, in the place of the
key without a model idle longest -- whose series goes with it.

A restarted trainer reads the retained samples again: a key's idle time is that of its newest sample's record, not of
the restart, so the keys held after a restart are those held before it (it used to stamp every sample with the time
it was read again: the first keys of the log won the room back, days-old invented ones included, and the key that
held it was refused, its samples dead-lettered)."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from aiokafka import TopicPartition
from prometheus_client import generate_latest
from trainer_samples import KEY, AtTheEnd, Producer, samples

from app.clock import ManualClock
from app.config import Settings
from app.contracts import encode
from app.errors import ConfigError
from app.trainer.service import TrainerService

INVENTED = 20_000


TP = TopicPartition("training-samples", 0)
Batch = list[Any]  # of samples (produced as they are fetched) or (sample, produced at: clock.now()) pairs


class Samples:
    """A training-samples consumer that hands out ``batches`` one per fetch, then nothing (``drained`` set). Each
    batch comes a second after the one before (``gaps``: the seconds before the batch at that index instead), with
    records stamped (their ``timestamp``) as produced then, or at the time paired with a sample; ``log`` keeps every
    (sample, produced at) handed out, for a restarted trainer to read again. ``partition_of``: the partition of each
    key (0 without); ``end_offsets`` and ``position`` answer as Kafka would: for a ``replay``, with every batch there
    from the start, else with each produced as it is fetched."""

    def __init__(self, batches: list[Batch], clock: ManualClock, gaps: dict[int, float] | None = None,
                 partition_of: dict[str, int] | None = None, pause_s: float = 0.0, replay: bool = False) -> None:
        self.batches = list(batches)
        self.clock = clock
        self.gaps = gaps or {}
        self.partition_of = partition_of or {}
        self.pause_s = pause_s  # how long each fetch with records takes
        self.given = 0
        self.offsets: dict[TopicPartition, int] = {}
        self.replay = replay
        self.ends: dict[TopicPartition, int] = {}
        for batch in self.batches:
            for item in batch:
                tp = self.tp(item[0] if isinstance(item, tuple) else item)
                self.ends[tp] = self.ends.get(tp, 0) + 1
        self.log: list[tuple[dict[str, Any], float]] = []
        self.drained = asyncio.Event()

    def tp(self, sample: dict[str, Any]) -> TopicPartition:
        return TopicPartition("training-samples", self.partition_of.get(sample["model_key"], 0))

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: (self.ends if self.replay else self.offsets).get(tp, 0) for tp in tps}

    async def position(self, tp: TopicPartition) -> int:
        return self.offsets.get(tp, 0)

    async def getmany(self, **kw: Any) -> dict[Any, list[Any]]:
        if not self.batches:
            self.drained.set()
            await asyncio.sleep(0.01)
            return {}
        await asyncio.sleep(self.pause_s)
        self.clock.advance(self.gaps.get(self.given, 1.0))
        self.given += 1
        records: dict[TopicPartition, list[Any]] = {}
        for item in self.batches.pop(0):
            sample, produced = item if isinstance(item, tuple) else (item, self.clock.now())
            self.log.append((sample, produced))
            tp = self.tp(sample)
            offset = self.offsets.get(tp, 0)
            records.setdefault(tp, []).append(SimpleNamespace(
                topic=tp.topic, partition=tp.partition, offset=offset, key=sample["model_key"].encode(),
                value=encode("training-samples", sample), timestamp=round(produced * 1000)))
            self.offsets[tp] = offset + 1
        return records


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


def consume(service: TrainerService, batches: list[Batch] | Samples, **kw: Any) -> Samples:
    """Run the trainer's samples loop (and its model-updates loop, if its consumer is no :class:`AtTheEnd`) over
    ``batches`` (``kw``: to :class:`Samples`) until it has taken them all; the consumer they came from."""
    consumer = batches if isinstance(batches, Samples) else Samples(batches, service.clock, **kw)  # type: ignore[arg-type]
    service._samples = consumer  # type: ignore[assignment]
    service._sample_guard = service._update_guard = Guard()  # type: ignore[assignment]
    service._sample_tps = sorted({TP, *consumer.ends})

    async def go() -> None:
        tasks = [asyncio.create_task(service._consume_samples())]
        if not isinstance(service._updates, AtTheEnd):
            tasks.append(asyncio.create_task(service._consume_updates()))
        drained = asyncio.create_task(consumer.drained.wait())
        await asyncio.wait([*tasks, drained], timeout=120, return_when=asyncio.FIRST_COMPLETED)
        ended = [t for t in tasks if t.done()]
        assert drained.done(), ended[0].exception() if ended else "not drained in 120 s"
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(go())
    return consumer


def trainer(tmp_path: Path, clock: ManualClock | None = None,
            announced: tuple[str, ...] = ("gCTF:gpu", "Motioncor2:gpu"),
            **kw: Any) -> TrainerService:
    """A trainer whose dead letters are kept in ``dead_lettered``, knowing ``announced`` as keys with a model."""
    svc = TrainerService(Settings.from_env({}, models_dir=str(tmp_path / "models")), registry_check_s=0,
                         clock=clock or ManualClock(1_700_000_100.0), **kw)
    svc._updates = AtTheEnd()  # type: ignore[assignment]
    svc.dead_lettered = []  # type: ignore[attr-defined]
    svc.dead_letter_later = lambda source, bad: svc.dead_lettered.extend(bad)  # type: ignore[method-assign,attr-defined]
    for key in announced:  # keys with a model, as model-updates announced them
        svc._note_announced({"model_key": key, "version": 1, "sha256": "ab" * 32})
    return svc


@pytest.fixture
def service(tmp_path: Path) -> TrainerService:
    return trainer(tmp_path)


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


DAY = 86_400.0


def test_after_a_quiet_spell_the_idle_keys_make_room_for_the_batch_that_ends_it(tmp_path: Path) -> None:
    """Keys idle past ``RTT_TRAINER_KEY_IDLE_S`` are dropped before a batch is added, not after: the new key of a
    batch read first after the clock moved on two days (the loop polls twice a second, so a paused process, or a
    fetch that waited on the broker) takes their place instead of being refused at the bound."""
    clock = ManualClock(1_700_000_000.0 + 30 * DAY)
    service = trainer(tmp_path, clock, max_keys=4)
    old = of("gCTF:gpu", 5) + [s for i in range(3) for s in of(f"invented{i}:cpu")]  # a key with a model, 3 without
    consume(service, [old, of("upload:cpu", 20)], gaps={1: 2 * DAY})  # upload:cpu 2 days later
    assert service.history.keys() == ["upload:cpu"] and service.history.count("upload:cpu") == 20
    assert service.dead_lettered == []  # type: ignore[attr-defined]


def test_a_restarted_trainer_holds_the_keys_it_held_before(tmp_path: Path) -> None:
    """The keys a trainer holds at the bound, it holds again after a restart: the retained samples it reads again
    are as old as their records, so keys idle two days by then are dropped for a new key, not held in its place."""
    clock = ManualClock(1_700_000_000.0 + 30 * DAY)
    now = clock.now()
    old = of("gCTF:gpu", 5) + [s for i in range(3) for s in of(f"invented{i}:cpu")]  # a key with a model, 3 without
    log = [(s, now - 3 * DAY) for s in old] + [(s, now - 3600.0 + 60.0 * i) for i, s in enumerate(of("upload:cpu", 20))]
    service = trainer(tmp_path, clock, max_keys=4)
    consume(service, [log], replay=True)  # the retained samples, read in one batch
    # as a trainer running all along holds them: the keys idle 2 days by upload:cpu's first sample went
    assert service.history.keys() == ["upload:cpu"] and service.history.count("upload:cpu") == 20
    assert service.dead_lettered == []  # type: ignore[attr-defined]
    assert value(service, "rtt_trainer_bad_messages_total",
                 {"topic": "training-samples", "reason": "model_keys_full"}) is None
    assert value(service, "rtt_trainer_keys_dropped_total") == 4.0
    # upload:cpu is idle from its newest sample on (produced 41 minutes before the restart), not from the restart
    consume(service, [[]], gaps={0: DAY - 2_460.0 - 60.0})
    assert service.history.keys() == ["upload:cpu"]
    consume(service, [[]], gaps={0: 120.0})
    assert service.history.keys() == []


def test_a_replay_s_batch_is_taken_in_the_order_its_samples_were_produced(tmp_path: Path) -> None:
    """A batch of a replay holds partitions one after another, not in time order: upload:cpu's partition first, the
    invented keys' (days older) after it. Taken as a trainer running all along took them, the invented keys come and
    go before upload:cpu: none is refused at the bound (the newest, taken first, left no room for the last of them)."""
    clock = ManualClock(1_700_000_000.0 + 30 * DAY)
    now = clock.now()
    log = [(s, now - 3_600.0 + 60.0 * i) for i, s in enumerate(of("upload:cpu", 5))]
    log += [(s, now - 2 * DAY) for i in range(3) for s in of(f"invented{i}:cpu")]
    service = trainer(tmp_path, clock, max_keys=3)
    consume(service, [log], replay=True, partition_of={"upload:cpu": 1})
    assert service.history.keys() == ["upload:cpu"] and service.dead_lettered == []  # type: ignore[attr-defined]


def test_a_key_read_behind_in_a_replay_is_not_dropped_as_idle(tmp_path: Path) -> None:
    """A replay reads partitions at their own pace: a key whose newest sample read so far is days old may have newer
    ones not read yet, and is not dropped before its partition is read up to where it ended at the start."""
    clock = ManualClock(1_700_000_000.0 + 30 * DAY)
    now = clock.now()
    # upload:cpu (partition 1): a sample every 6 hours for 3 days, up to now; gCTF:gpu (partition 0) only now
    steady = [(s, now - 3 * DAY + 6 * 3600.0 * i) for i, s in enumerate(of("upload:cpu", 13))]
    fresh = [(s, now - 60.0) for s in of("gCTF:gpu", 3)]
    service = trainer(tmp_path, clock, key_idle_s=DAY)
    # partition 0 whole and upload:cpu's first day, then a minute later the rest of partition 1
    consume(service, [fresh + steady[:4], steady[4:]], gaps={1: 60.0}, partition_of={"upload:cpu": 1}, replay=True)
    assert service.history.count("upload:cpu") == 13 and service.history.count("gCTF:gpu") == 3
    assert value(service, "rtt_trainer_keys_dropped_total") == 0.0


class Updates:
    """A model-updates consumer holding one announcement, handed over on its first fetch, a while after it is asked:
    read to its end only then."""

    def __init__(self, key: str) -> None:
        self.record = SimpleNamespace(
            topic="model-updates", partition=0, offset=0, key=key.encode(), timestamp=-1,
            value=encode("model-updates", {"model_key": key, "version": 1, "sha256": "ab" * 32, "ts": 1_700_000_000.0,
                                           "location": "x", "format": "json", "features": ["a"], "metrics": {}}))
        self.read = False

    async def end_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
        return {tp: 1 for tp in tps}

    async def position(self, tp: TopicPartition) -> int:
        return int(self.read)

    async def getmany(self, **kw: Any) -> dict[Any, list[Any]]:
        await asyncio.sleep(0.01 if self.read else 0.3)
        if self.read:
            return {}
        self.read = True
        return {TopicPartition("model-updates", 0): [self.record]}


def test_model_updates_are_read_to_their_end_before_the_first_sample(tmp_path: Path) -> None:
    """At the bound, a key with a model gets in: the trainer knows it has one before it takes the first sample,
    though model-updates hands its announcement over only after the samples are there to read."""
    service = trainer(tmp_path, announced=(), max_keys=2)
    for i, key in enumerate(["a:cpu", "b:cpu"]):  # the bound reached by keys without a model
        service.history.add(of(key)[0], now=service.clock.monotonic() - 10.0 + i)
    service._updates = Updates("gCTF:gpu")  # type: ignore[assignment]
    service._update_tps = [TopicPartition("model-updates", 0)]
    consume(service, [of("gCTF:gpu", 3)])
    assert service.history.keys() == ["b:cpu", "gCTF:gpu"] and service.history.count("gCTF:gpu") == 3
    assert service.dead_lettered == []  # type: ignore[attr-defined]
    assert value(service, "rtt_trainer_keys_evicted_total") == 1.0


class Stuck(Updates):
    """A model-updates consumer never read to its end (a broker that does not answer its fetches)."""

    async def getmany(self, **kw: Any) -> dict[Any, list[Any]]:
        await asyncio.sleep(0.05)
        return {}


async def test_a_retrain_at_start_waits_for_the_samples_past_the_wait_for_model_updates(tmp_path: Path) -> None:
    """The samples loop reads model-updates to its end first, for as long as ``catch_up_timeout_s``; a retrain
    started meanwhile waits for that, then for the samples: it used to wait the same ``catch_up_timeout_s`` from its
    own start, ran out as the samples loop began and trained on an empty history (insufficient_data)."""
    clock = ManualClock(1_700_000_100.0)
    service = trainer(tmp_path, clock, announced=(), selector=None, catch_up_timeout_s=0.5,
                      train_params={"n_estimators": 20})
    service._updates = Stuck(KEY)  # type: ignore[assignment]
    service._update_tps = [TopicPartition("model-updates", 0)]
    service._producer = Producer()  # type: ignore[assignment]
    rows = samples(60)
    consumer = Samples([rows[:20], rows[20:40], rows[40:]], clock, pause_s=0.1, replay=True)  # a replay of 0.3 s
    service._samples = consumer  # type: ignore[assignment]
    service._sample_guard = service._update_guard = Guard()  # type: ignore[assignment]
    service._sample_tps = [TP]
    loop = asyncio.create_task(service._consume_samples())
    await asyncio.sleep(0)  # the trainer started: its samples loop waits for model-updates
    try:
        outcome = await service.retrain({"model_key": KEY, "reason": "cold_start", "ts": clock.now()})
    finally:
        loop.cancel()
        await asyncio.gather(loop, return_exceptions=True)
    assert outcome.outcome == "promoted", outcome
    assert service.history.count(KEY) == 60
