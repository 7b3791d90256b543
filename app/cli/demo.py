"""``rttsched demo``: the whole system on a simulated cluster, then the baselines on the same workload.

Starts the embedded broker (unless ``RTT_KAFKA_BOOTSTRAP`` names one), creates the topics under a fresh
uuid prefix, starts worker, trainer and extender as child processes on free ports, runs the simulated
cluster live against them for a few minutes (placement by the real extender over HTTP), then runs the
offline policies on the same workload and seed, prints the policy table and writes the report. Everything
it started is stopped on the way out: normal end, error, Ctrl-C (SIGINT), SIGTERM or SIGHUP (the terminal or SSH
session closed; one ignored, as under ``nohup``, stays ignored). Stopped by a signal, it exits with 128 + its number,
as a shell expects: 130 (SIGINT), 143 (SIGTERM), 129 (SIGHUP). The terminal's signals do not reach its children,
each in a session of its own: the demo stops them, and on Linux they get SIGTERM when it dies without stopping
them (a SIGKILL), its Python children SIGKILL 10 s later if still running (:mod:`app.cli.processes`).
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import time
from pathlib import Path
from typing import Any

from app.cli.output import say

HELP = "run broker, worker, trainer and extender on a live simulated cluster, compare with baselines, write a report"
LIVE_NAME = "rtt_aware_live"
# every policy in the report's order (app.sim.policies.POLICY_NAMES, not imported here: the CLI starts fast),
# baselines first: the goals' best baseline is the best of them all, the tuned Trimaran ones included
OFFLINE_POLICIES = ("kube_default", "round_robin", "random", "load_aware", "target_load", "load_aware_tuned",
                    "target_load_tuned", "static_best", "rtt_aware", "clairvoyant")
READY_TIMEOUT_S = 120.0
MAX_MINUTES = 1440  # a day of live run
HANGUP = getattr(signal, "SIGHUP", None)  # the terminal or SSH session closed (none on Windows)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--minutes", type=float, default=3.0, help="wall minutes of the live run (default 3)")
    p.add_argument("--tasks", type=int, default=None,
                   help="tasks in the workload (default: 4 per node per simulated second over the run)")
    p.add_argument("--seed", type=int, default=1, help="workload and policy seed (default 1)")
    p.add_argument("--speed", type=float, default=1.0,
                   help="simulated seconds per wall second of the live run (default 1 = real time; see docs/demo.md)")
    p.add_argument("--out", default="reports/demo", help="report directory (default reports/demo)")
    p.add_argument("--no-live", action="store_true", help="offline policies only (no broker, no processes)")
    p.add_argument("--no-html", action="store_true", help="CSV and JSON only")


def _say(msg: str) -> None:
    """One line on stderr. One that cannot be written is dropped, never raised: the clean-up that says what it
    does goes on after a hang-up; a terminal that is gone (EIO) or a reader gone (EPIPE) gets nothing more, and
    the last line (``rttsched demo: interrupted``) goes nowhere instead of failing again."""
    say(f"demo: {msg}", sys.stderr)


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP stopping the live run as Ctrl-C does (the same clean-up), remembering which: the demo then
    exits with 128 + its number, as a shell reports a command that signal ended (143, 129)."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _raise_interrupt(signum: int, _frame: Any) -> None:
    raise Stopped(signum)


def demo_config(minutes: float, tasks: int | None, speed: float, scrape_interval_s: float = 1.0) -> Any:
    """The workload: ``tasks`` over ``minutes`` wall minutes at ``speed`` (default rate: 4 per node per s)."""
    from app.config import check_flag, positive
    from app.errors import ConfigError
    from app.sim.hardware import preset
    from app.sim.runner import RATE_PER_NODE_S, SimConfig

    check_flag("--minutes", minutes, positive)  # > 0 and finite, as the settings' durations
    if minutes > MAX_MINUTES:  # its workload is drawn up front: 1e300 minutes would be a workload without end
        raise ConfigError("--minutes", f"must be <= {MAX_MINUTES}, a day (got {minutes:g})")
    if tasks is not None and tasks < 1:
        raise ConfigError("--tasks", f"must be >= 1 (got {tasks})")
    sim_s = minutes * 60.0 * speed
    if tasks is None:
        rate = RATE_PER_NODE_S * len(preset("small"))
        return SimConfig(n_tasks=max(1, round(rate * sim_s)), rate_per_s=rate, scrape_interval_s=scrape_interval_s)
    return SimConfig(n_tasks=tasks, rate_per_s=tasks / sim_s, scrape_interval_s=scrape_interval_s)


def _half_accuracy(m: Any) -> dict[str, float]:
    """1 - MAPE per ``app:node_class`` over the tasks of the second half that carry a prediction."""
    import numpy as np

    late = (np.arange(len(m.apps)) >= len(m.apps) // 2) & m.ok & np.isfinite(m.predicted_ms) & (m.rtt_ms > 0)
    apps, classes = np.array(m.apps), m.task_node_class()
    out = {}
    for key in sorted({f"{a}:{c}" for a, c in zip(apps[late], classes[late], strict=True)}):
        app, cls = key.split(":")
        sel = late & (apps == app) & (classes == cls)
        out[key] = max(0.0, 1.0 - float(np.mean(np.abs(m.predicted_ms[sel] - m.rtt_ms[sel]) / m.rtt_ms[sel])))
    return out


def explain_examples(url: str, config: Any, input_mb: float = 512.0) -> list[dict[str, Any]]:
    """One ``POST /explain`` per app over its candidates (GPU apps: the GPU nodes), for the report."""
    from app.cli.explain import post
    from app.errors import RttError
    from app.sim.apps import APPS
    from app.sim.policies.extender_http import pod_json
    from app.sim.runner import build_nodes

    nodes = build_nodes(config, 1.0)
    out = []
    for i, (app, profile) in enumerate(APPS.items()):
        names = [n.name for n in nodes if n.node_class == "gpu" or not profile.wants_gpu]
        body = {"Pod": pod_json(f"explain{i}", app, input_mb), "NodeNames": names, "Explain": {"top": 3}}
        try:
            out.append(post(url, body, 10.0))
        except RttError as exc:  # the report goes without this example; the run's figures stand
            _say(f"no explanation for {app}: {exc}")
    return out


async def remove_leftovers(settings: Any, *, topics: bool = True) -> str:
    """Delete what the demo made under its own prefix on a broker and a Redis it did not start: its topics
    (``topics``) and, with ``REDIS_URL``, its Redis keys; what was done, in a line. A failure is said, not
    raised: the run's results stand."""
    from app.kafka.admin import delete_prefixed_topics
    from app.redis_client import delete_prefixed_keys

    done = []
    if topics:
        try:
            done.append(f"removed its {len(await delete_prefixed_topics(settings))} topics ({settings.topic_prefix}*)")
        except Exception as exc:  # noqa: BLE001 - reported, never the end of a finished run
            done.append(f"could not remove its topics {settings.topic_prefix}*: {exc}")
    if settings.redis_url:
        try:
            done.append(f"removed its {await delete_prefixed_keys(settings)} Redis keys "
                        f"(rttsched:{settings.topic_prefix}*)")
        except Exception as exc:  # noqa: BLE001
            done.append(f"could not remove its Redis keys rttsched:{settings.topic_prefix}*: {exc}")
    return "; ".join(done)


def _live(args: argparse.Namespace, settings: Any, config: Any, out: Path) -> tuple[Any, list[dict[str, Any]]]:
    """Start everything, run live, ask the extender to explain a few placements, stop everything (also on
    errors and interrupts)."""
    import asyncio
    import dataclasses
    import tempfile
    import uuid

    import orjson

    from app.cli.processes import ProcessError, ProcessGroup
    from app.kafka.admin import ensure_topics
    from app.kafka.embedded import EmbeddedBroker, free_ports
    from app.redis_client import check_redis
    from app.sim.live import run_live, scaled_worker_env
    from app.sim.policies.rtt_aware import shipped_policy

    old_term = signal.signal(signal.SIGTERM, _raise_interrupt)
    old_int = signal.getsignal(signal.SIGINT)
    # SIGHUP: the terminal or SSH session closed. The children, each in a session of its own, do not get it: it
    # stops the demo as SIGTERM does, unless it is ignored (nohup)
    old_hup = signal.getsignal(HANGUP) if HANGUP is not None else None
    if HANGUP is not None and old_hup is not signal.SIG_IGN:
        signal.signal(HANGUP, _raise_interrupt)
    broker: EmbeddedBroker | None = None
    group: ProcessGroup | None = None
    made: Any = None  # the demo's settings once its topics exist
    tmp = tempfile.TemporaryDirectory(prefix="rttsched-demo-")
    t0 = time.monotonic()
    try:
        pids: dict[str, int] = {}
        logs = out / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        bootstrap = settings.kafka_bootstrap
        if not bootstrap:
            _say("starting the embedded broker")
            broker = EmbeddedBroker()  # bound before it starts: an interrupt during start still stops it
            broker.start()
            bootstrap = broker.bootstrap
            pids["broker"] = broker.pid or 0
            (logs / "pids.json").write_bytes(orjson.dumps(pids))
        prefix = f"demo-{uuid.uuid4().hex[:8]}-"
        s = dataclasses.replace(settings, kafka_bootstrap=bootstrap, topic_prefix=prefix,
                                models_dir=str(Path(tmp.name) / "models"))
        if s.redis_url:  # unreachable or refused: one line now, not a run whose every model load fails
            asyncio.run(check_redis(s))
        asyncio.run(ensure_topics(s))
        made = s  # what the demo made under its prefix is removed at the end
        ext_port, worker_port, trainer_port = free_ports(3)  # distinct: each child binds its own
        env = {"RTT_KAFKA_BOOTSTRAP": bootstrap, "RTT_TOPIC_PREFIX": prefix, "RTT_MODELS_DIR": s.models_dir,
               "RTT_METRICS_PORT": "0", "PYTHONUNBUFFERED": "1", **scaled_worker_env(settings, args.speed)}
        group = ProcessGroup(logs, env)
        group.start("worker", ["worker", "--datadir", str(Path(tmp.name) / "faust"), "--loglevel", "warning"],
                    env={"RTT_METRICS_PORT": str(worker_port)})
        group.start("trainer", ["trainer"], env={"RTT_METRICS_PORT": str(trainer_port)})
        policy_file = Path(tmp.name) / "extender-policy.json"
        policy_file.write_bytes(orjson.dumps(dict(shipped_policy())))  # the policy the offline rtt_aware runs
        group.start("extender", ["extender", "--host", "127.0.0.1", "--port", str(ext_port),
                                 "--policy", str(policy_file)])
        pids.update({name: proc.pid for name, proc in group.children.items()})
        (logs / "pids.json").write_bytes(orjson.dumps(pids))
        _say(f"topics under prefix {prefix} on {bootstrap}; worker, trainer, extender starting")
        _say(f"logs in {logs}")
        url = f"http://127.0.0.1:{ext_port}"
        group.wait_http("extender", f"{url}/readyz", READY_TIMEOUT_S)
        # /readyz, not an open port: the worker and the trainer answer on their port while they wait for Kafka at
        # start (503 there), the worker's /readyz is 200 once Faust's own server runs
        group.wait_http("worker", f"http://127.0.0.1:{worker_port}/readyz", READY_TIMEOUT_S)
        group.wait_http("trainer", f"http://127.0.0.1:{trainer_port}/readyz", READY_TIMEOUT_S)
        _say(f"ready after {time.monotonic() - t0:.1f}s: " + ", ".join(f"{k} pid {v}" for k, v in pids.items()))
        _say(f"live run: {config.n_tasks} tasks, about {args.minutes:g} min at speed {args.speed:g}, extender {url}")
        result = run_live(config, s, url, args.seed, speed=args.speed, on_tick=group.check)
        return result, explain_examples(url, config)
    except ProcessError as exc:  # one line for the user; the child's whole log stays in logs/
        lines = [ln for ln in str(exc).splitlines() if ln.strip()]
        raise ProcessError(f"{lines[0].split(';')[0]}: {lines[-1].strip() if len(lines) > 1 else ''} "
                           f"(logs in {out / 'logs'})") from None
    finally:
        for stopping in (signal.SIGINT, signal.SIGTERM, HANGUP):  # a second signal must not cut the clean-up short
            if stopping is not None:
                signal.signal(stopping, signal.SIG_IGN)
        try:
            if group is not None:
                group.stop()
            if made is not None and (broker is None or made.redis_url):  # on the user's broker or Redis
                _say(asyncio.run(remove_leftovers(made, topics=broker is None)))
            if broker is not None:
                broker.stop()
            with contextlib.suppress(OSError):
                tmp.cleanup()
            _say(f"stopped everything it started ({time.monotonic() - t0:.1f}s since start)")
        finally:
            signal.signal(signal.SIGINT, old_int)
            signal.signal(signal.SIGTERM, old_term)
            if HANGUP is not None and old_hup is not None:
                signal.signal(HANGUP, old_hup)


def run(args: argparse.Namespace, settings: Any) -> int:
    import logging

    from tqdm import tqdm

    from app.cli.flags import writable_dir
    from app.cli.summary import bar_width, live_lines, output_lines, summary_lines
    from app.errors import ConfigError
    from app.sim.report import goal_rows, hardware_labels, report_problem, summarise, write_report
    from app.sim.report.halves import half_figures
    from app.sim.runner import describe, run_offline

    if not 0 < args.speed <= 20:
        raise ConfigError("--speed", f"must be in (0, 20] (got {args.speed})")
    if args.seed < 0:  # numpy seeds are >= 0
        raise ConfigError("--seed", f"must be >= 0 (got {args.seed})")
    if args.seed >= 2**63:  # the report's JSON holds 64-bit integers: a larger seed failed after the runs
        raise ConfigError("--seed", f"must be below 2**63 (got {args.seed})")
    config = demo_config(args.minutes, args.tasks, args.speed, settings.scrape_interval_s)
    if not getattr(args, "verbose", False):
        logging.getLogger().setLevel(logging.WARNING)  # progress bars and the table; -v for every log line
        logging.getLogger("aiokafka").setLevel(logging.CRITICAL)  # retried connects while the broker starts
    out = writable_dir(args.out, "--out")  # before the runs: a bad one fails at once, not after them
    if problem := report_problem(out, html=not args.no_html):  # an OSError after every run, else
        raise ConfigError("--out", problem)
    t_start = time.monotonic()
    runs: dict[str, list[Any]] = {}
    explained: list[dict[str, Any]] = []
    info: dict[str, Any] = {**describe(config), "seed": args.seed}
    if not args.no_live:
        try:
            live, explained = _live(args, settings, config, out)
        except Stopped as exc:  # Ctrl-C (130) is said by the command's main
            say("rttsched demo: interrupted", sys.stderr)
            return 128 + exc.signum
        runs[LIVE_NAME] = [live.metrics]
        info["live"] = live.describe()
    with tqdm(total=len(OFFLINE_POLICIES), file=sys.stderr, unit="policy", desc="offline", ncols=bar_width()) as bar:
        for policy in OFFLINE_POLICIES:
            bar.set_postfix_str(policy)
            runs[policy] = [run_offline(config, policy, args.seed)]
            bar.update(1)
    agg = summarise(runs)
    live_rows = [LIVE_NAME] if LIVE_NAME in runs else []
    print(f"\n{config.n_tasks} tasks, seed {args.seed}; " + (
        f"{LIVE_NAME}: live (real worker, trainer, extender)\nother rows: offline simulator" if live_rows
        else "every row: offline simulator"))
    print("\n".join(summary_lines(agg, goal_rows(agg, live=live_rows))))
    if live_rows:
        halves = {p: tuple(half_figures(runs[p][0], w)["mean_rtt_ms"] for w in ("all", "first", "second"))
                  for p in (LIVE_NAME, *OFFLINE_POLICIES)}
        # the clairvoyant's column: its estimate at placement (true work, every running task), what knowing
        # everything then buys a prediction while later arrivals still change the RTT
        accuracy = {p: _half_accuracy(runs[p][0]) for p in (LIVE_NAME, "rtt_aware", "clairvoyant") if p in runs}
        info["accuracy_second_half"] = accuracy
        print()
        print("\n".join(live_lines(info["live"], halves, LIVE_NAME, accuracy)))
    if not args.no_html:  # the plots take seconds after the last run
        _say("writing the report")
    write_report(runs, out, info, html=not args.no_html, live=live_rows, hardware=hardware_labels(config),
                 explained=explained)
    print()
    print("\n".join([*output_lines(out, not args.no_html), f"{time.monotonic() - t_start:.0f}s in all"]))
    return 0
