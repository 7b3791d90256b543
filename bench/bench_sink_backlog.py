"""The extender's rtt-predictions sink under a slow broker: one batch per partition per linger (as before) vs
one batch per partition inside the producer, records riding along while it waits (``KafkaSink`` now).

Every produce round trip is made ``DELAY`` ms longer (the client's ``send`` sleeps after a produce response);
144 records/s over 6 nodes (24 requests/s, one record per node each, ~300 bytes) for ``--seconds`` on the
embedded broker. Per sink and delay: records delivered, dropped, delivery latency (``send_many`` to the
broker's acknowledgement) p50 / p99 / max, and the new sink against the old as ratios.

    python3 bench/bench_sink_backlog.py             # ~2.5 min
    python3 bench/bench_sink_backlog.py --quick     # 5 s per run
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

from aiokafka.client import AIOKafkaClient
from arguments import positive_float

from app.config import Settings
from app.extender.kafka_sink import KafkaSink, _append
from app.extender.metrics import ExtenderMetrics
from app.extender.predictions import Record
from app.kafka.admin import ensure_topics
from app.kafka.batches import partition_for
from app.kafka.embedded import EmbeddedBroker

DELAYS_MS = (0, 30, 60, 150)
NODES = [f"bench-node-{i}".encode() for i in range(6)]
RATE_HZ = 24
VALUE = b'{"x":' + b"1" * 300 + b"}"
_delay_s = 0.0
_send = AIOKafkaClient.send


async def _slow_send(self: AIOKafkaClient, node_id: int, request: Any, *args: Any, **kwargs: Any) -> Any:
    response = await _send(self, node_id, request, *args, **kwargs)
    if _delay_s and type(request).__name__.startswith("ProduceRequest"):
        await asyncio.sleep(_delay_s)
    return response


class OneBatchPerLinger(KafkaSink):
    """The sink as it was: every linger, each open batch handed to ``send_batch`` in a task of its own."""

    async def send_many(self, records: Sequence[Record]) -> None:
        ts = int(time.time() * 1000)
        for key, value in records:
            partition = partition_for(key, self._partitions)
            batch = self._open.get(partition)
            if batch is None:
                batch = self._open[partition] = self._producer.create_batch()
            if not _append(batch, key, value, ts):
                await self._ship(batch, partition)
                batch = self._open[partition] = self._producer.create_batch()
                _append(batch, key, value, ts)
        if self._open and self._timer is None:
            self._timer = asyncio.get_running_loop().call_later(self._linger_s, self._linger)

    def _linger(self) -> None:
        self._timer = None
        task = asyncio.get_running_loop().create_task(self._ship_all())
        self._shipping.add(task)
        task.add_done_callback(self._shipping.discard)

    async def _ship_all(self) -> None:
        batches, self._open = self._open, {}
        for partition, batch in batches.items():
            try:
                await self._ship(batch, partition)
            except Exception as exc:
                self._failed(batch.record_count(), exc)

    async def _ship_open(self) -> None:
        await self._ship_all()
        while any(not t.done() for t in self._shipping):
            await asyncio.gather(*self._shipping, return_exceptions=True)


class AckTimer:
    """Each record's delivery latency, ``send_many`` to the broker's acknowledgement: the caller appends a record's
    send time to ``sent_at[partition]``; a batch acknowledged adds its records' latencies, in order."""

    def __init__(self, sink: KafkaSink) -> None:
        self.sent_at: dict[int, list[float]] = defaultdict(list)
        self.acked: dict[int, int] = defaultdict(int)
        self.latencies: list[float] = []
        self.sink = sink
        self.send_batch = send_batch = sink._producer.send_batch

        async def timed(batch: Any, topic: str, *, partition: int) -> Any:
            fut = await send_batch(batch, topic, partition=partition)

            def done(f: asyncio.Future[Any]) -> None:
                if f.cancelled() or f.exception() is not None:
                    return
                first, n = self.acked[partition], batch.record_count()
                now = time.monotonic()
                self.latencies.extend(now - t for t in self.sent_at[partition][first:first + n])
                self.acked[partition] = first + n

            fut.add_done_callback(done)
            return fut

        sink._producer.send_batch = timed

    def restore(self) -> None:
        self.sink._producer.send_batch = self.send_batch


async def run(settings: Settings, sink_type: type[KafkaSink], seconds: float) -> dict[str, float]:
    metrics = ExtenderMetrics()
    sink = sink_type(settings, metrics)
    await sink.start()
    timer = AckTimer(sink)
    sent_at, latencies = timer.sent_at, timer.latencies
    sent = 0
    start = next_at = time.monotonic()
    while time.monotonic() - start < seconds:
        now = time.monotonic()
        for node in NODES:
            sent_at[partition_for(node, sink._partitions)].append(now)
        await sink.send_many([(node, VALUE) for node in NODES])
        sent += len(NODES)
        next_at += 1 / RATE_HZ
        await asyncio.sleep(max(0.0, next_at - time.monotonic()))
    delivered_in_time = len(latencies)
    lat = sorted(latencies)
    dropped = metrics.dropped._value.get()
    timer.restore()
    try:
        await asyncio.wait_for(sink.close(), 60)
    except TimeoutError:
        pass
    pct = (lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] * 1000) if lat else (lambda q: float("nan"))
    return {"sent": sent, "delivered": delivered_in_time, "dropped": dropped,
            "p50": pct(0.5), "p99": pct(0.99), "max": lat[-1] * 1000 if lat else float("nan")}


def main() -> int:
    global _delay_s
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5 s per run instead of 15")
    ap.add_argument("--seconds", type=positive_float, default=None, help="seconds per run")
    args = ap.parse_args()
    seconds = args.seconds or (5.0 if args.quick else 15.0)
    AIOKafkaClient.send = _slow_send  # type: ignore[method-assign]
    broker = EmbeddedBroker().start()
    rows: dict[tuple[int, str], dict[str, float]] = {}
    try:
        settings = Settings.from_env({}, kafka_bootstrap=broker.bootstrap, topic_prefix=f"sb{uuid.uuid4().hex[:8]}-")
        asyncio.run(ensure_topics(settings))
        for delay in DELAYS_MS:
            _delay_s = delay / 1000
            for name, sink_type in (("before", OneBatchPerLinger), ("now", KafkaSink)):
                print(f"[bench] +{delay} ms per produce round trip, {name}: {seconds:.0f} s", file=sys.stderr)
                rows[delay, name] = asyncio.run(run(settings, sink_type, seconds))
    finally:
        broker.stop()
    print(f"\nrtt-predictions sink, 144 records/s over 6 nodes for {seconds:.0f} s, embedded broker (Tansu); latency: "
          "send_many to acknowledgement, of the records acknowledged before the run's end")
    print(f"{'+RTT ms':>7} {'sink':>6} {'sent':>6} {'acked':>6} {'dropped':>7} {'p50 ms':>8} {'p99 ms':>8} "
          f"{'max ms':>8} {'p50 now/before':>14} {'max now/before':>14}")
    for delay in DELAYS_MS:
        old, new = rows[delay, "before"], rows[delay, "now"]
        for name, r in (("before", old), ("now", new)):
            ratio = (f"{new['p50'] / old['p50']:13.2f}x {new['max'] / old['max']:13.2f}x" if name == "now" else "")
            print(f"{delay:>7} {name:>6} {r['sent']:6.0f} {r['delivered']:6.0f} {r['dropped']:7.0f} {r['p50']:8.1f} "
                  f"{r['p99']:8.1f} {r['max']:8.1f} {ratio}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
