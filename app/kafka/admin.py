"""Create every topic of ``topics/`` on a broker, idempotently, and check those that exist.

An existing topic must have the contract's partition count and cleanup policy: a compacted topic
(model-updates, node-features, node-weights, the changelogs) left on ``delete`` — created by hand or
auto-created before ``topics create`` ran — loses its values at its retention, and a restarted extender or
worker then finds no models or state. The policy is read back with DescribeConfigs (a broker that does not
answer it is warned about, and the contract's policy is printed as wanted, not checked).
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import weakref
from collections.abc import Awaitable, Callable, Sequence

from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from prometheus_client import CollectorRegistry, Gauge

from app.config import Settings
from app.contracts import load_contracts
from app.errors import RttError
from app.kafka.client import client_options
from app.kafka.quiet import handled_connect
from app.kafka.refusal import refusal
from app.retry import Backoff

TOPIC_ALREADY_EXISTS = 36
UNKNOWN_TOPIC_OR_PARTITION = 3
RECREATE_WAIT_S = 30.0  # how long a deleted topic may stay listed before it is created again
START_FIRST_TRY_S = 1.0  # a service waiting for its broker at start tries again after 1 s, doubling ...
START_LAST_TRY_S = 10.0  # ... up to 10 s between tries
START_REMIND_S = 30.0  # while it waits, it says so again at most this often
log = logging.getLogger(__name__)
_WAITING: weakref.WeakKeyDictionary[CollectorRegistry, Gauge] = weakref.WeakKeyDictionary()


def start_waiting_gauge(registry: CollectorRegistry) -> Gauge:
    """``rtt_kafka_start_waiting`` in ``registry`` (the process's), created once per registry at 0: 1 while
    :func:`wait_reachable` waits for the broker and topics at start -- the process answers its ``/metrics``
    meanwhile (``up`` is 1), so alerts read this to tell a service that waits from one that runs."""
    gauge = _WAITING.get(registry)
    if gauge is None:
        gauge = _WAITING[registry] = Gauge(
            "rtt_kafka_start_waiting", "1 while the service waits at start for its Kafka broker and topics"
            " (RTT_KAFKA_START_WAIT_S), 0 once they answered", registry=registry)
    return gauge


class TopicError(RttError):
    """A topic could not be created, or exists with another partition count or cleanup policy. ``results``: every
    topic as it was left when that was found (the ones created before, those that differ), where it was found."""

    def __init__(self, message: str, results: Sequence[TopicResult] = ()) -> None:
        super().__init__(message)
        self.results = list(results)


class KafkaRefused(TopicError):
    """The broker turns this client away for good (:mod:`app.kafka.refusal`: SASL credentials or mechanism, the
    broker's certificate, the security protocol): one line naming the settings to check. :func:`wait_reachable`
    does not wait for it."""


@dataclasses.dataclass(frozen=True)
class InternalTopic:
    """A topic a process needs that is not a contract (a worker group's changelogs and ownership topic)."""

    name: str
    partitions: int
    compacted: bool = False

    def configs(self) -> dict[str, str]:
        return {"cleanup.policy": "compact" if self.compacted else "delete"}


@dataclasses.dataclass(frozen=True)
class TopicResult:
    topic: str
    partitions: int
    cleanup_policy: str  # the broker's (the contract's where the broker would not say)
    created: bool
    recreated: bool = False  # deleted and created again (``recreate``)
    differs: bool = False  # has another partition count or cleanup policy, left as it is

    @property
    def status(self) -> str:
        """``created``, ``recreated``, ``differs`` or ``exists``."""
        return ("recreated" if self.recreated else "created" if self.created else "differs" if self.differs
                else "exists")


DEFAULT_CLEANUP = "delete"  # Kafka's log.cleanup.policy default: a topic config the broker does not list


async def started_admin(settings: Settings) -> AIOKafkaAdminClient:
    """A started admin client on the configured broker (the caller closes it); :class:`TopicError` naming
    ``RTT_KAFKA_BOOTSTRAP`` when the broker does not answer, :class:`KafkaRefused` naming the settings to check
    when it turns the client away for good (:func:`app.kafka.refusal.refusal` asks it why)."""
    options = client_options(settings, request_timeout_ms=10_000)
    admin = AIOKafkaAdminClient(**options)
    try:
        with handled_connect():
            await admin.start()
    except (KafkaError, KeyError, ValueError) as exc:  # the last two: aiokafka's SCRAM client, on an error answer
        await admin.close()
        refused = await refusal(settings, {k: v for k, v in options.items()
                                           if k not in ("bootstrap_servers", "request_timeout_ms")})
        if refused is not None:
            raise KafkaRefused(refused.message(settings.bootstrap_servers)) from None
        if not isinstance(exc, KafkaError):
            raise
        raise TopicError(f"cannot reach Kafka at {settings.bootstrap_servers} (RTT_KAFKA_BOOTSTRAP): {exc}") from None
    return admin


async def check_reachable(settings: Settings, topics: Sequence[str] = ()) -> None:
    """Raise :class:`TopicError` ("cannot reach Kafka at …") unless the broker answers: a process that needs
    it from its first step says so in one line instead of failing deep inside its client. ``topics``
    (contract names) must exist under ``RTT_TOPIC_PREFIX``: a process started before ``rttsched topics
    create`` (or with a mistyped prefix) used to have them auto-created by the broker with its default
    partition count, which ``topics create`` then refused. The check lists the topics (a metadata request
    for every topic creates none)."""
    if not topics:
        admin = await started_admin(settings)
        await admin.close()
        return
    missing = await missing_topics(settings, topics)
    if missing:
        raise TopicError(no_topics(settings, missing))


async def wait_reachable(settings: Settings, topics: Sequence[str] = (), *, service: str,
                         waiting: Callable[[str | None], None] | None = None, backoff: Backoff | None = None,
                         remind_s: float = START_REMIND_S, clock: Callable[[], float] = time.monotonic,
                         sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
                         check: Callable[[Settings, Sequence[str]], Awaitable[None]] | None = None,
                         registry: CollectorRegistry | None = None, since: float | None = None) -> float:
    """:func:`check_reachable` tried until it passes, for a long-running ``service`` (worker, trainer, bridge) started
    before its broker or before ``rttsched topics create``: it waits instead of exiting, so that pods started in any
    order come up as soon as Kafka does (not after CrashLoopBackOff's growing pauses). The seconds waited.

    The tries are 1 s apart, doubling up to 10 s (``backoff``). One WARNING line when the wait begins, naming the
    broker and why (unreachable, or the topics missing and that ``rttsched topics create`` makes them); another
    when the reason changes, or every ``remind_s`` while it lasts; one INFO line, with how long it waited, when
    the broker answers. ``waiting`` is told the reason after each failed try and None once it passed (a readiness
    page). ``RTT_KAFKA_START_WAIT_S`` > 0 bounds the wait, a try under way included (a broker that takes connections
    and answers nothing held each for the client's 10 s request timeout): past it, the last try's :class:`TopicError`
    (one line; ``no answer within …`` for a try cut short) is raised, with how long it waited. Cancelling the
    awaiting task (SIGTERM) stops the wait at once. ``registry``: the process's, whose ``rtt_kafka_start_waiting``
    (:func:`start_waiting_gauge`) is 1 from the first try until one passes, 0 after. ``since``: the ``clock()`` from
    which ``RTT_KAFKA_START_WAIT_S`` counts (default: as this wait begins): a service that waits again, its own start
    having failed on a broker gone meanwhile, counts its whole start (``gave up after`` the seconds since then).
    A :class:`KafkaRefused` (wrong SASL credentials or mechanism, a certificate not verified, the other security
    protocol: :mod:`app.kafka.refusal`) is raised at once, bound or not: a setting to fix, not a broker to wait for.
    """
    gauge = start_waiting_gauge(registry) if registry is not None else None
    if gauge is not None:
        gauge.set(1)
    check = check or check_reachable
    backoff = backoff or Backoff(first_s=START_FIRST_TRY_S, max_s=START_LAST_TRY_S)
    bound_s = settings.kafka_start_wait_s
    start = clock()
    counted = start if since is None else min(since, start)  # where the bound counts from
    said: tuple[str, float] | None = None  # the reason last logged, and when
    timed_out = False  # the last try ran to the bound
    while True:
        try:
            if bound_s:  # a try under way ends at the bound too (a broker that takes connections, answers nothing)
                try_s = max(bound_s - (clock() - counted), START_FIRST_TRY_S)  # the last try, at the bound, gets 1 s
                try:
                    async with asyncio.timeout(try_s):  # not asyncio.wait_for: in Python 3.11 it loses a cancel
                        await check(settings, topics)  # (SIGTERM) that comes as a try ends, and the wait ran on
                except TimeoutError:
                    timed_out = True
                    raise TopicError(f"cannot reach Kafka at {settings.bootstrap_servers} (RTT_KAFKA_BOOTSTRAP): no"
                                     f" answer within {try_s:.0f} s") from None
            else:
                await check(settings, topics)
        except KafkaRefused:  # a setting to fix: no wait heals it
            raise
        except TopicError as exc:
            reason = str(exc)
            waited = clock() - start
            if bound_s and (clock() - counted >= bound_s or timed_out):
                raise TopicError(f"{reason} (gave up after {clock() - counted:.0f} s: RTT_KAFKA_START_WAIT_S="
                                 f"{bound_s:g})") from None
            if waiting is not None:
                waiting(reason)
            if not bound_s:
                until = "until it answers (RTT_KAFKA_START_WAIT_S=0)"
            elif since is not None:  # a wait after an earlier one: what is left of the bound
                until = f"for the {bound_s - (clock() - counted):.0f} s left of RTT_KAFKA_START_WAIT_S={bound_s:g}"
            else:
                until = f"for up to {bound_s:g} s (RTT_KAFKA_START_WAIT_S)"
            if said is None:
                log.warning("%s: waiting for Kafka: %s; trying again every %g-%g s %s", service, reason,
                            backoff.first_s, backoff.max_s, until)
                said = (reason, clock())
            elif _kind(reason) != _kind(said[0]) or clock() - said[1] >= remind_s:
                log.warning("%s: still waiting for Kafka at %s after %.0f s: %s", service,
                            settings.bootstrap_servers, waited, reason)
                said = (reason, clock())
            pause = backoff.next()
            if bound_s:
                pause = max(0.0, min(pause, bound_s - (clock() - counted)))
            await sleep(pause)
            continue
        waited = clock() - start
        if gauge is not None:
            gauge.set(0)
        if waiting is not None:
            waiting(None)
        if said is not None:
            log.info("%s: Kafka at %s answered after %.1f s of waiting", service, settings.bootstrap_servers, waited)
        return waited


def _kind(reason: str) -> str:
    """What a reason of :func:`wait_reachable` is about, so that a change (the broker up, its topics still missing)
    is said at once: ``topics`` or ``broker``."""
    return "topics" if reason.startswith("no topic ") else "broker"


async def missing_topics(settings: Settings, topics: Sequence[str]) -> list[str]:
    """The prefixed names of the contract ``topics`` the broker does not have, from a listing of its topics (which
    creates none); :class:`TopicError` when Kafka cannot be reached or asked."""
    admin = await started_admin(settings)
    try:
        have = set(await admin.list_topics())
    except (KafkaError, OSError) as exc:
        raise TopicError(f"cannot list the topics of {settings.bootstrap_servers} (RTT_KAFKA_BOOTSTRAP): "
                         f"{exc}") from None
    finally:
        await admin.close()
    return [settings.topic(name) for name in topics if settings.topic(name) not in have]


def no_topics(settings: Settings, missing: Sequence[str]) -> str:
    """What :func:`check_reachable` says of topics the broker does not have (prefixed names)."""
    return (f"no topic {', '.join(missing)} on {settings.bootstrap_servers} (RTT_TOPIC_PREFIX "
            f"{settings.topic_prefix!r}): create them with `rttsched topics create`")


async def ensure_topics(settings: Settings, internal: Sequence[InternalTopic] = (),
                        recreate: bool = False) -> list[TopicResult]:
    """Create each contract's topic (prefixed), and ``internal`` ones, if missing; verify the partitions and
    cleanup policy of those that exist.

    ``recreate``: a topic with another partition count or policy is deleted and created again (its messages lost)
    instead of an error — for a broker just started in memory, where a client that reached it first had a
    topic auto-created with the broker's default count.
    """
    created: set[str] = set()  # by an attempt before the last
    recreated: set[str] = set()
    for attempt in range(3):
        try:
            results = await _ensure_topics(settings, internal)
        except _WrongTopics as exc:
            created |= {r.topic for r in exc.results if r.created}
            if not recreate:
                raise TopicError(f"{exc}: delete and create them again (`rttsched topics create --recreate --yes` "
                                 "does, dropping their messages)", exc.results) from None
            if attempt == 2:
                raise TopicError(f"{exc}, still after deleting and creating them twice",
                                 [dataclasses.replace(r, created=r.created or r.topic in created)
                                  for r in exc.results]) from None
            log.warning("%s: deleting and creating them again (their messages are dropped)", exc)
            admin = await started_admin(settings)
            try:  # at once, the same connection: a client retrying meanwhile would have it auto-created again
                await _recreate(admin, exc.wrong)
            finally:
                await admin.close()
            recreated |= {new.name for new, _ in exc.wrong}
            continue
        return [dataclasses.replace(r, created=r.created or r.topic in created, recreated=r.topic in recreated)
                for r in results]
    raise AssertionError("unreachable")


async def _recreate(admin: AIOKafkaAdminClient, wrong: list[tuple[NewTopic, str]]) -> None:
    """Delete the topics of ``wrong`` and create them as wanted; :class:`TopicError` with the broker's error code
    when it refuses either (topic ACLs, ``delete.topic.enable=false``). Kafka deletes a topic in the background:
    the creation waits up to ``RECREATE_WAIT_S`` for the broker to stop listing it."""
    names = [new.name for new, _ in wrong]
    deleted = await admin.delete_topics(names)
    refused = [f"{topic}: error {code}" for topic, code, *_ in deleted.topic_error_codes
               if code not in (0, UNKNOWN_TOPIC_OR_PARTITION)]
    if refused:
        raise TopicError(f"the broker did not delete {'; '.join(refused)}")
    deadline = time.monotonic() + RECREATE_WAIT_S
    while set(names) & set(await admin.list_topics()) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    created = await admin.create_topics([new for new, _ in wrong])
    failed = [f"{topic}: error {code}: {message}" for topic, code, message in (e[:3] for e in created.topic_errors)
              if code not in (0, TOPIC_ALREADY_EXISTS)]
    if failed:
        raise TopicError(f"the broker deleted but did not create again {'; '.join(failed)}")


class _WrongTopics(Exception):
    """Topics that exist otherwise than wanted: ``(the topic wanted, what it has)``; ``results``: every topic."""

    def __init__(self, wrong: list[tuple[NewTopic, str]], results: list[TopicResult]) -> None:
        self.wrong = wrong
        self.results = results
        super().__init__("; ".join(f"topic {new.name} has {have}" for new, have in wrong)
                         + " (topics/ or the worker's partition count)")


async def _cleanup_policies(admin: AIOKafkaAdminClient, names: list[str]) -> dict[str, str]:
    """``{topic: cleanup.policy}`` as the broker has them (its default where a topic sets none); topics it would
    not describe are left out, with a warning."""
    try:
        responses = await admin.describe_configs(
            [ConfigResource(ConfigResourceType.TOPIC, name) for name in names])
    except KafkaError as exc:
        log.warning("the broker did not describe the topics' configs (%r): cleanup policies not checked", exc)
        return {}
    out: dict[str, str] = {}
    for response in responses:
        for code, message, _, name, entries in (r[:5] for r in response.resources):
            if code:
                log.warning("cleanup.policy of %s not checked: error %d: %s", name, code, message)
                continue
            found = {e[0]: e[1] for e in entries}
            out[name] = found.get("cleanup.policy") or DEFAULT_CLEANUP
    return out


async def _ensure_topics(settings: Settings, internal: Sequence[InternalTopic]) -> list[TopicResult]:
    contracts = load_contracts()
    admin = await started_admin(settings)
    try:
        wanted: dict[str, tuple[int, str, NewTopic]] = {}
        for c in contracts.values():
            name = settings.topic(c.name)
            wanted[name] = (c.partitions, c.cleanup_policy,
                            NewTopic(name, c.partitions, settings.replicas(c.replication_factor),
                                     topic_configs=c.topic_configs()))
        for t in internal:
            wanted[t.name] = (t.partitions, t.configs()["cleanup.policy"],
                              NewTopic(t.name, t.partitions, settings.replicas(), topic_configs=t.configs()))
        resp = await admin.create_topics([new for _, _, new in wanted.values()])
        created: dict[str, bool] = {}
        for topic, code, message in (e[:3] for e in resp.topic_errors):
            if code not in (0, TOPIC_ALREADY_EXISTS):
                raise TopicError(f"creating {topic}: error {code}: {message}")
            created[topic] = code == 0
        described = await admin.describe_topics(list(wanted))
        results: list[TopicResult] = []
        wrong: list[tuple[NewTopic, str]] = []
        for d in described:
            name = d["topic"]
            partitions, cleanup, new = wanted[name]
            have = len(d["partitions"])
            if have != partitions:
                wrong.append((new, f"{have} partitions, {partitions} expected"))
            results.append(TopicResult(name, have, cleanup, created.get(name, False)))
        policies = await _cleanup_policies(admin, list(wanted))
        checked = []
        for r in results:
            have_policy = policies.get(r.topic)
            partitions, cleanup, new = wanted[r.topic]
            if have_policy is not None and set(have_policy.split(",")) != set(cleanup.split(",")):
                wrong.append((new, f"cleanup.policy {have_policy}, {cleanup} expected"))
            checked.append(dataclasses.replace(r, cleanup_policy=have_policy or cleanup))
        if wrong:
            merged: dict[str, tuple[NewTopic, list[str]]] = {}
            for topic, problem in wrong:
                merged.setdefault(topic.name, (topic, []))[1].append(problem)
            checked = [dataclasses.replace(r, differs=r.topic in merged) for r in checked]
            raise _WrongTopics([(topic, " and ".join(problems)) for topic, problems in merged.values()],
                               sorted(checked, key=lambda r: r.topic))
        return sorted(checked, key=lambda r: r.topic)
    finally:
        await admin.close()


async def delete_prefixed_topics(settings: Settings) -> list[str]:
    """Delete every topic whose name starts with ``settings.topic_prefix`` (a run's own, under a prefix of its
    own: the demo's on a broker it did not start); the names deleted. An empty prefix deletes nothing."""
    if not settings.topic_prefix:
        return []
    admin = await started_admin(settings)
    try:
        names = sorted(t for t in await admin.list_topics() if t.startswith(settings.topic_prefix))
        if names:
            await admin.delete_topics(names)
        return names
    finally:
        await admin.close()
