"""``rttsched broker --port P`` on a port something else holds: one line naming ``--port``, exit code 2, and no
Tansu started (the port is tried before it)."""

from __future__ import annotations

import socket

import pytest

from app.cli.main import main


@pytest.mark.parametrize("bound", ["127.0.0.1", "0.0.0.0"])  # noqa: S104 - the other server's address, a test's
def test_a_taken_broker_port_is_named(bound: str, capsys: pytest.CaptureFixture[str]) -> None:
    with socket.create_server((bound, 0)) as taken:
        port = taken.getsockname()[1]
        assert main(["broker", "--host", "127.0.0.1", "--port", str(port), "--no-topics"]) == 2
    out = capsys.readouterr()
    assert out.err == f"rttsched broker: error: --port: cannot listen on 127.0.0.1:{port}: Address already in use\n"
    assert "listening" not in out.out
