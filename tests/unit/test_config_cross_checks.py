"""Settings that a command refused at its start are refused by the settings themselves, so that ``rttsched settings``
(which validates and prints them) and every command refuse them alike, in one line naming the variable, exit 2:
a trainer margin of 1, a CPU list that is not one, SASL settings with a protocol that is not SASL; too many apps for
the metrics kept name the apps when only they were set. What only a command knows stays its own check: whether the
trainer's CPUs are there (the settings may be checked on another machine), the pods watcher's TTL against a resync
its ``--resync`` may give, and the worker's feature history against its windows and bucket (its ``--history-s`` may
give another; ``rttsched settings`` refuses what the worker would without flags)."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import pytest

from app.cli.main import main
from app.config import Settings
from app.errors import ConfigError


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("RTT_") or name == "REDIS_URL":
            monkeypatch.delenv(name)


def refused(env: dict[str, str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    return info.value


def error_line(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(("env", "line"), [
    ({"RTT_TRAINER_MARGIN": "1"}, "RTT_TRAINER_MARGIN: must be in [0, 1) (got 1.0)"),
    ({"RTT_TRAINER_CPUS": "zz"}, "RTT_TRAINER_CPUS: bad CPU list 'zz'"),
    ({"RTT_TRAINER_CPUS": "3-1"}, "RTT_TRAINER_CPUS: bad CPU range '3-1' in '3-1'"),
])
@pytest.mark.parametrize("command", [["settings"], ["settings", "--json"], ["worker"], ["trainer"], ["extender"]])
def test_settings_a_command_refused_at_start_are_refused_by_every_command(
        env: dict[str, str], line: str, command: list[str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # never reached: the settings fail first
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(command) == 2
    assert error_line(capsys) == f"rttsched {command[0]}: error: {line}"
    assert refused(env).field == line.split(":")[0]


@pytest.mark.parametrize(("env", "line"), [
    ({"RTT_FEATURE_HISTORY_S": "10"}, "RTT_FEATURE_HISTORY_S: must be >= RTT_DWA_MAX_WINDOW_S (60.0) (got 10.0)"),
    ({"RTT_FEATURE_BUCKET_S": "1000"}, "RTT_FEATURE_BUCKET_S: must be <= RTT_FEATURE_HISTORY_S (120.0) (got 1000.0)"),
])
@pytest.mark.parametrize("command", [["settings"], ["settings", "--json"], ["worker"]])
def test_the_worker_s_history_checks_are_refused_by_settings_as_by_the_worker(
        env: dict[str, str], line: str, command: list[str], monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    """The feature history against the windows and the bucket is the worker's (its --history-s may change it), and
    rttsched settings refuses what the worker would without flags."""
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # never reached: the options fail first
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(command) == 2
    assert error_line(capsys) == f"rttsched {command[0]}: error: {line}"


def test_the_worker_s_history_flag_overrides_a_history_the_windows_alone_would_refuse(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """RTT_DWA_MAX_WINDOW_S=300 with the default history (120 s) is refused, unless --history-s gives a longer one:
    the worker then goes on to its broker (none here), not stopping at the settings."""
    monkeypatch.setenv("RTT_DWA_MAX_WINDOW_S", "300")
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", "127.0.0.1:1")
    monkeypatch.setenv("RTT_KAFKA_START_WAIT_S", "0.1")  # it waits for its broker no longer than this
    assert Settings.from_env({"RTT_DWA_MAX_WINDOW_S": "300"}).feature_history_s == 120.0  # the settings take it
    assert main(["worker", "--history-s", "600", "--datadir", str(tmp_path)]) == 2
    assert "cannot reach Kafka" in error_line(capsys)


def test_the_commands_own_checks_still_name_their_flags(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["worker", "--history-s", "30"]) == 2
    assert error_line(capsys) == ("rttsched worker: error: --history-s: must be >= RTT_DWA_MAX_WINDOW_S (60.0)"
                                  " (got 30.0)")
    assert main(["trainer", "--margin", "1"]) == 2
    assert error_line(capsys) == "rttsched trainer: error: --margin: must be in [0, 1) (got 1.0)"


def test_a_margin_below_one_and_a_history_as_long_as_the_window_are_taken() -> None:
    assert Settings.from_env({"RTT_TRAINER_MARGIN": "0.99"}).trainer_margin == 0.99
    assert Settings.from_env({"RTT_TRAINER_MARGIN": "0"}).trainer_margin == 0.0
    assert Settings.from_env({"RTT_FEATURE_HISTORY_S": "60"}).feature_history_s == 60.0
    assert Settings.from_env({"RTT_FEATURE_BUCKET_S": "120"}).feature_bucket_s == 120.0
    assert refused({"RTT_TRAINER_MARGIN": "nan"}).message == "must be in [0, 1) (got nan)"


def test_a_cpu_list_is_checked_for_its_syntax_only_and_fast() -> None:
    """The CPUs themselves are checked by the trainer where it runs (it pins itself at start, naming the CPUs it may
    use): the settings may be validated on another machine, and every process reads them."""
    assert Settings.from_env({"RTT_TRAINER_CPUS": "0,2,4-5"}).trainer_cpus == "0,2,4-5"
    assert Settings.from_env({"RTT_TRAINER_CPUS": "4095"}).trainer_cpus == "4095"  # not here, maybe there
    assert Settings.from_env({"RTT_TRAINER_CPUS": "  "}).trainer_cpus == ""
    started = time.perf_counter()
    problem = refused({"RTT_TRAINER_CPUS": "0-999999999"})
    assert time.perf_counter() - started < 0.5  # not a set of a billion CPUs
    assert str(problem) == "RTT_TRAINER_CPUS: CPU 999999999 in '0-999999999' is above any machine's (at most 65535)"
    assert str(refused({"RTT_TRAINER_CPUS": ","})) == "RTT_TRAINER_CPUS: empty CPU list ','"


def test_a_pods_ttl_below_the_settings_resync_is_left_to_the_pods_watcher(capsys: pytest.CaptureFixture[str]) -> None:
    """``rttsched pods --resync 2`` takes ``RTT_PODS_TTL_S=5``: refusing it in the settings would refuse a right
    combination, and stop every other process sharing the settings on a value only the pods watcher reads."""
    from app.cli.pods import _options

    settings = Settings.from_env({"RTT_PODS_TTL_S": "5"})
    args = argparse.Namespace(resync=2.0, ttl=None, poll=False)
    assert _options(args, settings).key_ttl_ms == 5000
    args.resync = None
    with pytest.raises(ConfigError, match=r"RTT_PODS_TTL_S: must be >= RTT_PODS_RESYNC_S \(got 5.0\)"):
        _options(args, settings)


# -- SASL settings with a protocol that is not SASL


def secret(tmp_path: Path) -> str:
    path = tmp_path / "sasl-password"
    path.write_text("pw\n")
    return str(path)


@pytest.mark.parametrize("protocol", ["PLAINTEXT", "SSL"])
def test_sasl_settings_need_a_sasl_protocol(protocol: str, tmp_path: Path) -> None:
    base = {"RTT_KAFKA_SECURITY_PROTOCOL": protocol}
    problem = refused({**base, "RTT_KAFKA_SASL_MECHANISM": "PLAIN"})
    assert str(problem) == (f"RTT_KAFKA_SECURITY_PROTOCOL: RTT_KAFKA_SASL_MECHANISM is set but the protocol is "
                            f"{protocol}: SASL needs SASL_PLAINTEXT or SASL_SSL")
    problem = refused({**base, "RTT_KAFKA_SASL_MECHANISM": "PLAIN", "RTT_KAFKA_SASL_USERNAME": "u",
                       "RTT_KAFKA_SASL_PASSWORD_FILE": secret(tmp_path)})
    assert problem.field == "RTT_KAFKA_SECURITY_PROTOCOL"
    assert problem.message.startswith("RTT_KAFKA_SASL_MECHANISM, RTT_KAFKA_SASL_USERNAME, RTT_KAFKA_SASL_PASSWORD_FILE"
                                      f" are set but the protocol is {protocol}")
    assert refused({**base, "RTT_KAFKA_SASL_USERNAME": "u"}).field == "RTT_KAFKA_SECURITY_PROTOCOL"


@pytest.mark.parametrize("protocol", ["SASL_PLAINTEXT", "SASL_SSL"])
def test_sasl_settings_are_taken_with_a_sasl_protocol(protocol: str, tmp_path: Path) -> None:
    s = Settings.from_env({"RTT_KAFKA_SECURITY_PROTOCOL": protocol, "RTT_KAFKA_SASL_MECHANISM": "SCRAM-SHA-256",
                           "RTT_KAFKA_SASL_USERNAME": "u", "RTT_KAFKA_SASL_PASSWORD_FILE": secret(tmp_path)})
    assert s.kafka_sasl_mechanism == "SCRAM-SHA-256"


def test_topics_list_refuses_sasl_settings_on_plaintext(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    """It ran on PLAINTEXT, exit 0, the SASL settings silently ignored."""
    monkeypatch.setenv("RTT_KAFKA_BOOTSTRAP", "127.0.0.1:1")  # never reached
    for name, value in (("RTT_KAFKA_SASL_MECHANISM", "PLAIN"), ("RTT_KAFKA_SASL_USERNAME", "u"),
                        ("RTT_KAFKA_SASL_PASSWORD_FILE", secret(tmp_path))):
        monkeypatch.setenv(name, value)
    assert main(["topics", "list"]) == 2
    assert error_line(capsys).startswith("rttsched topics: error: RTT_KAFKA_SECURITY_PROTOCOL: "
                                         "RTT_KAFKA_SASL_MECHANISM, ")


# -- too many apps for the metrics kept, named as the variable that was set


def test_too_many_apps_name_the_apps_when_the_metrics_kept_are_the_default(capsys: pytest.CaptureFixture[str],
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    problem = refused({"RTT_WORKER_MAX_APPS": "1000"})
    assert problem.field == "RTT_WORKER_MAX_APPS"
    assert problem.message.startswith("must be <= 288 with RTT_FEATURE_MAX_METRICS=256, its default (got 1000): ")
    assert problem.message.endswith("or set RTT_FEATURE_MAX_METRICS <= 113")
    assert Settings.from_env({"RTT_WORKER_MAX_APPS": "288"}).worker_max_apps == 288
    assert refused({"RTT_WORKER_MAX_APPS": "289"}).field == "RTT_WORKER_MAX_APPS"
    # both set: the metrics kept are named, as before
    problem = refused({"RTT_WORKER_MAX_APPS": "1000", "RTT_FEATURE_MAX_METRICS": "256"})
    assert str(problem).startswith("RTT_FEATURE_MAX_METRICS: must be <= 113 with RTT_WORKER_MAX_APPS=1000 (got 256)")
    assert Settings.from_env({"RTT_WORKER_MAX_APPS": "1000", "RTT_FEATURE_MAX_METRICS": "113"}).worker_max_apps == 1000
    monkeypatch.setenv("RTT_WORKER_MAX_APPS", "1000")
    assert main(["settings"]) == 2
    assert error_line(capsys).startswith("rttsched settings: error: RTT_WORKER_MAX_APPS: must be <= 288 with ")
