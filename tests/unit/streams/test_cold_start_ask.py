"""A key's first model is asked at the sample that calls for it, not at the worker's next sample check."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from app.clock import ManualClock
from app.config import Settings
from app.contracts import decode
from app.drift.joinbuffer import JoinBuffer
from app.registry.directory import DirectoryModelStore
from app.streams import feedback_errors
from app.streams.app import create_app
from app.streams.feedback_models import ModelCache
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


def worker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[FeedbackLoop, Sent]:
    sent = Sent()
    monkeypatch.setattr(feedback_errors, "contract_topic", sent.topic)
    settings = Settings(metrics_port=0)
    clock = ManualClock(1000.0)
    app = create_app(settings, id=f"t-{tmp_path.name}", components=[],
                     options=dataclasses.replace(WorkerOptions(), datadir=str(tmp_path)), clock=clock)
    loop = FeedbackLoop(settings, FeedbackOptions(cold_start_samples=25), clock,
                        SimpleNamespace(store=NodeStore(10.0, WorkerOptions(), 1.0)),  # type: ignore[arg-type]
                        ModelCache(settings, store=DirectoryModelStore(tmp_path / "models")),
                        JoinBuffer(60.0, clock=clock), None)  # type: ignore[arg-type]
    feedback_errors.register_errors(app, loop)
    return loop, sent


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
