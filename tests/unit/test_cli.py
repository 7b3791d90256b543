from __future__ import annotations

import contextlib
import importlib
import logging
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from child_processes import lines_until

from app.cli.main import COMMANDS, build_parser, main
from app.kafka.embedded import free_port


def run_cli(*args: str, env: dict[str, str] | None = None,
            cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    import os

    return subprocess.run([sys.executable, "-m", "app.cli.main", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=cwd, timeout=120)


def test_every_registered_command_has_a_module_and_help():
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    assert set(sub.choices) == set(COMMANDS)
    helps = {name: str(getattr(importlib.import_module(f"app.cli.{name}"), "HELP", "")).strip() for name in COMMANDS}
    assert all(helps.values()), helps
    assert {name: sub.choices[name].description for name in COMMANDS} == helps  # what `rttsched CMD -h` says


def test_bad_setting_fails_at_start_naming_the_variable(monkeypatch, capsys):
    monkeypatch.setenv("RTT_SCRAPE_INTERVAL_S", "fast")
    assert main(["topics", "list"]) == 2
    err = capsys.readouterr().err
    assert "RTT_SCRAPE_INTERVAL_S" in err and "Traceback" not in err


@pytest.mark.parametrize("argv, line", [
    (["--tasks", "-5"], "rttsched sim: error: --tasks: must be > 0 (got -5)"),
    (["--load", "0"], "rttsched sim: error: --load: must be > 0 (got 0.0)"),
    (["--arrivals", "trace"], "rttsched sim: error: --trace: required when arrivals is 'trace'"),
])
def test_a_bad_sim_flag_is_named_as_typed(argv, line, capsys, tmp_path):
    assert main(["sim", *argv, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.splitlines() == [line]


@pytest.mark.integration
def test_unreachable_broker_is_one_clear_line_not_a_traceback():
    port = free_port()
    out = run_cli("topics", "create", env={"RTT_KAFKA_BOOTSTRAP": f"127.0.0.1:{port}"})
    assert out.returncode == 2
    assert "cannot reach Kafka" in out.stderr
    assert "RTT_KAFKA_BOOTSTRAP" in out.stderr
    assert "Traceback" not in out.stderr + out.stdout


@pytest.mark.integration
@pytest.mark.parametrize("command", ["worker", "trainer"])
def test_a_service_started_without_broker_says_so_in_one_line(command, tmp_path):
    """The worker used to print Faust's traceback, the trainer its client's error and unclosed-client noise. It
    waits for its broker now: past its bound (RTT_KAFKA_START_WAIT_S), the one line it gives up with is the last,
    after the one WARNING saying it waits."""
    port = free_port()
    # its directories (var/faust, var/models by default) under tmp_path, not in the repository
    out = run_cli(command, env={"RTT_KAFKA_BOOTSTRAP": f"127.0.0.1:{port}", "RTT_METRICS_PORT": "0",
                                "RTT_WORKER_DATADIR": str(tmp_path / "faust"), "RTT_KAFKA_START_WAIT_S": "1",
                                "RTT_MODELS_DIR": str(tmp_path / "models")}, cwd=tmp_path)
    assert out.returncode == 2, out.stderr
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 2 and f"WARNING app.kafka.admin: {command}: waiting for Kafka" in lines[0], out.stderr
    assert lines[1].startswith(f"rttsched {command}: error: cannot reach Kafka at 127.0.0.1:{port} "
                               "(RTT_KAFKA_BOOTSTRAP)"), out.stderr
    assert lines[1].endswith("(gave up after 1 s: RTT_KAFKA_START_WAIT_S=1)"), out.stderr
    assert "Traceback" not in out.stderr + out.stdout


def test_unexpected_errors_become_one_line(monkeypatch, capsys):
    import app.cli.topics as topics

    def boom(args, settings):
        raise OSError("disk on fire")

    monkeypatch.setattr(topics, "run", boom)
    assert main(["topics", "list"]) == 1
    err = capsys.readouterr().err
    assert "OSError: disk on fire" in err and "Traceback" not in err


def test_verbose_is_accepted_before_and_after_the_command():
    parser = build_parser()
    assert parser.parse_args(["-v", "settings"]).verbose is True
    assert parser.parse_args(["settings", "-v"]).verbose is True
    assert parser.parse_args(["settings"]).verbose is False


def test_interactive_commands_log_warnings_only_by_default(monkeypatch, capsys):
    import app.cli.settings as settings_cmd

    def speak(args, settings):
        logging.getLogger("app.some.module").info("an info line")
        logging.getLogger("app.some.module").warning("a warning line")
        return 0

    monkeypatch.setattr(settings_cmd, "run", speak)
    with bare_root_logger():
        assert main(["settings"]) == 0
    err = capsys.readouterr().err
    assert "a warning line" in err and "an info line" not in err
    with bare_root_logger():
        assert main(["settings", "-v"]) == 0
    assert "an info line" in capsys.readouterr().err


@contextlib.contextmanager
def bare_root_logger() -> Iterator[None]:
    """The root logger without handlers, as in a new process, so that main()'s ``logging.basicConfig`` sets it
    up; the handlers it had (pytest's) are back afterwards, the one basicConfig added gone. Its level is put
    back by the autouse fixture of tests/conftest.py. (Monkeypatching ``root.handlers`` with a new list would
    leave pytest's handlers of this phase on the old one, for every later test.)"""
    root = logging.getLogger()
    had = root.handlers[:]
    for h in had:
        root.removeHandler(h)
    try:
        yield
    finally:
        for h in root.handlers[:]:
            root.removeHandler(h)
        for h in had:
            root.addHandler(h)


def test_settings_lists_every_setting_within_100_columns_with_source(monkeypatch, capsys):
    from app.config import Settings

    monkeypatch.setenv("COLUMNS", "160")
    monkeypatch.setenv("RTT_ERROR_PERIOD_S", "7")
    monkeypatch.setenv("REDIS_URL", "redis://:topsecret@db:6379/0")
    assert main(["settings"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "topsecret" not in out and "redis://:***@db:6379/0" in out
    names = [name for name, _default, _doc in Settings.describe()]
    starts = {line.split()[0] for line in lines[1:] if line[:1].strip()}
    assert starts == set(names)
    period = next(line for line in lines if line.startswith("RTT_ERROR_PERIOD_S "))
    assert period.split()[1:3] == ["7.0", "environment"]
    assert next(line for line in lines if line.startswith("RTT_SCRAPE_INTERVAL_S ")).split()[2] == "default"


def test_settings_json_keeps_empty_values_empty_and_the_table_shows_them(monkeypatch, capsys):
    import json

    monkeypatch.setenv("REDIS_URL", "")
    assert main(["settings", "--json"]) == 0
    rows = {r["variable"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["REDIS_URL"]["value"] == "" and rows["REDIS_URL"]["source"] == "environment"
    assert main(["settings"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("REDIS_URL "))
    assert line.split()[1:3] == ["''", "environment"]


def test_every_setting_is_described():
    from app.config import Settings

    assert [name for name, _default, doc in Settings.describe() if not doc.strip()] == []


@pytest.mark.integration
def test_broker_start_prints_no_error_or_warning_line():
    import os
    import signal

    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "broker", "--port", str(port), "--no-topics"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=dict(os.environ),
                            start_new_session=True)
    try:
        assert proc.stdout is not None
        seen = lines_until(proc.stdout, lambda line: "listening on" in line or not line, 60)
        assert any("listening on" in s for s in seen), seen
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        rest, _ = proc.communicate(timeout=30)
    text = "".join(seen) + rest
    assert " ERROR " not in text and " WARNING " not in text, text


@pytest.mark.integration
def test_publish_without_broker_is_one_line():
    port = free_port()
    out = run_cli("publish", "task-completions", "-", env={"RTT_KAFKA_BOOTSTRAP": f"127.0.0.1:{port}"})
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0, out.stderr
    assert "cannot reach Kafka" in out.stderr
