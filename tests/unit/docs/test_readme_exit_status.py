"""The README's exit statuses hold for a command a signal stops: 128 + the signal's number, as a shell expects
(130 SIGINT, 143 SIGTERM, 129 SIGHUP), which ``rttsched demo`` gives and a command the signal ends gets from the
shell; the README said "130 interrupted" only, although the demo exits 143 after SIGTERM and 129 after SIGHUP."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _exit_status_paragraph() -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    start = text.index("Exit status:")
    return " ".join(text[start:text.index("\n\n", start)].split())


def test_the_readme_gives_128_plus_the_signal_s_number_for_each_stopping_signal():
    para = _exit_status_paragraph()
    assert "128 + the signal's number" in para
    for sig, said in ((signal.SIGINT, "Ctrl-C (SIGINT)"), (signal.SIGTERM, "SIGTERM"), (signal.SIGHUP, "SIGHUP")):
        assert re.search(rf"\b{128 + sig} after {re.escape(said)}", para), f"no '{128 + sig} after {said}': {para}"
    # the commands whose own handling it names
    for words in ("`rttsched demo` stops everything it started first", "`rttsched publish` takes SIGTERM as Ctrl-C",
                  "SIGHUP stops the broker as SIGTERM does"):
        assert words in para


def test_a_command_the_readme_says_sigterm_ends_at_once_is_ended_by_it():
    """``rttsched sim`` keeps Python's SIGTERM: the process ends by the signal (the shell's 143), saying nothing."""
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "sim", "--preset", "small", "--policies", "all",
                             "--seeds", "5"], cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    time.sleep(2.0)  # importing or simulating: either way the run is far from its end (~25 s)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == -signal.SIGTERM, (proc.returncode, err[-2000:])
    assert "interrupted" not in err
    said = "`sim`, `select`, `topics`, `models`, `explain` and `settings` end at once on SIGTERM"
    assert said in _exit_status_paragraph()
