"""Faust's own recovery loop over a changelog recreated below what the worker read of it, and one wipe found by
both the worker's writes and its recovery.

``_restart_recovery`` of the installed faust-streaming runs here with a stand-in consumer: a Faust release that
moves or renames what :class:`~app.streams.changelog.RecreatedChangelogRecovery` extends fails these tests.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections import defaultdict
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from faust.exceptions import ConsistencyError
from faust.tables.recovery import Recovery, ServiceStopped
from faust.types import TP
from intake_standins import Batch
from yarl import URL

from app.config import Settings
from app.kafka.batches import BatchSender
from app.streams import changelog
from app.streams.app import create_app
from app.streams.changelog import RecreatedChangelogRecovery, found_recreated, write_rows
from app.streams.options import WorkerOptions

T = "w-node-window-changelog"


class Consumer:
    """What Faust's recovery asks of its consumer: the partitions' ends and starts, and seeks (recorded)."""

    def __init__(self, ends: dict[TP, int]) -> None:
        self.ends = ends
        self.seeks: list[dict[TP, int]] = []

    async def highwaters(self, *tps: TP) -> dict[TP, int]:
        return {tp: self.ends[tp] for tp in tps}

    async def earliest_offsets(self, *tps: TP) -> dict[TP, int]:
        return {tp: 0 for tp in tps}

    async def seek_wait(self, offsets: dict[TP, int]) -> None:
        self.seeks.append(dict(offsets))

    def resume_partitions(self, tps: Any) -> None: ...
    def pause_partitions(self, tps: Any) -> None: ...
    def resume_flow(self) -> None: ...


class Table:
    name = "node-window"
    recovery_buffer_size = 1000


class Tables(dict):  # type: ignore[type-arg]
    def __init__(self) -> None:
        super().__init__(t=object())
        self.calls: list[tuple[str, set[int]]] = []

    def on_recreated(self, table: Any, partitions: set[int]) -> bool:
        self.calls.append((table.name, set(partitions)))
        return True


def restart_recovery(cls: type[Recovery], active: dict[int, int], standby: dict[int, int],
                     ends: dict[int, int]) -> tuple[list[dict[TP, int]], list[tuple[str, set[int]]], Any]:
    """One pass of Faust's ``Recovery._restart_recovery`` with recovery class ``cls``: the seeks it made, the
    partitions handed to ``on_recreated`` and the recovery."""
    async def run() -> Any:
        consumer = Consumer({TP(T, p): e for p, e in ends.items()})

        async def maybe_start() -> None: ...

        app = SimpleNamespace(
            conf=SimpleNamespace(stream_recovery_delay=0.0, broker_request_timeout=5.0, store=URL("memory://"),
                                 recovery_consistency_check=True),
            tracer=None, _producer=None, consumer=consumer, in_recovery=False,
            flow_control=SimpleNamespace(resume=lambda: None), _fetcher=SimpleNamespace(maybe_start=maybe_start))
        tables = Tables()
        rec = cls(app, tables)  # type: ignore[arg-type]
        table = Table()
        for mine, tps, offsets in ((active, rec.active_tps, rec.active_offsets),
                                   (standby, rec.standby_tps, rec.standby_offsets)):
            for p, o in mine.items():
                tps.add(TP(T, p))
                rec.tp_to_table[TP(T, p)] = table  # type: ignore[assignment]
                offsets[TP(T, p)] = o
        rec.need_recovery = lambda: False  # type: ignore[method-assign]

        async def completed(generation_id: int = 0) -> None:
            raise ServiceStopped()  # one pass

        rec.on_recovery_completed = completed  # type: ignore[method-assign]
        rec.signal_recovery_start.set()
        await asyncio.wait_for(Recovery._restart_recovery.fun(rec), 10)  # type: ignore[attr-defined]
        return consumer.seeks, tables.calls, rec

    return asyncio.run(run())  # type: ignore[no-any-return]


def test_faust_recovery_reads_a_recreated_active_partition_from_its_start() -> None:
    seeks, calls, _ = restart_recovery(RecreatedChangelogRecovery, {1: 796, 2: 5}, {}, {1: 264, 2: 40})
    assert seeks[0] == {TP(T, 1): 0, TP(T, 2): 5}
    assert calls == [("node-window", {1})]


def test_faust_recovery_alone_raises_consistency_error_on_it() -> None:
    # what the worker did before (it exited with a traceback): the stand-ins above are enough to reach the check
    with pytest.raises(ConsistencyError):
        restart_recovery(Recovery, {1: 796}, {}, {1: 264})


def test_faust_recovery_seeks_a_recreated_standby_partition_to_its_start() -> None:
    # Faust seeks the standby partitions (to 500 here) before it asks for their ends: the hook seeks them again
    seeks, calls, rec = restart_recovery(RecreatedChangelogRecovery, {}, {4: 500, 5: 3}, {4: 12, 5: 9})
    assert [s for s in seeks if TP(T, 4) in s][-1] == {TP(T, 4): 0}
    assert [s for s in seeks if TP(T, 5) in s] == [{TP(T, 5): 3, TP(T, 4): 500}]  # only the recreated one again
    assert rec.standby_offsets[TP(T, 4)] == -1 and calls == []


def test_another_faust_release_is_named_in_a_warning() -> None:
    assert changelog.untested_faust(changelog.TESTED_FAUST) is None
    warning = changelog.untested_faust("0.15.9")
    assert warning is not None and "faust-streaming 0.15.9" in warning and "0.15.3" in warning


def test_a_recreated_partition_already_longer_than_what_was_read_is_not_found_by_offsets() -> None:
    # the documented limit (module docstring of app.streams.changelog): read up to 70, 120 records since the wipe
    assert found_recreated({TP(T, 0): 70}, {TP(T, 0): 119}) == set()


class Producer:
    """A log per partition; every batch stored at once. ``wipe()``: the broker came back empty."""

    def __init__(self) -> None:
        self.log: dict[tuple[str, int], list[Any]] = defaultdict(list)

    def create_batch(self) -> Batch:
        return Batch()

    async def send_batch(self, batch: Batch, topic: str, *, partition: int) -> asyncio.Future[Any]:
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        base = len(self.log[(topic, partition)])
        self.log[(topic, partition)] += batch.records
        fut.set_result(SimpleNamespace(offset=base))
        return fut

    def wipe(self) -> None:
        self.log.clear()


def one_wipe(tmp_path: Path, recovery_first: bool) -> tuple[float, dict[int, int]]:
    """Rows of partitions 1 and 2 written (800 each), read up to 796 by the recovery at start; the broker comes
    back empty; then a checkpoint writes one row on each and a recovery runs, in either order. The table's
    rtt_worker_changelog_rewinds_total and the recovery's offsets after."""
    async def run() -> tuple[float, dict[int, int]]:
        s = Settings.from_env({}, models_dir=str(tmp_path / "models"))
        app = create_app(s, id=f"t-{tmp_path.name}",
                         options=dataclasses.replace(WorkerOptions(), datadir=str(tmp_path / "w")))
        table = app.tables["node-window"]
        topic = table.changelog_topic.get_topic_name()
        producer = Producer()
        sender = BatchSender(producer)  # type: ignore[arg-type]
        table.intake = SimpleNamespace(sender=sender)
        recovery = app.tables.recovery
        for p in (1, 2):
            producer.log[(topic, p)] = [(b"old", b"1")] * 799
            recovery.tp_to_table[TP(topic, p)] = table
            recovery.active_offsets[TP(topic, p)] = 796

        async def write(n: int) -> None:
            await write_rows(table, [(p, f"k{n}".encode(), b"v") for p in (1, 2)], sender=sender,
                             on_rewound=table.rewrite)

        async def recover() -> None:
            ends = {TP(topic, p): len(producer.log[(topic, p)]) for p in (1, 2)}
            await recovery._build_highwaters(Consumer(ends), set(ends), recovery.active_highwaters, "active")

        await write(0)  # the sender's recorded end: 801 on each
        producer.wipe()
        if recovery_first:  # a rebalance right after the broker came back, then a checkpoint
            await recover()
            await write(1)
        else:
            await write(1)
            await recover()
        await write(2)  # and later checkpoints: nothing more found
        await recover()
        return (table.rewinds._value.get(),
                {p: recovery.active_offsets[TP(topic, p)] for p in (1, 2)})

    return asyncio.run(run())


@pytest.mark.parametrize("recovery_first", [False, True], ids=["write-first", "recovery-first"])
def test_one_wipe_counts_each_partition_once_and_writes_it_again_once(tmp_path: Path, recovery_first: bool) -> None:
    rewinds, offsets = one_wipe(tmp_path, recovery_first)
    assert rewinds == 2  # docs/worker.md: the counter counts the partitions found recreated
    assert offsets == {1: -1, 2: -1}
