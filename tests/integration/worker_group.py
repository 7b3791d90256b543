"""Helpers of the several-workers test: node names one per partition, the group's assignment, /metrics samples.

A worker's partitions are read from its own log: aiokafka logs ``Joined group '<id>' (generation N)`` on
every (re)join, and the feedback table logs ``partitions [..]: restored ...`` once the partitions of that
generation are recovered. The group has settled when every worker reports the same generation and their
partitions split the topic's partitions between them.

>>> log = ("... Joined group 'g' (generation 0) with member_id m\\n"
...        "... partitions [0, 1, 2, 3, 4, 5, 6, 7]: restored 0 join entries, 0 node trackers\\n"
...        "... Joined group 'g' (generation 1) with member_id m\\n"
...        "... partitions [1, 3, 5, 7]: restored 0 join entries, 0 node trackers\\n")
>>> assignment(log)
Assignment(generation=1, partitions=frozenset({1, 3, 5, 7}))
>>> assignment(log.rsplit("... partitions", 1)[0]) is None   # rejoined, not recovered yet
True
>>> labelled('m_total{topic="a"} 3.0\\nm_total{topic="b"} 1.0\\nother 2\\n', "m_total", "topic")
{'a': 3.0, 'b': 1.0}
"""

from __future__ import annotations

import dataclasses
import re
import time
import urllib.request
from collections.abc import Sequence

from app.cli.processes import ProcessError, ProcessGroup
from app.config import Settings
from app.kafka.embedded import free_port
from app.sim.scripted import parse_line

_JOINED = re.compile(r"Joined group '[^']+' \(generation (-?\d+)\)")
_RESTORED = re.compile(r"partitions \[([\d, ]*)\]: restored")


@dataclasses.dataclass(frozen=True)
class Assignment:
    generation: int
    partitions: frozenset[int]


def assignment(log_text: str) -> Assignment | None:
    """The worker's active partitions of its latest generation; None until that generation is recovered."""
    joins = list(_JOINED.finditer(log_text))
    if not joins:
        return None
    last = joins[-1]
    restored = list(_RESTORED.finditer(log_text, last.end()))
    if not restored:
        return None
    parts = restored[-1].group(1)
    return Assignment(int(last.group(1)), frozenset(int(p) for p in parts.split(",") if p.strip()))


def wait_settled(group: ProcessGroup, names: Sequence[str], partitions: int,
                 timeout_s: float = 45.0) -> dict[str, Assignment]:
    """Wait until every worker of ``names`` holds a non-empty share of one generation's assignment."""
    deadline = time.monotonic() + timeout_s
    seen: dict[str, Assignment | None] = {}
    while time.monotonic() < deadline:
        group.check()
        seen = {n: assignment((group.log_dir / f"{n}.log").read_text(errors="replace")) for n in names}
        done = [a for a in seen.values() if a is not None]
        if len(done) == len(names) and len({a.generation for a in done}) == 1 and all(a.partitions for a in done):
            covered = [p for a in done for p in a.partitions]
            if sorted(covered) == list(range(partitions)):
                return {n: a for n, a in seen.items() if a is not None}
        time.sleep(0.2)
    tails = "\n".join(f"--- {n}\n{group.log_tail(n, 8)}" for n in names)
    raise ProcessError(f"the group did not settle within {timeout_s:.0f}s: {seen}\n{tails}")


def start_workers(group: ProcessGroup, s: Settings, names: Sequence[str], **env: str) -> dict[str, str]:
    """Start one ``rttsched worker`` per name in ``s``'s group (same prefix), each with its own /metrics port
    and data directory; their /metrics URLs once every one runs (its Faust web server's /readyz 200: a worker that
    still waits for Kafka at start answers /metrics too)."""
    urls = {}
    for name in names:
        port = free_port()
        group.start(name, ["worker", "--datadir", str(group.log_dir / f"faust-{name}")], env={
            "RTT_KAFKA_BOOTSTRAP": s.bootstrap_servers, "RTT_TOPIC_PREFIX": s.topic_prefix,
            "RTT_METRICS_PORT": str(port), "RTT_MODELS_DIR": s.models_dir, "REDIS_URL": "", **env,
        })
        urls[name] = f"http://127.0.0.1:{port}/metrics"
    for name, url in urls.items():
        group.wait_http(name, url.replace("/metrics", "/readyz"), timeout_s=40)
    return urls


def scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as resp:  # noqa: S310 - loopback URL built by the test
        return str(resp.read().decode())


def labelled(text: str, name: str, label: str) -> dict[str, float]:
    """``{label value: sample value}`` of metric ``name`` in a Prometheus exposition."""
    out = {}
    for line in text.splitlines():
        parsed = parse_line(line)
        if parsed and parsed[0] == name and label in parsed[1]:
            out[parsed[1][label]] = parsed[2]
    return out
