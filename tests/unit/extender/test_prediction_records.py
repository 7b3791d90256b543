"""The rtt-predictions records of a request, beyond the usual one: no corrections, one candidate, several
models or feature maps without a correction, a chosen node in a later chunk or not among the candidates, a neutral
answer; each record compared with its contract value written out here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import orjson
import pytest

from app.contracts.codec import decode
from app.extender.predictions import decision_values, encode_decision, prediction_value, prediction_values
from app.scheduler.decide import NO_APP, Decision, NodeVerdict
from app.scheduler.podinfo import PodInfo

TS = 1_700_000_000.5


def decision(rtts: list[float], *, keys: list[str | None] | None = None, versions: list[int | None] | None = None,
             fresh: list[bool] | None = None, features: list[Mapping[str, float]] | None = None,
             correction: list[float] | None = None, **kw: Any) -> Decision:
    n = len(rtts)
    return Decision(PodInfo("p", "ns", "uid-9", "gCTF", 1.0), tuple(f"n{i}" for i in range(n)), [5] * n, rtts,
                    keys or ["gCTF:gpu"] * n, versions or [4] * n, [1.0] * n, [None] * n, fresh or [True] * n,
                    rtts, features or [], correction=correction or [], **kw)


def records(d: Decision, chunk: int = 128, chosen: str | None = None) -> list[dict[str, Any]]:
    parts = encode_decision(d, TS, chunk, chosen)
    return [decode("rtt-predictions", v, strict=True) for part in parts for _, v in part]


def value(node: str, rtt: float, **extra: Any) -> dict[str, Any]:
    v = {"task_id": "uid-9", "app": "gCTF", "node": node, "ts": TS, "predicted_rtt_ms": rtt, "model_version": 4,
         "model_key": "gCTF:gpu"}
    return {**v, **extra}


def test_a_single_candidate_is_one_record() -> None:
    assert records(decision([100.0])) == [value("n0", 100.0)] == list(decision_values(decision([100.0]), TS))


def test_without_corrections_no_record_carries_one() -> None:
    d = decision([100.0, 50.0])
    assert records(d) == [value("n0", 100.0), value("n1", 50.0)] == list(decision_values(d, TS))


def test_every_candidate_corrected_alike_still_carries_its_correction() -> None:
    d = decision([100.0, 50.0], correction=[2.0, 2.0])
    assert records(d) == [value("n0", 100.0, correction=2.0), value("n1", 50.0, correction=2.0)]


def test_candidates_of_several_models_without_corrections_each_carry_their_own_model() -> None:
    d = decision([100.0, 50.0], keys=["gCTF:gpu", "gCTF:gpu:n1"], versions=[4, 7])
    assert records(d) == [value("n0", 100.0), value("n1", 50.0, model_key="gCTF:gpu:n1", model_version=7)]


def test_candidates_with_different_feature_maps_without_corrections_each_carry_their_own() -> None:
    idle, busy = {"running_pods_gCTF": 0.0}, {"running_pods_gCTF": 2.0}
    d = decision([100.0, 50.0], features=[idle, busy])
    assert records(d) == [value("n0", 100.0, features=idle), value("n1", 50.0, features=busy)]


@pytest.mark.parametrize("chosen", ["n2", "n3"])
def test_a_chosen_node_in_a_later_chunk_is_marked(chosen: str) -> None:
    d = decision([100.0, 110.0, 120.0, 130.0])
    assert [v["node"] for v in records(d, chunk=2, chosen=chosen) if v.get("chosen")] == [chosen]


def test_a_chosen_node_that_is_not_a_candidate_marks_none() -> None:
    d = decision([100.0, 110.0, 120.0])
    assert not [v for v in records(d, chosen="n9") if v.get("chosen")]
    assert not [v for v in decision_values(d, TS, "n9") if v.get("chosen")]


def test_a_chosen_node_that_is_stale_after_every_published_one_marks_none() -> None:
    d = decision([100.0, 110.0, 120.0], fresh=[True, True, False])
    assert [v["node"] for v in records(d, chosen="n2")] == ["n0", "n1"]
    assert not [v for v in records(d, chosen="n2") if v.get("chosen")]


def test_a_node_named_twice_is_marked_at_the_winner_s_place() -> None:
    d = Decision(PodInfo("p", "ns", "uid-9", "gCTF", 1.0), ("n0", "n1", "n0"), [5, 5, 9], [100.0, 110.0, 50.0],
                 ["gCTF:gpu"] * 3, [4] * 3, [1.0] * 3, [None] * 3, [True] * 3, winner=2)
    assert [v.get("chosen", False) for v in records(d, chosen="n0")] == [False, False, True]
    assert [v.get("chosen", False) for v in decision_values(d, TS, "n0")] == [False, False, True]


def test_a_neutral_answer_publishes_nothing() -> None:
    d = decision([100.0, 110.0], neutral=NO_APP)
    assert records(d) == [] == list(decision_values(d, TS))


def test_a_prediction_value_has_no_correction_and_no_mark_unless_given() -> None:
    v = prediction_value("uid-9", "gCTF", "n0", TS, 100.0, 4, "gCTF:gpu", None)
    assert v == value("n0", 100.0)
    assert orjson.loads(orjson.dumps(v)) == decode("rtt-predictions", orjson.dumps(v), strict=True)


def test_prediction_values_are_one_per_verdict_with_the_chosen_one_marked() -> None:
    verdicts = [NodeVerdict("n0", 10, 100.0, "gCTF:gpu", 4, features={"running_pods_gCTF": 1.0}),
                NodeVerdict("n1", 5, 150.0, "gCTF:gpu", 4, correction=1.5)]
    assert prediction_values("uid-9", "gCTF", TS, verdicts, chosen="n1") == [
        value("n0", 100.0, features={"running_pods_gCTF": 1.0}),
        value("n1", 150.0, correction=1.5, chosen=True)]


@pytest.mark.parametrize(("keys", "versions"), [(["gCTF:gpu", "gCTF:gpu:n1"], [4, 4]), (["gCTF:gpu"] * 2, [4, 7])])
def test_candidates_whose_models_differ_in_key_or_version_alone_each_carry_their_own(
        keys: list[str | None], versions: list[int | None]) -> None:
    d = decision([100.0, 50.0], keys=keys, versions=versions)
    assert records(d) == [value("n0", 100.0), value("n1", 50.0, model_key=keys[1], model_version=versions[1])]
