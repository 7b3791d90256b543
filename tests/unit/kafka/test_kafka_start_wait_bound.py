"""``RTT_KAFKA_START_WAIT_S`` bounds the whole wait at start, a try under way included: a broker that takes
connections and does not answer (a broker still starting, a proxy in front of none) held each try for the client's
10 s request timeout, so a service with a 1 s bound gave up after 11 s. The try under way is cut at the bound, and
the one line it gives up with says the broker did not answer in time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence

import pytest

from app.config import Settings
from app.kafka.admin import TopicError, wait_reachable
from app.kafka.embedded import free_port


def test_a_try_that_hangs_is_cut_at_the_bound() -> None:
    tries: list[float] = []
    closed: list[bool] = []

    async def hangs(settings: Settings, topics: Sequence[str]) -> None:
        tries.append(time.monotonic())
        try:
            await asyncio.sleep(20.0)  # a broker that took the connection and says nothing
        finally:
            closed.append(True)  # the try's own clean-up runs

    started = time.monotonic()
    with pytest.raises(TopicError) as exc:
        asyncio.run(wait_reachable(Settings(kafka_bootstrap="127.0.0.1:9", kafka_start_wait_s=1.0), ("node-metrics",),
                                   service="worker", check=hangs))
    took = time.monotonic() - started
    assert took < 6.0, took  # the bound, and some slack on a loaded machine: not the 20 s try
    assert len(tries) == 1 and closed == [True]
    assert str(exc.value) == ("cannot reach Kafka at 127.0.0.1:9 (RTT_KAFKA_BOOTSTRAP): no answer within 1 s "
                              "(gave up after 1 s: RTT_KAFKA_START_WAIT_S=1)")


def test_the_real_check_against_a_silent_broker_gives_up_at_the_bound() -> None:
    import socket

    port = free_port()
    silent = socket.create_server(("127.0.0.1", port))  # takes connections (the backlog), never answers
    try:
        started = time.monotonic()
        with pytest.raises(TopicError) as exc:
            asyncio.run(wait_reachable(Settings(kafka_bootstrap=f"127.0.0.1:{port}", kafka_start_wait_s=2.0),
                                       ("node-metrics",), service="trainer"))
        took = time.monotonic() - started
    finally:
        silent.close()
    assert took < 7.0, took  # was 10 s or more: the admin client's request timeout
    assert str(exc.value).endswith("(gave up after 2 s: RTT_KAFKA_START_WAIT_S=2)"), exc.value
