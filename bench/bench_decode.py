"""Decoding a message at the edge: the contract's reference decoder against the edge decoder's paths.

    python3 bench/bench_decode.py            # 5,000 messages a topic, best of 7
    python3 bench/bench_decode.py --quick    # 1,000, best of 3

Per topic, µs per message for realistic values: ``app.contracts.decode`` (``orjson`` + the contract's
generated validator), the edge decoder without its typed path (number maps checked in C, the rest by the
validator; the plain validator where a contract has no number map), and the edge decoder as it runs (typed:
one msgspec pass); each result checked equal to the reference's. Ratios are against the reference. The last
column is the edge decoder on the same messages with one field their contract does not declare (a newer
release's, ignored: ``app.contracts.unknown``).
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_worker import snapshot  # noqa: E402
from extender_setup import features_value  # noqa: E402

from app.contracts.codec import decode, encode  # noqa: E402
from app.contracts.edge import EdgeDecoder  # noqa: E402
from app.contracts.unknown import UNKNOWN_FIELDS  # noqa: E402


def messages(n: int) -> dict[str, list[bytes]]:
    """node-metrics as bench_worker.py sends them (30 metrics), node-features as bench_extender.py's feed (40
    features), rtt-predictions and task-completions of a 64-node cluster."""
    rng = np.random.default_rng(1)
    ts = time.time()
    return {
        "node-metrics": [snapshot(i, n, ts + i, rng)[1] for i in range(n)],
        "node-features": [encode("node-features", features_value(f"gpu-{i:04d}", i, ts + i, rng), check=False)
                          for i in range(n)],
        "rtt-predictions": [orjson.dumps({
            "task_id": f"task-{i}", "app": "gCTF", "node": f"gpu-{i % 64:04d}", "ts": ts, "predicted_rtt_ms": 100.0 + i,
            "model_version": 3, "model_key": "gCTF:gpu",
            "features": {"running_pods_gCTF": float(i % 3), "running_pods_upload": 0.0}}) for i in range(n)],
        "task-completions": [orjson.dumps({
            "task_id": f"task-{i}", "app": "gCTF", "node": f"gpu-{i % 64:04d}", "submitted_ts": ts,
            "started_ts": ts + 0.1, "finished_ts": ts + 0.4, "rtt_ms": 400.0, "status": "ok",
            "input_size_mb": 512.0}) for i in range(n)],
    }


def best_us(fn: Callable[[bytes], Any], raws: list[bytes], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for raw in raws:
            fn(raw)
        best = min(best, time.perf_counter() - t0)
    return best / len(raws) * 1e6


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    n, rounds = (1000, 3) if a.quick else (5000, 7)
    print(f"µs per message, best of {rounds} rounds of {n:,} messages; x = reference / path")
    print(f"{'topic':<18} {'reference':>10} {'maps/plain':>11} {'x':>6} {'typed':>8} {'x':>6} {'+unknown':>9}")
    logging.getLogger("app.contracts.unknown").setLevel(logging.ERROR)  # the field's one warning
    for topic, raws in messages(n).items():
        untyped, typed = EdgeDecoder(topic, typed=False), EdgeDecoder(topic)
        for raw in raws[:200]:
            want = decode(topic, raw)
            if untyped(raw) != want or typed(raw) != want:
                raise SystemExit(f"{topic}: a path disagrees with the reference decoder on {raw[:80]!r}")
        ref = best_us(lambda r, t=topic: decode(t, r), raws, rounds)  # type: ignore[misc]
        old, new = best_us(untyped, raws, rounds), best_us(typed, raws, rounds)
        newer = [raw[:-1] + b',"zone":"eu-1"}' for raw in raws]  # one field this release does not know
        if typed(newer[0]) != decode(topic, raws[0]):
            raise SystemExit(f"{topic}: an unknown field changed the value decoded")
        unknown = best_us(typed, newer, rounds)
        print(f"{topic:<18} {ref:>10.2f} {old:>11.2f} {ref / old:>5.2f}x {new:>8.2f} {ref / new:>5.2f}x {unknown:>9.2f}"
              f"   ({untyped.mode} / {typed.mode})", flush=True)
    UNKNOWN_FIELDS.clear()
    return 0


if __name__ == "__main__":
    sys.exit(main())
