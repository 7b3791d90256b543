"""``rttsched trainer``: consume retrain-events, train off the event loop, announce promoted models.

Started before its broker or its topics, it waits for them (:func:`app.kafka.admin.wait_reachable`, bounded by
``RTT_KAFKA_START_WAIT_S``), ``/healthz`` 200 and ``/readyz`` 503 meanwhile, and until its consumers and producer have
started after the wait (``not ready: kafka: its clients starting``); SIGTERM or Ctrl-C then stops it at
once (one line, exit code 0). So it does while its Kafka clients start after the wait (one line, ``trainer: stopped
(SIGTERM) as it started``; the clients made so far stopped within the stop's bound, exit code 0): a broker that takes
connections and answers nothing holds each client's start for its 40 s request timeout.

Running, SIGTERM or Ctrl-C stops it cleanly (exit code 0) within the service's ``stop_timeout_s`` (20 s, below the
pod's 30 s of grace): what has not ended by then -- a training in its thread, which nothing can cancel -- is named in
one WARNING and the process exits at once with code 1, as the worker does when its stop outlasts its bound. A second
SIGTERM or Ctrl-C during the stop ends it at once: one line, exit code 128 + the signal's number (143, 130), also
while the stop waits for a lookup of the broker's name that a resolver does not answer; one once the stop has
finished (as the event loop closes and the process ends) changes nothing
(:class:`app.stopping.SignalRoute`)."""

from __future__ import annotations

import argparse
from typing import Any

# flag -> the environment variable it overrides (errors name the one the value came from: flag_errors)
FLAGS = {"--cpus": "RTT_TRAINER_CPUS", "--max-samples-per-key": "RTT_TRAINER_MAX_SAMPLES_PER_KEY",
         "--margin": "RTT_TRAINER_MARGIN"}
TRAINER_TOPICS = ("training-samples", "retrain-events", "model-updates", "dead-letters")  # read or written
CLIENTS_STARTING = "its clients starting"  # /readyz 503 says it between the wait passing and the clients' start
HELP = "retrain models on retrain-events (feature selection + XGBoost), promote winners, announce on model-updates"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--max-samples-per-key", type=int, default=None,
                   help="training samples kept in memory per model key (default RTT_TRAINER_MAX_SAMPLES_PER_KEY,"
                        " 50000)")
    p.add_argument("--cpus", default=None,
                   help='pin the trainer to these CPUs, e.g. "2-3" (default RTT_TRAINER_CPUS: no pinning)')
    p.add_argument("--margin", type=float, default=None,
                   help="relative holdout RMSE improvement a challenger needs over the champion, below 1"
                        " (default RTT_TRAINER_MARGIN, 0.02)")
    p.add_argument("--max-event-age", type=float, default=3600.0,
                   help="skip retrain events published more than this many seconds before they are read (default 3600)")


def run(args: argparse.Namespace, settings: Any) -> int:
    import asyncio
    import logging
    import signal

    from aiokafka.errors import KafkaConnectionError, KafkaError

    from app.cli.flags import flag_errors, writable_dir
    from app.errors import ConfigError
    from app.health import beating, serve_health
    from app.kafka.admin import TopicError, wait_reachable
    from app.kafka.quiet import PERIOD_S, handled_connect, quiet_client_errors
    from app.listen import check_listen
    from app.stopping import SignalRoute, exit_now
    from app.trainer.cpus import parse_cpus, pin_cpus
    from app.trainer.service import TrainerService

    log = logging.getLogger("app.cli.trainer")
    quiet_client_errors(PERIOD_S)
    with flag_errors(args, FLAGS):  # an error names the flag when the value came from it, else the variable
        if args.cpus is None:
            args.cpus = settings.trainer_cpus
        if args.max_samples_per_key is None:
            args.max_samples_per_key = settings.trainer_max_samples_per_key
        if args.margin is None:
            args.margin = settings.trainer_margin
        try:
            cpus = parse_cpus(args.cpus) if args.cpus.strip() else None
        except ValueError as exc:
            raise ConfigError("RTT_TRAINER_CPUS", str(exc)) from None
        if args.max_samples_per_key < 1:
            raise ConfigError("RTT_TRAINER_MAX_SAMPLES_PER_KEY", f"must be >= 1 (got {args.max_samples_per_key})")
        if not 0.0 <= args.margin < 1.0:
            raise ConfigError("RTT_TRAINER_MARGIN", f"must be in [0, 1) (got {args.margin})")
        # events older than this are skipped (0 or less: every event); inf: none
        if not args.max_event_age > 0:
            raise ConfigError("--max-event-age", f"must be > 0 seconds (got {args.max_event_age:g})")
        if cpus is not None:  # pinned here, before any thread starts, so that a CPU that is not there is named
            pin_cpus(cpus, field="RTT_TRAINER_CPUS")
    if not settings.redis_url:  # the registry is a local directory: one it cannot write fails now, named
        writable_dir(settings.models_dir, "RTT_MODELS_DIR")
    # a port taken, a host not this machine's: one line, naming the variable
    check_listen(settings.metrics_host, settings.metrics_port, "RTT_METRICS_PORT", "RTT_METRICS_HOST")

    async def main() -> int:
        service = TrainerService(settings, max_samples_per_key=args.max_samples_per_key, cpus=None,  # pinned above
                                 margin=args.margin, max_event_age_s=args.max_event_age,
                                 gpu_apps=settings.gpu_apps, registry_check_s=settings.registry_check_s,
                                 key_idle_s=settings.trainer_key_idle_s)
        # /metrics, and /healthz failing while this event loop is stuck; /readyz 503 while it waits for Kafka
        heartbeat = serve_health(settings.metrics_port, settings.metrics_host, service.metrics.registry)
        if heartbeat is not None:
            log.info("metrics on %s:%d/metrics (/healthz, /readyz)", settings.metrics_host, settings.metrics_port)
            heartbeat.waiting = "kafka: not asked yet"
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        task = asyncio.current_task()
        assert task is not None
        starting = True  # waiting for the broker, or its clients starting: a signal cancels that
        signals: list[str] = []

        def on_signal(sig: signal.Signals) -> None:
            if stop.is_set():  # asked again while it stops: at once, whatever the stop still waits for (and even
                # when the line cannot be written: its reader gone with the first Ctrl-C)
                exit_now(128 + sig.value,
                         f"trainer: {sig.name} during the stop ({signals[0]}): exiting at once without finishing it")
            signals.append(sig.name)
            if starting:  # still waiting for the broker (nothing to finish), or its clients still starting (a
                task.cancel()  # broker that takes connections and answers nothing holds each for 40 s)
            stop.set()

        # through one handler that never gives them back to their defaults: once the stop has finished (below), one
        # more is kept and nothing else (the loop's own handlers were the default again as asyncio.run closed it)
        route = SignalRoute()
        route.to(loop, on_signal)

        async def ended() -> None:
            """The stop has finished: a signal from now on changes nothing. A lookup of the broker's name still in a
            thread (a resolver that does not answer) would hold asyncio.run's end, where a signal is only kept: waited
            for first, a second signal ending it at once."""
            await loop.shutdown_default_executor()
            route.hold()

        def waiting_for(reason: str | None) -> None:  # the wait passed (None): ready once the clients started
            if heartbeat is not None:
                heartbeat.waiting = f"kafka: {reason or CLIENTS_STARTING}"

        try:  # no broker yet, or its topics not created: wait for them (RTT_KAFKA_START_WAIT_S bounds it)
            await beating(wait_reachable(settings, TRAINER_TOPICS, service="trainer", waiting=waiting_for,
                                         registry=service.metrics.registry), heartbeat)
        except asyncio.CancelledError:
            if stop.is_set():
                print(f"trainer: stopped ({signals[0]}) while waiting for Kafka", flush=True)
                await ended()
                return 0
            raise
        if stop.is_set():
            await ended()
            return 0
        try:
            try:
                with handled_connect():  # that one line, not the client's own ERROR besides
                    await service.start()
                if heartbeat is not None:  # its consumers and producer started: /readyz 200
                    heartbeat.waiting = None
            except KafkaError as exc:  # it answered the wait, then went away: the clients made so far are stopped
                said = ("cannot reach Kafka at" if isinstance(exc, KafkaConnectionError)
                        else "the trainer's clients failed to start on Kafka at")
                raise TopicError(f"{said} {settings.bootstrap_servers} (RTT_KAFKA_BOOTSTRAP) as the trainer started:"
                                 f" {exc}") from None
            starting = False
            assert service.crashed is not None
            waits = [asyncio.ensure_future(stop.wait()), asyncio.ensure_future(service.crashed.wait())]
            _, pending = await beating(asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED), heartbeat)
            for w in pending:
                w.cancel()
        except asyncio.CancelledError:
            if not stop.is_set():
                raise
            # the signal cancelled the start (or came as it ended): the stop below ends the clients made so far
            task.uncancel()
            print(f"trainer: stopped ({signals[0]}) as it started", flush=True)
        finally:
            starting = False
            await service.stop()
            if not service.left_behind:  # else it exits at once (below): nothing waited for
                await ended()  # stopped: a signal now (asyncio.run or Python ending) changes nothing, nor the exit code
        if service.left_behind:  # named in the stop's WARNING: neither asyncio.run nor Python's exit waits for them
            exit_now(1)
        return 1 if service.crashed is not None and service.crashed.is_set() else 0

    return asyncio.run(main())
