"""``rttsched extender`` refuses bad input at start with one line naming it, before it says "listening"."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

from app.cli.main import main

REPO = Path(__file__).resolve().parents[3]


def test_bad_policy_fails_naming_the_field_before_listening(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text("sla_ms: {gCTF: -5}\n")
    assert main(["extender", "--host", "127.0.0.1", "--port", "0", "--policy", str(policy)]) == 2
    out = capsys.readouterr()
    assert "policy.yaml.sla_ms.gCTF: must be a number > 0" in out.err
    assert "listening" not in out.out and "Traceback" not in out.err


def test_port_in_use_is_one_line_naming_the_flag(capsys: pytest.CaptureFixture[str]) -> None:
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["extender", "--host", "127.0.0.1", "--port", str(port)]) == 2
    err = capsys.readouterr().err
    assert err == f"rttsched extender: error: --port: cannot listen on 127.0.0.1:{port}: Address already in use\n"


def test_port_in_use_from_the_environment_names_the_variable(monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    """As the worker's and trainer's RTT_METRICS_PORT: the setting to change, exit code 2."""
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        monkeypatch.setenv("RTT_EXTENDER_HOST", "127.0.0.1")
        monkeypatch.setenv("RTT_EXTENDER_PORT", str(port))
        assert main(["extender", "--no-redis", "--no-publish"]) == 2
    err = capsys.readouterr().err
    assert err == (f"rttsched extender: error: RTT_EXTENDER_PORT: cannot listen on 127.0.0.1:{port}: "
                   "Address already in use\n")


@pytest.mark.parametrize("host", ["nonexistent.invalid", "192.0.2.1"])  # no such name; an address not this host's
@pytest.mark.parametrize("from_flag", [False, True])
def test_a_host_it_cannot_listen_on_is_named(host: str, from_flag: bool, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RTT_EXTENDER_PORT", "19106")
    if from_flag:
        argv = ["extender", "--host", host]
    else:
        monkeypatch.setenv("RTT_EXTENDER_HOST", host)
        argv = ["extender"]
    assert main([*argv, "--no-redis", "--no-publish"]) == 2
    field = "--host" if from_flag else "RTT_EXTENDER_HOST"
    err = capsys.readouterr().err
    assert err.startswith(f"rttsched extender: error: {field}: cannot listen on {host}:19106: ")
    assert len(err.splitlines()) == 1


def test_missing_tls_files_fail_naming_the_variable(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RTT_EXTENDER_TLS_CERT", str(tmp_path / "tls.crt"))
    monkeypatch.setenv("RTT_EXTENDER_TLS_KEY", str(tmp_path / "tls.key"))
    assert main(["extender", "--host", "127.0.0.1", "--port", "0"]) == 2
    out = capsys.readouterr()
    assert "RTT_EXTENDER_TLS_CERT" in out.err and "no such file" in out.err and "listening" not in out.out


def test_host_double_colon_answers_on_ipv6_and_ipv4_loopback(tmp_path: Path) -> None:
    """RTT_EXTENDER_HOST=:: (an IPv6 cluster): the extender starts, and answers on [::1] and on 127.0.0.1."""
    with socket.socket(socket.AF_INET6) as probe:  # the machine has an IPv6 loopback, or this test says so first
        probe.bind(("::1", 0))
    env = {**os.environ, "RTT_EXTENDER_HOST": "::", "RTT_EXTENDER_PORT": "0",
           "RTT_KAFKA_BOOTSTRAP": "127.0.0.1:1", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "app.cli.main", "extender", "--no-redis", "--no-publish"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # the first line: listening, or why not
        m = re.match(r"rttsched extender: listening on http://\[::\]:(\d+) ", line)
        assert m, line + (proc.stdout.read() if proc.poll() is not None else "")
        for host in ("[::1]", "127.0.0.1"):
            with urllib.request.urlopen(f"http://{host}:{m.group(1)}/healthz", timeout=10) as resp:
                assert resp.status == 200, host
    finally:
        proc.terminate()
        proc.wait(timeout=30)
