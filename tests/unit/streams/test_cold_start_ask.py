"""A key's first model is asked at the sample that calls for it, not at the worker's next sample check."""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from test_feedback_models import save
from test_model_cache_retry import Unreachable

from app.clock import ManualClock
from app.config import Settings
from app.contracts import decode
from app.drift.joinbuffer import JoinBuffer
from app.registry.directory import DirectoryModelStore
from app.streams import feedback_errors
from app.streams.app import create_app
from app.streams.feedback_models import START_BOUND_S, ModelCache
from app.streams.feedback_options import FeedbackOptions
from app.streams.feedback_state import FeedbackLoop
from app.streams.node_table import NodeStore
from app.streams.options import WorkerOptions


class Sent:
    """What the error component sends, by topic (it is given this in place of its Faust topics)."""

    def __init__(self) -> None:
        self.values: dict[str, list[dict[str, Any]]] = {}
        self.fail = False

    def topic(self, _app: Any, settings: Settings, name: str) -> Any:
        sent = self.values.setdefault(name, [])
        outer = self

        class Topic:
            async def send(self, key: bytes, value: bytes) -> None:
                if outer.fail:
                    raise ConnectionError("broker away")
                sent.append(decode(name, value, strict=True))

        return Topic()


def worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, models: ModelCache | None = None,
           ) -> tuple[FeedbackLoop, Sent]:
    """A worker's error component; its model cache ``models``, by default one that has read model-updates to
    their end (and found nothing)."""
    sent = Sent()
    monkeypatch.setattr(feedback_errors, "contract_topic", sent.topic)
    settings = Settings(metrics_port=0)
    clock = ManualClock(1000.0)
    app = create_app(settings, id=f"t-{tmp_path.name}", components=[],
                     options=dataclasses.replace(WorkerOptions(), datadir=str(tmp_path)), clock=clock)
    loop = FeedbackLoop(settings, FeedbackOptions(cold_start_samples=25), clock,
                        SimpleNamespace(store=NodeStore(10.0, WorkerOptions(), 1.0)),  # type: ignore[arg-type]
                        models if models is not None else read_cache(settings, tmp_path),
                        JoinBuffer(60.0, clock=clock), None)  # type: ignore[arg-type]
    feedback_errors.register_errors(app, loop)
    return loop, sent


def read_cache(settings: Settings, tmp_path: Path) -> ModelCache:
    cache = ModelCache(settings, store=DirectoryModelStore(tmp_path / "models"))
    asyncio.run(cache.end_first_pass())
    return cache


async def count(loop: FeedbackLoop, key: str, n: int) -> None:
    """``n`` samples of ``key``, counted as the join counts them, each followed by what it started."""
    for _ in range(n):
        loop.samples_per_key[key] += 1
        loop.handles["sample_counted"](key)
        await asyncio.sleep(0)
    while loop._background:
        await asyncio.sleep(0)


def test_the_sample_that_reaches_the_cold_start_count_asks_the_first_model(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    loop, sent = worker(tmp_path, monkeypatch)

    async def run() -> None:
        await count(loop, "gCTF:gpu", 24)
        assert sent.values["retrain-events"] == []  # below the count: nothing asked
        await count(loop, "gCTF:gpu", 1)
        events = sent.values["retrain-events"]
        assert [(e["model_key"], e["reason"], e["cumulative_error"], e["threshold"]) for e in events] == [
            ("gCTF:gpu", "cold_start", 25.0, 25.0)]
        await count(loop, "gCTF:gpu", 24)  # asked: the next ask only once the count has doubled
        assert len(sent.values["retrain-events"]) == 1
        await count(loop, "gCTF:gpu", 1)
        assert [e["cumulative_error"] for e in sent.values["retrain-events"]] == [25.0, 50.0]

    asyncio.run(run())


def test_a_batch_of_samples_past_the_count_starts_one_ask(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Samples counted in one batch (no await between them) start one background ask, which sends one event."""
    loop, sent = worker(tmp_path, monkeypatch)

    async def run() -> None:
        for _ in range(40):
            loop.samples_per_key["gCTF:gpu"] += 1
            loop.handles["sample_counted"]("gCTF:gpu")
        assert len(loop._background) == 1
        while loop._background:
            await asyncio.sleep(0)
        assert [(e["reason"], e["cumulative_error"]) for e in sent.values["retrain-events"]] == [("cold_start", 40.0)]

    asyncio.run(run())


def test_a_key_with_a_model_waits_for_the_sample_check(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Growth retrains are not asked at the sample; nor is anything while the ask cannot be sent, and the sample
    check asks it then."""
    loop, sent = worker(tmp_path, monkeypatch)
    monkeypatch.setattr(loop.models, "has", lambda key: key == "upload:cpu")

    async def run() -> None:
        await count(loop, "upload:cpu", 200)
        assert sent.values["retrain-events"] == []
        sent.fail = True
        await count(loop, "gCTF:gpu", 25)  # the ask fails: logged, not asked
        assert sent.values["retrain-events"] == []
        sent.fail = False
        await loop.handles["cold_start"]()  # the sample check: both keys
        got = sorted((e["model_key"], e["reason"]) for e in sent.values["retrain-events"])
        assert got == [("gCTF:gpu", "cold_start"), ("upload:cpu", "growth")]

    asyncio.run(run())


class Clock:
    """Monotonic seconds, moved by hand."""

    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_a_restarted_worker_asks_no_cold_start_before_its_models_are_read(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Sample counts past the cold-start count (restored at a restart) while model-updates is being read: no cold
    start is asked, at a sample or at the check, until the read has ended and its loads have resolved; then only
    the key with no model announced is asked."""
    store = DirectoryModelStore(tmp_path / "models")
    cache = ModelCache(Settings(metrics_port=0), store=store, clock=Clock())
    loop, sent = worker(tmp_path, monkeypatch, models=cache)
    update = save(store, "gCTF:gpu", 1.0)

    async def run() -> None:
        await count(loop, "gCTF:gpu", 30)
        await count(loop, "upload:cpu", 30)
        await loop.handles["cold_start"]()
        assert sent.values["retrain-events"] == [] and not cache.settled()
        cache.hold(update)  # read, not loaded yet: the key counts as having a model
        assert cache.has("gCTF:gpu") and not cache.has("upload:cpu")
        await loop.handles["cold_start"]()
        assert sent.values["retrain-events"] == []
        await cache.end_first_pass()  # read to the end; its one load done
        assert cache.version("gCTF:gpu") == update["version"] and cache.settled()
        await loop.handles["cold_start"]()
        got = [(e["model_key"], e["reason"]) for e in sent.values["retrain-events"]]
        assert got == [("upload:cpu", "cold_start")]

    asyncio.run(run())


def test_cold_starts_wait_for_a_read_that_never_ends_only_up_to_the_bound(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """A broker that never answers: cold starts are asked once ``START_BOUND_S`` has passed since the read began."""
    clock = Clock()
    cache = ModelCache(Settings(metrics_port=0), store=DirectoryModelStore(tmp_path / "models"), clock=clock)
    loop, sent = worker(tmp_path, monkeypatch, models=cache)
    cache.begin_read()

    async def run() -> None:
        await count(loop, "gCTF:gpu", 25)
        clock.t = START_BOUND_S - 0.1
        await loop.handles["cold_start"]()
        assert sent.values["retrain-events"] == []
        clock.t = START_BOUND_S
        await loop.handles["cold_start"]()
        assert [(e["model_key"], e["reason"]) for e in sent.values["retrain-events"]] == [("gCTF:gpu", "cold_start")]

    with caplog.at_level(logging.WARNING, logger="app.streams.feedback_models"):
        asyncio.run(run())
    assert any("not read to their end within 30 s" in r.getMessage() for r in caplog.records)


def test_a_model_waiting_for_the_registry_holds_cold_starts_up_to_the_bound_and_its_own_for_good(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read ended, but the registry is away: its load is not resolved, so no cold start is asked until the
    bound; after it, keys without a model are asked, and the key whose model waits for the registry is not."""
    clock = Clock()
    real = DirectoryModelStore(tmp_path / "models")
    store = Unreachable(real)
    cache = ModelCache(Settings(metrics_port=0, retry_max_backoff_s=60.0), store=store,  # type: ignore[arg-type]
                       clock=clock)
    loop, sent = worker(tmp_path, monkeypatch, models=cache)
    cache.begin_read()

    async def run() -> None:
        cache.hold(save(real, "gCTF:gpu", 1.0))
        await cache.end_first_pass()
        assert "gCTF:gpu" in cache.pending and cache.has("gCTF:gpu") and not cache.settled()
        await count(loop, "gCTF:gpu", 30)
        await count(loop, "upload:cpu", 30)
        await loop.handles["cold_start"]()
        assert sent.values["retrain-events"] == []
        clock.t = START_BOUND_S
        await loop.handles["cold_start"]()
        assert [(e["model_key"], e["reason"]) for e in sent.values["retrain-events"]] == [
            ("upload:cpu", "cold_start")]
        await cache.close()

    asyncio.run(run())
