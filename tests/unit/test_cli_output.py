"""What the commands print: aligned tables, and a reader that goes away (``| head``) ends them quietly."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from app.cli.main import main
from app.contracts import load_contracts


def _cut_early(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    """Run ``rttsched ARGV`` with its stdout a pipe whose reader has gone before it writes: ``| head`` that has
    read its lines, without the race of a real ``head`` (which may read everything before it exits)."""
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env={**os.environ, **(env or {})})
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # the only reader: the command's first write meets EPIPE
    err = proc.stderr.read()
    proc.wait(timeout=120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, b"", err)


@pytest.mark.parametrize("argv", [["settings"], ["topics", "list"], ["settings", "--json"]])
def test_a_reader_that_went_away_ends_the_command_quietly(argv):
    """It used to print ``error: BrokenPipeError: [Errno 32] Broken pipe`` and exit 1; now nothing, and 141 (128 +
    SIGPIPE) as a shell tool ended by SIGPIPE, with no "Exception ignored" from the interpreter's last flush."""
    done = _cut_early(*argv)
    assert done.stderr.decode() == ""
    assert done.returncode == 141


def test_head_reads_the_first_lines_and_nothing_is_said():
    """The pipeline people write; ``pipefail`` shows the command's own status (141, or 0 when ``head`` happened to
    read everything before it exited)."""
    done = subprocess.run(["bash", "-o", "pipefail", "-c", f"{sys.executable} -m app.cli.main settings | head -1"],
                          capture_output=True, text=True, timeout=120)
    assert done.stderr == ""
    assert done.stdout.split() == ["VARIABLE", "VALUE", "SOURCE", "DESCRIPTION"]
    assert done.returncode in (0, 141)


def test_a_broken_pipe_that_is_not_stdout_is_still_an_error(monkeypatch, capsys):
    """A connection's broken pipe (stdout not a pipe) is reported like any unexpected error, not swallowed."""
    import app.cli.topics as topics

    def broken(args, settings):
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(topics, "run", broken)
    assert main(["topics", "list"]) == 1
    assert "BrokenPipeError" in capsys.readouterr().err


def test_a_connection_s_broken_pipe_is_an_error_while_stdout_is_a_pipe_still_read():
    """Under docker, Kubernetes or systemd stdout is a pipe: a broken pipe of a connection (a socket whose peer is
    gone) must still be an error line and status 1 there, not taken for stdout's reader gone (141, silent)."""
    code = ("import socket, sys\n"
            "import app.cli.settings as mod\n"
            "from app.cli.main import main\n"
            "def run(args, settings):\n"
            "    a, b = socket.socketpair(); b.close()\n"
            "    a.sendall(b'x' * 1_000_000)\n"
            "mod.run = run\n"
            "sys.exit(main(['settings']))\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, done
    assert "error: BrokenPipeError" in done.stderr


def _columns_line_up(lines: list[str], names: list[str]) -> None:
    """Each row's first cell is its name, and every other column starts where its header does."""
    head = lines[0]
    starts = [i for i in range(1, len(head)) if head[i] != " " and head[i - 1] == " "]
    assert lines[1:] and len(lines) == len(names) + 1
    for line, name in zip(lines[1:], names, strict=True):
        assert line[:starts[0]].rstrip() == name, (line, head)
        for at in starts:
            assert line[at - 1] == " " and line[at - 2] == " ", (line, head)  # two spaces before every column


def test_topics_list_fits_a_long_prefix(monkeypatch, capsys):
    """RTT_TOPIC_PREFIX longer than the 22 columns the names had: the columns used to shift row by row."""
    monkeypatch.setenv("RTT_TOPIC_PREFIX", "staging-cluster-eu-west.")
    assert main(["topics", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["topic", "key", "parts", "cleanup", "retention_ms"]
    _columns_line_up(lines, [f"staging-cluster-eu-west.{name}" for name in load_contracts()])
    assert len({len(line) for line in lines}) == 1  # the last column, retention_ms, right-aligned


def test_topics_create_prints_the_same_table(monkeypatch, capsys):
    import app.kafka.admin as admin

    async def ensured(settings, internal=(), recreate=False):
        return [admin.TopicResult(f"staging-cluster-eu-west.{name}", 8, "delete", name == "node-metrics")
                for name in ("node-metrics", "rttsched-worker-node-features-table-changelog")]

    monkeypatch.setattr(admin, "ensure_topics", ensured)
    assert main(["topics", "create"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["topic", "parts", "cleanup", "status"]
    _columns_line_up(lines, ["staging-cluster-eu-west.node-metrics",
                             "staging-cluster-eu-west.rttsched-worker-node-features-table-changelog"])
    assert [line.split()[-1] for line in lines[1:]] == ["created", "exists"]


@pytest.mark.parametrize("action", ["list", "create"])
def test_an_empty_worker_id_is_refused(action, capsys):
    """``--worker-id ''`` used to mean the default group without a word."""
    assert main(["topics", action, "--worker-id", ""]) == 2
    assert capsys.readouterr().err.splitlines() == ["rttsched topics: error: --worker-id: must not be empty"]
