"""Shared fixtures: a real embedded broker and a real redis-server, each on a free port.

Set ``RTT_KAFKA_BOOTSTRAP`` / ``REDIS_URL`` to run the suite against servers you started yourself.
Every test that touches Kafka gets its own uuid topic prefix, so tests never see each other's data.
"""

from __future__ import annotations

import os

# ``mutmut run`` runs the tests once in its own process, then forks a child per mutant. A child that
# meets an OpenMP thread pool (XGBoost's libgomp) started before the fork waits forever for the
# pool's threads, which the fork did not copy. Under mutmut (it sets MUTANT_UNDER_TEST), OpenMP
# starts no thread: libgomp reads these when it loads, so before the imports below load XGBoost.
if "MUTANT_UNDER_TEST" in os.environ:
    os.environ["OMP_NUM_THREADS"] = "1"  # over any value set: more than one deadlocks
    os.environ["OMP_THREAD_LIMIT"] = "1"  # also caps an explicit nthread

import asyncio  # noqa: E402
import logging  # noqa: E402
import uuid  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from fault_stack import RedisServer  # noqa: E402
from hypothesis import settings  # noqa: E402

from app.config import Settings  # noqa: E402
from app.kafka.embedded import EmbeddedBroker  # noqa: E402

FIXTURES = Path(__file__).parent / "fixtures"

# Timing belongs in bench/: on a shared or slow machine a per-example deadline only makes tests flaky.
settings.register_profile("rttsched", deadline=None)
# For the mutation check (pytest --hypothesis-profile=mutation): the same examples for every mutant.
settings.register_profile("mutation", deadline=None, derandomize=True, database=None)
settings.load_profile("rttsched")


def pytest_configure(config: pytest.Config) -> None:
    """In a parallel run's main process, before it starts its workers: import ``dcor`` (the dev extra's
    reference for app.features.dcor_fast), which compiles its numba functions at import into their on-disk cache.
    Two workers that compiled them at once into an empty cache (a fresh install) aborted one of them in LLVM
    (``Fatal Python error: Aborted`` as they collected); compiled once here, the workers load the cache."""
    if getattr(config.option, "numprocesses", None) and not hasattr(config, "workerinput"):
        import importlib
        import importlib.util

        if importlib.util.find_spec("dcor") is not None:
            importlib.import_module("dcor")


@pytest.fixture(autouse=True)
def _root_logger_as_found() -> Iterator[None]:
    """Every test leaves the root logger as it found it: its level, its handlers, each handler's filters.

    ``app.cli.main.main()`` run in process calls ``logging.basicConfig`` (a level, and a handler when the root
    logger has none) and ``masking.install`` (a filter on every root handler): one test's DEBUG level, handler
    or filters reached every later test. pytest's own capture handlers come and go with each phase of a test
    (set-up, call, teardown), so they are left to pytest. The filters that keep recurring client errors to one per
    period (``app.kafka.quiet``, installed by the services' ``main``) go too: one test's held-back warning hid
    the next test's. So do the level, ``disabled`` and ``propagate`` of every logger that existed before the
    test: ``rttsched demo`` run in process sets ``aiokafka`` to CRITICAL, which emptied a later test's ``caplog``
    (in the order one process of a parallel run met them).
    """
    from app.kafka.quiet import RECURRING

    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    filters = {h: list(h.filters) for h in handlers}
    named = {name: list(logging.getLogger(name).filters) for name in RECURRING}
    states = {lg: (lg.level, lg.disabled, lg.propagate) for lg in _loggers()}
    yield
    for lg, state in states.items():
        if (lg.level, lg.disabled, lg.propagate) != state:
            lg.setLevel(state[0])
            lg.disabled, lg.propagate = state[1], state[2]
    for name, kept in named.items():
        logging.getLogger(name).filters[:] = kept
    root.setLevel(level)
    for h in root.handlers[:]:
        if h not in filters and not _pytests(h):
            root.removeHandler(h)
    for h in handlers:
        if h not in root.handlers and not _pytests(h):
            root.addHandler(h)
    for h, kept in filters.items():
        h.filters[:] = kept


def _loggers() -> list[logging.Logger]:
    return [lg for lg in list(logging.Logger.manager.loggerDict.values()) if isinstance(lg, logging.Logger)]


def _pytests(handler: logging.Handler) -> bool:
    return type(handler).__module__.startswith("_pytest.")


@pytest.fixture(scope="session")
def kafka_bootstrap() -> Iterator[str]:
    """Bootstrap address of a real Kafka-protocol broker for the whole session."""
    external = os.environ.get("RTT_KAFKA_BOOTSTRAP")
    if external:
        yield external
        return
    broker = EmbeddedBroker().start()
    try:
        yield broker.bootstrap
    finally:
        broker.stop()


@pytest.fixture(scope="session")
def redis_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """URL of a real redis-server, started on a free port (or ``REDIS_URL``)."""
    external = os.environ.get("REDIS_URL")
    if external:
        yield external
        return
    server = RedisServer(tmp_path_factory.mktemp("redis"), persist=False).start()
    try:
        yield server.url
    finally:
        server.stop()


@pytest.fixture
def settings_factory(tmp_path: Path) -> Callable[..., Settings]:
    """Build Settings for a test: its own uuid topic prefix and models directory."""
    prefix = f"t{uuid.uuid4().hex[:10]}-"

    def make(**overrides: object) -> Settings:
        base: dict[str, object] = {"topic_prefix": prefix, "models_dir": str(tmp_path / "models")}
        base.update(overrides)
        return Settings.from_env({}, **base)

    return make


@pytest.fixture
def kafka_settings(kafka_bootstrap: str, settings_factory: Callable[..., Settings]) -> Settings:
    """Settings on the real broker with every topic of topics/ created under a fresh prefix."""
    from app.kafka.admin import ensure_topics

    s = settings_factory(kafka_bootstrap=kafka_bootstrap)
    asyncio.run(ensure_topics(s))
    return s
