from __future__ import annotations

import subprocess
import sys

import pytest

from app.cli.main import COMMANDS, build_parser, main
from app.kafka.embedded import free_port


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "app.cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, timeout=120)


def test_every_registered_command_has_a_module_and_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == set(COMMANDS)


def test_bad_setting_fails_at_start_naming_the_variable(monkeypatch, capsys):
    monkeypatch.setenv("RTT_SCRAPE_INTERVAL_S", "fast")
    assert main(["topics", "list"]) == 2
    err = capsys.readouterr().err
    assert "RTT_SCRAPE_INTERVAL_S" in err and "Traceback" not in err


@pytest.mark.integration
def test_unreachable_broker_is_one_clear_line_not_a_traceback():
    port = free_port()
    out = run_cli("topics", "create", env={"RTT_KAFKA_BOOTSTRAP": f"127.0.0.1:{port}"})
    assert out.returncode == 2
    assert "cannot reach Kafka" in out.stderr
    assert "RTT_KAFKA_BOOTSTRAP" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_unexpected_errors_become_one_line(monkeypatch, capsys):
    import app.cli.topics as topics

    def boom(args, settings):
        raise OSError("disk on fire")

    monkeypatch.setattr(topics, "run", boom)
    assert main(["topics", "list"]) == 1
    err = capsys.readouterr().err
    assert "OSError: disk on fire" in err and "Traceback" not in err
