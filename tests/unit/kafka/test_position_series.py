"""The position-reset counter's series exist at 0 before any reset, so one wipe that resets every partition at once
is an ``increase()`` the alert RttschedBrokerDataLost sees, not a series first appearing at its final value."""

from __future__ import annotations

import asyncio

from test_positions import Clock, Consumer, guard, resets

from app.kafka.positions import BEFORE_START, BEYOND_END


def _series(reg, reason: str) -> float | None:
    return reg.get_sample_value("rtt_kafka_position_resets_total",
                                {"client": "test", "topic": "node-metrics", "reason": reason})


def test_the_series_of_a_topic_read_exist_at_zero_after_its_first_fetch() -> None:
    g, reg = guard(Consumer())
    assert _series(reg, BEYOND_END) is None
    assert asyncio.run(g.after_fetch({})) == {}
    assert _series(reg, BEYOND_END) == 0.0 and _series(reg, BEFORE_START) == 0.0


def test_the_series_exist_at_zero_before_a_reset_at_assignment_counts_it() -> None:
    consumer = Consumer(start=50)
    g, reg = guard(consumer, Clock())
    asyncio.run(g.on_assigned({}))
    assert _series(reg, BEFORE_START) is None  # nothing assigned, nothing read
    from test_positions import TP
    assert asyncio.run(g.on_assigned({TP: 10})) == {TP: 50}
    assert resets(reg, BEFORE_START) == 1.0 and _series(reg, BEYOND_END) == 0.0
