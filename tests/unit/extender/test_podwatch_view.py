"""Which pods count for which node and app, and the per-node view built from them."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.extender.podwatch_view import count_running, diff_views, placement, tally
from app.scheduler.podinfo import PodError

PODS = Path(__file__).resolve().parents[2] / "fixtures" / "pods"
EXPECTED = {"gpu-4090-1": {"gCTF": 2, "Motioncor2": 1}, "gpu-m40-1": {"Motioncor2": 1}, "cpu-1": {"upload": 1}}


def podlist() -> list[dict[str, Any]]:
    return list(json.loads((PODS / "podlist.json").read_text())["items"])


def test_fixture_pod_list_counts_running_labelled_pods_on_their_nodes():
    view, malformed = count_running(podlist())
    assert view == EXPECTED
    assert malformed == 0


def test_pending_terminating_finished_and_unlabelled_pods_do_not_count():
    by_name = {p["metadata"]["name"]: p for p in podlist()}
    for name in ("gctf-run-t3u4v", "gctf-run-m9n0p", "motioncor2-run-z7a8b", "nginx-web-w5x6y"):
        key, where = placement(by_name[name])
        assert key == by_name[name]["metadata"]["uid"] and where is None, name
    assert placement(by_name["upload-run-q1r2s"])[1] == ("cpu-1", "upload")


def _with(pod: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(pod)
    target = out
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value
    return out


@pytest.mark.parametrize(("path", "value"), [
    (("metadata",), ["not", "an", "object"]),
    (("metadata", "labels"), "rttsched.io/app=gCTF"),
    (("metadata", "uid"), 42),
    (("spec",), "gpu-4090-1"),
    (("spec", "nodeName"), 7),
    (("status",), []),
    (("status", "phase"), True),
])
def test_malformed_pods_raise_pod_error_and_are_skipped_by_the_count(path, value):
    good = podlist()[0]
    bad = _with(good, path, value)
    with pytest.raises(PodError):
        placement(bad)
    view, malformed = count_running([bad, good])
    assert malformed == 1 and view == {"gpu-4090-1": {"gCTF": 1}}


def test_a_pod_without_uid_or_name_has_no_identity():
    with pytest.raises(PodError, match="neither"):
        placement({"metadata": {"namespace": "cryoem", "labels": {"rttsched.io/app": "gCTF"}}})
    assert placement({"metadata": {"namespace": "em", "name": "p"}})[0] == "em/p"


# -- invariants against a naive recount
NODES = ["gpu-a", "gpu-b", "cpu-a"]
APPS = ["gCTF", "Motioncor2", "upload"]

pod_specs = st.fixed_dictionaries({
    "app": st.sampled_from([*APPS, None, "", "x" * 65]),
    "node": st.sampled_from([*NODES, None, ""]),
    "phase": st.sampled_from(["Running", "Pending", "Succeeded", "Failed", "Unknown", None]),
    "terminating": st.booleans(),
})
junk = st.one_of(st.none(), st.integers(), st.text(max_size=5), st.lists(st.integers(), max_size=2),
                 st.just({"metadata": {"uid": 5}}), st.just({"metadata": {"uid": "j"}, "spec": "x"}))


def _pod(i: int, s: dict[str, Any]) -> dict[str, Any]:
    meta: dict[str, Any] = {"uid": f"uid-{i}", "name": f"p-{i}", "namespace": "ns", "labels": {}}
    if s["app"] is not None:
        meta["labels"]["rttsched.io/app"] = s["app"]
    if s["terminating"]:
        meta["deletionTimestamp"] = "2024-05-14T09:31:02Z"
    return {"metadata": meta, "spec": {"nodeName": s["node"]} if s["node"] is not None else {},
            "status": {"phase": s["phase"]} if s["phase"] is not None else {}}


def _naive(specs: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    out: dict[str, dict[str, int]] = {}
    for s in specs:
        if s["app"] in APPS and s["node"] and s["phase"] == "Running" and not s["terminating"]:
            out.setdefault(s["node"], {}).setdefault(s["app"], 0)
            out[s["node"]][s["app"]] += 1
    return out


@given(st.lists(pod_specs, max_size=40), st.lists(junk, max_size=5), st.randoms(use_true_random=False))
def test_count_equals_a_naive_recount_in_any_order_and_skips_exactly_the_junk(specs, bad, rnd):
    pods: list[Any] = [_pod(i, s) for i, s in enumerate(specs)] + list(bad)
    rnd.shuffle(pods)
    view, malformed = count_running(pods)
    assert view == _naive(specs)
    assert malformed == len(bad)
    assert all(n > 0 for apps in view.values() for n in apps.values())


views = st.dictionaries(st.sampled_from(NODES), st.dictionaries(st.sampled_from(APPS), st.integers(1, 5), min_size=1))


@given(views, views)
def test_diff_turns_the_old_view_into_the_new_one_touching_only_what_changed(old, new):
    changed, removed = diff_views(old, new)
    result = {n: a for n, a in old.items() if n not in removed}
    result.update(changed)
    assert result == new
    assert all(old.get(n) != a for n, a in changed.items())
    assert set(removed) == set(old) - set(new)


def test_tally_counts_each_placement_once():
    assert tally([]) == {}
    assert tally([("n", "a")] * 3) == {"n": {"a": 3}}
