"""Which pods count for which node and app, and the per-node view built from them."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.extender.podwatch_view import count_running, diff_views, encode_node, placement, tally
from app.scheduler.cache import decode_running
from app.scheduler.podinfo import PodError

PODS = Path(__file__).resolve().parents[2] / "fixtures" / "pods"
STARTED = {"gpu-4090-1": {"gCTF": 2, "Motioncor2": 1}, "gpu-m40-1": {"Motioncor2": 1}, "cpu-1": {"upload": 1}}
COUNTED = {**STARTED, "gpu-m40-1": {"Motioncor2": 1, "gCTF": 1}}  # gctf-run-m9n0p is terminating: still counts
EXPECTED = {node: {"apps": COUNTED[node], "started": STARTED[node]} for node in COUNTED}


def podlist() -> list[dict[str, Any]]:
    return list(json.loads((PODS / "podlist.json").read_text())["items"])


def test_fixture_pod_list_counts_bound_unfinished_labelled_pods_on_their_nodes():
    view, malformed = count_running(podlist())
    assert view == EXPECTED
    assert malformed == 0


def test_unbound_finished_and_unlabelled_pods_do_not_count():
    by_name = {p["metadata"]["name"]: p for p in podlist()}
    for name in ("gctf-run-t3u4v", "motioncor2-run-z7a8b", "nginx-web-w5x6y"):
        key, where = placement(by_name[name])
        assert key == by_name[name]["metadata"]["uid"] and where is None, name
    assert placement(by_name["upload-run-q1r2s"])[1] == ("cpu-1", "upload", True)
    failed = _with(by_name["upload-run-q1r2s"], ("status", "phase"), "Failed")
    assert placement(failed)[1] is None


@pytest.mark.parametrize(("phase", "terminating", "started"), [
    ("Pending", False, False),  # bound, pulling its image or ContainerCreating
    ("Running", True, False),  # terminating: its containers run until the grace period ends
    ("Pending", True, False),
    ("Unknown", False, False),  # its node stopped reporting; it may still run
    (None, False, False),  # no status yet
    ("Running", False, True),
])
def test_bound_pods_count_until_finished_and_have_started_only_while_running(phase, terminating, started):
    pod = copy.deepcopy({p["metadata"]["name"]: p for p in podlist()}["gctf-run-a1b2c"])
    pod["status"] = {"phase": phase} if phase else {}
    if terminating:
        pod["metadata"]["deletionTimestamp"] = "2024-05-14T09:40:00Z"
    assert placement(pod)[1] == ("gpu-4090-1", "gCTF", started)


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
    assert malformed == 1 and view == {"gpu-4090-1": {"apps": {"gCTF": 1}, "started": {"gCTF": 1}}}


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


def _naive(specs: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, int]]]:
    out: dict[str, dict[str, dict[str, int]]] = {}
    for s in specs:
        if s["app"] in APPS and s["node"] and s["phase"] not in ("Succeeded", "Failed"):
            node = out.setdefault(s["node"], {"apps": {}, "started": {}})
            node["apps"][s["app"]] = node["apps"].get(s["app"], 0) + 1
            if s["phase"] == "Running" and not s["terminating"]:
                node["started"][s["app"]] = node["started"].get(s["app"], 0) + 1
    return out


@given(st.lists(pod_specs, max_size=40), st.lists(junk, max_size=5), st.randoms(use_true_random=False))
def test_count_equals_a_naive_recount_in_any_order_and_skips_exactly_the_junk(specs, bad, rnd):
    pods: list[Any] = [_pod(i, s) for i, s in enumerate(specs)] + list(bad)
    rnd.shuffle(pods)
    view, malformed = count_running(pods)
    assert view == _naive(specs)
    assert malformed == len(bad)
    assert all(n > 0 for counts in view.values() for apps in counts.values() for n in apps.values())
    assert all(counts["apps"].get(app, 0) >= n for counts in view.values() for app, n in counts["started"].items())


apps_counts = st.dictionaries(st.sampled_from(APPS), st.integers(1, 5), min_size=1)
views = st.dictionaries(st.sampled_from(NODES), st.fixed_dictionaries({"apps": apps_counts, "started": apps_counts}))


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
    assert tally([("n", "a", True)] * 3) == {"n": {"apps": {"a": 3}, "started": {"a": 3}}}
    assert tally([("n", "a", False)]) == {"n": {"apps": {"a": 1}, "started": {}}}


def test_a_node_value_keeps_apps_as_the_extender_decodes_it_and_adds_started():
    raw = encode_node({"apps": {"gCTF": 2}, "started": {"gCTF": 1}}, 7.5)
    assert decode_running(raw) == {"gCTF": 2}
    assert orjson.loads(raw) == {"apps": {"gCTF": 2}, "started": {"gCTF": 1}, "ts": 7.5}
