"""``rttsched bridge`` stopped while it starts, before its event loop runs: a SIGTERM is a clean stop (one line, exit
0, nothing sent), a SIGINT an interruption (130), as they are once it runs (README, *exit statuses*). The bridge is
held where the start reads its targets file, a FIFO the test writes once the signal has come, so the signal lands
exactly there; no broker is asked (none listens at the address given). Before, a SIGTERM in that part of the start
(the first second or so of a bridge: its imports, its targets, its metrics server) killed it: 143."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from app.kafka.embedded import free_port

REPO = Path(__file__).resolve().parents[3]
TARGETS = "node: worker-1\ntargets: [http://127.0.0.1:9/metrics]\n"


def bridge_held_at_its_targets(tmp_path: Path) -> tuple[subprocess.Popen[str], int]:
    """A bridge started on a FIFO as its targets file, and the FIFO's writing end once the bridge opened it to read:
    the bridge waits there, in its start, until the test writes its targets."""
    fifo = tmp_path / "targets.yaml"
    os.mkfifo(fifo)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(RTT_KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}", RTT_METRICS_PORT=str(free_port()),
               RTT_METRICS_HOST="127.0.0.1")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "bridge", "--targets", str(fifo)], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    return proc, os.open(fifo, os.O_WRONLY)  # returns once the bridge has it open for reading


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_the_bridge_starts_ends_it_as_once_it_runs(tmp_path: Path, signum: int, status: int) -> None:
    proc, fd = bridge_held_at_its_targets(tmp_path)
    try:
        proc.send_signal(signum)
        time.sleep(0.3)  # delivered while the bridge reads its targets
        with contextlib.suppress(BrokenPipeError):  # a bridge the signal ended reads no more
            os.write(fd, TARGETS.encode())
        os.close(fd)
        fd = -1
        out, err = proc.communicate(timeout=30)
    finally:
        if fd >= 0:
            os.close(fd)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == status, f"exit {proc.returncode}\n{out}\n{err}"
    assert "Traceback" not in out + err, err
    if signum == signal.SIGTERM:
        assert out.splitlines() == ["bridge: stopped (SIGTERM), 0 rounds, 0 messages, 0 failed scrapes, "
                                    "0 rounds not taken by Kafka"], out
        assert "cannot reach Kafka" not in err, err  # stopped before asking the broker
    else:
        assert err.splitlines()[-1] == "rttsched bridge: interrupted", err
