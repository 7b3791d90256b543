"""What the integration tests share that run ``rttsched`` as a child on the real embedded broker: its topics under a
fresh prefix, the child's environment, the child started with its output gathered, the child code that holds a Kafka
client's start until the test has stopped the broker, the wait for what the child says, and its SIGTERM stop that
leaves no trace.

Importable as ``broker_children`` from every test: ``tests/conftest.py`` puts this folder on ``sys.path``.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from child_processes import Gathered

from app.config import Settings
from app.kafka.admin import ensure_topics
from app.kafka.embedded import EmbeddedBroker, free_port

REPO = Path(__file__).resolve().parents[1]
START_S = 90.0  # imports, the wait and Faust's start on a loaded machine

# child code: ``await hold_until_gone()`` writes ``held`` (or ``mark``) unless the test wrote ``gone``, then holds,
# the event loop running on, until ``gone`` exists (``marks``: the folder of the marks)
HOLD_UNTIL_GONE = """
async def hold_until_gone(mark="held"):
    if not (marks / "gone").exists():
        (marks / mark).write_text("")
    while not (marks / "gone").exists():
        await asyncio.sleep(0.02)
"""


def topics_on(broker: EmbeddedBroker) -> Settings:
    """The settings of ``broker`` with a prefix of its own, their topics made."""
    settings = Settings.from_env({}, kafka_bootstrap=broker.bootstrap, topic_prefix=f"t{uuid.uuid4().hex[:10]}-")
    asyncio.run(ensure_topics(settings))
    return settings


def child_env(settings: Settings, tmp_path: Path, **extra: str) -> dict[str, str]:
    """The environment of a child ``rttsched`` on ``settings``' broker and topics: this one's less its ``RTT_`` and
    ``REDIS_URL`` settings, a free metrics port, its models in ``tmp_path``, ``MARKS`` = ``tmp_path``, and ``extra``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTT_") and k != "REDIS_URL"}
    env.update(RTT_KAFKA_BOOTSTRAP=settings.bootstrap_servers, RTT_TOPIC_PREFIX=settings.topic_prefix,
               RTT_METRICS_PORT=str(free_port()), RTT_METRICS_HOST="127.0.0.1", RTT_MODELS_DIR=str(tmp_path / "models"),
               MARKS=str(tmp_path), PYTHONPATH=str(REPO), **extra)
    return env


def popen(code: str, argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen[str]:
    """``python -c code *argv`` in the repository with ``env``, in a session of its own, its stderr sent to its piped
    stdout (for :class:`~child_processes.Gathered`)."""
    return subprocess.Popen([sys.executable, "-c", code, *argv], env=env, cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)


def wait_for(proc: Gathered, what: Callable[[], bool], label: str, timeout_s: float = START_S) -> None:
    """Wait until ``what()``; the test fails, with the child's last output, where the child ended before or
    ``timeout_s`` passed."""
    deadline = time.monotonic() + timeout_s
    while not what():
        if proc.proc.poll() is not None:
            proc.read_to_end()
            if what():
                return
            pytest.fail(f"ended (exit {proc.proc.returncode}) before {label}:\n{proc.text[-8000:]}")
        assert time.monotonic() < deadline, f"no {label} within {timeout_s:g} s:\n{proc.text[-8000:]}"
        time.sleep(0.05)


def stops_cleanly(proc: Gathered) -> None:
    """SIGTERM the child (its session): it ends with exit code 0, no traceback, no crash, no client left unclosed. Its
    WARNING and ERROR lines are printed."""
    os.killpg(proc.proc.pid, signal.SIGTERM)
    code = proc.proc.wait(60)
    proc.read_to_end()
    text = proc.text
    print("".join(line + "\n" for line in text.splitlines() if " WARNING " in line or " ERROR " in line))
    assert "Traceback" not in text and "Crashed reason=" not in text and "Unclosed" not in text, text[-8000:]
    assert code == 0, text[-8000:]
