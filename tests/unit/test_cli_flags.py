"""A bad flag is one line naming the flag as typed (a bad environment variable: the variable), rc 2.

Every check here fails before anything is started or reached: no broker, Redis or extender is needed.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from app.cli.main import main

# the environment variables these tests set or that would change what they see
ENV = ("RTT_EXTENDER_PORT", "RTT_EXTENDER_HOST", "RTT_EXTENDER_POLICY_FILE", "RTT_TRAINER_CPUS",
       "RTT_TRAINER_MARGIN", "RTT_TRAINER_MAX_SAMPLES_PER_KEY", "RTT_FEATURE_HISTORY_S",
       "RTT_WORKER_SESSION_TIMEOUT_S", "RTT_DWA_MAX_WINDOW_S", "RTT_FEATURE_WINDOW_S", "RTT_PODS_RESYNC_S",
       "RTT_PODS_TTL_S", "RTT_PODS_API_URL", "RTT_PODS_TOKEN_FILE", "RTT_PODS_CA_FILE", "REDIS_URL")


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def affinity():
    """The test process's CPU affinity, restored after the test (the trainer pins the process it runs in)."""
    before = os.sched_getaffinity(0)
    yield before
    os.sched_setaffinity(0, before)


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    """The one line on stderr; no traceback and no exception class name in it."""
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    assert not re.search(r"\b\w+(Error|Exception)\b", err), err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


def bad_cpu() -> int:
    """A CPU number this machine does not have."""
    return max(os.cpu_count() or 1, *os.sched_getaffinity(0)) + 7


# -- a storage engine the shipped Tansu does not have is refused up front, its password masked

@pytest.mark.parametrize("url", ["postgres://u:secretpw@127.0.0.1:1/db", "sqlite://x.db", "foo://bar", "notaurl"])
def test_broker_refuses_a_storage_engine_tansu_lacks(url, capsys):
    from app.kafka.embedded import free_port

    assert main(["broker", "--port", str(free_port()), "--storage-engine", url]) == 2
    line = error_line(capsys)
    assert line.startswith("rttsched broker: error: --storage-engine: "), line
    assert "memory://" in line and "s3://" in line and "secretpw" not in line


# -- ports

@pytest.mark.parametrize("command", ["extender", "broker"])
@pytest.mark.parametrize("port", ["99999", "-1", "65536"])
def test_a_port_out_of_range_is_named(command, port, capsys):
    assert main([command, "--port", port]) == 2
    assert error_line(capsys) == f"rttsched {command}: error: --port: must be a port between 0 and 65535 (got {port})"


def test_extender_port_0_is_a_port_the_os_picks_as_with_the_setting(monkeypatch, capsys):
    """``--port 0`` used to be dropped (falsy) and the extender listened on RTT_EXTENDER_PORT's 8888."""
    import app.extender.boot as boot_mod

    seen = {}

    async def fake_boot(settings, options, sock, **_kw):
        seen["option"], seen["bound"] = options.port, sock.getsockname()

    monkeypatch.setattr(boot_mod, "boot", fake_boot)
    monkeypatch.setenv("RTT_EXTENDER_PORT", "8888")
    assert main(["extender", "--host", "127.0.0.1", "--port", "0", "--no-publish", "--no-redis"]) == 0
    assert seen["option"] == 0
    host, port = seen["bound"]
    assert host == "127.0.0.1" and port not in (0, 8888)


# -- explain --timeout

@pytest.mark.parametrize(("value", "shown"), [("-1", "-1"), ("0", "0"), ("nan", "nan")])
def test_explain_timeout_must_be_positive(value, shown, capsys):
    assert main(["explain", "--url", "http://127.0.0.1:9", "--app", "gCTF", "--nodes", "a", "--timeout", value]) == 2
    assert error_line(capsys) == f"rttsched explain: error: --timeout: must be > 0 (got {shown})"


# -- explain refuses a pod it could only answer neutrally for (one line, exit 2, nothing sent)
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kube"


@pytest.mark.parametrize(("flags", "line"), [
    (["--app", "bad app!"], "--app: not an app label value: letters, digits, '.', '_' and '-', at most 64 "
                            "(got 'bad app!')"),
    (["--app", "x" * 65], "--app: not an app label value"),
    (["--pod", str(FIXTURES / "nodelist.json")], "--pod: must hold a v1 Pod with metadata (got a list of items)"),
    (["--pod", "{tmp}/list.json"], "--pod: must hold a v1 Pod with metadata (got list)"),
    (["--pod", "{tmp}/node.json"], "--pod: must hold a v1 Pod with metadata (got kind Node)"),
    (["--pod", "{tmp}/null.json"], "--pod: must hold a v1 Pod with metadata (got kind None)"),
])
def test_explain_refuses_an_app_or_pod_it_cannot_use(flags, line, tmp_path, capsys):
    (tmp_path / "list.json").write_text("[1]")
    (tmp_path / "node.json").write_text('{"kind": "Node", "metadata": {"name": "a"}}')
    (tmp_path / "null.json").write_text('{"kind": null, "metadata": {"name": "a"}}')
    argv = ["explain", "--url", "http://127.0.0.1:9", "--nodes", "a", *[f.format(tmp=tmp_path) for f in flags]]
    assert main(argv) == 2
    assert error_line(capsys).startswith(f"rttsched explain: error: {line}")


# -- explain's head is wrapped, not cut, and names only what the pod has

def _answer(pod: dict, nodes: int = 2) -> dict:
    return {"pod": pod, "contributions_method": "approx", "best": "n0",
            "nodes": [{"node": f"n{i}", "hardware": "cpu", "score": 5, "source": "node-weights"}
                      for i in range(nodes)]}


def test_explain_head_is_wrapped_within_100_columns_not_cut():
    from app.cli.explain import WIDTH, format_answer

    short = format_answer(_answer({"app": "gCTF", "namespace": "default", "name": "explain-gctf"}))
    assert short[0].endswith("(XGBoost, margin scale)") and short[1] == "best: n0"
    name = "a-very-long-pod-name-" * 5
    lines = format_answer(_answer({"app": "Motioncor2", "namespace": "electron-microscopy", "name": name}))
    assert max(map(len, lines)) <= WIDTH
    head = lines[:lines.index("best: n0")]
    assert len(head) > 1 and all(line.startswith("  ") for line in head[1:])
    text = " ".join(line.strip() for line in head)
    assert f"Motioncor2 pod electron-microscopy/{name.rstrip('-')}" in text.replace("- ", "-")
    assert text.endswith("2 candidates, contributions approx (XGBoost, margin scale)")


@pytest.mark.parametrize(("pod", "head"), [
    ({"app": None, "namespace": "", "name": "x"}, "pod x (no app label): 2 candidates"),
    ({"app": "gCTF", "namespace": "", "name": "x"}, "gCTF pod x: 2 candidates"),
    ({"app": None, "namespace": "em", "name": "x"}, "pod em/x (no app label): 2 candidates"),
    ({}, "pod (unnamed) (no app label): 2 candidates"),
])
def test_explain_head_leaves_out_what_the_pod_lacks(pod, head):
    from app.cli.explain import format_answer

    first = format_answer(_answer(pod))[0]
    assert first.startswith(head) and "None" not in first, first


# -- trainer --cpus and --max-event-age

def test_trainer_cpus_that_do_not_exist_are_named_with_those_that_do(affinity, capsys):
    cpu = bad_cpu()
    assert main(["trainer", "--cpus", str(cpu)]) == 2
    line = error_line(capsys)
    assert line.startswith(f"rttsched trainer: error: --cpus: cannot pin to CPUs {cpu}: "), line
    from app.trainer.cpus import format_cpus

    assert f"may use CPUs {format_cpus(affinity)}" in line
    assert os.sched_getaffinity(0) == affinity  # nothing pinned


def test_trainer_cpus_some_of_which_do_not_exist_are_refused(affinity, capsys):
    cpu = bad_cpu()
    assert main(["trainer", "--cpus", f"{min(affinity)},{cpu}"]) == 2
    line = error_line(capsys)
    assert line.startswith("rttsched trainer: error: --cpus: cannot pin to CPUs ") and f": {cpu} not available" in line
    assert os.sched_getaffinity(0) == affinity  # what was pinned before the check is undone


def test_trainer_cpus_from_the_environment_name_the_variable(affinity, monkeypatch, capsys):
    monkeypatch.setenv("RTT_TRAINER_CPUS", str(bad_cpu()))
    assert main(["trainer"]) == 2
    assert error_line(capsys).startswith("rttsched trainer: error: RTT_TRAINER_CPUS: cannot pin to CPUs ")


@pytest.mark.parametrize(("value", "shown"), [("-5", "-5"), ("0", "0"), ("nan", "nan")])
def test_trainer_max_event_age_must_be_positive(value, shown, capsys):
    """0 or less skipped every retrain event (an event is skipped when it is older than this)."""
    assert main(["trainer", "--max-event-age", value]) == 2
    assert error_line(capsys) == f"rttsched trainer: error: --max-event-age: must be > 0 seconds (got {shown})"


# -- the flag is named when the value came from it, the variable when it came from the environment

@pytest.mark.parametrize(("argv", "line"), [
    (["worker", "--history-s", "-1"],
     "rttsched worker: error: --history-s: must be >= RTT_DWA_MAX_WINDOW_S (60.0) (got -1.0)"),
    (["worker", "--session-timeout-s", "0"], "rttsched worker: error: --session-timeout-s: must be > 0 (got 0.0)"),
    (["trainer", "--cpus", "zz"], "rttsched trainer: error: --cpus: bad CPU list 'zz'"),
    (["trainer", "--cpus", "0-999999999"],  # refused at once, not a billion CPUs put in a set first
     "rttsched trainer: error: --cpus: CPU 999999999 in '0-999999999' is above any machine's (at most 65535)"),
    (["trainer", "--max-samples-per-key", "0"], "rttsched trainer: error: --max-samples-per-key: must be >= 1 (got 0)"),
    (["trainer", "--margin", "1"], "rttsched trainer: error: --margin: must be in [0, 1) (got 1.0)"),
    (["pods", "--resync", "-1"], "rttsched pods: error: --resync: must be > 0 (got -1.0)"),
    (["pods", "--ttl", "5"], "rttsched pods: error: --ttl: must be >= RTT_PODS_RESYNC_S (got 5.0)"),
    (["pods", "--resync", "10", "--ttl", "5"], "rttsched pods: error: --ttl: must be >= --resync (got 5.0)"),
    (["pods", "--api-url", "ftp://x"],
     "rttsched pods: error: --api-url: must be an http:// or https:// URL (got 'ftp://x')"),
    (["pods", "--api-url", "http://127.0.0.1:9", "--token-file", "/nonexistent/token"],
     "rttsched pods: error: --token-file: no such file: /nonexistent/token"),
])
def test_a_bad_flag_is_named_not_its_variable(argv, line, capsys):
    assert main(argv) == 2
    assert error_line(capsys) == line


def test_extender_policy_flag_is_named(capsys):
    assert main(["extender", "--policy", "/nonexistent/policy.yaml"]) == 2
    assert error_line(capsys).startswith("rttsched extender: error: --policy: cannot read /nonexistent/policy.yaml")


@pytest.mark.parametrize(("env", "argv", "start"), [
    ({"RTT_FEATURE_HISTORY_S": "10"}, ["worker"], "rttsched worker: error: RTT_FEATURE_HISTORY_S: must be >= "),
    ({"RTT_TRAINER_CPUS": "zz"}, ["trainer"], "rttsched trainer: error: RTT_TRAINER_CPUS: bad CPU list 'zz'"),
    ({"RTT_TRAINER_MARGIN": "1"}, ["trainer"], "rttsched trainer: error: RTT_TRAINER_MARGIN: must be in [0, 1)"),
    ({"RTT_PODS_RESYNC_S": "-1"}, ["pods"], "rttsched pods: error: RTT_PODS_RESYNC_S: must be > 0"),
    ({"RTT_PODS_TTL_S": "5"}, ["pods", "--resync", "10"],
     "rttsched pods: error: RTT_PODS_TTL_S: must be >= --resync (got 5.0)"),
    ({"RTT_PODS_API_URL": "ftp://x"}, ["pods"], "rttsched pods: error: RTT_PODS_API_URL: must be an http://"),
    ({"RTT_EXTENDER_POLICY_FILE": "/nonexistent/policy.yaml"}, ["extender"],
     "rttsched extender: error: RTT_EXTENDER_POLICY_FILE: cannot read /nonexistent/policy.yaml"),
])
def test_a_bad_variable_is_still_named_as_the_variable(env, argv, start, monkeypatch, capsys):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    assert error_line(capsys).startswith(start)


# -- a directory the command cannot use, named before anything is started

@pytest.mark.parametrize(("env", "argv", "line"), [
    ({"RTT_WORKER_DATADIR": "/proc/nope"}, ["worker"],
     "rttsched worker: error: RTT_WORKER_DATADIR: cannot create /proc/nope: No such file or directory"),
    ({}, ["worker", "--datadir", "/proc/nope"],
     "rttsched worker: error: --datadir: cannot create /proc/nope: No such file or directory"),
    ({"RTT_MODELS_DIR": "/proc/nope"}, ["trainer"],
     "rttsched trainer: error: RTT_MODELS_DIR: cannot create /proc/nope: No such file or directory"),
])
def test_a_directory_that_cannot_be_written_is_named_at_start(env, argv, line, monkeypatch, capsys):
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # never reached: the directory fails first
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(argv) == 2
    assert error_line(capsys) == line


# -- a /metrics port that is taken, named as its variable before anything is started or reached

@pytest.mark.parametrize("argv", [["worker", "--datadir", "{tmp}"],
                                  ["bridge", "--target", "node=w,url=http://127.0.0.1:9/metrics"],
                                  ["trainer"], ["pods", "--api-url", "http://127.0.0.1:9"]])
def test_a_metrics_port_that_is_taken_is_named(argv, tmp_path, monkeypatch, capsys):
    import socket

    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        monkeypatch.setenv("RTT_METRICS_PORT", str(port))
        monkeypatch.setenv("RTT_METRICS_HOST", "127.0.0.1")
        monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # never reached: the port fails first
        monkeypatch.setenv("RTT_MODELS_DIR", str(tmp_path / "models"))
        if argv[0] == "pods":  # it writes to Redis (never reached either)
            monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
        assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    assert error_line(capsys) == (f"rttsched {argv[0]}: error: RTT_METRICS_PORT: cannot listen on 127.0.0.1:{port}: "
                                  "Address already in use")


@pytest.mark.parametrize("url", ["http://127.0.0.1:abc", "http://[::1", "ftp://h", "http://"])
def test_a_pods_api_url_that_is_no_url_is_named(url, monkeypatch, capsys):
    monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    assert main(["pods", "--once", "--api-url", url]) == 2
    assert error_line(capsys).startswith("rttsched pods: error: --api-url: ")


@pytest.mark.parametrize(("argv", "line"), [
    (["worker", "--history-s", "inf"], "rttsched worker: error: --history-s: must be finite (got inf)"),
    (["worker", "--history-s", "1e6"],
     "rttsched worker: error: --history-s: must be <= 86400 s, a day (got 1000000.0)"),
    (["worker", "--session-timeout-s", "inf"], "rttsched worker: error: --session-timeout-s: must be finite (got inf)"),
    (["worker", "--id", "a b/c"],
     "rttsched worker: error: --id: letters, digits, '.', '_' and '-' only (got 'a b/c')"),
    (["topics", "list", "--worker-id", "a b/c"],
     "rttsched topics: error: --worker-id: letters, digits, '.', '_' and '-' only (got 'a b/c')"),
])
def test_a_flag_holds_to_the_bounds_of_its_variable(argv, line, capsys):
    assert main(argv) == 2
    assert error_line(capsys) == line


@pytest.mark.parametrize("host", ["nonexistent.invalid", "192.0.2.1"])  # no such name; an address not this host's
@pytest.mark.parametrize("argv", [["worker", "--datadir", "{tmp}"],
                                  ["bridge", "--target", "node=w,url=http://127.0.0.1:9/metrics"],
                                  ["trainer"], ["pods", "--api-url", "http://127.0.0.1:9"]])
def test_a_metrics_host_it_cannot_listen_on_is_named(argv, host, tmp_path, monkeypatch, capsys):
    """The host is what is wrong, not the port: the line names RTT_METRICS_HOST."""
    monkeypatch.setenv("RTT_METRICS_PORT", "19105")
    monkeypatch.setenv("RTT_METRICS_HOST", host)
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # never reached: the host fails first
    monkeypatch.setenv("RTT_MODELS_DIR", str(tmp_path / "models"))
    if argv[0] == "pods":
        monkeypatch.setenv("REDIS_URL", "redis://127.0.0.1:1/0")
    assert main([a.format(tmp=tmp_path) for a in argv]) == 2
    said = f"rttsched {argv[0]}: error: RTT_METRICS_HOST: cannot listen on {host}:19105: "
    assert error_line(capsys).startswith(said)


@pytest.mark.parametrize("host", ["nonexistent.invalid", "192.0.2.1"])  # no such name; an address not this host's
def test_a_broker_host_it_cannot_listen_on_is_named(host, capsys):
    assert main(["broker", "--port", "0", "--host", host, "--no-topics"]) == 2
    assert error_line(capsys).startswith(f"rttsched broker: error: --host: cannot listen on {host}: ")


@pytest.mark.parametrize(("url", "detail"), [
    ("http://127.0.0.1:abc", "not a URL: Port could not be cast to integer value as 'abc'"),
    ("http://[::1", "not a URL: Invalid IPv6 URL"),
    ("http://h:99999", "not a URL: Port out of range 0-65535"),
    ("http://:80", "names no host"),
])
def test_explain_url_that_is_no_url_is_named(url, detail, capsys):
    assert main(["explain", "--url", url, "--app", "gCTF", "--nodes", "a", "--timeout", "1"]) == 2
    assert error_line(capsys) == f"rttsched explain: error: --url: {detail} (got {url!r})"
