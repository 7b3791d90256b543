"""Publishing rtt-predictions: CPU per record from a decision to a record batch, beside the plain ways.

    python3 bench/bench_publish.py                 # 64 and 5,000 candidates, 5 trials each
    python3 bench/bench_publish.py --nodes 64 --requests 1000
    python3 bench/bench_publish.py --quick         # about 4,000 records, 2 trials each

Every prioritize answer publishes one rtt-predictions record per fresh candidate, so at 64 nodes the
extender encodes and batches 64 records a request. Three ways over the same decisions (the extender's own
``decide`` on the bench view, every request a different pod):

* ``dicts``: each record's contract value as a dict (``decision_values``), ``orjson.dumps``, and aiokafka's
  public ``BatchBuilder.append`` — the straightforward way;
* ``prepared + public append``: the publisher's encoding (``encode_prepared``) and the public append;
* ``extender``: the publisher's encoding and ``KafkaSink.send_many`` (batches per partition, appended past
  the builder's per-record Python layer).

The batches go nowhere (a producer that only builds them): no broker, one thread. Best of the trials,
µs per record; the ratio is against ``dicts``.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import orjson
from aiokafka.producer.message_accumulator import BatchBuilder
from arguments import positive_int
from extender_setup import in_process_service, payload, train, view, with_input_size

from app.config import Settings
from app.extender.kafka_sink import BATCH_BYTES, KafkaSink
from app.extender.predictions import decision_values, encode_prepared, prepare
from app.extender.protocol import parse_args
from app.kafka.batches import partition_for

NOW = 1_715_678_500.0
PARTITIONS = 8


class _BuildOnly:
    """The two producer calls the sink makes: batches are built, never sent."""

    def create_batch(self) -> BatchBuilder:
        return BatchBuilder(BATCH_BYTES, 0)

    async def send_batch(self, batch: BatchBuilder, _topic: str, partition: int) -> asyncio.Future[None]:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        fut.set_result(None)
        return fut


def _public_append(open_: dict[int, BatchBuilder], records: list[tuple[bytes, bytes]]) -> None:
    for key, value in records:
        p = partition_for(key, PARTITIONS)
        batch = open_.get(p)
        if batch is None or batch.append(key=key, value=value, timestamp=None) is None:
            batch = open_[p] = BatchBuilder(BATCH_BYTES, 0)
            batch.append(key=key, value=value, timestamp=None)


async def measure(n: int, requests: int, trials: int) -> dict[str, float]:
    service = in_process_service(train(), view(n, NOW - 1), NOW)
    body = payload(n, "names")
    decisions = [service._decide("prioritize", parse_args(with_input_size(body, i))) for i in range(requests)]
    prepared = [p for d in decisions if (p := prepare(d, NOW)) is not None]
    records = sum(len(part) for p in prepared for part in encode_prepared(p))
    sink = KafkaSink(Settings())
    sink._producer, sink._partitions = _BuildOnly(), PARTITIONS
    best = {"dicts": float("inf"), "prepared + public append": float("inf"), "extender": float("inf")}
    for trial in range(trials):
        print(f"[bench] {n} nodes: trial {trial + 1}/{trials} ({requests} requests, {records} records)", flush=True)
        t0 = time.perf_counter()
        open_: dict[int, Any] = {}
        for d in decisions:
            _public_append(open_, [(v["node"].encode(), orjson.dumps(v)) for v in decision_values(d, NOW)])
        t1 = time.perf_counter()
        open_ = {}
        for p in prepared:
            for part in encode_prepared(p):
                _public_append(open_, part)
        t2 = time.perf_counter()
        for p in prepared:
            for part in encode_prepared(p):
                await sink.send_many(part)
                if sink._busy:  # a full batch handed over: let it go in, as the publisher's pauses do
                    await asyncio.sleep(0)
        t3 = time.perf_counter()
        sink._open.clear()
        sink._handed.clear()
        for name, seconds in (("dicts", t1 - t0), ("prepared + public append", t2 - t1), ("extender", t3 - t2)):
            best[name] = min(best[name], seconds / records * 1e6)
    if sink._timer is not None:
        sink._timer.cancel()
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--nodes", type=positive_int, nargs="*", default=None,
                    help="candidates per request (default 64 5000)")
    ap.add_argument("--requests", type=int, default=0,
                    help="requests per trial (default: about 20,000 records; --quick: about 4,000)")
    ap.add_argument("--trials", type=positive_int, default=None, help="trials (default 5; --quick: 2)")
    ap.add_argument("--quick", action="store_true", help="fewer records and trials")
    a = ap.parse_args()
    nodes = a.nodes or [64, 5000]
    trials = a.trials or (2 if a.quick else 5)
    records = 4_000 if a.quick else 20_000
    rows = []
    for n in nodes:
        requests = a.requests or max(4, records // n)
        rows.append((n, asyncio.run(measure(n, requests, trials))))
    print("\n| candidates | way | µs per record | × dicts |")
    print("|---|---|---|---|")
    for n, best in rows:
        for name, us in best.items():
            print(f"| {n:,} | {name} | {us:.2f} | {best['dicts'] / us:.2f} |")


if __name__ == "__main__":
    main()
