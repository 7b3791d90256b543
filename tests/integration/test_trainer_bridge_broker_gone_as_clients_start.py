"""``rttsched trainer`` and ``rttsched bridge`` whose broker answers their start wait and is gone as their own
clients start, on the real embedded broker.

The trainer's service starts its producer, then its consumers; the bridge, its producer. The child holds before the
trainer's first consumer's start (its producer already started) or the bridge's producer's start: it writes ``held``
and holds until the test writes ``gone``; the test stops the broker there. The start fails: the service ends with
one line, ``… cannot reach Kafka at … (RTT_KAFKA_BOOTSTRAP) …``, exit code 2 (its supervisor starts it again, and it
waits), with every client it made stopped: no ``Unclosed`` client, no traceback.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from broker_children import HOLD_UNTIL_GONE, REPO, START_S, child_env, topics_on

from app.kafka.embedded import EmbeddedBroker

pytestmark = pytest.mark.integration


# ``rttsched <argv>`` whose first start of ``module.CLASS`` writes ``held`` and holds until ``gone`` exists
CHILD = """
import asyncio, importlib, os, sys
from pathlib import Path

module = importlib.import_module(os.environ["HELD_MODULE"])
marks, name = Path(os.environ["MARKS"]), os.environ["HELD_CLASS"]

""" + HOLD_UNTIL_GONE + """
class Held(getattr(module, name)):
    async def start(self):
        await hold_until_gone()
        await super().start()

setattr(module, name, Held)
from app.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.fixture
def broker() -> Iterator[EmbeddedBroker]:
    with EmbeddedBroker() as b:  # stopped whatever the test did
        yield b


@pytest.mark.parametrize(("argv", "module", "cls", "when"), [
    (["trainer"], "app.trainer.service", "AIOKafkaConsumer", " as the trainer started: "),
    (["bridge", "--target", "node=w1,url=http://127.0.0.1:9/m"], "app.bridge.producer", "AIOKafkaProducer", ": "),
], ids=["trainer-consumer", "bridge-producer"])
def test_a_broker_gone_as_a_services_clients_start_ends_it_with_one_line_and_its_clients_stopped(
        broker: EmbeddedBroker, tmp_path: Path, argv: list[str], module: str, cls: str, when: str) -> None:
    env = child_env(topics_on(broker), tmp_path, RTT_TRAINER_CPUS="", PYTHONUNBUFFERED="1", HELD_MODULE=module,
                    HELD_CLASS=cls)
    proc = subprocess.Popen([sys.executable, "-c", CHILD, *argv], env=env, cwd=REPO, text=True, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, start_new_session=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)
    reader.start()
    try:
        deadline = time.monotonic() + START_S
        while not (tmp_path / "held").exists():
            assert proc.poll() is None, f"ended (exit {proc.returncode}) before the hold:\n{''.join(lines)}"
            assert time.monotonic() < deadline, f"no hold within {START_S:g} s:\n{''.join(lines)}"
            time.sleep(0.05)
        broker.stop()
        (tmp_path / "gone").write_text("")
        code = proc.wait(60)
        reader.join(5)
        text = "".join(lines)
        print(text)
        assert code == 2, text
        said = [line for line in lines if "cannot reach Kafka at" in line]
        assert len(said) == 1, text
        assert f"cannot reach Kafka at {broker.bootstrap} (RTT_KAFKA_BOOTSTRAP){when}" in said[0], text
        assert "Traceback" not in text and "Unclosed" not in text, text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait(30)
