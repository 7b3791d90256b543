from __future__ import annotations

import pytest

from app.errors import ConfigError


def test_bad_config_names_the_field():
    from app.config import Settings

    with pytest.raises(ConfigError) as info:
        Settings.from_env({"RTT_EXTENDER_PORT": "70000"})
    assert info.value.field == "RTT_EXTENDER_PORT"
    with pytest.raises(ConfigError, match="RTT_SCRAPE_INTERVAL_S: must be a number"):
        Settings.from_env({"RTT_SCRAPE_INTERVAL_S": "fast"})
    with pytest.raises(ConfigError, match="RTT_COLD_START_SAMPLES: must be an integer .got '2.5'."):
        Settings.from_env({"RTT_COLD_START_SAMPLES": "2.5"})


def test_fetch_wait_is_bounded_and_named():
    from app.config import Settings

    assert Settings.from_env({}).kafka_fetch_max_wait_ms == 50
    assert Settings.from_env({"RTT_KAFKA_FETCH_MAX_WAIT_MS": "200"}).kafka_fetch_max_wait_ms == 200
    for bad in ("0", "6000"):
        with pytest.raises(ConfigError) as info:
            Settings.from_env({"RTT_KAFKA_FETCH_MAX_WAIT_MS": bad})
        assert info.value.field == "RTT_KAFKA_FETCH_MAX_WAIT_MS"


@pytest.mark.parametrize(("env", "field", "words"), [
    ({"REDIS_URL": "notaurl"}, "REDIS_URL", "must start with redis://, rediss:// or unix://"),
    ({"REDIS_URL": "redis://db:abc/0"}, "REDIS_URL", "not a URL"),
    ({"REDIS_URL": "redis://db:6379/cache"}, "REDIS_URL", "a database number"),
    ({"REDIS_URL": "redis://:hunter2@/0"}, "REDIS_URL", "names no host"),
    ({"RTT_KAFKA_BOOTSTRAP": "127.0.0.1:abc"}, "RTT_KAFKA_BOOTSTRAP", "'127.0.0.1:abc' is not host:port"),
    ({"RTT_KAFKA_BOOTSTRAP": "a:9092,b:0"}, "RTT_KAFKA_BOOTSTRAP", "'b:0' is not host:port"),
    ({"RTT_TOPIC_PREFIX": "bad prefix!"}, "RTT_TOPIC_PREFIX", "letters, digits"),
])
def test_connection_settings_are_checked_at_start(env, field, words):
    from app.config import Settings

    with pytest.raises(ConfigError) as info:
        Settings.from_env(env)
    assert info.value.field == field and words in info.value.message
    assert "hunter2" not in str(info.value)  # a password in the URL stays masked


EMBEDDED = ["kafka://127.0.0.1:9092"]  # the brokers when RTT_KAFKA_BOOTSTRAP is not set: the embedded one


@pytest.mark.parametrize(("env", "redis_url", "brokers", "prefix"), [
    ({"REDIS_URL": "redis://127.0.0.1:6379/0"}, "redis://127.0.0.1:6379/0", EMBEDDED, ""),
    ({"REDIS_URL": "rediss://:pw@redis.example:6380"}, "rediss://:pw@redis.example:6380", EMBEDDED, ""),
    ({"REDIS_URL": "unix:///run/redis.sock?db=1"}, "unix:///run/redis.sock?db=1", EMBEDDED, ""),
    ({"REDIS_URL": "redis://redis"}, "redis://redis", EMBEDDED, ""),
    ({"RTT_KAFKA_BOOTSTRAP": "[::1]:9092, kafka-0.kafka:9093"}, "",
     ["kafka://[::1]:9092", "kafka://kafka-0.kafka:9093"], ""),
    ({"RTT_TOPIC_PREFIX": "t0a1.b_c-"}, "", EMBEDDED, "t0a1.b_c-"),
], ids=["redis", "rediss-password", "unix-socket", "redis-no-port", "bootstrap-list", "prefix"])
def test_good_connection_settings_pass(env, redis_url, brokers, prefix):
    from app.config import Settings
    from app.streams.app import broker_urls

    s = Settings.from_env(env)
    assert (s.redis_url, s.redis_client_url) == (redis_url, redis_url)  # no password file: the URL as given
    assert broker_urls(s.bootstrap_servers) == brokers
    assert s.topic_prefix == prefix and s.topic("node-metrics") == f"{prefix}node-metrics"


@pytest.mark.parametrize("name", ["RTT_EXTENDER_REBUILD_INTERVAL_S", "RTT_ERROR_PERIOD_S", "RTT_DRIFT_DELTA"])
def test_an_infinite_duration_or_bound_fails_at_start(name):
    from app.config import Settings

    with pytest.raises(ConfigError) as info:
        Settings.from_env({name: "inf"})
    assert info.value.field == name and info.value.message == "must be finite (got inf)"


def test_a_bucket_longer_than_the_history_fails_at_start():
    from app.config import Settings
    from app.streams.options import WorkerOptions

    with pytest.raises(ConfigError) as info:
        WorkerOptions.from_settings(Settings.from_env({"RTT_FEATURE_BUCKET_S": "1000"}))
    assert info.value.field == "RTT_FEATURE_BUCKET_S" and "RTT_FEATURE_HISTORY_S (120.0)" in info.value.message


@pytest.mark.parametrize("name", ["RTT_FEATURE_WINDOW_S", "RTT_FEATURE_HISTORY_S", "RTT_DWA_MAX_WINDOW_S"])
def test_a_feature_window_longer_than_a_day_fails_at_start(name):
    from app.config import Settings

    with pytest.raises(ConfigError) as info:  # node-features' window_s is at most a day
        Settings.from_env({name: "90000"})
    assert info.value.field == name and "86400" in info.value.message


@pytest.mark.parametrize("bad", ["0", "-5", "inf", "a day"])
def test_the_trainer_key_idle_time_is_checked_at_start(bad):
    from app.config import Settings
    from app.trainer.service import TrainerService

    assert Settings.from_env({}).trainer_key_idle_s == 86_400.0
    assert Settings.from_env({"RTT_TRAINER_KEY_IDLE_S": "3600"}).trainer_key_idle_s == 3600.0
    with pytest.raises(ConfigError) as info:
        Settings.from_env({"RTT_TRAINER_KEY_IDLE_S": bad})
    assert info.value.field == "RTT_TRAINER_KEY_IDLE_S"
    with pytest.raises(ValueError, match="key_idle_s"):
        TrainerService(Settings(), key_idle_s=0.0)


@pytest.mark.parametrize(("path", "words"), [
    ("/nonexistent/redis-password", "no such file: /nonexistent/redis-password"),
    ("{tmp}", "a directory, not a file: {tmp} (name the file in it"),  # a mounted Secret's directory, not its key
    ("/dev/null", "not a regular file: /dev/null"),
])
def test_a_secret_file_setting_says_what_is_wrong_with_the_path(path, words, tmp_path):
    from app.config import Settings

    with pytest.raises(ConfigError) as info:
        Settings.from_env({"RTT_REDIS_PASSWORD_FILE": path.format(tmp=tmp_path)})
    assert info.value.field == "RTT_REDIS_PASSWORD_FILE" and words.format(tmp=tmp_path) in info.value.message


@pytest.mark.parametrize(("name", "value", "problem"), [
    ("RTT_PODS_RESYNC_S", "1e300", "must be <= 86400 s, a day"),
    ("RTT_PODS_RESYNC_S", "inf", "must be finite"),
    ("RTT_PODS_TTL_S", "nan", "must be >= 0"),
    ("RTT_PODS_TTL_S", "1e300", "must be <= 259200 s, 3 days"),
])
def test_the_pods_watcher_s_periods_are_checked_in_every_process_that_reads_them(name, value, problem):
    """The extender reads RTT_PODS_RESYNC_S too (its view is stale after 2 x it): a period whose TTL in ms Redis
    cannot take is refused at the start of every command, not only of ``rttsched pods``."""
    from app.config import Settings

    with pytest.raises(ConfigError, match=f"{name}: {problem}"):
        Settings.from_env({name: value})


def test_the_metrics_a_worker_keeps_fit_the_training_samples_contract():
    """A worker keeping more metrics per node than a training sample can carry (5 aggregates each, a running-pods
    count per app, the hardware and task columns) would write samples the trainer dead-letters: refused at start.
    The figures config.py keeps are those of the contract and of the feature builder."""
    from app.config import FEATURES_PER_METRIC, SAMPLE_FEATURES_MAX, SAMPLE_OTHER_FEATURES, Settings
    from app.contracts import contract
    from app.features.hardware import hardware_features
    from app.features.vector import AGGREGATES

    features = contract("training-samples").value_schema["properties"]["features"]
    assert SAMPLE_FEATURES_MAX == features["maxProperties"]
    assert FEATURES_PER_METRIC == len(AGGREGATES)
    assert len(hardware_features("gpu", "RTX 4090", 16, 1)) + 1 <= SAMPLE_OTHER_FEATURES  # + task_input_size_mb
    assert Settings.from_env({"RTT_FEATURE_MAX_METRICS": "300"}).feature_max_metrics == 300
    with pytest.raises(ConfigError, match=r"RTT_FEATURE_MAX_METRICS: must be <= 300 with RTT_WORKER_MAX_APPS=64 "):
        Settings.from_env({"RTT_FEATURE_MAX_METRICS": "301"})
    with pytest.raises(ConfigError, match=r"must be <= 253 with RTT_WORKER_MAX_APPS=300 \(got 256\)"):
        Settings.from_env({"RTT_WORKER_MAX_APPS": "300", "RTT_FEATURE_MAX_METRICS": "256"})
    # so many apps that no metric fits: the apps are named, with a bound that can be met (it said "<= -7")
    with pytest.raises(ConfigError, match=r"RTT_WORKER_MAX_APPS: must be <= 1563 \(got 1600\)"):
        Settings.from_env({"RTT_WORKER_MAX_APPS": "1600", "RTT_FEATURE_MAX_METRICS": "1"})
    assert Settings.from_env({"RTT_WORKER_MAX_APPS": "1563", "RTT_FEATURE_MAX_METRICS": "1"}).worker_max_apps == 1563
