"""A broker that answers the wait at start (:func:`app.kafka.admin.wait_reachable`) and is gone when the trainer's own
clients start: the trainer closes those clients and exits with one line naming ``RTT_KAFKA_BOOTSTRAP`` and code 2, as
a wait that gives up does. Before, it exited with code 1, ``error: KafkaConnectionError: … (run with -v for
details)``, its client's ERROR line and four ``Unclosed AIOKafka…`` ERROR records (the clients it had made were never
stopped). The wait is made to pass at once here; nothing listens on the bootstrap port."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from app.kafka.embedded import free_port

REPO = Path(__file__).resolve().parents[2]
# the wait passes at once: the broker "answered", then went away before the service's own clients started
PASSED_WAIT = """
import sys
import app.kafka.admin as admin

async def answered(*args, **kwargs):
    return 0.0

admin.wait_reachable = answered
from app.cli.main import main
sys.exit(main(sys.argv[1:]))
"""


@pytest.mark.parametrize("command", ["trainer"])
def test_a_broker_gone_between_the_wait_and_the_start_is_one_line_and_code_2(command: str, tmp_path: Path) -> None:
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RTT_") and k != "REDIS_URL"}
    env.update(RTT_KAFKA_BOOTSTRAP=f"127.0.0.1:{port}", RTT_METRICS_PORT="0", RTT_MODELS_DIR=str(tmp_path / "models"),
               RTT_REGISTRY_CHECK_S="0", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", PASSED_WAIT, command], capture_output=True, text=True, env=env,
                         cwd=tmp_path, timeout=120)
    text = out.stdout + out.stderr
    assert out.returncode == 2, text
    errors = [line for line in out.stderr.splitlines() if " ERROR " in line or ": error: " in line]
    assert errors == [line for line in out.stderr.splitlines() if line.startswith(f"rttsched {command}: error: ")], text
    assert len(errors) == 1 and errors[0].startswith(
        f"rttsched {command}: error: cannot reach Kafka at 127.0.0.1:{port} (RTT_KAFKA_BOOTSTRAP)"), text
    assert "Unclosed" not in text and "Traceback" not in text and "run with -v" not in text, text
