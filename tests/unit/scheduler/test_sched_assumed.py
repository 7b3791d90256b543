"""Assumed pods: TTL, visibility in metrics, replacement, exclusion, bound."""

from __future__ import annotations

import pytest

from app.scheduler.assumed import AssumedPods


def test_pending_until_features_newer_than_placement_plus_scrape_delay() -> None:
    a = AssumedPods(ttl_s=60, scrape_delay_s=5)
    a.assume("p1", "gCTF", "n1", now=100.0)
    assert [p.task_id for p in a.pending("n1", features_ts=105.0, now=106.0)] == ["p1"]
    assert a.pending("n1", features_ts=105.1, now=106.0) == ()
    assert len(a.on_node("n1", now=106.0)) == 1  # still counts for anti-affinity
    assert a.pending("n2", features_ts=0.0, now=106.0) == ()


def test_ttl_and_expire() -> None:
    a = AssumedPods(ttl_s=10, scrape_delay_s=0)
    a.assume("p1", "gCTF", "n1", now=0.0)
    a.assume("p2", "gCTF", "n1", now=5.0)
    assert len(a.on_node("n1", now=9.0)) == 2
    assert [p.task_id for p in a.on_node("n1", now=12.0)] == ["p2"]
    assert a.expire(now=12.0) == 1 and len(a) == 1
    assert a.expire(now=100.0) == 1 and len(a) == 0


def test_same_pod_scored_again_moves_and_can_be_excluded() -> None:
    a = AssumedPods()
    a.assume("p1", "gCTF", "n1", now=0.0)
    a.assume("p1", "gCTF", "n2", now=1.0)
    assert a.on_node("n1", now=2.0) == ()
    assert [p.node for p in a.on_node("n2", now=2.0)] == ["n2"]
    assert a.on_node("n2", now=2.0, exclude="p1") == ()
    a.forget("p1")
    assert len(a) == 0


def test_bounded_oldest_dropped_first() -> None:
    a = AssumedPods(ttl_s=1000, max_pods=2)
    for i in range(3):
        a.assume(f"p{i}", "gCTF", "n1", now=float(i))
    assert sorted(p.task_id for p in a.on_node("n1", now=3.0)) == ["p1", "p2"]


@pytest.mark.parametrize("kwargs", [{"ttl_s": 0}, {"scrape_delay_s": -1}, {"max_pods": 0}])
def test_bad_settings(kwargs: dict) -> None:
    with pytest.raises(ValueError):
        AssumedPods(**kwargs)
