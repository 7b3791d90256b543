from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import pytest
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType

from app.config import Settings
from app.contracts import load_contracts
from app.kafka.admin import ensure_topics, started_admin
from app.kafka.embedded import BrokerError, EmbeddedBroker

pytestmark = pytest.mark.integration


def test_embedded_broker_starts_answers_and_stops_without_orphans():
    broker = EmbeddedBroker().start()
    pid = broker.pid
    try:
        assert pid is not None
        os.kill(pid, 0)  # alive
        broker.stop()
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)
    finally:  # a failed check leaves no broker, nor anything of its process group, behind
        broker.stop()
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGKILL)


def test_broker_refuses_a_busy_port(kafka_bootstrap):
    host, port = kafka_bootstrap.rsplit(":", 1)
    with pytest.raises(BrokerError, match="already in use"):
        EmbeddedBroker(int(port), host).start()


async def _broker_cleanup_policies(settings, topics: list[str]) -> dict[str, str]:
    """``cleanup.policy`` of each topic as the broker describes it."""
    admin = await started_admin(settings)
    try:
        responses = await admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, t) for t in topics])
    finally:
        await admin.close()
    out = {}
    for response in responses:
        for error_code, _message, _type, name, entries in (tuple(r)[:5] for r in response.resources):
            assert error_code == 0, name
            out[name] = {tuple(e)[0]: tuple(e)[1] for e in entries}["cleanup.policy"]
    return out


def test_topic_creation_is_idempotent_and_follows_the_contracts(kafka_bootstrap, settings_factory):
    s = settings_factory(kafka_bootstrap=kafka_bootstrap)  # a fresh prefix: nothing exists yet
    contracts = load_contracts()
    expected = {s.topic(name) for name in contracts}
    first = asyncio.run(ensure_topics(s))
    assert {r.topic for r in first} == expected
    assert all(r.created for r in first)
    again = asyncio.run(ensure_topics(s))
    assert {r.topic for r in again} == expected
    assert not any(r.created for r in again)
    on_broker = asyncio.run(_broker_cleanup_policies(s, sorted(expected)))
    assert set(on_broker) == expected
    for r in again:
        c = contracts[r.topic.removeprefix(s.topic_prefix)]
        assert r.partitions == c.partitions
        assert on_broker[r.topic] == c.cleanup_policy  # what the broker keeps, not what was asked
    assert {on_broker[s.topic(n)] for n in ("node-features", "node-weights", "model-updates")} == {"compact"}


async def _replicas(settings, topics: list[str]) -> dict[str, set[int]]:
    """The number of replicas of each topic's partitions as the broker describes them."""
    admin = await started_admin(settings)
    try:
        described = await admin.describe_topics(topics)
    finally:
        await admin.close()
    return {d["topic"]: {len(p["replicas"]) for p in d["partitions"]} for d in described}


@pytest.mark.parametrize(("setting", "replicas"), [(0, 1), (3, 3)])
def test_topics_get_the_configured_replication_factor(kafka_bootstrap, settings_factory, setting, replicas):
    from app.kafka.admin import InternalTopic

    s = settings_factory(kafka_bootstrap=kafka_bootstrap, topic_replication_factor=setting)
    changelog = InternalTopic(s.topic("rttsched-worker-buckets-changelog"), 8, compacted=True)
    asyncio.run(ensure_topics(s, [changelog]))
    names = sorted({s.topic(n) for n in load_contracts()} | {changelog.name})
    assert asyncio.run(_replicas(s, names)) == {n: {replicas} for n in names}  # the contracts' 1 unless set


def create_topic(s: Settings, name: str, partitions: int, configs: dict[str, str] | None = None) -> None:
    """Create ``name`` as a client or an operator would, otherwise than its contract says."""
    from aiokafka.admin import NewTopic

    async def create() -> None:
        admin = await started_admin(s)
        try:
            await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=configs or {})])
        finally:
            await admin.close()

    asyncio.run(create())


def test_a_topic_auto_created_with_another_count_is_an_error_or_recreated(kafka_bootstrap, settings_factory, caplog):
    """A client that reached a fresh in-memory broker first had node-metrics auto-created with the broker's
    default count: `rttsched broker` recreates it with the contract's; anywhere else it is an error."""
    import logging

    from app.kafka.admin import TopicError

    s = settings_factory(kafka_bootstrap=kafka_bootstrap)
    name = s.topic("node-metrics")

    create_topic(s, name, 4)  # as Tansu auto-creates it
    with pytest.raises(TopicError, match=f"topic {name} has 4 partitions, 8 expected"):
        asyncio.run(ensure_topics(s))
    with caplog.at_level(logging.WARNING, logger="app.kafka.admin"):
        results = {r.topic: r for r in asyncio.run(ensure_topics(s, recreate=True))}
    assert results[name].partitions == load_contracts()["node-metrics"].partitions == 8
    assert any("deleting and creating them again" in r.getMessage() for r in caplog.records)


def test_topics_create_names_a_wrong_topic_and_recreate_mends_it(kafka_bootstrap, settings_factory, monkeypatch,
                                                                  capsys):
    """What runbook §7 tells the on-call to run after Tansu auto-created a topic with its default count."""
    from app.cli.main import main

    s = settings_factory(kafka_bootstrap=kafka_bootstrap)
    name = s.topic("node-metrics")

    create_topic(s, name, 4)  # as Tansu auto-creates it
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", kafka_bootstrap)
    monkeypatch.setenv("RTT_TOPIC_PREFIX", s.topic_prefix)
    assert main(["topics", "create"]) == 2
    out, err = capsys.readouterr()
    assert f"topic {name} has 4 partitions, 8 expected" in err and "rttsched topics create --recreate --yes" in err
    status = _statuses(out)  # what it did before it refused: the other topics created, this one left as it was
    assert status.pop(name) == ("4", "differs") and status and {s for _, s in status.values()} == {"created"}, out
    assert main(["topics", "create", "--recreate"]) == 2  # it drops messages: only with --yes
    assert "--recreate: drops every message" in capsys.readouterr().err
    assert main(["topics", "create", "--recreate", "--yes"]) == 0
    status = _statuses(capsys.readouterr().out)
    assert status.pop(name) == ("8", "recreated") and {s for _, s in status.values()} == {"exists"}, status
    assert main(["topics", "create"]) == 0  # as the contract has it now: nothing to mend
    assert {s for _, s in _statuses(capsys.readouterr().out).values()} == {"exists"}


def _statuses(out: str) -> dict[str, tuple[str, str]]:
    """``rttsched topics create``'s table: topic -> (partitions, status)."""
    lines = out.splitlines()
    assert lines[0].split() == ["topic", "parts", "cleanup", "status"], out
    return {topic: (parts, status) for topic, parts, _, status in (line.split() for line in lines[1:])}


def test_a_compacted_topic_that_exists_on_delete_is_an_error_or_recreated(kafka_bootstrap, settings_factory):
    """model-updates created beforehand (by hand, or auto-created) with the broker's default policy, ``delete``:
    its models would go at its retention. It used to pass: only the partition count was checked, and the
    contract's policy was printed as the topic's."""
    from app.kafka.admin import TopicError

    s = settings_factory(kafka_bootstrap=kafka_bootstrap)
    name = s.topic("model-updates")
    partitions = load_contracts()["model-updates"].partitions

    create_topic(s, name, partitions, {"cleanup.policy": "delete"})  # by hand, the broker's default policy
    with pytest.raises(TopicError, match=f"topic {name} has cleanup.policy delete, compact expected"):
        asyncio.run(ensure_topics(s))
    results = {r.topic: r for r in asyncio.run(ensure_topics(s, recreate=True))}
    assert results[name].cleanup_policy == "compact"
    assert asyncio.run(_broker_cleanup_policies(s, [name])) == {name: "compact"}


@pytest.mark.parametrize("argv", [["worker"], ["trainer"], ["publish", "task-completions", "-"],
                                  ["bridge", "--target", "node=w1,url=http://127.0.0.1:9/metrics"]])
def test_a_process_started_before_its_topics_exist_says_so_and_creates_none(kafka_bootstrap, settings_factory,
                                                                            argv, tmp_path):
    """Started before `rttsched topics create` (or with a mistyped prefix), the worker, trainer, bridge and publish had
    the broker auto-create their topics with its default partition count, which `topics create` then refused."""
    import subprocess
    import sys

    s = settings_factory(kafka_bootstrap=kafka_bootstrap)  # a fresh prefix: nothing exists
    env = {**os.environ, "RTT_KAFKA_BOOTSTRAP": kafka_bootstrap, "RTT_TOPIC_PREFIX": s.topic_prefix,
           "RTT_MODELS_DIR": str(tmp_path / "models"), "RTT_WORKER_DATADIR": str(tmp_path / "faust"),
           "RTT_KAFKA_START_WAIT_S": "2"}  # the services wait for their topics: this long only (publish does not)
    env.pop("REDIS_URL", None)
    proc = subprocess.run([sys.executable, "-m", "app.cli.main", *argv], env=env, input=b"", capture_output=True,
                          timeout=60)
    err = proc.stderr.decode()
    assert proc.returncode == 2, err[-2000:]
    assert f"no topic {s.topic_prefix}" in err and "create them with `rttsched topics create`" in err, err
    assert "Traceback" not in err

    async def listed() -> list[str]:
        admin = await started_admin(s)
        try:
            return [t for t in await admin.list_topics() if t.startswith(s.topic_prefix)]
        finally:
            await admin.close()

    assert asyncio.run(listed()) == []
