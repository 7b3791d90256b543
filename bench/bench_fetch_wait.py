"""How long a message takes from a producer to a consumer's ``getmany``, by the consumer's ``fetch_max_wait_ms``.

A Kafka broker answers a fetch as soon as ``fetch_min_bytes`` (1) are there; a broker that holds every fetch
until its wait runs out (Tansu, the embedded broker) delays each message by up to that bound. The
extender's view (completions forget assumed pods, node-features, node-weights, model updates) and the
worker's intakes read with ``RTT_KAFKA_FETCH_MAX_WAIT_MS`` (default 50); aiokafka's default is 500.

Per setting: one message every 40 ms for ``--messages`` messages (keyed over 6 nodes, linger 5 ms, as the
simulator's sink), the delivery latency percentiles, and the consumer process's CPU while idle (fetches
that come back empty), against the 500 ms default as a ratio.

    python3 bench/bench_fetch_wait.py             # ~1 min
    python3 bench/bench_fetch_wait.py --quick
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
import uuid

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from app.config import Settings
from app.kafka.admin import ensure_topics
from app.kafka.embedded import EmbeddedBroker

WAITS_MS = (500, 100, 50, 10)
IDLE_S = 3.0


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


async def measure(settings: Settings, wait_ms: int, messages: int) -> dict[str, float]:
    topic = settings.topic("task-completions")
    producer = AIOKafkaProducer(bootstrap_servers=settings.bootstrap_servers, acks=1, linger_ms=5)
    consumer = AIOKafkaConsumer(bootstrap_servers=settings.bootstrap_servers, group_id=None,
                                enable_auto_commit=False, fetch_max_wait_ms=wait_ms)
    await producer.start()
    await consumer.start()
    try:
        parts = (await consumer._client.fetch_all_metadata()).partitions_for_topic(topic) or set()
        tps = [TopicPartition(topic, p) for p in sorted(parts)]
        consumer.assign(tps)
        await consumer.seek_to_end(*tps)
        latencies: list[float] = []

        async def consume() -> None:
            while True:
                batches = await consumer.getmany(timeout_ms=100)
                now = time.time()
                for records in batches.values():
                    latencies.extend(now - float(r.value or b"0") for r in records)

        task = asyncio.create_task(consume())
        await asyncio.sleep(1.0)
        cpu0 = time.process_time()
        await asyncio.sleep(IDLE_S)
        idle_cpu_ms_s = (time.process_time() - cpu0) / IDLE_S * 1000.0
        for i in range(messages):
            await producer.send(topic, str(time.time()).encode(), key=f"node-{i % 6}".encode())
            await asyncio.sleep(0.04)
        await asyncio.sleep(max(1.5, 3 * wait_ms / 1000.0))
        task.cancel()
        latencies.sort()
        n = len(latencies)
        return {"n": n, "p50": 1000 * latencies[n // 2], "p90": 1000 * latencies[int(n * 0.9)],
                "max": 1000 * latencies[-1], "idle_cpu": idle_cpu_ms_s}
    finally:
        await consumer.stop()
        await producer.stop()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="50 messages per setting instead of 200")
    ap.add_argument("--messages", type=int, default=None)
    args = ap.parse_args()
    messages = args.messages or (50 if args.quick else 200)
    broker = EmbeddedBroker().start()
    try:
        settings = Settings.from_env({}, kafka_bootstrap=broker.bootstrap, topic_prefix=f"fw{uuid.uuid4().hex[:8]}-")
        asyncio.run(ensure_topics(settings))
        rows = {}
        for i, wait in enumerate(WAITS_MS, 1):
            log(f"[{i}/{len(WAITS_MS)}] fetch_max_wait_ms {wait}: {messages} messages, {IDLE_S:.0f} s idle")
            rows[wait] = asyncio.run(measure(settings, wait, messages))
    finally:
        broker.stop()
    base = rows[WAITS_MS[0]]
    print(f"\nproducer -> consumer latency on the embedded broker (Tansu), one message per 40 ms ({messages} each)")
    print(f"{'fetch_max_wait_ms':>17} {'p50 ms':>8} {'p90 ms':>8} {'max ms':>8} {'p50 vs 500':>10} "
          f"{'idle CPU ms/s':>13} {'idle vs 500':>11}")
    for wait, r in rows.items():
        note = {500: "  (aiokafka default)", 50: "  (RTT_KAFKA_FETCH_MAX_WAIT_MS default)"}.get(wait, "")
        print(f"{wait:>17} {r['p50']:8.1f} {r['p90']:8.1f} {r['max']:8.1f} {r['p50'] / base['p50']:9.2f}x "
              f"{r['idle_cpu']:13.2f} {r['idle_cpu'] / max(base['idle_cpu'], 1e-9):10.2f}x{note}")
    print("(idle CPU: the consumer process while nothing is produced; every setting also pays it on a busy topic "
          "only when no message is waiting)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
