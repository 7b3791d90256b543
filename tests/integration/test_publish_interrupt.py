"""``rttsched publish`` of a large file stopped by a signal (Ctrl-C, SIGTERM) while it sends to a healthy broker,
against the real embedded broker: every line before the one it says to resume from is on the topic (no gap), the
count it says not sent is every message read from that line on, exit status 130, no traceback. Before, SIGINT or
SIGTERM a few seconds in left thousands of lines from the middle of the file off the topic, and no "not sent"
line said so."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_publish_broker_restart import completion, topic_values

from app.config import Settings

pytestmark = pytest.mark.integration

LINES = 200_000  # far more than are sent before the signal: it lands while publish is busy


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_publish_stopped_by_a_signal_on_a_healthy_broker_leaves_no_gap_and_counts_what_it_did_not_send(
        kafka_settings: Settings, tmp_path: Path, signum: int) -> None:
    path = tmp_path / "completions.jsonl"
    with path.open("w") as f:
        for n in range(1, LINES + 1):
            f.write(json.dumps(completion(n)) + "\n")  # line n: away-n
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}  # nodes not checked
    env.update(RTT_KAFKA_BOOTSTRAP=kafka_settings.kafka_bootstrap, RTT_TOPIC_PREFIX=kafka_settings.topic_prefix)
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "publish", "task-completions", str(path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    try:
        assert proc.stderr is not None
        said = b""
        while b"messages so far" not in said and proc.poll() is None:  # busy publishing now
            said += proc.stderr.readline()
        assert b"messages so far" in said, said
        proc.send_signal(signum)
        signalled = time.monotonic()
        rc = proc.wait(timeout=30)
        stopped_s = time.monotonic() - signalled
        err = said.decode() + proc.stderr.read().decode()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert "Traceback" not in err, err
    assert rc == 130, (rc, err)  # it was still publishing: 200,000 lines take far longer than the first 50,000
    assert "rttsched publish: interrupted" in err, err
    assert stopped_s < 10.0, f"{stopped_s:.1f} s after the signal"

    values = asyncio.run(topic_values(kafka_settings, "task-completions", timeout_s=60.0))
    lines = {int(v["task_id"].split("-")[1]) for v in values}  # at least once: some may be there twice
    not_sent = re.search(rf"publish: (\d+) message\(s\) not sent \(from {re.escape(str(path))}:(\d+) on\)", err)
    if not_sent is None:  # every line read was sent: no line after the first one missing
        first, n = max(lines) + 1, 0
    else:
        n, first = int(not_sent[1]), int(not_sent[2])
    gaps = sorted(set(range(1, first)) - lines)
    assert not gaps, f"{len(gaps)} line(s) before {first} not on the topic ({gaps[:3]} ... {gaps[-3:]}): {err}"
    assert not {line for line in lines if line >= first + n}, (
        f"lines from {first + n} on are on the topic: more than the {n} said not sent were read: {err}")
    assert 50_000 <= first + n <= LINES, (first, n)
