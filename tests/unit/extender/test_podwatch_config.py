"""Start-up configuration of the pods watcher: API access, options, and the CLI's one-line errors."""

from __future__ import annotations

import pytest

from app.cli.main import main
from app.errors import ConfigError
from app.extender.podwatch import PodWatchOptions
from app.extender.podwatch_api import KubeAccess, KubeApiError


def test_in_cluster_access_uses_the_service_host_port_token_and_ca(tmp_path):
    access = KubeAccess.in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "6443"},
                                   root=tmp_path)
    assert access.base_url == "https://10.96.0.1:6443"
    assert access.token_file == str(tmp_path / "token") and access.ca_file == str(tmp_path / "ca.crt")
    v6 = KubeAccess.in_cluster({"KUBERNETES_SERVICE_HOST": "fd00::1"}, root=tmp_path)
    assert v6.base_url == "https://[fd00::1]:443"


def test_outside_a_cluster_without_an_api_url_fails_naming_the_variable():
    with pytest.raises(ConfigError) as err:
        KubeAccess.in_cluster({})
    assert err.value.field == "RTT_PODS_API_URL"


def test_the_token_is_re_read_on_every_request_as_projected_tokens_rotate(tmp_path):
    token = tmp_path / "token"
    token.write_text("first\n")
    access = KubeAccess.from_url("http://127.0.0.1:8001/", str(token))
    assert access.base_url == "http://127.0.0.1:8001"
    assert access.headers()["Authorization"] == "Bearer first"
    token.write_text("rotated")
    assert access.headers()["Authorization"] == "Bearer rotated"
    token.unlink()
    with pytest.raises(KubeApiError) as err:
        access.headers()
    assert err.value.kind == "token"
    assert "Authorization" not in KubeAccess.from_url("http://127.0.0.1:8001").headers()


@pytest.mark.parametrize(("url", "token", "field"), [
    ("127.0.0.1:8001", "", "RTT_PODS_API_URL"),
    ("ftp://api", "", "RTT_PODS_API_URL"),
    ("http://127.0.0.1:8001", "/nonexistent/token", "RTT_PODS_TOKEN_FILE"),
])
def test_bad_access_options_fail_at_start_naming_the_variable(url, token, field):
    with pytest.raises(ConfigError) as err:
        KubeAccess.from_url(url, token)
    assert err.value.field == field


def test_options_reject_bad_values_naming_the_variable():
    with pytest.raises(ConfigError) as err:
        PodWatchOptions(resync_s=0)
    assert err.value.field == "RTT_PODS_RESYNC_S"
    with pytest.raises(ConfigError) as err:
        PodWatchOptions(resync_s=30, ttl_s=10)
    assert err.value.field == "RTT_PODS_TTL_S"
    assert PodWatchOptions(resync_s=2).key_ttl_ms == 6000
    assert PodWatchOptions(resync_s=2, ttl_s=9).key_ttl_ms == 9000


@pytest.mark.parametrize(("env", "named"), [
    ({"RTT_PODS_RESYNC_S": "often"}, "RTT_PODS_RESYNC_S"),
    ({"RTT_PODS_RESYNC_S": "-5"}, "RTT_PODS_RESYNC_S"),
    ({"RTT_PODS_API_URL": "kubernetes.default"}, "RTT_PODS_API_URL"),
    ({"REDIS_URL": ""}, "REDIS_URL"),
])
def test_cli_reports_a_bad_setting_in_one_line(monkeypatch, capsys, env, named):
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("RTT_PODS_API_URL", "http://127.0.0.1:1")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["pods", "--once"]) == 2
    err = capsys.readouterr().err
    assert named in err and "Traceback" not in err and err.count("\n") == 1


def test_an_unreadable_ca_file_fails_at_start_naming_the_variable(tmp_path):
    access = KubeAccess.in_cluster({"KUBERNETES_SERVICE_HOST": "10.96.0.1"}, root=tmp_path)
    with pytest.raises(ConfigError) as err:
        access.ssl_context()
    assert err.value.field == "RTT_PODS_CA_FILE"
    assert KubeAccess.from_url("http://127.0.0.1:8001").ssl_context() is None


@pytest.mark.parametrize(("options", "line"), [
    ({"resync_s": float("inf")}, "RTT_PODS_RESYNC_S: must be finite (got inf)"),
    ({"resync_s": float("nan")}, "RTT_PODS_RESYNC_S: must be > 0 (got nan)"),
    ({"resync_s": 1e300}, "RTT_PODS_RESYNC_S: must be <= 86400 s, a day (got 1e+300)"),
    ({"ttl_s": float("nan")}, "RTT_PODS_TTL_S: must be >= 0 (got nan)"),
    ({"ttl_s": float("inf")}, "RTT_PODS_TTL_S: must be finite (got inf)"),
    ({"ttl_s": 1e300}, "RTT_PODS_TTL_S: must be <= 259200 s, 3 days (got 1e+300)"),
])
def test_options_hold_to_the_bounds_of_the_settings_and_of_a_redis_ttl(options, line):
    """A resync or TTL that is no finite number, or whose TTL in ms Redis would refuse, fails at start: it used to
    fail in key_ttl_ms (OverflowError, ValueError) or at each write (ResponseError), forever in service mode."""
    with pytest.raises(ConfigError) as err:
        PodWatchOptions(**options)
    assert str(err.value) == line


def test_the_longest_options_give_a_ttl_redis_takes():
    assert PodWatchOptions(resync_s=86_400).key_ttl_ms == 259_200_000
    assert PodWatchOptions(resync_s=86_400, ttl_s=259_200).key_ttl_ms == 259_200_000


@pytest.mark.parametrize(("argv", "env", "line"), [
    (["--resync", "inf"], {}, "rttsched pods: error: --resync: must be finite (got inf)"),
    (["--ttl", "nan"], {}, "rttsched pods: error: --ttl: must be >= 0 (got nan)"),
    (["--resync", "1e300"], {}, "rttsched pods: error: --resync: must be <= 86400 s, a day (got 1e+300)"),
    (["--ttl", "1e300"], {}, "rttsched pods: error: --ttl: must be <= 259200 s, 3 days (got 1e+300)"),
    (["--resync", "0"], {}, "rttsched pods: error: --resync: must be > 0 (got 0.0)"),
    ([], {"RTT_PODS_RESYNC_S": "1e300"},
     "rttsched pods: error: RTT_PODS_RESYNC_S: must be <= 86400 s, a day (got 1e+300)"),
    ([], {"RTT_PODS_RESYNC_S": "inf"}, "rttsched pods: error: RTT_PODS_RESYNC_S: must be finite (got inf)"),
])
@pytest.mark.parametrize("once", [True, False])
def test_resync_and_ttl_flags_hold_to_the_bounds_of_their_variables(monkeypatch, capsys, argv, env, line, once):
    """Named as typed, exit 2, before the API, Redis or the metrics port is looked at (in --once and as a service)."""
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    monkeypatch.setenv("RTT_PODS_API_URL", "http://127.0.0.1:1")
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(["pods", *argv, *(["--once"] if once else [])]) == 2
    assert capsys.readouterr().err.splitlines() == [line]


@pytest.mark.parametrize("pinged", [True, False])
def test_once_with_redis_away_is_one_line_naming_redis_url(monkeypatch, capsys, pinged):
    """The API answers, Redis does not: one line naming REDIS_URL and exit 2, as `rttsched models` says it, not
    ``error: ConnectionError: ...`` and exit 1. ``pinged``: Redis went away after answering the first PING."""
    import app.redis_client
    from app.extender.podwatch_api import PodsApi
    from app.kafka.embedded import free_port

    async def listed(self):
        return [], "1"

    async def answered(settings):
        return None

    port = free_port()
    monkeypatch.setattr(PodsApi, "list_pods", listed)
    if pinged:
        monkeypatch.setattr(app.redis_client, "check_redis", answered)
    monkeypatch.setenv("REDIS_URL", f"redis://127.0.0.1:{port}/0")
    assert main(["pods", "--once", "--api-url", "http://127.0.0.1:1"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"rttsched pods: error: REDIS_URL: cannot use Redis at redis://127.0.0.1:{port}/0: "), line
    assert "Connection refused" in line or "Connect call failed" in line, line
