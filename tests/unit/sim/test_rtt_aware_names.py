"""rtt_aware remembers the names of the last few candidate lists: a list seen again gets the same names and nodes,
a changed list (a node filled up, freed room, joined or left) its own."""

from __future__ import annotations

import numpy as np

from app.sim.hardware import NodeSpec
from app.sim.policies.rtt_aware import NAMED_LISTS, RttAware


def spec(name: str) -> NodeSpec:
    return NodeSpec(name, "cpu", 8, 32.0, 500.0)


def test_a_candidate_list_seen_again_gets_its_names_and_a_changed_one_its_own() -> None:
    policy = RttAware(np.random.default_rng(0), background=False)
    a, b, c = spec("a"), spec("b"), spec("c")
    by_name, names = policy._by_name([a, b, c])
    assert names == ("a", "b", "c") and by_name == {"a": a, "b": b, "c": c}
    assert policy._by_name([a, b, c])[1] is names  # a new list with the same nodes
    assert policy._by_name([a, c])[1] == ("a", "c")
    assert policy._by_name([c, b, a])[1] == ("c", "b", "a")
    lists = [[spec(f"n{k}")] for k in range(NAMED_LISTS + 1)]
    for nodes in lists:
        assert policy._by_name(nodes)[1] == (nodes[0].name,)
    assert policy._by_name([a, b, c])[1] == ("a", "b", "c")  # forgotten by then: named afresh


def test_changing_the_list_passed_changes_nothing_remembered() -> None:
    policy = RttAware(np.random.default_rng(0), background=False)
    nodes = [spec("a"), spec("b")]
    policy._by_name(nodes)
    nodes.append(spec("c"))
    assert policy._by_name(nodes)[1] == ("a", "b", "c")
