"""The chaos table: each fault against the real processes -> processes dead, messages lost, counted twice, recovery.

    python3 bench/bench_chaos.py [--only broker,away,redis,redis-wiped,kill,input]

Each scenario runs the processes it needs (embedded broker, ``rttsched worker``, ``trainer``, ``extender``,
a redis-server of its own) from ``bench/fault_outages.py`` and ``bench/fault_worker.py`` — the
same scenarios the fault tests run — and reports:

* **dead**: rttsched processes that exited (0 wanted);
* **lost**: messages produced after the fault that were never processed, pairs never counted, models
  announced or retrains asked for that never reached the worker and the extender (0 wanted);
* **twice**: pairs counted, or messages emitted, more than once (0 wanted);
* **recover s**: broker wipe — broker back to the first post-wipe sample (the load resumes 2 s after the
  broker); broker away — broker back to the first sample after it; Redis outage — Redis back to the
  retrain's model served by the worker and the extender; Redis
  restarted without its data — Redis back to the worker serving the model the trainer made for the empty
  registry;
  SIGKILL at period close — second kill to every pair reported (a worker start included); hostile input —
  valid snapshots after a ts = 9.9e10 one to the node's next node-features.

The hostile-input row's notes set its worker's RSS growth for 10,000 node names (capped at 1,000) beside the
same names, measured the same way in the same run, sent to a worker whose cap is raised to hold them all.

Load average and the table go to stdout; progress to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from fault_outages import broker_away, broker_wipe, redis_outage, redis_wiped  # noqa: E402
from fault_stack import Load, Outcome, Stack, stack_on_redis  # noqa: E402
from fault_worker import NAMES, hostile_input, names_uncapped, period_kill  # noqa: E402

from app.config import Settings  # noqa: E402
from app.kafka.admin import ensure_topics  # noqa: E402
from app.kafka.embedded import EmbeddedBroker  # noqa: E402

SCENARIOS = ("broker", "away", "redis", "redis-wiped", "kill", "input")


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _on_stack(root: Path, scenario: Callable[[Stack, Load], Awaitable[Outcome]]) -> Outcome:
    """``scenario`` against a stack of its own (broker, worker, trainer, extender), no Redis."""
    stack = Stack(root)
    try:
        stack.start()
        return asyncio.run(scenario(stack, Load(stack.settings)))
    finally:
        stack.stop()


def run_redis(root: Path) -> Outcome:
    with stack_on_redis(root) as (stack, server):
        return asyncio.run(redis_outage(stack, Load(stack.settings), server))


def run_redis_wiped(root: Path) -> Outcome:
    with stack_on_redis(root, persist=False, trainer_env={"RTT_REGISTRY_CHECK_S": "1"}) as (stack, server):
        return asyncio.run(redis_wiped(stack, Load(stack.settings), server))


def _on_own_broker(root: Path, scenario: str) -> Outcome:
    with EmbeddedBroker() as broker:
        s = Settings.from_env({}, kafka_bootstrap=broker.bootstrap, topic_prefix=f"{scenario}-",
                              models_dir=str(root / "models"), error_period_s=1.0)
        asyncio.run(ensure_topics(s))
        s = dataclasses.replace(s, error_period_s=1.0)
        if scenario == "kill":
            return asyncio.run(period_kill(s, root))[0]
        outcome, r = asyncio.run(hostile_input(s, root))
        say(f"  the same {NAMES:,} names, the cap raised to {NAMES:,}")
        raised = dataclasses.replace(s, topic_prefix=f"{scenario}-uncapped-")
        asyncio.run(ensure_topics(raised))
        u = asyncio.run(names_uncapped(raised, root / "uncapped"))
        return dataclasses.replace(outcome, detail=(
            f"{outcome.detail}; the same names with the cap raised to {NAMES:,} (same run): {u['nodes']:.0f} held,"
            f" RSS +{u['rss_growth_kb'] / 1024:.0f} MB on {u['rss_before_kb'] / 1024:.0f} MB,"
            f" {u['rss_growth_kb'] / max(r['rss_growth_kb'], 1):.1f}x the capped growth"))


def table(rows: list[Outcome]) -> str:
    head = ["fault", "processes dead", "messages lost", "counted twice", "recover s", "notes"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    lines += ["| " + " | ".join(r.row()) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--only", default=",".join(SCENARIOS), help=f"comma-separated subset of {', '.join(SCENARIOS)}")
    args = p.parse_args(argv)
    chosen = [x.strip() for x in args.only.split(",") if x.strip()]
    unknown = set(chosen) - set(SCENARIOS)
    if unknown:
        p.error(f"unknown scenarios {sorted(unknown)} (choose from {', '.join(SCENARIOS)})")
    runners = {"broker": lambda r: _on_stack(r, broker_wipe), "away": lambda r: _on_stack(r, broker_away),
               "redis": run_redis, "redis-wiped": run_redis_wiped,
               "kill": lambda r: _on_own_broker(r, "kill"), "input": lambda r: _on_own_broker(r, "input")}
    rows = []
    with tempfile.TemporaryDirectory(prefix="rtt-chaos-") as tmp:
        for i, name in enumerate(chosen, 1):
            say(f"scenario {i}/{len(chosen)}: {name}")
            t0 = time.monotonic()
            rows.append(runners[name](Path(tmp) / name))
            say(f"  done in {time.monotonic() - t0:.0f} s: {rows[-1]}")
    print(f"load average {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f} "
          f"on {os.cpu_count()} CPUs")
    print(table(rows))
    return 0 if all(r.dead == r.lost == r.twice == 0 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
