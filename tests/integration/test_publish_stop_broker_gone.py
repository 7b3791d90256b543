"""``rttsched publish`` stopped (SIGTERM, SIGINT) during the first send to a broker that just went away, against the
real embedded broker: it ends within about 2 s of the signal, still saying which messages it did not send and the
input line to resume from (every line before it delivered), and that the ones it was sending may be on the topic
all the same. Before, it waited for the producer to let the batch in flight go: the rest of the producer's 10 s
request timeout, about 8 s."""

from __future__ import annotations

import fcntl
import signal
import struct
import subprocess
import termios
import time

import pytest
from test_publish_broker_restart import one_delivered_then_broker_gone, publishing

pytestmark = pytest.mark.integration

PROMPT_S = 3.0  # the stop's own bound is 1.5 s (app.cli.publish.STOP_S); the rest is the interpreter's exit
QUEUED_S = 0.2  # from the bytes of a line read out of the pipe to its record in the read-ahead (microseconds idle)


def all_read(proc: subprocess.Popen[bytes], timeout_s: float = 30.0) -> None:
    """Returns once publish has read every byte written to its stdin (the pipe holds none: FIONREAD), and a moment
    for the reading thread to queue the record; a loaded machine may take a while to run that thread at all."""
    assert proc.stdin is not None
    deadline = time.monotonic() + timeout_s
    while True:
        unread = struct.unpack("i", fcntl.ioctl(proc.stdin.fileno(), termios.FIONREAD, b"\0" * 4))[0]
        if not unread:
            break
        assert time.monotonic() < deadline, f"publish read nothing of its last {unread} bytes in {timeout_s:g} s"
        time.sleep(0.02)
    time.sleep(QUEUED_S)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_in_the_first_send_to_a_broker_just_gone_ends_publish_at_once(signum: int) -> None:
    with publishing("prompt") as (broker, settings, proc):
        one_delivered_then_broker_gone(broker, settings, proc)  # line 2 in its first try, line 3 read ahead
        all_read(proc)  # line 3 read before the signal, however loaded the machine
        assert proc.stderr is not None
        proc.send_signal(signum)  # about 1 s into line 2's first try: 9 s of its request timeout to go
        signalled = time.monotonic()
        rc = proc.wait(timeout=30)
        stopped_s = time.monotonic() - signalled
        err = proc.stderr.read().decode()
    assert "Traceback" not in err, err
    assert rc == 130 and "rttsched publish: interrupted" in err, (rc, err)
    assert stopped_s < PROMPT_S, f"{stopped_s:.1f} s after the signal"
    assert "holding them" not in err, err  # the signal came in the first try
    [line] = [x for x in err.splitlines() if "not sent" in x]
    topic = settings.topic("task-completions")
    assert line == (f"publish: 2 message(s) not sent (from <stdin>:2 on); 1 of them was sent and not acknowledged, "
                    f"and may be on {topic} all the same (at least once): check before sending it again"), line
