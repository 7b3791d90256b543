"""``AssumedPods.scan`` remembers its last answer per node while that answer holds: whatever the order of
placements, forgets and scans, and at times right on a pod's expected end or TTL, it answers what its
definition (:meth:`counts`, :meth:`pending`, :meth:`on_node`) gives."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from app.scheduler.assumed import AssumedPods

TTL_S, DELAY_S = 10.0, 2.0
NODES = ("n1", "n2")
APPS = ("gCTF", "upload")


def defined(a: AssumedPods, node: str, now: float, features_ts: float, exclude: str,
            since: float) -> tuple[dict[str, int], tuple[str, ...], tuple[str, ...]]:
    return (a.counts(node, now, exclude, since), tuple(p.app for p in a.pending(node, features_ts, now, exclude)),
            tuple(p.task_id for p in a.on_node(node, now, exclude)))


step = st.one_of(
    st.tuples(st.just("assume"), st.integers(0, 5), st.sampled_from(APPS), st.sampled_from(NODES),
              st.integers(0, 3), st.sampled_from([None, 0.5, 2.0, 4.0, math.nan])),
    st.tuples(st.just("forget"), st.integers(0, 5)),
    st.tuples(st.just("scan"), st.sampled_from(NODES), st.integers(-3, 3), st.sampled_from([0.0, 2.0, 4.5]),
              st.sampled_from(["", "p0", "p3", "nobody"]), st.sampled_from([-math.inf, 0.0, 3.0])),
)


@settings(max_examples=400, deadline=None)
@given(st.lists(step, max_size=40), st.sampled_from([0.0, 1.7e9]), st.floats(0.0, 1.0))
def test_scan_answers_its_definition_whatever_it_remembers(steps: list[tuple], epoch: float, grain: float) -> None:
    a = AssumedPods(ttl_s=TTL_S, scrape_delay_s=DELAY_S)
    now = epoch
    for s in steps:
        if s[0] == "assume":
            _, pod, app, node, dt, expected_s = s
            now += dt * 0.5
            a.assume(f"p{pod}", app, node, now, expected_s)
        elif s[0] == "forget":
            a.forget(f"p{s[1]}")
        else:
            _, node, back, fts, exclude, since = s
            # times on a grid that lands on expected ends (multiples of 0.75 s) and TTLs (10 s), or between them
            at = now + back * 0.75 + (grain if back == 3 else 0.0) + (TTL_S if back == -3 else 0.0)
            asked = (node, at, epoch + fts, exclude, epoch + since)
            counts, pending, live = a.scan(*asked)
            assert (counts, pending, tuple(p.task_id for p in live)) == defined(a, *asked)
            counts["changed"] = 1  # the caller's map: changing it changes nothing remembered
            assert "changed" not in a.scan(*asked)[0]


def test_a_remembered_scan_ends_with_a_pods_expected_end_and_ttl() -> None:
    a = AssumedPods(ttl_s=TTL_S, scrape_delay_s=DELAY_S)
    a.assume("p1", "gCTF", "n1", 100.0, expected_s=2.0)  # expected to end at 103
    a.assume("p2", "upload", "n1", 101.0)  # counts until its TTL, 111
    assert a.scan("n1", 102.0, 0.0)[0] == {"gCTF": 1, "upload": 1}
    assert a.scan("n1", 103.0, 0.0)[0] == {"upload": 1}
    assert a.scan("n1", 110.999, 0.0)[0] == {"upload": 1}
    assert a.scan("n1", 111.0, 0.0) == ({}, (), ())
    assert a.scan("n1", 102.0, 0.0)[0] == {"gCTF": 1, "upload": 1}  # an earlier time: asked afresh


def test_a_placement_or_a_forget_on_the_node_ends_what_scan_remembers() -> None:
    a = AssumedPods(ttl_s=TTL_S, scrape_delay_s=DELAY_S)
    a.assume("p1", "gCTF", "n1", 100.0)
    assert a.scan("n1", 100.5, 0.0, "p9")[0] == {"gCTF": 1}
    a.assume("p2", "upload", "n1", 100.5)
    assert a.scan("n1", 100.5, 0.0, "p9")[0] == {"gCTF": 1, "upload": 1}
    a.forget("p1")
    assert a.scan("n1", 100.5, 0.0, "p9")[0] == {"upload": 1}
    assert a.scan("n1", 100.5, 0.0, "p2") == ({}, (), ())  # excluding a pod that is there
