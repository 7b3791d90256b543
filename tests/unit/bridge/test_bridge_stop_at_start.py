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
    the bridge waits there, in its start, until the test writes its targets. A bridge that ends before it opens the
    FIFO fails the test with its output (it does not leave the test waiting for a reader that never comes)."""
    fifo = tmp_path / "targets.yaml"
    os.mkfifo(fifo)
    env = {k: v for k, v in os.environ.items() if k != "REDIS_URL"}
    env.update(RTT_KAFKA_BOOTSTRAP=f"127.0.0.1:{free_port()}", RTT_METRICS_PORT=str(free_port()),
               RTT_METRICS_HOST="127.0.0.1")
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "bridge", "--targets", str(fifo)], env=env,
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 60
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # ENXIO until the bridge has it open for reading
        except OSError:
            time.sleep(0.01)
            continue
        os.set_blocking(fd, True)
        return proc, fd
    if proc.poll() is None:
        proc.kill()
    out, err = proc.communicate()
    pytest.fail(f"the bridge never opened its targets (exit {proc.returncode}):\n{out}\n{err}")


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
    assert_stopped_before_its_first_round(proc.returncode, out, err, signum, status)
    if signum == signal.SIGTERM:
        assert "cannot reach Kafka" not in err, err  # stopped before asking the broker


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)],
                         ids=["SIGTERM", "SIGINT"])
def test_a_start_blocked_reading_its_targets_ends_at_the_signal(tmp_path: Path, signum: int, status: int) -> None:
    """Its targets a FIFO that nothing is ever written to (``--targets <(slow command)``, ``/dev/stdin``): the read
    would block for ever. Before, the signal was only noted and the read went on: no signal but SIGKILL ended it."""
    proc, fd = bridge_held_at_its_targets(tmp_path)
    try:
        proc.send_signal(signum)
        try:
            out, err = proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            pytest.fail(f"still reading its targets 10 s after the signal:\n{out}\n{err}")
    finally:
        os.close(fd)
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert_stopped_before_its_first_round(proc.returncode, out, err, signum, status)


HOLD = """
import sys
sys.path.insert(0, sys.argv[1])
from app.cli.bridge import _Held
held = _Held()
try:
    import signalled_in_its_import
except KeyboardInterrupt:
    print("interrupted in the import")
    raise SystemExit(0)
print("imported", held.noted)
try:
    print("asked", held.asked())
except KeyboardInterrupt:
    print("interrupted at the next step")
"""


def in_an_import(tmp_path: Path, signum: int, times: int) -> subprocess.CompletedProcess[str]:
    """A hold (:class:`app.cli.bridge._Held`) where ``signum`` comes ``times`` times inside an import."""
    raises = f"signal.raise_signal({int(signum)})\n" * times
    (tmp_path / "signalled_in_its_import.py").write_text(f"import signal\n{raises}DONE = True\n")
    return subprocess.run([sys.executable, "-c", HOLD, str(REPO)], cwd=tmp_path, capture_output=True, text=True,
                          timeout=30, check=False)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_inside_an_import_is_held_until_the_next_step(tmp_path: Path, signum: int) -> None:
    done = in_an_import(tmp_path, signum, 1)
    assert done.returncode == 0, done.stderr
    then = "asked True" if signum == signal.SIGTERM else "interrupted at the next step"
    assert done.stdout.splitlines() == [f"imported [{int(signum)}]", then], done.stdout + done.stderr


@pytest.mark.parametrize(("signum", "status"), [(signal.SIGTERM, -signal.SIGTERM), (signal.SIGINT, 0)],
                         ids=["SIGTERM", "SIGINT"])
def test_a_second_signal_is_not_held(tmp_path: Path, signum: int, status: int) -> None:
    """Before, every one was noted: a start stuck in an import (or a read) outlasted any number of them."""
    done = in_an_import(tmp_path, signum, 2)
    assert done.returncode == status, (done.returncode, done.stdout, done.stderr)
    if signum == signal.SIGINT:
        assert done.stdout.splitlines() == ["interrupted in the import"], done.stdout + done.stderr
    else:
        assert done.stdout == "", done.stdout  # ended by the second SIGTERM, as before the hold


def assert_stopped_before_its_first_round(code: int | None, out: str, err: str, signum: int, status: int) -> None:
    """The documented exit of a signal that came while the bridge started: SIGTERM a clean stop, SIGINT 130."""
    assert code == status, f"exit {code}\n{out}\n{err}"
    assert "Traceback" not in out + err, err
    if signum == signal.SIGTERM:
        assert out.splitlines() == ["bridge: stopped (SIGTERM), 0 rounds, 0 messages, 0 failed scrapes, "
                                    "0 rounds not taken by Kafka"], out
    else:
        assert err.splitlines()[-1] == "rttsched bridge: interrupted", err
