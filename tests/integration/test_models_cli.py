"""``rttsched models`` against a real redis-server and the embedded broker.

Two versions of a key are registered and announced the trainer's way (a challenger trained by the trainer's
pipeline, :meth:`ModelRegistry.register`, the trainer's model-updates message), the second a bad model; the CLI
rolls back. The registry's current is then a new version holding the first version's blob, announced above every
version before it; the extender's view feed installs it; the running trainer takes the announcement as its own
newest, its registry check leaves it alone, and its next retrain judges the challenger against the rolled-back
model. A rollback that a retrain's promotion overtakes changes nothing and says so. ``list`` and ``show`` flag a
current version that was never announced; bad input, and a Redis or a broker that does not answer, are one line
and exit status 2.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import orjson
import pytest
from test_trainer import produce

from app.cli.main import main
from app.config import Settings
from app.contracts import encode
from app.extender.feed import ViewFeed
from app.extender.metrics import ExtenderMetrics
from app.extender.models import registry_loader
from app.kafka.embedded import free_port
from app.model.base import Predictor
from app.model.fast import FastPredictor
from app.registry.base import sha256_hex
from app.registry.redis_store import RedisModelStore
from app.registry.store import open_store
from app.scheduler.builder import SnapshotBuilder
from app.trainer.announcements import announce, read_announced
from app.trainer.history import Dataset, SampleHistory
from app.trainer.pipeline import train_challenger
from app.trainer.registry import ModelRegistry
from app.trainer.service import TrainerService

pytestmark = pytest.mark.integration

KEY = "gCTF:gpu"
GPUS = ("Tesla K20c", "Tesla M40", "NVIDIA GeForce RTX 4090")
FAST = {"n_estimators": 40}


def samples(n: int, rng: np.random.Generator) -> list[dict[str, Any]]:
    """gCTF samples whose RTT depends on GPU utilisation and memory used (plus 2 % noise)."""
    out = []
    for i in range(n):
        util, mem = float(rng.uniform(0, 100)), float(rng.uniform(0, 8000))
        out.append({
            "model_key": KEY, "task_id": f"task-{i}", "app": "gCTF", "node": f"gpu-{i % 3}", "node_class": "gpu",
            "gpu_model": GPUS[i % 3], "started_ts": 1_700_000_000.0 + i, "input_size_mb": 64.0, "window_s": 30.0,
            "rtt_ms": (300.0 + 6.0 * util + 0.05 * mem) * float(rng.normal(1.0, 0.02)),
            "features": {"nvidia_smi_utilization_gpu__mean": util, "nvidia_smi_memory_used__mean": mem},
        })
    return out


def dataset(rows: list[dict[str, Any]]) -> Dataset:
    history = SampleHistory()
    for s in rows:
        history.add(s)
    return history.dataset(KEY)


async def until(done: Callable[[], Any], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not done():
        assert time.monotonic() < deadline, f"{what} not seen in {timeout_s}s"
        await asyncio.sleep(0.05)


@pytest.fixture
def cli(kafka_settings: Settings, redis_url: str, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> Callable[..., Any]:
    """``rttsched ARGS`` in this process (in a thread: it runs its own event loop) on the test's broker, topic
    prefix and Redis; its exit status, stdout and stderr."""
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", kafka_settings.bootstrap_servers)
    monkeypatch.setenv("RTT_TOPIC_PREFIX", kafka_settings.topic_prefix)
    monkeypatch.setenv("REDIS_URL", redis_url)

    async def run(*argv: str, **env: str) -> tuple[int, str, str]:
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        capsys.readouterr()
        rc = await asyncio.to_thread(main, ["models", *argv])
        out, err = capsys.readouterr()
        return rc, out, err

    return run


async def test_a_rollback_reaches_the_extender_and_the_trainer_judges_against_it(
        kafka_settings: Settings, redis_url: str, cli: Callable[..., Any]) -> None:
    s = dataclasses.replace(kafka_settings, redis_url=redis_url)
    rows = samples(700, np.random.default_rng(5))
    await produce(s, "training-samples", [(KEY, encode("training-samples", v)) for v in rows])
    ds = dataset(rows)
    store = open_store(s)
    registry = ModelRegistry(store=store)

    # v1 a good model, v2 a bad one (trained on shuffled RTTs): each registered and announced the trainer's way
    good = await asyncio.to_thread(train_challenger, ds, "gpu", params=FAST)
    bad = await asyncio.to_thread(train_challenger, dataclasses.replace(
        ds, y=np.random.default_rng(6).permutation(ds.y)), "gpu", params=FAST)
    v1 = registry.register(KEY, good)
    await announce(s, v1)
    v2 = registry.register(KEY, bad, after=v1["version"])
    await announce(s, v2)
    assert (v1["version"], v2["version"]) == (1, 2)

    # the extender's view feed (its model loader, its snapshot builder) and a running trainer
    builder = SnapshotBuilder()
    installed: dict[int, Predictor] = {}
    load = registry_loader(s)

    async def keep(update: Mapping[str, Any]) -> Predictor:
        installed[int(update["version"])] = predictor = await load(update)
        return predictor

    feed = ViewFeed(s, builder, keep, ExtenderMetrics(), rebuild=lambda _force: None)
    feed.start()
    trainer = TrainerService(s, registry=ModelRegistry(s), train_params=FAST, catch_up_timeout_s=15.0,
                             registry_check_s=0.3)
    try:
        async with trainer:
            await until(lambda: builder.model_version(KEY) == 2, "v2 in the extender's view")
            await until(lambda: trainer.announced.get(KEY, (0, ""))[0] == 2, "v2 known to the trainer")

            rc, out, err = await cli("rollback", KEY, "--yes")
            assert rc == 0, err
            current = store.current(KEY)
            assert current is not None and current.version == 3 and current.restores == 1
            blob, record = store.load(KEY)
            assert sha256_hex(blob) == record.sha256 == v1["sha256"]  # v1's blob, verified, under a new version
            assert f"{KEY}: v2 -> v3 (the model of v1, sha256 {v1['sha256'][:12]})" in out

            announced = await read_announced(s)
            assert (announced[KEY].version, announced[KEY].sha256) == (3, v1["sha256"])  # above v2's announcement

            # the extender goes over to it: v3, whose predictions are v1's
            await until(lambda: builder.model_version(KEY) == 3, "the rolled-back model in the extender's view")
            first = FastPredictor.from_bytes(store.load(KEY, 1)[0], tuple(v1["features"]))
            X = ds.columns(first.feature_names)
            np.testing.assert_array_equal(installed[3].predict(X), first.predict(X))

            # the trainer: the rollback is its newest announcement; its registry check leaves it alone
            await until(lambda: trainer.announced.get(KEY) == (3, v1["sha256"]), "v3 known to the trainer")
            reg = trainer.metrics.registry
            assert reg.get_sample_value("rtt_trainer_model_version", {"model_key": KEY}) == 3.0
            await asyncio.sleep(1.0)  # three registry checks
            assert await trainer.check_registry() == []
            assert store.current(KEY).version == 3 and (await read_announced(s))[KEY].version == 3

            # its next retrain is judged against the rolled-back model (v2 would have lost to it)
            task = trainer.submit({"model_key": KEY, "reason": "manual", "ts": time.time(), "onset_ts": None})
            assert task is not None
            outcome = await task
            assert outcome.outcome == "rejected" and outcome.verdict is not None, outcome
            assert outcome.verdict.reason == "not_better"
            assert outcome.verdict.champion_rmse_ms is not None
            assert outcome.verdict.champion_rmse_ms < 0.5 * bad.metrics["rmse_ms"]

            # a second rollback goes further back, not back to the bad v2: there is nothing before v1
            rc, _, err = await cli("rollback", KEY, "--yes")
            assert rc == 2 and err.strip().count("\n") == 0, err
            assert "has no version older than 1" in err and "Traceback" not in err
    finally:
        await feed.stop()
        store.close()  # type: ignore[attr-defined]


async def test_a_rollback_overtaken_by_a_retrain_changes_nothing_and_exits_2(
        kafka_settings: Settings, redis_url: str, cli: Callable[..., Any], monkeypatch: pytest.MonkeyPatch) -> None:
    """The trainer promotes a retrain after the rollback was planned (and shown), before it saves the version
    gone back to: the rollback refuses in one line, saves and announces nothing; the retrain stays current."""
    s = dataclasses.replace(kafka_settings, redis_url=redis_url)
    registry = ModelRegistry(s)
    for after, seed in ((0, 10), (1, 11)):
        challenger = await asyncio.to_thread(train_challenger, dataset(samples(300, np.random.default_rng(seed))),
                                             "gpu", params=FAST, selector=None)
        await announce(s, registry.register(KEY, challenger, after=after))
    retrained = await asyncio.to_thread(train_challenger, dataset(samples(300, np.random.default_rng(12))), "gpu",
                                        params=FAST, selector=None)
    promoted: dict[str, Any] = {}
    load = RedisModelStore.load

    def the_retrain_lands_first(self: RedisModelStore, model_key: str, version: int | None = None) -> Any:
        """The rollback's read of the version it goes back to (after its plan and its checks): the trainer's
        promotion gets there first."""
        if not promoted:
            promoted["at"] = version
            promoted.update(registry.register(KEY, retrained, after=2))
        return load(self, model_key, version)

    monkeypatch.setattr(RedisModelStore, "load", the_retrain_lands_first)
    rc, out, err = await cli("rollback", KEY, "--yes")

    assert (promoted["at"], promoted["version"]) == (1, 3)
    assert f"{KEY}: current v2" in out and "back to v1" in out  # the plan it showed
    assert rc == 2, (out, err)
    assert err == (f"rttsched models: error: the current version of {KEY} changed to v3 while rolling back: nothing "
                   "changed; run it again\n")
    current = registry.store.current(KEY)
    assert current is not None and (current.version, current.sha256) == (3, promoted["sha256"])
    assert current.restores is None  # the retrain, not a rollback
    assert [r.version for r in registry.store.versions(KEY)] == [1, 2, 3]  # the rollback saved nothing
    assert (await read_announced(s))[KEY].version == 2  # and announced nothing


async def test_list_and_show_flag_a_current_version_that_was_never_announced(
        kafka_settings: Settings, redis_url: str, cli: Callable[..., Any]) -> None:
    s = dataclasses.replace(kafka_settings, redis_url=redis_url)
    rows = samples(300, np.random.default_rng(7))
    challenger = await asyncio.to_thread(train_challenger, dataset(rows), "gpu", params=FAST, selector=None)
    registry = ModelRegistry(s)
    v1 = registry.register(KEY, challenger)
    await announce(s, v1)
    v2 = registry.register(KEY, challenger, after=1)  # promoted, never announced
    other = registry.register("upload:cpu", challenger)
    await announce(s, other)

    rc, out, err = await cli("list")
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].split() == ["KEY", "CURRENT", "SHA256", "SAVED", "(UTC)", "ROWS", "RMSE", "MS", "MAPE", "KEPT",
                                "ANNOUNCED"]
    (gctf,) = [line for line in lines if line.startswith(KEY)]
    assert gctf.split()[:3] == [KEY, "v2", v2["sha256"][:12]] and "v1" in gctf.split()
    assert gctf.endswith("v1 !") and "not the newest announced" in lines[-1]  # flagged, and said why
    (upload,) = [line for line in lines if line.startswith("upload:cpu")]
    assert upload.split()[1] == "v1" and upload.endswith("v1") and str(300) in upload.split()
    assert max(len(line) for line in lines[:-1]) <= 100

    rc, out, _ = await cli("list", "--app", "upload")
    assert rc == 0 and KEY not in out and "upload:cpu" in out

    rc, out, _ = await cli("list", "--json")
    listed = {m["model_key"]: m for m in orjson.loads(out)}
    assert listed[KEY]["agrees"] is False and listed["upload:cpu"]["agrees"] is True
    assert listed[KEY]["announced"]["version"] == 1 and listed[KEY]["kept"] == [1, 2]

    rc, out, err = await cli("show", KEY)
    assert rc == 0, err
    lines = out.splitlines()
    assert lines[0].startswith(f"{KEY}: current v2, announced v1 (sha256 {v1['sha256'][:12]}")
    by_version = {line.split()[0]: line.split() for line in lines[2:]}
    assert by_version["v1"][1:3] == ["announced", v1["sha256"][:12]]
    assert by_version["v2"][1:3] == ["current", v2["sha256"][:12]]

    rc, out, _ = await cli("show", KEY, "--json")
    shown = orjson.loads(out)
    assert shown["current"] == 2 and [v["version"] for v in shown["versions"]] == [1, 2]


async def test_bad_input_and_an_unreachable_redis_or_broker_are_one_line_and_exit_2(
        kafka_settings: Settings, redis_url: str, cli: Callable[..., Any]) -> None:
    s = dataclasses.replace(kafka_settings, redis_url=redis_url)
    registry = ModelRegistry(s)
    for after, seed in ((0, 8), (1, 9)):
        challenger = await asyncio.to_thread(train_challenger, dataset(samples(300, np.random.default_rng(seed))),
                                             "gpu", params=FAST, selector=None)
        await announce(s, registry.register(KEY, challenger, after=after))

    cases = {
        ("rollback", "upload:cpu", "--yes"): f"no model 'upload:cpu' in the registry (keys: {KEY})",
        ("rollback", KEY, "--to", "9", "--yes"): f"model '{KEY}' has no version 9 (kept: v1, v2)",
        ("rollback", KEY, "--to", "2", "--yes"): f"model '{KEY}': v2 is the current version already",
        ("rollback", KEY, "--to", "0", "--yes"): "--to: must be a version >= 1 (got 0)",
        ("rollback", "../etc", "--yes"): "KEY: model key '../etc' must match",
        ("rollback", KEY): "stdin is not a terminal to ask on: add --yes",
        ("show", "nope:cpu"): "no model 'nope:cpu' in the registry or on model-updates",
    }
    for argv, said in cases.items():
        rc, out, err = await cli(*argv)
        assert rc == 2, (argv, out, err)
        assert err.count("\n") == 1 and said in err and "Traceback" not in err, (argv, err)
    assert registry.store.current(KEY).version == 2  # nothing rolled back

    kafka = free_port()  # the broker away: refused before anything is changed
    rc, out, err = await cli("rollback", KEY, "--to", "1", "--yes", RTT_KAFKA_BOOTSTRAP=f"127.0.0.1:{kafka}")
    assert rc == 2 and err.count("\n") == 1 and "Traceback" not in err, err
    assert f"cannot reach Kafka at 127.0.0.1:{kafka} (RTT_KAFKA_BOOTSTRAP)" in err
    assert registry.store.current(KEY).version == 2 and len(registry.store.versions(KEY)) == 2

    port = free_port()
    for argv in (("list",), ("show", KEY), ("rollback", KEY, "--yes")):
        rc, out, err = await cli(*argv, REDIS_URL=f"redis://127.0.0.1:{port}/0")
        assert rc == 2, (argv, out, err)
        assert err.count("\n") == 1 and "Traceback" not in err, (argv, err)
        assert f"model registry at redis://127.0.0.1:{port}/0 unavailable" in err and "(REDIS_URL)" in err, err
