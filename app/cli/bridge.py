"""``rttsched bridge``: scrape exporters every interval and produce node-metrics.

    rttsched bridge --target node=worker-1,class=gpu,url=http://10.0.0.11:9100/metrics,url=http://10.0.0.11:9400/metrics
    rttsched bridge --targets /etc/rttsched/targets.yaml
    rttsched bridge --targets targets.yaml --once      # two scrapes, print the second as JSON, produce nothing

SIGTERM (how Kubernetes and docker stop it) stops it cleanly: no round starts, the one under way may finish, what
the producer holds is delivered, within 5 s of the signal in all (:data:`app.bridge.producer.STOP_S`); then one
line ``bridge: stopped (SIGTERM), N rounds, ...`` and exit code 0. Ctrl-C (SIGINT) is an interruption: exit 130.
From the moment this command runs, before its event loop does (its imports, its settings, its metrics server),
SIGTERM stops it as cleanly (nothing was sent, no round ran: ``bridge: stopped (SIGTERM), 0 rounds, ...``, exit
code 0) and SIGINT is an interruption (130) (:class:`_Held`): at once where that is safe -- a SIGINT anywhere but an
import, a SIGTERM while it reads its targets, which may block for ever (a FIFO, ``<(command)``, ``/dev/stdin``) --
else at the next step, never by the signal in the middle of an import. A second signal of a kind is not held: a
start stuck anywhere still yields to one repeated (SIGTERM then ends it as by default, 143).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from typing import Any

PRODUCER_STARTING = "its producer starting"  # /readyz 503 says it between the wait passing and the producer's start
HELP = "scrape node_exporter / dcgm-exporter / nvidia_gpu_exporter endpoints and produce node-metrics"


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", action="append", default=[], metavar="SPEC",
                   help="node=NAME[,class=cpu|gpu][,gpu_model=MODEL],url=URL[,exporter=NAME][,url=URL...] (repeatable; "
                        "exporter= names the exporter of the url= before it)")
    p.add_argument("--targets", metavar="FILE", help="YAML targets file (one node, or nodes: [...]); ${VAR} expanded")
    p.add_argument("--mapping", metavar="FILE", help="exporter -> canonical mapping (default: the built-in one)")
    p.add_argument("--once", action="store_true",
                   help="scrape twice one interval apart (so rates exist), print the second snapshot of every "
                        "node as a JSON line, produce nothing")
    p.add_argument("--scrapes", type=int, metavar="N", help="stop after N rounds (default: run until interrupted)")


class _Stopped(BaseException):
    """A SIGTERM acted on while the bridge starts: a clean stop, nothing sent (:class:`_Held`)."""


_IMPORT_MODULES = frozenset({"importlib._bootstrap", "importlib._bootstrap_external", "_frozen_importlib",
                             "_frozen_importlib_external"})


def _importing(frame: Any) -> bool:
    """Whether ``frame`` (where a signal handler interrupted the main thread) runs inside an import."""
    while frame is not None:
        if frame.f_globals.get("__name__") in _IMPORT_MODULES:
            return True
        frame = frame.f_back
    return False


class _Held:
    """SIGTERM and SIGINT while the bridge starts, before its event loop takes them over: never acted on in the
    middle of an import. One that comes inside an import is noted, and acted on by :meth:`asked` at the next step.
    Elsewhere SIGINT acts at once (:class:`KeyboardInterrupt`), and so does SIGTERM while :meth:`reading` the
    targets and mapping (a FIFO, ``/dev/stdin`` or ``<(command)`` may block that read for ever): :class:`_Stopped`,
    the clean stop; a SIGTERM during the other steps is noted. Once a signal has come, its kind is no longer held:
    a second one acts as it did before the hold (SIGINT: :class:`KeyboardInterrupt`; SIGTERM: what it was,
    Python's default: the end, 143), so no start, however stuck, outlasts a signal repeated.
    SIGINT is held only where it is Python's default (one ignored, as under ``nohup``, stays ignored)."""

    def __init__(self) -> None:
        import signal

        self.noted: list[int] = []
        self._reading = False
        self._term = signal.signal(signal.SIGTERM, self._note)
        self._int = signal.getsignal(signal.SIGINT)
        if self._int is signal.default_int_handler:
            signal.signal(signal.SIGINT, self._note)

    def _before(self, signum: int) -> Any:
        import signal

        if signum == signal.SIGINT:
            return self._int
        return self._term if self._term is not None else signal.SIG_DFL  # None: set outside Python

    def _note(self, signum: int, frame: Any) -> None:
        import signal

        self.noted.append(signum)
        signal.signal(signum, self._before(signum))  # a second one is not held
        if _importing(frame):
            return
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self._reading:
            raise _Stopped

    def asked(self) -> bool:
        """Whether SIGTERM came (a clean stop asked); :class:`KeyboardInterrupt` when SIGINT came first."""
        import signal

        if self.noted and self.noted[0] == signal.SIGINT:
            raise KeyboardInterrupt
        return bool(self.noted)

    @contextlib.contextmanager
    def reading(self) -> Iterator[None]:
        """A step that may block for ever (reading the targets): a SIGTERM in it stops the bridge at once; one that
        came before it does so before it starts."""
        if self.asked():
            raise _Stopped
        self._reading = True
        try:
            yield
        finally:
            self._reading = False

    def release_sigint(self) -> None:
        """SIGINT as Python has it again (asyncio.run turns it into the main task's cancellation); one noted before
        raises :class:`KeyboardInterrupt` here."""
        import signal

        if signal.getsignal(signal.SIGINT) == self._note:
            signal.signal(signal.SIGINT, self._int)
        self.asked()

    def release(self) -> None:
        """Both signals back as they were -- SIGTERM ignored once one came (a supervisor asking again must not kill it
        half-way through its stop), as the event loop leaves it."""
        import signal

        if signal.getsignal(signal.SIGINT) == self._note:
            signal.signal(signal.SIGINT, self._int)
        if signal.SIGTERM in self.noted:
            signal.signal(signal.SIGTERM, signal.SIG_IGN)
        elif signal.getsignal(signal.SIGTERM) == self._note:
            signal.signal(signal.SIGTERM, self._before(signal.SIGTERM))


def run(args: argparse.Namespace, settings: Any) -> int:
    if args.once:  # two scrapes printed, nothing produced: stopped by a signal as the other interactive commands are
        return _run(args, settings, None)
    held = _Held()
    try:
        return _run(args, settings, held)
    except _Stopped:  # SIGTERM before anything started: nothing to finish
        print("bridge: stopped (SIGTERM), 0 rounds, 0 messages, 0 failed scrapes, 0 rounds not taken by Kafka",
              flush=True)
        return 0
    finally:
        held.release()


def _run(args: argparse.Namespace, settings: Any, held: _Held | None) -> int:
    import asyncio
    import signal

    import orjson

    from app.bridge.mapping import load_mapping
    from app.bridge.metrics import BridgeMetrics, serve_metrics
    from app.bridge.producer import STOP_S
    from app.bridge.scraper import BridgeStats, run_bridge
    from app.bridge.snapshot import Snapshot
    from app.bridge.targets import check_unique, load_targets, parse_target_flag
    from app.errors import ConfigError
    from app.health import beating
    from app.kafka.admin import wait_reachable
    from app.kafka.quiet import PERIOD_S, quiet_client_errors

    with held.reading() if held is not None else contextlib.nullcontext():  # a FIFO may never end: a signal does
        mapping = load_mapping(args.mapping)
        exporters = tuple(mapping.exporters)  # what an endpoint's exporter may be declared as
        targets = [parse_target_flag(t, exporters) for t in args.target]
        if args.targets:
            targets += load_targets(args.targets, exporters=exporters)
    if not targets:
        raise ConfigError("--target/--targets", "give at least one scrape target")
    check_unique(targets)
    if args.scrapes is not None and args.scrapes < 1:
        raise ConfigError("--scrapes", f"must be >= 1 (got {args.scrapes})")

    if args.once:
        last: list[Snapshot] = []

        def keep(snaps: list[Snapshot]) -> None:  # a late scrape goes out before its node's next: the newest only
            newest = {snap.message["node"]: snap for snap in snaps}
            last[:] = newest.values()

        asyncio.run(run_bridge(settings, targets, scrapes=2, publish=False, mapping=mapping, on_round=keep))
        for snap in last:
            print(orjson.dumps(snap.message).decode())
        silent = [snap.message["node"] for snap in last if not snap.message["metrics"]]
        if silent:
            print(f"rttsched bridge: no metrics from {', '.join(silent)} (the warnings above say why)", file=sys.stderr)
        return 1 if silent else 0

    assert held is not None
    said = "stopped (SIGTERM), "
    if held.asked():  # SIGTERM before anything started: nothing to finish
        raise _Stopped
    metrics = BridgeMetrics()
    heartbeat = serve_metrics(metrics, settings.metrics_port, settings.metrics_host)  # a taken port: named first
    if heartbeat is not None:
        heartbeat.waiting = "kafka: not asked yet"
    held.release_sigint()

    async def main() -> tuple[BridgeStats, bool]:
        stop = asyncio.Event()
        task = asyncio.current_task()
        assert task is not None
        starting = True

        def on_sigterm() -> None:  # Kubernetes and docker stop it so: a clean stop, exit code 0
            if starting and not stop.is_set():
                task.cancel()  # still asking the broker: nothing to finish
            stop.set()

        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, on_sigterm)  # the one noted while it started: taken over below
        try:
            if held.asked():
                stop.set()
                return BridgeStats(), True
            def waiting(reason: str | None) -> None:  # /readyz 503 naming it; the wait passed (None): ready once
                if heartbeat is not None:  # the producer started
                    heartbeat.waiting = f"kafka: {reason or PRODUCER_STARTING}"

            def producing() -> None:
                if heartbeat is not None:
                    heartbeat.waiting = None

            try:  # no broker yet, or its topic not created: wait for them (RTT_KAFKA_START_WAIT_S bounds it)
                await beating(wait_reachable(settings, ("node-metrics",), service="bridge", waiting=waiting,
                                             registry=metrics.registry),
                              heartbeat)
            except asyncio.CancelledError:
                if stop.is_set():
                    return BridgeStats(), True
                raise
            starting = False
            quiet_client_errors(PERIOD_S)  # aiokafka's per-retry errors while the broker is away: one per 10 s
            print(f"bridge: {len(targets)} node(s), every {settings.scrape_interval_s:g}s -> "
                  f"{settings.topic('node-metrics')} on {settings.bootstrap_servers}", flush=True)
            stats = await beating(run_bridge(settings, targets, scrapes=args.scrapes, mapping=mapping,
                                             metrics=metrics, stop=stop, on_started=producing), heartbeat)
            return stats, stop.is_set()
        finally:  # a SIGTERM more (a supervisor asking again) while it winds down must not kill it half-way
            loop.remove_signal_handler(signal.SIGTERM)
            signal.signal(signal.SIGTERM, signal.SIG_IGN)

    stats, stopped = asyncio.run(main())
    said = said if stopped else ""
    abandoned = f", the round under way abandoned after {STOP_S:g}s" if stats.abandoned else ""
    print(f"bridge: {said}{stats.rounds} rounds, {stats.messages} messages, {stats.failed_scrapes} failed scrapes, "
          f"{stats.unpublished} rounds not taken by Kafka{abandoned}", flush=True)
    return 0
