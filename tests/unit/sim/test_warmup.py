"""bench/bench_warmup.py: rtt_aware's mean over the clairvoyant's, split by app and arrival time."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
from bench_warmup import POLICIES, rows

from app.sim.policies.rtt_aware import RttAware
from app.sim.runner import SimConfig, run_offline


def test_the_slices_add_up_to_the_difference_of_the_means() -> None:
    cfg = SimConfig(n_tasks=400)
    runs = {p: run_offline(cfg, (lambda rng: RttAware(rng)) if p == "rtt_aware" else p, 2) for p in POLICIES}
    assert all(m.ok.all() for m in runs.values())  # every task ran: the sum is exact
    body = rows(runs, [0.0, 2.0, 6.0])
    gap = runs["rtt_aware"].rtt_ms.mean() - runs["clairvoyant"].rtt_ms.mean()
    assert sum(float(r[-1]) for r in body) == pytest.approx(gap, abs=0.01 * len(body))
    assert {r[0] for r in body} == {"0–2 s", "2–6 s", "6 s –"}
    assert {r[1] for r in body} == {"Motioncor2", "gCTF", "upload"}
    assert sum(int(r[2]) for r in body) == 400
    for r in body:
        shares = [float(x) for x in r[6:9] if x != "–"]
        assert shares, r  # every slice has tasks of its app under at least one policy
        assert all(0.0 <= s <= 1.0 for s in shares)
        if r[1] != "upload":  # a GPU app never runs on a CPU node
            assert shares == [0.0] * len(shares)
    first = [r for r in body if r[0] == "0–2 s"]
    sel = (runs["rtt_aware"].submit_s < 2.0) & (np.asarray(runs["rtt_aware"].apps) == first[0][1])
    assert float(first[0][5]) == pytest.approx(runs["rtt_aware"].rtt_ms[sel].mean(), abs=0.05)


@pytest.mark.parametrize("argv", [["--scenario", "nope"], ["--edges", "0,x"], ["--edges", "2,1"]])
def test_bad_arguments_are_named(argv: list[str], bench_error: Callable[[str, list[str]], str]) -> None:
    line = bench_error("bench_warmup", argv)
    assert line.removeprefix("argument ").startswith(f"{argv[0]}: ") and line.count(argv[0]) == 1  # named once
