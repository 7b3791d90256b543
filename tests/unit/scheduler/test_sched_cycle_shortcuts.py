"""The scheduling cycle's shortcuts give what their definitions give: the top-scored hosts without building
(host, score) pairs, the filter's passing nodes when none failed, and each policy's own contention factors
however often policies alternate."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st
from scheduler_fixtures import make_linear, make_view

from app.scheduler.assumed import AssumedPods
from app.scheduler.cycle import _top, filter_answer, top_scored
from app.scheduler.decide import DecideParams, Decision, decide
from app.scheduler.filtering import contention_factor
from app.scheduler.podinfo import PodInfo
from app.scheduler.policy import policy_from_dict

NOW = 1005.0
NODES = ["slow", "fast", "mid"]
POD = PodInfo("ctf-9", "em", "uid-9", "gCTF", 512.0)


@given(st.lists(st.integers(0, 10), max_size=12))
def test_the_top_hosts_are_top_scored_of_the_pairs(scores: list[int]) -> None:
    nodes = tuple(f"n{i}" for i in range(len(scores)))
    assert _top(nodes, scores) == tuple(top_scored(zip(nodes, scores, strict=True)))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([None, "sla", "anti-affinity"]), min_size=1, max_size=6), st.booleans())
def test_the_filter_passes_what_decision_passed_says(failed: list[str | None], neutral: bool) -> None:
    nodes = tuple(f"n{i}" for i in range(len(failed)))
    d = Decision(POD, nodes, [5] * len(nodes), failed=failed, neutral="not_ready" if neutral else None)
    assert filter_answer(d).passing == tuple(d.passed())


def test_each_policy_keeps_its_own_contention_factors() -> None:
    view = make_view(make_linear())
    snap = view.build(now=NOW)
    light = DecideParams(policy_from_dict({"contention": {"interfering": 0.1, "other": 0.2}}))
    heavy = DecideParams(policy_from_dict({"contention": {"interfering": 0.9, "other": 2.0}}))
    for _ in range(2):
        for params in (light, heavy, light):
            assumed = AssumedPods(ttl_s=60.0, scrape_delay_s=5.0)
            assumed.assume("p1", "upload", "fast", now=NOW - 1.0)
            assumed.assume("p2", "gCTF", "mid", now=NOW - 1.0)
            d = decide(snap, POD, NODES, assumed, params, NOW, note_expected=False)
            for i, name in enumerate(NODES):
                pending = {"fast": ("upload",), "mid": ("gCTF",)}.get(name, ())
                factor = contention_factor("gCTF", pending, params.policy) if pending else 1.0
                assert d.rtt_ms[i] == d.model_rtt_ms[i] * factor
