"""``rttsched demo`` end to end: a short live run on the embedded broker writes the report and stops
everything it started; SIGINT in the middle of a run, or the terminal closing (SIGHUP), stops every child too.

Both run the real command as a subprocess (embedded broker, worker, trainer, extender as its children);
the demo writes the pids it started to ``<out>/logs/pids.json``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from child_processes import alive, default_signals, demo_env, left_running, lines_until, on_terminal

from app.config import Settings

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
POLICIES = ("rtt_aware_live", "kube_default", "round_robin", "random", "load_aware", "target_load", "static_best",
            "rtt_aware", "clairvoyant")


def _pids(out: Path) -> dict[str, int]:
    path = out / "logs" / "pids.json"
    return json.loads(path.read_text()) if path.exists() else {}


def _default_sigint() -> None:
    """In the child before exec: Ctrl-C as a terminal delivers it. A test run started as a background job
    (``pytest &``, a CI runner) has SIGINT ignored, and an ignored signal stays ignored across exec."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _demo(out: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "app.cli.main", "demo", "--out", str(out), *args],
        cwd=ROOT, env=demo_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        preexec_fn=_default_sigint,  # noqa: PLW1509 - only resets a signal disposition
    )


def _stop_everything(out: Path, proc: subprocess.Popen[str] | None = None) -> None:
    """Kill the demo (``proc``, while it runs) and every child of ``<out>/logs/pids.json`` still alive.

    Called in a ``finally`` around the whole test, after its own checks: a failed or timed-out run leaves no
    broker, worker, trainer or extender behind, and a check that the demo stopped its children finds them as
    the demo left them, not as this cleanup did.
    """
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()
    try:
        pids = _pids(out)
    except ValueError:  # cut short while the demo wrote it
        pids = {}
    for pid in pids.values():
        if alive(pid):
            with contextlib.suppress(ProcessLookupError):  # ended meanwhile
                os.killpg(pid, signal.SIGKILL)


def test_short_live_demo_writes_report_and_stops_everything(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = _demo(out, "--minutes", "0.3", "--tasks", "150", "--seed", "3")
    try:
        stdout, stderr = proc.communicate(timeout=150)
        assert proc.returncode == 0, stderr[-3000:]
        assert "Traceback" not in stderr
        too_wide = [ln for ln in re.split(r"[\r\n]", stdout + stderr) if len(ln) > 100]
        assert too_wide == []  # progress bars included: nothing wraps in a 100-column terminal
        assert "±" not in stdout  # one seed: no interval

        pids = _pids(out)
        assert set(pids) == {"broker", "worker", "trainer", "extender"}
        assert left_running(pids) == []

        html = (out / "report.html").read_text()
        assert "Placements explained" in html  # the extender explained a few placements before it stopped
        for policy in POLICIES:
            assert policy in html, policy
            assert any(line.startswith(policy + " ") for line in stdout.splitlines()), policy

        doc = json.loads((out / "policies.json").read_text())
        live = doc["config"]["live"]
        assert live["extender"]["requests"] == 150  # every task was placed by asking the real extender
        assert live["extender"]["errors"] == 0
        assert live["sink"]["rejected"] == 0 and live["sink"]["failed"] == 0
        assert live["sink"]["sent"] >= 150  # every completion plus the scrapes reached Kafka
        runs = doc["runs"]
        assert runs["rtt_aware_live"][0]["tasks"] + runs["rtt_aware_live"][0]["failed"] == 150
        assert runs["kube_default"][0]["tasks"] == runs["rtt_aware_live"][0]["tasks"]  # same workload offline
    finally:
        _stop_everything(out, proc)


def test_sigint_stops_every_child(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    proc = _demo(out, "--minutes", "2", "--no-html")
    try:
        assert proc.stderr is not None
        said = lines_until(proc.stderr,
                           lambda line: line.startswith("demo: ready after") or (not line and proc.poll() is not None),
                           90)
        ready = said[-1].startswith("demo: ready after")
        assert ready, f"the demo never became ready (exit code {proc.poll()}): {''.join(said[-5:])}"
        pids = _pids(out)
        assert set(pids) == {"broker", "worker", "trainer", "extender"}
        assert all(alive(p) for p in pids.values())
        time.sleep(2.0)  # let the live run start placing tasks
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
        assert proc.returncode == 130, stderr[-3000:]
        assert "rttsched demo: interrupted" in stderr
        assert "Traceback" not in stderr
        assert left_running(pids) == []
        assert not (out / "policies.json").exists()  # interrupted before the report
    finally:
        _stop_everything(out, proc)


def test_a_closed_terminal_stops_every_child(tmp_path: Path) -> None:
    """The demo on a terminal that closes once it is ready: the kernel sends it SIGHUP, which killed it before its
    clean-up, leaving worker, trainer and extender (sessions of their own) running under PID 1."""
    out = tmp_path / "demo"
    try:
        # SIGINT and SIGHUP as a terminal delivers them (a test run under nohup has SIGHUP ignored)
        with on_terminal([sys.executable, "-m", "app.cli.main", "demo", "--out", str(out), "--minutes", "2",
                          "--no-html"], cwd=ROOT, env=demo_env(), before=default_signals) as demo:
            said = demo.read_until(b"demo: ready after", 90)
            assert b"demo: ready after" in said, said[-1000:]
            pids = _pids(out)
            assert set(pids) == {"broker", "worker", "trainer", "extender"}
            assert all(alive(p) for p in pids.values())
            demo.close()  # the terminal closes
            status = demo.wait(60, every_s=0.1)
            assert status == 129, f"the demo ended with {status} (-1: killed by the SIGHUP, with no clean-up)"
            assert left_running(pids, 2.0) == []  # its clean-up stopped them all before it ended
    finally:
        _stop_everything(out)


def test_kafka_sink_produces_keyed_messages_and_rejects_bad_ones(kafka_settings: Settings) -> None:
    import asyncio

    from aiokafka import AIOKafkaConsumer, TopicPartition

    from app.contracts import contract, decode
    from app.sim.kafka_sink import KafkaSink

    sink = KafkaSink(kafka_settings).start()
    for i in range(5):
        sink.emit("node-metrics", f"worker-{i % 2}", {"node": f"worker-{i % 2}", "ts": 1_700_000_000.0 + i,
                                                      "node_class": "gpu", "gpu_model": "Tesla M40",
                                                      "metrics": {"nvidia_smi_utilization_gpu": 0.5}})
    sink.emit("node-metrics", "worker-0", {"node": "worker-0"})  # breaks the contract: never sent
    sink.close()
    assert sink.stats() == {"emitted": 5, "sent": 5, "failed": 0, "rejected": 1, "dropped": 0}

    async def read() -> list[tuple[bytes, dict[str, Any]]]:
        topic = kafka_settings.topic("node-metrics")
        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_settings.bootstrap_servers, group_id=None,
                                    auto_offset_reset="earliest")
        await consumer.start()
        try:
            tps = [TopicPartition(topic, p) for p in range(contract("node-metrics").partitions)]
            consumer.assign(tps)
            await consumer.seek_to_beginning(*tps)
            got: list[tuple[bytes, dict[str, Any]]] = []
            for _ in range(50):
                for msgs in (await consumer.getmany(timeout_ms=200)).values():
                    got += [(m.key, decode("node-metrics", m.value, strict=True)) for m in msgs]
                if len(got) >= 5:
                    break
            return got
        finally:
            await consumer.stop()

    got = asyncio.run(read())
    assert len(got) == 5
    assert all(key.decode() == value["node"] for key, value in got)  # keyed by node, as the contract says


def test_unreachable_extender_places_exactly_like_kube_default() -> None:
    import numpy as np

    from app.kafka.embedded import free_port
    from app.sim.policies.extender_http import ExtenderPolicy
    from app.sim.runner import SimConfig, build_simulation, run_offline

    port = free_port()  # nothing listens there
    config = SimConfig(n_tasks=60, events="none", join_node=False)

    def factory(rng: np.random.Generator) -> ExtenderPolicy:
        return ExtenderPolicy(f"http://127.0.0.1:{port}", rng, timeout_s=0.2)

    sim = build_simulation(config, factory, seed=2)
    sim.run()
    live = sim.metrics()
    stats = live.trace.notes["extender"]
    assert stats["requests"] == 60 and stats["errors"] == 60
    # the fallback is kube-default scoring with the policy's own generator: identical placements
    assert live.fingerprint() == run_offline(config, "kube_default", seed=2).fingerprint()


def test_a_failing_child_is_one_line_and_everything_stops(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    env = {**demo_env(), "RTT_TRAINER_CPUS": "4095"}  # the trainer cannot pin itself there and exits
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "app.cli.main", "demo", "--out", str(out), "--minutes", "0.5"],
            cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 2, proc.stderr[-3000:]
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("rttsched demo: error:")]
        assert len(errors) == 1 and "trainer exited" in errors[0]
        assert "Traceback" not in proc.stderr
        pids = _pids(out)
        assert {"broker", "worker", "trainer", "extender"} <= set(pids)
        assert left_running(pids) == []
    finally:
        _stop_everything(out)


def test_an_unusable_redis_is_one_line_before_anything_but_the_broker_starts(tmp_path: Path) -> None:
    """REDIS_URL pointing at nothing: the demo used to run to its end, every model load failing in the logs only,
    and exit 0 with NaN accuracies."""
    from app.kafka.embedded import free_port

    out = tmp_path / "demo"
    url = f"redis://127.0.0.1:{free_port()}/0"
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "app.cli.main", "demo", "--out", str(out), "--minutes", "0.2"],
            cwd=ROOT, env={**demo_env(), "REDIS_URL": url}, capture_output=True, text=True, timeout=120,
        )
        assert proc.returncode == 2, proc.stderr[-3000:]
        errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("rttsched demo: error:")]
        assert len(errors) == 1 and errors[0].startswith(f"rttsched demo: error: REDIS_URL: cannot use Redis at {url}")
        assert "Traceback" not in proc.stderr
        pids = _pids(out)
        assert set(pids) == {"broker"} and left_running(pids) == []
    finally:
        _stop_everything(out)


def test_what_the_demo_made_on_a_broker_and_redis_it_did_not_start_is_removed(
        kafka_settings: Settings, redis_url: str) -> None:
    """Its topics and Redis keys stayed behind on every run against a real broker (13 topics, ~90 partitions)."""
    import asyncio
    import dataclasses
    import uuid

    import redis

    from app.cli.demo import remove_leftovers
    from app.kafka.admin import InternalTopic, ensure_topics, started_admin

    mine = dataclasses.replace(kafka_settings, topic_prefix=f"demo-{uuid.uuid4().hex[:8]}-", redis_url=redis_url)
    other = dataclasses.replace(kafka_settings, redis_url=redis_url)  # another deployment on the same broker
    asyncio.run(ensure_topics(mine, [InternalTopic(mine.topic("rttsched-worker-partitions"), 8)]))
    client = redis.Redis.from_url(redis_url)
    client.set(f"rttsched:{mine.topic_prefix}models:gCTF:gpu", b"1")
    client.set(f"rttsched:{mine.topic_prefix}:dead-letters:x", b"1")
    client.set(f"rttsched:{other.topic_prefix}models:gCTF:gpu", b"1")

    said = asyncio.run(remove_leftovers(mine))
    assert said.startswith("removed its 11 topics") and "removed its 2 Redis keys" in said, said

    async def topics() -> set[str]:
        admin = await started_admin(kafka_settings)
        try:
            return set(await admin.list_topics())
        finally:
            await admin.close()

    left = asyncio.run(topics())
    assert not {t for t in left if t.startswith(mine.topic_prefix)}
    assert other.topic("node-metrics") in left
    assert client.exists(f"rttsched:{other.topic_prefix}models:gCTF:gpu") == 1
    assert client.keys(f"rttsched:{mine.topic_prefix}*") == []
    client.close()
