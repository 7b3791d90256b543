"""``app.stopping.exit_now`` ends the process at once, with its code, whatever still runs or cannot be written.

It is how a service leaves when its stop gave up on something (a training in a thread, which Python's own exit would
join) and how ``rttsched trainer`` answers a second signal during its stop. Its line on stdout must not keep it from
ending when nothing reads that stdout any more (``rttsched trainer | tee log``, ``tee`` ended by the first Ctrl-C):
the write fails there, and the exit must still come.
"""

from __future__ import annotations

import subprocess
import sys
import time

EXIT_WITH_A_THREAD = """
import logging, threading, time
from app.stopping import exit_now
logging.basicConfig(format="%(levelname)s %(message)s")
threading.Thread(target=time.sleep, args=(60,)).start()  # not a daemon: Python's exit would wait for it
logging.getLogger("t").warning("stopping without the thread")
exit_now(3, "exiting at once")
"""


def run(code: str, **kw: object) -> tuple[subprocess.CompletedProcess[str], float]:
    t0 = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code], text=True, timeout=30, **kw)  # type: ignore[call-overload]
    return done, time.monotonic() - t0


def test_it_exits_at_once_with_its_code_and_its_output_written() -> None:
    done, took = run(EXIT_WITH_A_THREAD, capture_output=True)
    said = (done.returncode, done.stdout, done.stderr)
    assert said == (3, "exiting at once\n", "WARNING stopping without the thread\n"), said
    assert took < 20.0  # not the thread's 60 s


def test_a_stdout_nothing_reads_does_not_keep_it_from_exiting() -> None:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.5)\n" + EXIT_WITH_A_THREAD],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    proc.stdout.close()  # the reader of its stdout is gone before it writes its line
    try:
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert (proc.returncode, err) == (3, "WARNING stopping without the thread\n")
