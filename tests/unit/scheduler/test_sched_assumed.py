"""Assumed pods: TTL, visibility in metrics, replacement, exclusion, bound."""

from __future__ import annotations

import math

import pytest

from app.scheduler.assumed import MAX_APPS, MAX_HINTS, AssumedPods


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


def test_a_predicted_rtt_shortens_the_placement_but_never_past_the_ttl() -> None:
    a = AssumedPods(ttl_s=30, rtt_multiple=2.0)
    a.expect("p1", ["n1", "n2"], [5000.0, 100.0])
    a.assume("p1", "gCTF", "n1", now=0.0)  # 2 x 5 s
    a.assume("p2", "gCTF", "n1", now=0.0, expected_s=60.0)  # capped at the TTL
    a.expect("p3", ["n2"], [math.nan])
    a.assume("p3", "gCTF", "n1", now=0.0)  # no usable prediction for n1: the TTL
    assert [p.task_id for p in a.on_node("n1", now=9.9)] == ["p1", "p2", "p3"]
    assert [p.task_id for p in a.on_node("n1", now=10.1)] == ["p2", "p3"]
    assert a.counts("n1", now=10.1, exclude="p2") == {"gCTF": 1}
    assert a.on_node("n1", now=30.1) == ()


def test_hints_are_used_once_and_bounded() -> None:
    a = AssumedPods(ttl_s=30, max_pods=2)
    for i in range(MAX_HINTS + 1):
        a.expect(f"p{i}", ["n1"], [1000.0])
    assert a.hinted == MAX_HINTS
    a.assume("p0", "gCTF", "n1", now=0.0)  # its hint was dropped (oldest first): the TTL applies
    a.assume("p2", "gCTF", "n1", now=0.0)
    assert {p.task_id: p.until for p in a.on_node("n1", now=0.0)} == {"p0": 30.0, "p2": 1.5}
    a.assume("p2", "gCTF", "n1", now=1.0)  # scored again without a new prediction: the TTL
    assert a.on_node("n1", now=2.0)[-1].until == 31.0
    a.unexpect("p3")  # placed nowhere the extender expected: its note goes
    assert a.hinted == MAX_HINTS - 2


def test_apps_are_remembered_first_seen_first_and_bounded() -> None:
    a = AssumedPods(ttl_s=30, max_pods=10)
    for i in range(MAX_APPS + 5):
        a.assume(f"p{i}", f"app{i}", "n1", now=0.0)
    a.assume("q", "app0", "n1", now=0.0)
    assert a.apps[:2] == ("app0", "app1") and len(a.apps) == MAX_APPS


def test_rtt_multiple_must_be_positive() -> None:
    with pytest.raises(ValueError, match="rtt_multiple"):
        AssumedPods(rtt_multiple=0.0)


def test_pending_load_outlives_the_expected_end_until_the_scrape_shows_it() -> None:
    a = AssumedPods(ttl_s=30, scrape_delay_s=5, rtt_multiple=1.0)
    a.assume("p1", "gCTF", "n1", now=100.0, expected_s=1.0)
    assert a.on_node("n1", now=102.0) == () and a.counts("n1", now=102.0) == {}
    assert [p.task_id for p in a.pending("n1", features_ts=104.0, now=102.0)] == ["p1"]
    assert a.pending("n1", features_ts=105.5, now=106.0) == ()
