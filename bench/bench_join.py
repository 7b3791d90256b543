"""The worker's join buffer when it is full: which completions still find their prediction.

The extender publishes one rtt-predictions message per candidate node of each pod, and the worker keeps
them in its :class:`~app.drift.joinbuffer.JoinBuffer` (``max_entries`` keys, 500,000 by default) until
the pod's completion arrives. At 24 pods/s over 300 candidate nodes one worker receives 7,200 predictions
a second, so the buffer is full after about 70 s; a task that runs longer finds its prediction only if the
buffer let other keys go before it.

One seeded run per policy, on a :class:`~app.clock.ManualClock`, with the same pods:

* ``oldest first``: past ``max_entries`` the oldest keys leave, whatever they hold (every prediction is
  fed as ``chosen``, so there is no spare to prefer);
* ``spares first``: the predictions not marked ``chosen`` leave first, oldest first; the prediction for
  the node the extender assumed the pod on is marked.

Each simulated second: the predictions of that second's 24 pods, the completions due in that second (a
pod runs on its chosen node for a uniform 30-300 s), then ``expire()``, which the worker runs at every
checkpoint (each second). Pods arrive all along; the table counts those that arrive during ``--seconds``
after a 100 s warm-up (the buffer is full by then), and the run goes on until the last of them has
finished. It gives the completions matched with their prediction, by task duration, and the share each
policy matches; ``ratio`` is spares first over oldest first. ``µs/arrival`` is the run's time per message
(predictions and completions, the expiries included).

    python3 bench/bench_join.py            # 60 s of counted pods: 3.3 M predictions per policy, ~30 s
    python3 bench/bench_join.py --quick    # a tenth of the candidates and of max_entries (the same 70 s
                                           # to fill): a few seconds
"""

from __future__ import annotations

import argparse
import dataclasses
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from app.clock import ManualClock  # noqa: E402
from app.drift.joinbuffer import MATCHED, JoinBuffer  # noqa: E402

PODS_PER_S = 24
CANDIDATES = 300
MAX_ENTRIES = 500_000  # RTT_JOIN_MAX_ENTRIES
TTL_S = 600.0  # RTT_JOIN_TTL_S
MIN_RUN_S, MAX_RUN_S = 30.0, 300.0
WARM_UP_S = 100  # pods arriving before are not counted
BUCKETS = ((30.0, 70.0), (70.0, 150.0), (150.0, 300.0))  # task durations, s
PREDICTION = {"predicted_rtt_ms": 100.0}  # one payload for every prediction (the join only keeps it)
COMPLETION = {"rtt_ms": 100.0}


@dataclasses.dataclass(frozen=True)
class Setup:
    candidates: int
    max_entries: int
    seconds: int  # of counted arrivals
    seed: int


@dataclasses.dataclass
class Outcome:
    policy: str
    matched: list[int]  # counted completions matched with their prediction, per bucket
    total: list[int]  # counted completions, per bucket
    arrivals: int
    wall_s: float


def bucket(run_s: float) -> int:
    return next(i for i, (_, hi) in enumerate(BUCKETS) if run_s < hi or i == len(BUCKETS) - 1)


def run(policy: str, setup: Setup) -> Outcome:
    """Drive one JoinBuffer second by second (``policy``: ``oldest first`` or ``spares first``)."""
    rng = random.Random(setup.seed)  # the same pods for both policies
    clock = ManualClock(0.0)
    jb = JoinBuffer(TTL_S, setup.max_entries, clock)
    add, complete = jb.add_prediction, jb.add_completion
    mark_all = policy == "oldest first"
    names = [f"node-{i:03d}" for i in range(setup.candidates)]
    counted = range(WARM_UP_S, WARM_UP_S + setup.seconds)
    end = counted.stop + int(MAX_RUN_S) + 1
    due: dict[int, list[tuple[str, str, float, bool]]] = {}
    matched, total = [0] * len(BUCKETS), [0] * len(BUCKETS)
    arrivals = 0
    start = time.perf_counter()
    for s in range(end + 1):
        if s < counted.stop + MAX_RUN_S:  # arrivals go on while counted pods run
            for k in range(PODS_PER_S):
                task_id, chosen, run_s = f"pod-{s}-{k}", rng.choice(names), rng.uniform(MIN_RUN_S, MAX_RUN_S)
                for node in names:
                    add((task_id, node), PREDICTION, chosen=mark_all or node == chosen)
                due.setdefault(s + int(run_s) + 1, []).append((task_id, chosen, run_s, s in counted))
            arrivals += PODS_PER_S * len(names)
        for task_id, chosen, run_s, count in due.pop(s, ()):
            r = complete((task_id, chosen), COMPLETION)
            if count:
                b = bucket(run_s)
                total[b] += 1
                matched[b] += r.outcome == MATCHED
            arrivals += 1
        jb.expire()
        clock.advance(1.0)
        if s % 100 == 99:
            print(f"  {policy}: {s + 1}/{end + 1} s simulated, {len(jb):,} keys held", file=sys.stderr, flush=True)
    return Outcome(policy, matched, total, arrivals, time.perf_counter() - start)


def render(old: Outcome, new: Outcome) -> str:
    lines = [f"{'task duration':>14} {'completions':>12} {'oldest first':>13} {'spares first':>13} {'ratio':>7}"]
    rows = [(f"{lo:.0f}-{hi:.0f} s", old.total[i], old.matched[i], new.matched[i])
            for i, (lo, hi) in enumerate(BUCKETS)]
    rows.append(("all", sum(old.total), sum(old.matched), sum(new.matched)))
    for label, n, a, b in rows:
        ratio = f"{b / a:.2f}" if a else "inf" if b else "-"
        lines.append(f"{label:>14} {n:>12,} {a:>6,} {a / max(n, 1):>5.0%} {b:>6,} {b / max(n, 1):>5.0%} {ratio:>7}")
    for o in (old, new):
        lines.append(f"{o.policy}: {o.arrivals:,} arrivals in {o.wall_s:.1f} s, "
                     f"{o.wall_s / o.arrivals * 1e6:.2f} µs/arrival")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true",
                   help="a tenth of the candidates and of max_entries (the same time to fill)")
    p.add_argument("--seconds", type=int, default=60, help="seconds of counted arrivals (default 60)")
    p.add_argument("--seed", type=int, default=1)
    args = p.parse_args(argv)
    scale = 10 if args.quick else 1
    setup = Setup(CANDIDATES // scale, MAX_ENTRIES // scale, args.seconds, args.seed)
    print(f"{PODS_PER_S} pods/s x {setup.candidates} candidates, runs {MIN_RUN_S:.0f}-{MAX_RUN_S:.0f} s, "
          f"max_entries {setup.max_entries:,}, TTL {TTL_S:.0f} s; pods counted from {WARM_UP_S} s for "
          f"{setup.seconds} s, seed {setup.seed}")
    old = run("oldest first", setup)
    new = run("spares first", setup)
    print(render(old, new))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
