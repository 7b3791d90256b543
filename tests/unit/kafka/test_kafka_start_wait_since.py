"""``wait_reachable(since=...)``: ``RTT_KAFKA_START_WAIT_S`` counted from the first wait's start, not from this wait's,
so that a worker sent back to waiting (its broker gone as Faust started) waits only for what is left of the bound."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import pytest

from app.config import Settings
from app.kafka.admin import TopicError, wait_reachable


def test_a_wait_counts_its_bound_from_since(caplog: pytest.LogCaptureFixture) -> None:
    now = [100.0]
    tries: list[float] = []
    pauses: list[float] = []

    async def refused(settings: Settings, topics: Sequence[str]) -> None:
        tries.append(now[0])
        raise TopicError("cannot reach Kafka at 127.0.0.1:9 (RTT_KAFKA_BOOTSTRAP): refused")

    async def sleep(s: float) -> None:
        pauses.append(s)
        now[0] += s

    with pytest.raises(TopicError) as exc:  # began 7 s ago with a 10 s bound: 3 s left
        asyncio.run(wait_reachable(Settings(kafka_bootstrap="127.0.0.1:9", kafka_start_wait_s=10.0), (),
                                   service="worker", check=refused, clock=lambda: now[0], sleep=sleep, since=93.0))
    # the pauses are jittered: their sum is 3 s to rounding
    assert now[0] == pytest.approx(103.0) and sum(pauses) == pytest.approx(3.0), (now, pauses)
    assert str(exc.value).endswith("refused (gave up after 10 s: RTT_KAFKA_START_WAIT_S=10)"), exc.value
    warned = [r.getMessage() for r in caplog.records if "waiting for Kafka" in r.getMessage()]
    assert len(warned) == 1 and warned[0].endswith("for the 3 s left of RTT_KAFKA_START_WAIT_S=10"), warned
