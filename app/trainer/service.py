"""The trainer process: retrain-events in, model-updates out, training off the event loop.

Three consumers share one event loop (the third, of model-updates, is described further down):

* **training-samples**, no consumer group: every partition assigned, read from the earliest retained
  offset, each sample appended to a bounded per-key :class:`~app.trainer.history.SampleHistory`
  (every trainer replica needs every key's samples, since any key's event may reach it);
* **retrain-events**, group ``{topic_prefix}rttsched-trainer`` (replicas share keys; the prefix keeps
  deployments on one cluster apart); from the earliest offset when the group has none, skipping events
  published more than ``max_event_age_s`` ago (:func:`event_published`). No auto-commit: an event is
  committed once its retrain ended (promoted, rejected, insufficient data, failed) or it was skipped,
  dead-lettered or coalesced into a retrain that ended — each partition up to, never past, its oldest event
  still in progress (:class:`~app.kafka.commits.GroupCommits`). A trainer stopped mid-retrain leaves that
  event uncommitted: the next one retrains it.

A key no sample arrived for in ``RTT_TRAINER_KEY_IDLE_S`` (default a day, by arrival on the trainer's
clock, checked every ``min(idle / 4, 60 s)``) has its history dropped (``rtt_trainer_keys_dropped_total``),
and the freed heap pages go back to the OS (:mod:`app.trainer.memory`): an app whose pipeline versions come
and go (each a new app label, so new model keys) no longer holds the trainer's memory until a restart. A
key that comes back starts its history again from its next sample: its retrains are ``insufficient_data``
until it has enough rows, and its model stays the champion (served by workers and extenders, and judged
on the new rows' holdout against each challenger) until a challenger beats it. What the trainer keeps of
announcements (versions, sha256) stays. A restarted trainer reads the retained samples again, each as old as its
record's timestamp (not as new as the restart), so it holds the keys a trainer running all along would: a key idle by
then is dropped at the first idle check once its partition is read up to where it ended at the start (a key of a
partition read behind is judged at the newest sample read from it), and at ``RTT_TRAINER_MAX_KEYS`` a new key's sample
drops first the keys idle by its own time; a batch is taken in time order across partitions.

At most ``RTT_TRAINER_MAX_KEYS`` keys are held (``rtt_trainer_keys``): at the bound, a sample of a new key is refused
(``model_keys_full``: counted, dead-lettered, one WARNING per :data:`~app.kafka.quiet.PERIOD_S`), unless its key has a
model (announced on model-updates, read to its end before the first sample is taken): that key takes the place of the
key idle longest without a model and not training (``rtt_trainer_keys_evicted_total``), so a producer inventing keys
never crowds out one whose model serves. A key's ``rtt_trainer_key_samples_total`` series goes with its history,
dropped or evicted.

On an event, after the samples consumer has caught up with the samples topic's end offsets as they
were at that moment (so a sample produced before the event is in the history), the key's rows go
through :func:`app.trainer.pipeline.train_challenger` in a one-thread executor. A thread, not a
process: XGBoost's training and the numba/numpy measures of the selection release the GIL, and a
process pool would copy the history through pickle on every retrain. The champion is loaded from the
registry and scored on the same holdout in that thread too; :func:`app.trainer.champion.judge`
decides; a promoted challenger is saved, promoted and announced on model-updates — in place of the champion it
was judged against only (compare-and-set: a rollback that landed meanwhile is judged against again,
:meth:`~app.trainer.registry.ModelRegistry.promote_challenger`).

While a key is training, further events for it are coalesced (dropped and counted): the running
retrain already uses every sample up to its start, and a drift that persists is signalled again by
the worker once the new model serves.

The registry and model-updates are kept in agreement (:mod:`app.trainer.agreement`, the third consumer).
A message of any of the three that breaks its contract is dead-lettered with its reason, once
(:mod:`app.trainer.dead_letters`); so is a training sample whose ``started_ts`` is later than the trainer's clock
plus ``RTT_MAX_CLOCK_SKEW_S`` (``ts_in_future``, :func:`app.contracts.admission.check_time`: newest in time, it
would sit in every holdout of its key). An old sample is kept: the history is the topic's retained samples.

Redis or Kafka away does not lose a retrain, nor does a models directory (``RTT_MODELS_DIR``, the registry
without Redis) that is full, read-only, not permitted or gone: a retrain whose registry step fails with
:class:`~app.model.errors.RegistryUnavailableError` (one WARNING line naming the registry and why, e.g.
``models directory /x: No space left on device``) waits with backoff (at most ``RTT_RETRY_MAX_BACKOFF_S``
between tries) until the registry answers again — for a directory, until it takes a write as large as the
model it refused — and is then tried again, until it is done, the newest event that arrived for the key in
the meantime superseding the one it started with; an announcement Kafka does not acknowledge is sent
again the same way (``rtt_trainer_retrain_retries_total{step}``). While a retrain waits for the registry,
``rtt_trainer_degraded{reason="model_store"}`` is 1; it is 0 again once no retrain waits (a trainer stopped while
one waits leaves it at 1, and does not log the registry usable again). ``rtt_trainer_degraded{reason="kafka"}``
is 1 while the broker does not answer the trainer's look for its metadata (every ``broker_check_s``,
:meth:`TrainerService._watch_broker`). Every consumer checks its read positions
(:class:`~app.kafka.positions.PositionGuard`; the group's committed offsets on each assignment), so a wiped or
recreated topic is read again from its start; a broker error while a position is checked is waited out like any
other.
"""

from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import contextlib
import dataclasses
import functools
import logging
import math
import threading
import time
from collections.abc import Callable, Container, Iterable
from typing import Any

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.errors import KafkaError, NoOffsetForPartitionError, OffsetOutOfRangeError

from app.clock import Clock, SystemClock
from app.config import Settings
from app.contracts import contract, decode
from app.contracts.admission import check_key, check_time
from app.contracts.keys import parse_model_key
from app.errors import ContractError
from app.kafka.client import client_options, consumer_options
from app.kafka.commits import GroupCommits, Mark
from app.kafka.positions import PositionGuard
from app.kafka.quiet import PERIOD_S
from app.model.errors import CurrentChangedError, NotEnoughSamplesError, RegistryError, RegistryUnavailableError
from app.model.train import MIN_SAMPLES
from app.registry.base import CorruptRecordError, check_model_key
from app.retry import Backoff
from app.stopping import cancel_within, still_running
from app.trainer.agreement import REGISTRY_LOST, RegistryAgreement
from app.trainer.champion import MARGIN, Verdict
from app.trainer.cpus import pin_cpus
from app.trainer.dead_letters import TrainerDeadLetters
from app.trainer.history import KEYS_FULL, Dataset, SampleHistory, build_dataset
from app.trainer.memory import release_freed_memory
from app.trainer.metrics import KAFKA, MODEL_STORE, TrainerMetrics
from app.trainer.pipeline import HOLDOUT_FRACTION, Challenger, Selector, default_selector, fit_rows, retrain
from app.trainer.registry import ModelRegistry, announcement

log = logging.getLogger(__name__)

BROKER_CHECK_S = 5.0  # the broker is asked for its metadata this often (seconds): rtt_trainer_degraded{reason="kafka"}
GROUP_ID = "rttsched-trainer"
IDLE_CHECK_MAX_S = 60.0  # idle keys are looked for at least this often (seconds)
OUTCOMES_KEPT = 1000  # TrainerService.outcomes keeps the newest outcomes only (one per retrain and coalesced event)
RETRY_S = 1.0  # pause after a broker error of a consumer loop (seconds)
STOP_TIMEOUT_S = 20.0  # stop() gives up waiting on its loops and clients after this (below the pod's 30 s of grace)
STOP_CLIENT_MIN_S = 1.0  # a client still to stop once that time is spent gets this long to close
SESSION_TIMEOUT_MS = 10_000  # retrain-events group: a trainer gone without leaving is replaced after this


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("%s failed: %r", task.get_name(), task.exception())


def storable(key: str) -> None:
    """``bad_model_key`` unless ``key`` is a model key the registry can store (a model trained for it would be lost).

    >>> storable("gCTF:gpu")
    >>> storable("POST /upload:cpu")
    Traceback (most recent call last):
    ...
    app.errors.ContractError: bad_model_key: model key 'POST /upload:cpu' must match ^...$
    """
    parse_model_key(key)
    try:
        check_model_key(key)
    except RegistryError as exc:
        raise ContractError("bad_model_key", str(exc)) from None


def event_published(rec: Any, event: dict[str, Any]) -> float:
    """When a retrain event was published (seconds): its record's timestamp (CreateTime, set by the producer at
    send), or the event's ``ts`` where the record has none. A drift event's ``ts`` is the close of the error period
    that signalled it, fixed when the event is staged, and the event is sent once its checkpoint is stored: after an
    outage, possibly hours later.

    >>> from types import SimpleNamespace
    >>> event_published(SimpleNamespace(timestamp=1_700_000_000_500), {"ts": 1_699_990_000.0})
    1700000000.5
    >>> event_published(SimpleNamespace(timestamp=-1), {"ts": 1_699_990_000.0})
    1699990000.0
    """
    ts = getattr(rec, "timestamp", None)
    if ts is None or ts < 0:
        return float(event["ts"])
    return ts / 1000.0


@dataclasses.dataclass(frozen=True)
class AnyOf(Container[str]):
    """The keys in any of ``parts`` (looked up in each, as they are now).

    >>> "b" in AnyOf(({"a": 1}, {"b"})), "c" in AnyOf(({"a": 1}, {"b"}))
    (True, False)
    """

    parts: tuple[Container[str], ...]

    def __contains__(self, key: object) -> bool:
        return any(key in part for part in self.parts)


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one retrain did: ``outcome`` is promoted | rejected | failed | insufficient_data | coalesced."""

    model_key: str
    reason: str
    outcome: str
    version: int | None = None
    verdict: Verdict | None = None
    metrics: dict[str, float] | None = None
    detail: str = ""


class TrainerService(RegistryAgreement):
    """Consume, train, judge, register, announce. ``start()``, then ``stop()`` (or ``async with``).

    Parameters
    ----------
    settings
        Bootstrap servers, topic prefix, registry location.
    registry
        Model store access; default :class:`~app.trainer.registry.ModelRegistry` on ``settings``.
    max_samples_per_key
        Bound of each key's sample history.
    cpus
        CPUs to pin this process to (``os.sched_setaffinity``); None leaves the affinity alone.
    margin
        Relative RMSE improvement a challenger needs (:func:`~app.trainer.champion.judge`).
    holdout_fraction
        Most recent share of a key's rows kept out of training and used to judge both models.
    max_event_age_s
        Events published longer ago than this are skipped, so a new group does not replay a week. Published: the
        record's timestamp (set by the producer at send), or the event's ``ts`` for a record without one; not the
        ``ts`` alone, which a drift event fixes when it is staged, possibly long before an outage lets it out.
    selector
        Feature selection (``None``: every varying column).
    gpu_apps
        Apps that run on the GPU: their models may not get slower on a faster GPU
        (:func:`app.model.constraints.direction`).
    registry_check_s
        Seconds between two comparisons of the registry with model-updates (0: none).
    key_idle_s
        A key with no new sample for this long (seconds, ``clock.monotonic``) has its history dropped;
        default ``settings.trainer_key_idle_s``.
    max_keys
        Keys whose history is held at most (:class:`~app.trainer.history.SampleHistory`); default
        ``settings.trainer_max_keys``.
    broker_check_s
        Seconds between two looks at whether the broker answers (``rtt_trainer_degraded{reason="kafka"}``).
    stop_timeout_s
        How long :meth:`stop` waits, in all, for its cancelled tasks and its Kafka clients to end (a client still to
        stop then gets ``STOP_CLIENT_MIN_S``); what has not ended by then is named in one WARNING and left behind.
    """

    session_timeout_ms = SESSION_TIMEOUT_MS
    _sample_guard: PositionGuard
    _event_guard: PositionGuard
    _update_guard: PositionGuard

    def __init__(self, settings: Settings, *, registry: ModelRegistry | None = None,
                 max_samples_per_key: int = 50_000, cpus: Iterable[int] | None = None, margin: float = MARGIN,
                 holdout_fraction: float = HOLDOUT_FRACTION, max_event_age_s: float = 3600.0,
                 selector: Selector | None = default_selector, metrics: TrainerMetrics | None = None,
                 clock: Clock | None = None, catch_up_timeout_s: float = 30.0,
                 train_params: dict[str, Any] | None = None, gpu_apps: Iterable[str] = (),
                 registry_check_s: float = 30.0, key_idle_s: float | None = None,
                 max_keys: int | None = None, broker_check_s: float = BROKER_CHECK_S,
                 stop_timeout_s: float = STOP_TIMEOUT_S) -> None:
        if not 0.0 <= margin < 1.0:
            raise ValueError(f"margin must be in [0, 1) (got {margin})")
        key_idle_s = settings.trainer_key_idle_s if key_idle_s is None else key_idle_s
        if not 0.0 < key_idle_s < math.inf:
            raise ValueError(f"key_idle_s must be > 0 and finite (got {key_idle_s})")
        if not 0.0 < broker_check_s < math.inf:
            raise ValueError(f"broker_check_s must be > 0 and finite (got {broker_check_s})")
        if not 0.0 < stop_timeout_s < math.inf:
            raise ValueError(f"stop_timeout_s must be > 0 and finite (got {stop_timeout_s})")
        if not 0.0 < holdout_fraction < 1.0:
            raise ValueError(f"holdout_fraction must be in (0, 1) (got {holdout_fraction})")
        self.settings = settings
        self.registry = registry or ModelRegistry(settings)
        self.history = SampleHistory(max_samples_per_key, settings.trainer_max_keys if max_keys is None else max_keys,
                                     on_evict=self._evicted)
        self.cpus = set(cpus) if cpus is not None else None
        self.margin = margin
        self.holdout_fraction = holdout_fraction
        self.max_event_age_s = max_event_age_s
        self.selector = selector
        self.metrics = metrics or TrainerMetrics()
        self.clock = clock or SystemClock()
        self.catch_up_timeout_s = catch_up_timeout_s
        self.train_params = train_params
        self.gpu_apps = frozenset(gpu_apps)
        self.registry_check_s = registry_check_s
        self.broker_check_s = broker_check_s
        self.stop_timeout_s = stop_timeout_s
        self._broker_away = False  # the broker did not answer the last look
        self.key_idle_s = key_idle_s
        self._idle_check_s = min(key_idle_s / 4, IDLE_CHECK_MAX_S)
        self._idle_checked: float | None = None  # clock.monotonic() of the last idle check
        self._room_checked: float | None = None  # the sample time of the last one for a new key at max_keys
        self._since = -math.inf  # clock.now() as the samples loop began: samples produced before are a replay
        # partitions of training-samples not read up to their end offsets as the samples loop began (None: those not
        # known yet), the newest sample time (clock.monotonic()) read from each partition, and each key's partition
        self._behind: dict[TopicPartition, int] | None = None
        self._read_at: dict[TopicPartition, float] = {}
        self._key_tp: dict[str, TopicPartition] = {}
        self._ends_unknown = False  # the last look for those end offsets failed (said once)
        self._reading: asyncio.Event | None = None  # set once the samples loop reads (model-updates read first)
        self.dead_letters = TrainerDeadLetters(settings, self.metrics, self.clock)
        self.announced = {}
        self._floor = {}
        self._unannounced = {}
        self._unreadable = {}
        self._lost = {}
        self._full_said: float | None = None  # clock.monotonic() of the last line about samples refused at max_keys
        self._full_since = 0  # samples refused at max_keys since that line
        self.outcomes: collections.deque[Outcome] = collections.deque(maxlen=OUTCOMES_KEPT)  # oldest first
        self._training: set[str] = set()
        # keys with a model (announced) or training: a new key never takes their place, and they take another's
        self._kept = AnyOf((self._floor, self._training))
        self._waiting: set[str] = set()  # keys whose retrain waits for the model registry
        self._latest: dict[str, dict[str, Any]] = {}  # key -> newest event that arrived while it was training
        self._marks: dict[str, list[Mark]] = {}  # key -> retrain-events its running retrain answers for
        self._commits: GroupCommits | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._executor = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="trainer")
        self._samples: AIOKafkaConsumer | None = None
        self._events: AIOKafkaConsumer | None = None
        self._updates: AIOKafkaConsumer | None = None
        self._producer: AIOKafkaProducer | None = None
        self._sample_tps: list[TopicPartition] = []
        self._in_fetch: set[AIOKafkaConsumer] = set()  # consumers whose loop waits in getmany: all it read is applied
        self._update_tps: list[TopicPartition] = []
        self.crashed: asyncio.Event | None = None
        self.left_behind: list[str] = []  # what the last stop() gave up on (still running)

    # -- lifecycle
    async def start(self) -> None:
        if self.cpus is not None:
            pin_cpus(self.cpus)
        s = self.settings
        self.crashed = asyncio.Event()
        self._producer = AIOKafkaProducer(**client_options(s, acks="all"))
        self._samples = AIOKafkaConsumer(**consumer_options(s, group_id=None, enable_auto_commit=False,
                                                            auto_offset_reset="none"))
        # committed by hand once an event's retrain ended (GroupCommits); positions checked on assignment
        self._events = AIOKafkaConsumer(**consumer_options(
            s, group_id=s.topic_prefix + GROUP_ID, enable_auto_commit=False, auto_offset_reset="none",
            session_timeout_ms=self.session_timeout_ms, heartbeat_interval_ms=1_000))
        self._updates = AIOKafkaConsumer(**consumer_options(s, group_id=None, enable_auto_commit=False,
                                                            auto_offset_reset="none"))
        topic = s.topic("training-samples")
        self._sample_tps = [TopicPartition(topic, p) for p in range(contract("training-samples").partitions)]
        self._update_tps = [TopicPartition(s.topic("model-updates"), p)
                            for p in range(contract("model-updates").partitions)]
        await self._producer.start()
        self.dead_letters.producer = self._producer
        for consumer, tps in ((self._samples, self._sample_tps), (self._updates, self._update_tps)):
            await consumer.start()
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
        await self._events.start()
        self._sample_guard = PositionGuard(self._samples, "trainer-samples", registry=self.metrics.registry,
                                           topic_label=lambda _t: "training-samples")
        self._event_guard = PositionGuard(self._events, "trainer-events", registry=self.metrics.registry,
                                          topic_label=lambda _t: "retrain-events")
        self._commits = GroupCommits(self._events, self._event_guard)
        self._events.subscribe([s.topic("retrain-events")], listener=self._commits)
        self._update_guard = PositionGuard(self._updates, "trainer-updates", registry=self.metrics.registry,
                                           topic_label=lambda _t: "model-updates")
        loops = [(self._consume_samples(), "samples"), (self._consume_events(), "events"),
                 (self._consume_updates(), "updates"), (self._watch_broker(), "broker-check")]
        if self.registry_check_s > 0:
            loops.append((self._watch_registry(), "registry-check"))
        for coro, name in loops:
            self._spawn(coro, name).add_done_callback(self._watch)
        log.info("trainer started: samples from %s, events from %s", topic, s.topic("retrain-events"))

    async def stop(self) -> None:
        """Cancel the loops and retrains, commit what ended, stop the Kafka clients: within ``stop_timeout_s``
        (and ``STOP_CLIENT_MIN_S`` per client still to stop then), so SIGTERM stops a trainer whatever does not
        answer. A task that does not end when cancelled, a client whose stop waits on a broker, or a training still
        running in its thread is left behind: named in :attr:`left_behind`, and all of them in one WARNING at the
        end. A process that exits then must not wait for them (:func:`app.stopping.exit_now`): the interpreter's
        exit joins the training's thread, and ``asyncio.run`` cancels the tasks again without bound."""
        deadline = time.monotonic() + self.stop_timeout_s
        left: list[str] = []
        tasks = await cancel_within(list(self._tasks), self.stop_timeout_s, "trainer", None)  # failures: logged
        if tasks:  # by their callback
            left.append(still_running(tasks, self.stop_timeout_s))
        if self._commits is not None:  # the events whose retrain ended; a cancelled one is read again
            await self._until(deadline, self._commits.flush(), "the last commit of retrain-events", left)
        for client, what in ((self._events, "the retrain-events consumer"), (self._samples, "the samples consumer"),
                             (self._updates, "the model-updates consumer"), (self._producer, "the producer")):
            if client is not None:
                await self._until(deadline, client.stop(), what, left)
        await self._until(deadline, self.dead_letters.close(), "the dead-letter marks", left)
        await self._until(deadline, self._shut_executor(), "the training or registry call running in its thread",
                          left)
        self.left_behind = left
        if left:
            log.warning("trainer stopping: %s; stopping without %s", "; ".join(left),
                        "it" if len(left) == 1 else "them")
        else:
            log.info("trainer stopped")

    async def _shut_executor(self) -> None:
        """Drop the executor's queued calls and wait, without blocking the event loop, for the one it runs (a
        training, a registry save: nothing stops it). Given up on by :meth:`stop`'s deadline, it is left to finish
        in its thread; ``rttsched trainer`` then exits without it (the interpreter's own exit would wait for it)."""
        loop = asyncio.get_running_loop()
        shut: asyncio.Future[None] = loop.create_future()

        def ended() -> None:
            if not shut.done():
                shut.set_result(None)

        def shut_down() -> None:
            self._executor.shutdown(wait=True, cancel_futures=True)
            with contextlib.suppress(RuntimeError):  # the event loop closed meanwhile
                loop.call_soon_threadsafe(ended)

        threading.Thread(target=shut_down, name="trainer-shutdown", daemon=True).start()
        await shut

    async def _until(self, deadline: float, step: Any, what: str, left: list[str]) -> None:
        """Await ``step`` of :meth:`stop` until ``deadline`` (``time.monotonic()``; at least ``STOP_CLIENT_MIN_S``):
        if it takes longer it is cancelled, and said in ``left``; nothing if it fails."""
        bound = max(deadline - time.monotonic(), STOP_CLIENT_MIN_S)
        try:
            async with asyncio.timeout(bound):
                await step
        except TimeoutError:
            left.append(f"{what} did not end within {bound:.1f} s")
        except Exception as exc:
            log.debug("trainer stopping: %s failed to stop: %r", what, exc)

    async def __aenter__(self) -> TrainerService:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    def _watch(self, task: asyncio.Task[Any]) -> None:
        """A consumer loop must never end: if one does, log why and set :attr:`crashed`."""
        if task.cancelled():
            return
        log.error("trainer %s loop ended: %r", task.get_name(), task.exception())
        if self.crashed is not None:
            self.crashed.set()

    async def _watch_broker(self) -> None:
        """Ask the broker for its metadata every ``broker_check_s``: the consumers and the producer retry by
        themselves while it is away (a fetch returns nothing, a send waits), so only a look of its own tells the
        trainer runs without it. No answer within ``broker_check_s`` (5 s at most) sets
        ``rtt_trainer_degraded{reason="kafka"}`` with one WARNING; the first answer after clears it with one INFO."""
        assert self._producer is not None
        client, servers = self._producer.client, self.settings.bootstrap_servers
        while True:
            try:  # not asyncio.wait_for: in Python 3.11 it swallows a cancel that comes as the look is answered,
                # and this loop, run on, kept stop() waiting for it without end
                async with asyncio.timeout(min(self.broker_check_s, 5.0)):
                    await client.fetch_all_metadata()
            except (KafkaError, OSError, TimeoutError) as exc:
                if not self._broker_away:
                    log.warning("degraded (kafka): Kafka at %s not answering (%s: %s); the trainer reads and "
                                "announces nothing until it does", servers, type(exc).__name__, exc)
                self._broker_away = True
                self.metrics.degraded.labels(KAFKA).set(1)
            else:
                if self._broker_away:
                    log.info("Kafka at %s answers again", servers)
                self._broker_away = False
                self.metrics.degraded.labels(KAFKA).set(0)
            await asyncio.sleep(self.broker_check_s)

    # -- consuming
    async def _fetch(self, consumer: AIOKafkaConsumer, guard: PositionGuard,
                     on_reset: Callable[[dict[TopicPartition, int]], None] | None = None,
                     **kw: Any) -> dict[Any, list[Any]]:
        """One ``getmany`` with its read positions checked; an empty batch while the broker is away.

        ``on_reset`` gets the partitions whose positions were reset (read again from their start), with their new
        positions. A broker error, of the fetch or of a position check, is logged and waited out (``RETRY_S``):
        never the end of the loop; a fetched batch is returned even when the check after it failed."""
        self._in_fetch.add(consumer)
        try:
            batches = await consumer.getmany(**kw)
        except OffsetOutOfRangeError as exc:
            await self._check(guard.out_of_range(exc.args[0]), guard, on_reset)
            return {}
        except NoOffsetForPartitionError as exc:  # a group without an offset whose assignment check failed
            log.info("%s: no committed offset for %s: reading it from its start", guard.client, exc.args)
            with contextlib.suppress(KafkaError):
                await consumer.seek_to_beginning(*exc.args)
            return {}
        except KafkaError as exc:
            log.warning("%s: %r; retrying", guard.client, exc)
            await asyncio.sleep(RETRY_S)
            return {}
        finally:
            self._in_fetch.discard(consumer)
        guard.note(batches)
        await self._check(guard.after_fetch(), guard, on_reset)
        return batches  # type: ignore[no-any-return]

    @staticmethod
    async def _check(check: Any, guard: PositionGuard,
                     on_reset: Callable[[dict[TopicPartition, int]], None] | None) -> None:
        """Await a position check of ``guard``; its resets to ``on_reset``. A broker error is logged and waited out:
        the next fetch checks again."""
        try:
            reset = await check
        except KafkaError as exc:
            log.warning("%s: read positions not checked (%r); retrying", guard.client, exc)
            await asyncio.sleep(RETRY_S)
            return
        if reset and on_reset is not None:
            on_reset(reset)

    async def _consume_samples(self) -> None:
        assert self._samples is not None
        self._reading = asyncio.Event()
        self._since = self.clock.now()
        # the keys with a model known first: at max_keys, a sample of one takes the place of a key without
        await self._caught_up(self._updates, self._update_tps, "model-updates")
        self._reading.set()
        while True:
            if self._behind is None:
                self._behind = await self._end_offsets()
            batches = await self._fetch(self._samples, self._sample_guard, self._samples_reset, timeout_ms=500,
                                        max_records=5_000)
            now = self.clock.monotonic()
            wall, skew = self.clock.now(), self.settings.max_clock_skew_s
            # idle keys go before the batch is added: after a quiet spell, its new keys find the room they left
            if self._idle_checked is None or now - self._idle_checked >= self._idle_check_s:
                self._idle_checked = now
                self.drop_idle(now)
            if self._behind:  # the batch reads up to their positions: its samples are applied in time order next
                await self._replayed()
            bad: list[tuple[Any, ContractError]] = []
            # in the order they came (a replay reads partitions at their own pace: its batch in time order)
            timed = sorted(((self._sample_time(rec, now, wall), tp, rec) for tp, records in batches.items()
                            for rec in records), key=lambda item: item[0])
            for at, tp, rec in timed:  # no await in here: a batch lands in the history at once
                self._read_at[tp] = max(self._read_at.get(tp, -math.inf), at)
                try:
                    sample = decode("training-samples", rec.value)
                    check_key("training-samples", rec.key, sample)
                    # one from the future would sit in every holdout of its key; old ones are the history
                    check_time("training-samples", sample, now=wall, max_skew_s=skew, max_age_s=math.inf)
                    key = sample["model_key"]
                    if self.history.full_for(key):
                        self._make_room(at)
                    if self.history.add(sample, at, keep=self._kept):
                        self.metrics.key_samples.labels(key).inc()
                    else:
                        self.metrics.duplicates.inc()
                    self._key_tp[key] = tp
                except ContractError as exc:
                    self.metrics.bad_messages.labels(topic="training-samples", reason=exc.reason).inc()
                    if exc.reason == KEYS_FULL:
                        self._keys_full(f"{tp.topic}:{rec.offset}", exc, now)
                    else:
                        log.warning("bad training sample at %s:%d: %s", tp.topic, rec.offset, exc)
                    bad.append((rec, exc))
            if bad:
                self.dead_letter_later("training-samples", bad)
            self.metrics.samples.set(len(self.history))
            self.metrics.keys.set(self.history.n_keys)
            self.metrics.history_bytes.set(self.history.nbytes)

    def _sample_time(self, rec: Any, now: float, wall: float) -> float:
        """When (``clock.monotonic()``) a trainer running all along would have taken the sample of ``rec``: ``now``
        for one produced since the samples loop began, or without a timestamp; for one produced before (the
        retained samples a restarted trainer reads again) as long before ``now`` as its record's timestamp is before
        ``wall``, so a key's idle time (``RTT_TRAINER_KEY_IDLE_S``, ``max_keys``) is that of its newest sample, not
        that of the restart."""
        ts = getattr(rec, "timestamp", None)
        if ts is None or ts < 0 or ts / 1000.0 >= self._since:
            return now
        return now - (wall - ts / 1000.0)

    def _known_until(self, t: float) -> Callable[[str], float]:
        """Up to when each key's samples are known, at time ``t``: ``t``, but for a key of a partition not read yet
        up to its end offset of when the samples loop began (all of them while those are not known), the newest
        sample read from it, if earlier: a key idle by ``t`` as far as read may have newer samples not read yet."""
        behind, read_at, key_tp = self._behind, self._read_at, self._key_tp

        def until(key: str) -> float:
            tp = key_tp.get(key)
            if tp is None or (behind is not None and tp not in behind):
                return t
            return min(t, read_at.get(tp, -math.inf))

        return until

    def _make_room(self, at: float) -> None:
        """A sample of a new key at ``max_keys``: the keys idle by its time ``at`` go first, as a trainer taking it
        when it came would have dropped them by then (looked for once per idle check period of sample time: a
        producer inventing keys sends thousands)."""
        if self._room_checked is None or at - self._room_checked >= self._idle_check_s:
            self._room_checked = at
            self.drop_idle(at)

    async def _end_offsets(self) -> dict[TopicPartition, int] | None:
        """The end offsets of training-samples now (what a replay reads up to); None if the broker did not say."""
        assert self._samples is not None
        if not self._sample_tps:
            return {}
        try:
            ends = dict(await self._samples.end_offsets(self._sample_tps))
        except KafkaError as exc:
            if not self._ends_unknown:  # one line until they are known: the broker away, every pass fails
                log.warning("training-samples end offsets unknown (%r): no idle key dropped until they are", exc)
            self._ends_unknown = True
            return None
        self._ends_unknown = False
        return ends

    async def _replayed(self) -> None:
        """Partitions read up to their end offsets of when the samples loop began leave :attr:`_behind` (positions
        past the batch fetched: applied in time order, none of its samples is newer than one applied before it)."""
        assert self._samples is not None and self._behind is not None
        for tp, end in list(self._behind.items()):
            try:
                if await self._samples.position(tp) < end:
                    continue
            except KafkaError:
                return
            del self._behind[tp]

    def _samples_reset(self, reset: dict[TopicPartition, int]) -> None:
        """Partitions of training-samples read again from their start (recreated, trimmed): the end offsets they
        are read up to again are taken anew."""
        self._behind = None

    def _keys_full(self, where: str, exc: ContractError, now: float) -> None:
        """A sample of a new key refused at ``max_keys``: one WARNING per :data:`~app.kafka.quiet.PERIOD_S` (a
        producer inventing keys sends thousands), saying how many were refused since the line before."""
        self._full_since += 1
        if self._full_said is not None and now - self._full_said < PERIOD_S:
            return
        more = f" ({self._full_since - 1:,} more refused since the line before)" if self._full_since > 1 else ""
        log.warning("training sample at %s refused: %s; one such line per %.0f s%s", where, exc, PERIOD_S, more)
        self._full_said, self._full_since = now, 0

    def dead_letter_later(self, source: str, bad: list[tuple[Any, ContractError]]) -> None:
        """Dead-letter ``bad`` (of a topic read from its start) in the background: the consumer reads on while
        the broker does not take them (their marks are stored only once they are, so a restarted trainer sends
        what this one could not)."""
        task = self._spawn(self.dead_letters.send(source, bad), f"dead-letters:{source}")
        task.add_done_callback(_log_failure)

    def drop_idle(self, now: float) -> list[str]:
        """Drop the history of every key no sample arrived for in ``key_idle_s`` before ``now`` (but a key
        training: its next check drops it; a key of a partition a replay has not read up to ``now``, judged at the
        newest sample read from it); the keys dropped."""
        gone = self.history.drop_idle(now, self.key_idle_s, keep=self._training, until=self._known_until(now))
        if gone:
            self.metrics.keys_dropped.inc(len(gone))
            for key in gone:
                self._forget_series(key)
            log.info("dropped the sample history of %d key(s) with no sample for %.0f s: %s", len(gone),
                     self.key_idle_s, gone[:10])
            with contextlib.suppress(RuntimeError):  # stopping: the executor is shut down
                self._executor.submit(release_freed_memory)  # the freed rows' pages back to the OS
        return gone

    def _evicted(self, key: str) -> None:
        """``key``'s history made room for a key with a model (the history at ``max_keys``)."""
        self.metrics.keys_evicted.inc()
        self._forget_series(key)
        log.info("dropped the sample history of %s, idle longest of the keys without a model: the trainer holds "
                 "RTT_TRAINER_MAX_KEYS keys and a key with a model needs room", key)

    def _forget_series(self, key: str) -> None:
        """The metric series (and the partition noted) of a key whose history went."""
        self._key_tp.pop(key, None)
        with contextlib.suppress(KeyError):
            self.metrics.key_samples.remove(key)

    async def _consume_events(self) -> None:
        """Each event handed to :meth:`submit` with its mark; the group commits it once its retrain ended (or at
        once: a bad event once dead-lettered, a stale one once skipped)."""
        assert self._events is not None and self._commits is not None
        commits = self._commits
        while True:
            batches = await self._fetch(self._events, self._event_guard, commits.reset, timeout_ms=500)
            for tp, records in batches.items():
                for rec in records:
                    mark = commits.read(tp, rec.offset)
                    if mark is None:  # read twice within this assignment (a seek back): handed out once
                        continue
                    try:
                        event = decode("retrain-events", rec.value)
                        check_key("retrain-events", rec.key, event)
                        storable(event["model_key"])
                    except ContractError as exc:
                        self.metrics.bad_messages.labels(topic="retrain-events", reason=exc.reason).inc()
                        log.warning("bad retrain event at offset %d: %s", rec.offset, exc)
                        await self.dead_letters.send("retrain-events", [(rec, exc)], once=False)  # then committed
                        commits.done(mark)
                        continue
                    published = event_published(rec, event)
                    if self.clock.now() - published > self.max_event_age_s:
                        log.info("skipping stale retrain event for %s (published %.0f, ts %.0f)",
                                 event["model_key"], published, event["ts"])
                        commits.done(mark)
                        continue
                    self.submit(event, mark)
            commits.commit_soon()

    def submit(self, event: dict[str, Any], mark: Mark | None = None) -> asyncio.Task[Outcome] | None:
        """Start a retrain for the event's key, or coalesce it if that key is training (returns None).

        ``mark``: the event's place on retrain-events, committed once the retrain of its key ends (the one started
        here, or the running one it was coalesced into); a retrain cancelled by :meth:`stop` leaves it uncommitted,
        so the next trainer reads the event again."""
        key = event["model_key"]
        if key in self._training:
            self._latest[key] = event  # a retrain waiting to try again uses the newest event
            if mark is not None:
                self._marks.setdefault(key, []).append(mark)
            self.metrics.coalesced.inc()
            self.outcomes.append(Outcome(key, event["reason"], "coalesced"))
            log.info("retrain of %s already running: event coalesced", key)
            return None
        self._training.add(key)
        self._marks[key] = [mark] if mark is not None else []
        task: asyncio.Task[Outcome] = self._spawn(self.retrain(event), f"retrain:{key}")
        task.add_done_callback(lambda t: self._done(key, t))
        return task

    def _done(self, key: str, task: asyncio.Task[Outcome]) -> None:
        """A retrain of ``key`` ended: an event coalesced during it is dropped (it ran on every sample up to then);
        the events it answers for may be committed, unless it was cancelled (the trainer stopping)."""
        self._training.discard(key)
        self._latest.pop(key, None)
        marks = self._marks.pop(key, [])
        if self._commits is not None and not task.cancelled():
            for mark in marks:
                self._commits.done(mark)

    async def catch_up(self) -> bool:
        """Wait until every sample on training-samples now is in the history; False on timeout.

        The samples loop first reads model-updates to its end (as long as ``catch_up_timeout_s``): a retrain started
        meanwhile waits for that first, then ``catch_up_timeout_s`` for the samples, so it never trains on a history
        that wait left empty."""
        reading = self._reading
        if reading is not None and not reading.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.catch_up_timeout_s + 5.0):  # a cancel is never lost (not wait_for)
                    await reading.wait()
        return await self._caught_up(self._samples, self._sample_tps, "training-samples")

    async def _caught_up(self, consumer: AIOKafkaConsumer | None, tps: list[TopicPartition], what: str) -> bool:
        """Wait until every record of ``tps`` up to their end offsets of now is applied by ``consumer``'s loop (in
        the history, or noted as announced); False on timeout.

        The positions are compared only while the loop waits in ``getmany``: a position moves as ``getmany``
        returns records, before the loop applies them, and the loop may wait on the broker in between (a position
        check). Waiting in ``getmany``, it has applied everything it fetched, and a fetch brings whole batches,
        so this holds too on the embedded broker, whose ListOffsets answers the first offset of the last batch + 1."""
        assert consumer is not None
        try:
            end = await consumer.end_offsets(tps)
        except KafkaError as exc:
            log.warning("%s end offsets unknown (%r); going on with what was read", what, exc)
            return False
        deadline = time.monotonic() + self.catch_up_timeout_s
        while time.monotonic() < deadline:
            if not tps or (consumer in self._in_fetch
                           and all([await consumer.position(tp) >= end[tp] for tp in tps])):
                return True
            await asyncio.sleep(0.05)
        log.warning("%s not read to its end within %.0fs; going on with what was read", what,
                    self.catch_up_timeout_s)
        return False

    # -- one retrain
    async def retrain(self, event: dict[str, Any]) -> Outcome:
        """Train, judge, and (if better) register and announce a model for ``event["model_key"]``."""
        key = event["model_key"]
        backoff = Backoff.upto(self.settings.retry_max_backoff_s)
        cancelled = False
        try:
            while True:
                reason = event["reason"]
                try:
                    outcome = await self._retrain(key, reason, event)
                except RegistryUnavailableError as exc:
                    self._registry_away(key, exc)
                    await self._registry_back(key, backoff)
                    event = self._latest.pop(key, event)  # the newest event that arrived while it waited
                    continue
                except CurrentChangedError as exc:  # the registry gave up on it, logged there: the next event trains
                    outcome = Outcome(key, reason, "failed", detail=f"{type(exc).__name__}: {exc}")
                except CorruptRecordError as exc:  # an operator mends it (docs/runbook.md §10): no traceback
                    log.error("retrain of %s failed: the registry's record cannot be read, nothing trained: %s", key,
                              exc)
                    outcome = Outcome(key, reason, "failed", detail=f"{type(exc).__name__}: {exc}")
                except Exception as exc:
                    log.exception("retrain of %s failed", key)
                    outcome = Outcome(key, reason, "failed", detail=f"{type(exc).__name__}: {exc}")
                break
        except asyncio.CancelledError:  # the trainer stopping: the registry is no more usable than it was
            cancelled = True
            raise
        finally:
            if not cancelled:
                self._registry_wait_over(key)
        self.metrics.retrains.labels(reason=reason, outcome=outcome.outcome).inc()
        self.outcomes.append(outcome)
        return outcome

    async def _retrain(self, key: str, reason: str, event: dict[str, Any]) -> Outcome:
        _, node_class, _ = parse_model_key(key)
        loop = asyncio.get_running_loop()
        landed = None
        if self.registry.unsure(key):
            landed = await loop.run_in_executor(self._executor, self.registry.landed, key)
        if landed is not None:  # the last try's save was applied though the registry did not answer it
            await self._announce(landed.fields, event, timed=reason != REGISTRY_LOST)
            return Outcome(key, reason, "promoted", version=int(landed.fields["version"]), verdict=landed.verdict,
                           metrics=landed.metrics, detail="saved by the try before, whose answer was lost")
        if reason == REGISTRY_LOST:  # the current version, if the registry kept one, saved again above the lost
            try:
                record = await loop.run_in_executor(self._executor, self.registry.reissue, key,
                                                    self._newest_announced(key))
            except CurrentChangedError as exc:  # promoted meanwhile (a rollback, a retrain): the next check looks
                log.warning("retrain of %s: the current version changed to %s before it was saved again: nothing "
                            "saved", key, f"v{exc.found}" if exc.found else "none")
                return Outcome(key, reason, "rejected", detail=str(exc))
            if record is not None:
                await self._announce(record, event, timed=False)
                return Outcome(key, reason, "promoted", version=int(record["version"]),
                               detail="the registry's current version saved again")
        # a current record that cannot be read (CorruptRecordError) fails the retrain now, not after its training:
        # no challenger could be judged against it, nor replace it
        await loop.run_in_executor(self._executor, self.registry.store.current, key)
        await self.catch_up()
        names, rows = self.history.snapshot(key)
        if fit_rows(len(rows), self.holdout_fraction) < MIN_SAMPLES:
            level = logging.DEBUG if self._repeated(key, reason, f"{len(rows)} samples") else logging.INFO
            log.log(level, "retrain of %s: only %d samples", key, len(rows))
            return Outcome(key, reason, "insufficient_data", detail=f"{len(rows)} samples")
        onset = event.get("onset_ts") if reason == "drift" else None
        run = functools.partial(self._train_and_judge, names, rows, node_class, key, onset)
        try:
            challenger, verdict = await loop.run_in_executor(self._executor, run)
        except NotEnoughSamplesError as exc:
            return Outcome(key, reason, "insufficient_data", detail=str(exc))
        self.metrics.training_seconds.observe(challenger.seconds)
        log.info("retrain of %s (%s): %s, challenger rmse %.1f ms vs champion %s", key, reason, verdict.reason,
                 verdict.challenger_rmse_ms, verdict.champion_rmse_ms)
        if verdict.promote:  # against the model that serves now, if an operator rolled back meanwhile
            verdict = await loop.run_in_executor(self._executor, self.registry.judge_again, key, challenger,
                                                 verdict, self.margin)
        if not verdict.promote:
            return Outcome(key, reason, "rejected", verdict=verdict, metrics=challenger.metrics)
        await self._caught_up(self._updates, self._update_tps, "model-updates")  # the newest version announced
        # in place of the champion judged against only: a rollback that landed meanwhile is judged against again
        verdict, record = await loop.run_in_executor(self._executor, self.registry.promote_challenger, key,
                                                     challenger, verdict, self._newest_announced(key), self.margin)
        if record is None:
            return Outcome(key, reason, "rejected", verdict=verdict, metrics=challenger.metrics)
        await self._announce(record, event, timed=reason != REGISTRY_LOST)
        return Outcome(key, reason, "promoted", version=int(record["version"]), verdict=verdict,
                       metrics=challenger.metrics)

    def _registry_away(self, key: str, exc: RegistryUnavailableError) -> None:
        """A retrain of ``key`` could not use the registry: one WARNING line naming it and why (no traceback: the
        condition passes), a retry counted, and the trainer degraded (``model_store``) while it waits."""
        self.metrics.retries.labels(step="registry").inc()
        self._waiting.add(key)
        self.metrics.degraded.labels(MODEL_STORE).set(1)
        log.warning("retrain of %s: %s; trying again once the registry answers", key, exc)

    def _registry_wait_over(self, key: str) -> None:
        """The retrain of ``key`` no longer waits for the registry (it ended): the trainer is no longer degraded once
        no retrain waits. Not called for a retrain cancelled while it waits (the trainer stopping): the registry is
        no more usable for that, and neither the gauge nor the log says otherwise."""
        if key not in self._waiting:
            return
        self._waiting.discard(key)
        if not self._waiting:
            self._model_store_gauge()  # 0, unless the registry check cannot reach the registry
            log.info("model registry usable again: no retrain waits for it")

    async def _registry_back(self, key: str, backoff: Backoff) -> None:
        """Wait (with backoff) until the registry would take ``key``'s save (:meth:`ModelRegistry.ready`): no
        training is spent while it cannot."""
        loop = asyncio.get_running_loop()
        while True:
            await asyncio.sleep(backoff.next())
            try:
                await loop.run_in_executor(self._executor, self.registry.ready, key)
                return
            except RegistryUnavailableError:
                continue
            except Exception as exc:  # a check it cannot run (a Redis user not allowed a command): not ready
                log.warning("retrain of %s waits: the registry's readiness check failed: %s: %s", key,
                            type(exc).__name__, exc)

    def _train_and_judge(self, names: tuple[str, ...], rows: list[Any], node_class: str,
                         key: str, onset_ts: float | None = None) -> tuple[Challenger, Verdict]:
        app = parse_model_key(key)[0]

        def champion(holdout: Dataset) -> dict[str, float] | None:
            return self.registry.champion_metrics(key, holdout)

        try:
            return retrain(build_dataset(names, rows), node_class, champion, margin=self.margin,
                           holdout_fraction=self.holdout_fraction, selector=self.selector,
                           params=self.train_params, onset_ts=onset_ts, gpu_app=app in self.gpu_apps)
        finally:
            release_freed_memory()  # the retrain's working set goes back to the OS, not to the next peak

    async def _announce(self, record: dict[str, Any], event: dict[str, Any], *, timed: bool = True) -> None:
        """Send ``record`` on model-updates until Kafka takes it; ``timed``: observe the time from the event's
        drift onset (or its time) to now."""
        assert self._producer is not None
        now = self.clock.now()
        onset = event.get("onset_ts")
        key, value = announcement(record, ts=now, onset_ts=onset)
        backoff = Backoff.upto(self.settings.retry_max_backoff_s)
        while True:
            try:
                await self._producer.send_and_wait(self.settings.topic("model-updates"), value, key=key)
                break
            except KafkaError as exc:  # registered and current already: only the announcement is missing
                wait = backoff.next()
                self.metrics.retries.labels(step="announce").inc()
                log.warning("announcing %s v%d: %r; trying again in %.1f s", record["model_key"], record["version"],
                            exc, wait)
                await asyncio.sleep(wait)
        self.metrics.model_version.labels(model_key=record["model_key"]).set(record["version"])
        self._note_announced(record)
        if timed:
            start = onset if onset is not None else event["ts"]
            self.metrics.drift_to_promotion.observe(max(0.0, now - float(start)))
        log.info("announced %s version %d", record["model_key"], record["version"])
