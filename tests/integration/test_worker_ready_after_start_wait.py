"""A worker started before its topics, on the real embedded broker: while it waits its port serves its own series
(``rtt_kafka_start_waiting`` 1 among them) and ``/readyz`` 503, and :func:`app.sim.scripted.start_worker` -- like
every wait of the tests and benchmarks for "the worker runs" -- returns only once Faust's web server answers
``/readyz`` 200, where the same series go on (``rtt_kafka_start_waiting`` 0). Before, the wait returned on the
first ``/metrics`` 200, which the waiting worker answered with an empty page before Faust ran, and nothing in that
page said it waited."""

from __future__ import annotations

import asyncio
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from app.cli.processes import ProcessGroup
from app.config import Settings
from app.kafka.admin import ensure_topics
from app.kafka.embedded import free_port
from app.sim import scripted
from app.sim.scripted import metric_value

pytestmark = pytest.mark.integration


def get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as r:  # noqa: S310 - loopback URL we built
            return r.status, r.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_start_worker_returns_once_faust_runs_and_the_waiting_gauge_is_one_series_across_the_wait(
        kafka_bootstrap: str, settings_factory: Callable[..., Settings], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    s = settings_factory(kafka_bootstrap=kafka_bootstrap)  # its topics not created yet
    port = free_port()
    monkeypatch.setattr(scripted, "free_port", lambda: port)
    base = f"http://127.0.0.1:{port}"
    with ProcessGroup(tmp_path) as group:
        returned: list[str] = []
        failed: list[BaseException] = []

        def start() -> None:
            try:
                returned.append(scripted.start_worker(group, s, "worker"))
            except BaseException as exc:  # noqa: BLE001 - said by the assertion below
                failed.append(exc)

        starting = threading.Thread(target=start, daemon=True)
        starting.start()
        deadline = time.monotonic() + 60
        while "waiting for Kafka: no topic" not in group.log_tail("worker", 200):
            assert time.monotonic() < deadline and not failed, (failed, group.log_tail("worker"))
            time.sleep(0.1)
        time.sleep(3.0)  # a few tries more, its port answering /metrics meanwhile
        status, page = get(f"{base}/metrics")
        assert status == 200 and metric_value(page, "rtt_kafka_start_waiting") == 1.0, page
        assert "# TYPE rtt_worker_nodes gauge" in page  # the registry Faust's page serves after
        assert get(f"{base}/readyz")[0] == 503
        assert not returned and not failed, "start_worker returned while the worker waited for its topics"

        asyncio.run(ensure_topics(s))
        topics_at = time.monotonic()
        starting.join(90)
        assert returned == [f"{base}/metrics"], (failed, group.log_tail("worker"))
        print(f"start_worker returned {time.monotonic() - topics_at:.1f} s after the topics were created")
        assert get(f"{base}/readyz") == (200, '{"ready":true,"degraded":{}}')
        page = get(f"{base}/metrics")[1]
        assert "\nrtt_kafka_start_waiting 0.0\n" in page, page  # the same series, through
        assert "# TYPE rtt_worker_nodes gauge" in page
