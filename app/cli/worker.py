"""``rttsched worker``: run the stream processor (Faust worker) until SIGTERM / Ctrl-C.

Broker, topic prefix, windows and the /metrics port come from the RTT_* settings. Start more workers
with the same ``--id`` to split the partitions between them. A stop that has not finished
``--stop-timeout-s`` after the signal ends with one ERROR line and exit code 1 (:mod:`app.streams.shutdown`).
Started before its broker or its topics, it waits for them (:func:`app.kafka.admin.wait_reachable`, bounded by
``RTT_KAFKA_START_WAIT_S``, counted from its first wait), its metrics port answering probes meanwhile; SIGTERM or
Ctrl-C then stops it at once (one line, exit code 0); a second one while that stop still waits (a lookup of the
broker's name that a resolver does not answer) ends it at once: one line, exit code 143 (130 for Ctrl-C). A broker
that answers the wait and is gone before Faust's producer connected sends it back to waiting (one WARNING, then a
new Faust app) for what is left of that bound (none left: the one line below, ``… (gave up after N s:
RTT_KAFKA_START_WAIT_S=…)``); gone after that, or another Kafka error that ends Faust's start, and the worker ends
with one line naming ``RTT_KAFKA_BOOTSTRAP`` and exit code 2
(:class:`app.streams.shutdown.DeadlineWorker` keeps Faust's traceback out) -- also when a SIGTERM or Ctrl-C comes
during the stop that follows that failure (it only asked for that stop). A signal at any other moment of the start,
between two event loops included (the wait's end and Faust's handlers, a failed start and the wait again), and after
a clean stop, is a clean stop: exit code 0 (:class:`app.stopping.SignalRoute`).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from app.stopping import SignalRoute

# flag -> the environment variable it overrides (errors name the one the value came from: flag_errors)
FLAGS = {"--session-timeout-s": "RTT_WORKER_SESSION_TIMEOUT_S", "--history-s": "RTT_FEATURE_HISTORY_S",
         "--datadir": "RTT_WORKER_DATADIR"}
HELP = ("run the stream processor: node-metrics -> node-features, feedback loop (join, errors, retrain events, "
        "node-weights), dead letters, /metrics on RTT_METRICS_PORT")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--id", default=None,
                   help="Faust app id = consumer group (default {RTT_TOPIC_PREFIX}rttsched-worker)")
    p.add_argument("--session-timeout-s", type=float, default=None,
                   help="Kafka group session timeout (default RTT_WORKER_SESSION_TIMEOUT_S, 10)")
    p.add_argument("--history-s", type=float, default=None,
                   help="per-node bucket history in seconds, at least the longest feature window"
                        " (default RTT_FEATURE_HISTORY_S, 120)")
    p.add_argument("--datadir", default=None, help="Faust data directory (default RTT_WORKER_DATADIR, var/faust)")
    p.add_argument("--stop-timeout-s", type=float, default=None,
                   help="after SIGTERM / Ctrl-C, exit (code 1, one ERROR line saying why) when the stop has not"
                        " finished within this (default 30; below Kubernetes' grace period)")
    p.add_argument("--loglevel", default="info", choices=["debug", "info", "warning", "error"])


def run(args: argparse.Namespace, settings: Any) -> int:
    import asyncio
    import dataclasses
    import logging
    import time

    from aiokafka.errors import KafkaConnectionError

    from app.cli.flags import flag_errors, writable_dir
    from app.config import check_flag, positive, topic_name_part
    from app.contracts import load_contracts
    from app.kafka.admin import TopicError
    from app.kafka.quiet import PERIOD_S, quiet_client_errors
    from app.listen import hold_listen
    from app.stopping import SignalRoute
    from app.streams.app import create_app, start_steps
    from app.streams.metrics import WorkerMetrics
    from app.streams.options import WorkerOptions
    from app.streams.shutdown import DEFAULT_STOP_TIMEOUT_S, DeadlineWorker, StopDeadline

    log = logging.getLogger("app.cli.worker")
    if args.id is not None:  # the consumer group and a part of its changelog topics' names
        check_flag("--id", args.id, topic_name_part)
    stop_timeout_s = DEFAULT_STOP_TIMEOUT_S if args.stop_timeout_s is None else args.stop_timeout_s
    check_flag("--stop-timeout-s", stop_timeout_s, positive)
    with flag_errors(args, FLAGS):  # bad flags first, named as typed
        opts = WorkerOptions.from_settings(settings, session_timeout_s=args.session_timeout_s,
                                           history_s=args.history_s, datadir=args.datadir)
        given = {field: value for field, value in (("worker_session_timeout_s", args.session_timeout_s),
                                                   ("feature_history_s", args.history_s)) if value is not None}
        dataclasses.replace(settings, **given)  # and the checks of their variables (finite, at most a day ...)
        writable_dir(opts.datadir, "RTT_WORKER_DATADIR")
    # Faust's web server would bind /metrics late, with a page of traceback when the port is taken: bound here
    # first and held, the web server serves on this socket
    held = hold_listen(settings.metrics_host, settings.metrics_port, "RTT_METRICS_PORT", "RTT_METRICS_HOST")
    # no broker yet, or its topics not created: wait for them (RTT_KAFKA_START_WAIT_S), answering probes meanwhile
    # (/readyz 503 "not ready: kafka ..."); SIGTERM stops it cleanly. One clear line, not Faust's traceback, when
    # the wait is bounded and ends.
    began = time.monotonic()  # RTT_KAFKA_START_WAIT_S bounds from the first wait on: every wait and try after it
    since: float | None = None  # the first wait counts from its own start, one after it from ``began``
    # SIGTERM and Ctrl-C through one handler from here to the process's end, passed to the event loop of the moment
    # (the wait's, Faust's) and kept between two: none finds its default (143, KeyboardInterrupt) as a loop ends
    signals = SignalRoute()
    try:
        while True:
            # the app's series, made now: the wait's /metrics serves them (rtt_kafka_start_waiting 1), Faust's page
            # after it; made again for an app made again (an app registers series of its own on them)
            metrics = WorkerMetrics()
            stopped_by = asyncio.run(_wait_for_kafka(settings, tuple(load_contracts()), held, metrics.registry,
                                                     since, signals))
            if stopped_by:
                print(f"worker: stopped ({stopped_by}) while waiting for Kafka", flush=True)
                return 0
            quiet_client_errors(PERIOD_S)
            app = create_app(settings, id=args.id, options=opts, web_socket=held, metrics=metrics)
            print(f"worker {app.conf.id} on {settings.bootstrap_servers}"
                  + (f", /metrics on port {settings.metrics_port}" if settings.metrics_port else ""), flush=True)
            # the deadline stays armed until the process ends: Python's exit waits for Faust's consumer thread too
            deadline = StopDeadline(stop_timeout_s, settings.bootstrap_servers)
            worker = DeadlineWorker(app, deadline=deadline, signals=signals, loglevel=args.loglevel, quiet=True,
                                    redirect_stdouts=False, override_logging=False)
            if signals.noted:  # since the wait passed: nothing started yet, nothing to stop
                print(f"worker: stopped ({signals.noted[0].name}) as it started", flush=True)
                return 0
            code = _execute(worker)  # a signal from here until Faust's handlers would be installed: acted on then
            signals.hold()  # Faust's loop has ended: one now is kept, for the wait again, or left (the stop is done)
            failed = worker.start_failure
            if failed is None or worker.failed_as_stopping:  # ran, or stopped by a signal during its start
                return code
            # a Kafka error ended Faust's start (Faust has stopped its clients; a signal during that stop only asked
            # for the stop that was under way: the failure is said all the same)
            stopping = deadline.armed
            if not isinstance(failed, KafkaConnectionError):  # not the broker gone: waiting again would not help
                raise TopicError(f"the worker's clients failed to start on Kafka at {settings.bootstrap_servers}"
                                 f" (RTT_KAFKA_BOOTSTRAP): {failed}")
            said = f"cannot reach Kafka at {settings.bootstrap_servers} (RTT_KAFKA_BOOTSTRAP)"
            if start_steps(app).after_producer.reached:  # the web server had the port, the consumer may have run
                raise TopicError(f"{said} as the worker started: {failed}")
            # the broker answered the wait and was gone when the producer started; nothing taken over yet (the port
            # still held here, no consumer): wait again, a new app after it, within what is left of the bound
            bound_s, spent_s = settings.kafka_start_wait_s, time.monotonic() - began
            if stopping or (bound_s and spent_s >= bound_s):
                gave_up = "" if stopping else f" (gave up after {spent_s:.0f} s: RTT_KAFKA_START_WAIT_S={bound_s:g})"
                raise TopicError(f"{said} as Faust started: {failed}{gave_up}")
            log.warning("worker: %s as Faust started: %s; waiting for it again", said, failed)
            since = began
    finally:
        if held is not None:  # Faust's web server closes it when it served on it; not otherwise
            held.close()


def _execute(worker: Any) -> int:
    """Run ``worker`` (Faust's ``execute_from_commandline``) to its end; its exit code."""
    try:
        worker.execute_from_commandline()
    except SystemExit as exc:
        return int(exc.code or 0)
    return 0


async def _wait_for_kafka(settings: Any, topics: tuple[str, ...], held: Any, registry: Any,
                          since: float | None, signals: SignalRoute) -> str | None:
    """Wait until the broker answers and has ``topics`` (:func:`app.kafka.admin.wait_reachable`, its bound counted
    from ``since``, the first wait's start, when this wait comes after it), the port ``held`` answering probes
    meanwhile (``/metrics``: ``registry``, ``rtt_kafka_start_waiting`` 1 in it); the signal (SIGTERM, SIGINT, from
    ``signals``: one kept since the last loop's end too) that stopped the wait, if one did (a clean stop, as once the
    worker runs). One after the wait passed is kept by ``signals``."""
    import asyncio
    import signal

    from app.health import answer_while_waiting
    from app.kafka.admin import wait_reachable
    from app.stopping import exit_now

    reason: list[str | None] = ["kafka: not asked yet"]
    stopped: list[str] = []
    task = asyncio.current_task()
    assert task is not None

    done = False

    def on_signal(sig: signal.Signals) -> None:
        if stopped:  # asked again while it stops: at once, whatever the stop still waits for
            exit_now(128 + sig.value,
                     f"worker: {sig.name} during the stop ({stopped[0]}): exiting at once without finishing it")
        if not done:
            task.cancel()
        stopped.append(sig.name)

    def waiting(why: str | None) -> None:
        reason[0] = None if why is None else f"kafka: {why}"

    signals.to(asyncio.get_running_loop(), on_signal)
    try:
        async with answer_while_waiting(held, lambda: reason[0], registry):
            await wait_reachable(settings, topics, service="worker", waiting=waiting, registry=registry, since=since)
            done = True
    except asyncio.CancelledError:
        if stopped:
            return stopped[0]
        raise
    finally:
        if stopped:  # a lookup of the broker's name still in a thread (a resolver that does not answer) would hold
            # asyncio.run's end, where a signal is only kept: waited for here, a second signal ending it at once
            await asyncio.get_running_loop().shutdown_default_executor()
        signals.hold()
    return stopped[0] if stopped else None
