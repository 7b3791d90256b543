"""Redis as k8s/redis.yaml and docker-compose.yml start it, with the Secret as `openssl rand -hex 24 >` writes it
(a trailing newline): the password it requires is the one the components send (``RTT_REDIS_PASSWORD_FILE``,
read without the newline), and an empty secret stops it instead of leaving it without a password."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
import redis
import yaml

from app.config import Settings
from app.kafka.embedded import free_port

REPO = Path(__file__).resolve().parents[3]
K8S_SECRET = "/etc/redis/secrets/redis-password"
COMPOSE_SECRET = "/run/secrets/redis-password"


def k8s_script() -> str:
    deployment = next(d for d in yaml.safe_load_all((REPO / "k8s" / "redis.yaml").read_text())
                      if d and d["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["sh", "-c"]
    return str(container["args"][0])


def compose_script() -> str:
    command = yaml.safe_load((REPO / "docker-compose.yml").read_text())["services"]["redis"]["command"]
    assert command[:2] == ["sh", "-c"]
    return str(command[2]).replace("$$", "$")  # compose's escape of a literal $


SCRIPTS = {"k8s": (k8s_script, K8S_SECRET), "compose": (compose_script, COMPOSE_SECRET)}


def start(script: str, secret_path: str, secret: Path, port: int, workdir: Path) -> subprocess.Popen[bytes]:
    """The container's command, with the secret at ``secret`` and the server on ``port`` of this host."""
    assert secret_path in script and "exec redis-server" in script
    local = script.replace(secret_path, str(secret)).replace(
        "exec redis-server", f"exec redis-server --port {port} --bind 127.0.0.1 --dir {workdir}")
    return subprocess.Popen(["sh", "-c", local], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


@pytest.mark.parametrize("where", sorted(SCRIPTS))
def test_the_password_redis_requires_is_the_one_the_components_send(tmp_path: Path, where: str) -> None:
    script, secret_path = SCRIPTS[where][0](), SCRIPTS[where][1]
    secret = tmp_path / "redis-password"
    secret.write_text("4f1c0e9a7d\n")  # as `openssl rand -hex 24 > file` writes it
    port = free_port()
    server = start(script, secret_path, secret, port, tmp_path)
    try:
        url = Settings(redis_url=f"redis://127.0.0.1:{port}/0", redis_password_file=str(secret)).redis_client_url
        client = redis.Redis.from_url(url, socket_timeout=2)
        deadline = time.monotonic() + 10
        while True:
            try:
                assert client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise
                time.sleep(0.05)
        with pytest.raises(redis.AuthenticationError):  # a password is required at all
            redis.Redis(port=port, password="wrong", socket_timeout=2).ping()
        client.close()
    finally:
        server.terminate()
        server.wait(10)


@pytest.mark.parametrize("where", sorted(SCRIPTS))
def test_an_empty_or_missing_secret_stops_redis(tmp_path: Path, where: str) -> None:
    script, secret_path = SCRIPTS[where][0](), SCRIPTS[where][1]
    empty = tmp_path / "empty"
    empty.write_text("")
    for secret in (empty, tmp_path / "missing"):
        server = start(script, secret_path, secret, free_port(), tmp_path)
        try:
            assert server.wait(10) != 0  # before exec: no server without a password
        finally:  # a server that did start (wait timed out) must not stay listening
            if server.poll() is None:
                server.kill()
                server.wait(10)


def test_the_runbook_s_redis_check_reads_the_password_where_the_container_has_it() -> None:
    runbook = (REPO / "docs" / "runbook.md").read_text()
    commands = [line for line in runbook.splitlines() if "redis-cli" in line]  # each run in the Redis pod
    assert commands and all(f'"$(cat {K8S_SECRET})"' in line for line in commands), commands
    assert K8S_SECRET in k8s_script()
