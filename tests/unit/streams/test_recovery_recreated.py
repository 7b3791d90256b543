"""A changelog partition recreated below the offset the worker's recovery had read it up to.

Faust's recovery raised ConsistencyError on it (the worker exited with a traceback) when the worker had
restored rows from its changelogs and a memory-only broker came back empty. The worker's recovery reads such
a partition again from its start, and the state it owns of it is marked to be written again.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
from faust.types import TP

from app.config import Settings
from app.streams.app import create_app
from app.streams.changelog import ChangelogTableManager, RecreatedChangelogRecovery
from app.streams.options import WorkerOptions


class Consumer:
    def __init__(self, ends: dict[TP, int]) -> None:
        self.ends = ends

    async def highwaters(self, *tps: TP) -> dict[TP, int]:
        return {tp: self.ends[tp] for tp in tps}

    async def seek_wait(self, offsets: dict[TP, int]) -> None: ...


def recovered(tmp_path: Path, offsets: dict[int, int | None], ends: dict[int, int],
              standby: bool = False) -> tuple[dict[int, Any], list[tuple[str, set[int]]], dict[int, int], str]:
    """Run the recovery's highwater step on the node-window changelog: the offsets after, the tables
    handed to ``on_recreated``, the highwaters and the changelog's name."""
    async def run() -> Any:
        s = Settings.from_env({}, models_dir=str(tmp_path / "models"))
        app = create_app(s, id=f"t-{tmp_path.name}",
                         options=dataclasses.replace(WorkerOptions(), datadir=str(tmp_path / "w")))
        manager = app.tables
        assert isinstance(manager, ChangelogTableManager)
        recovery = manager.recovery
        assert isinstance(recovery, RecreatedChangelogRecovery)
        table = manager["node-window"]
        topic = table.changelog_topic.get_topic_name()
        calls: list[tuple[str, set[int]]] = []
        written_again = manager.on_recreated
        assert written_again is not None

        def on_recreated(t: Any, partitions: set[int]) -> bool:
            calls.append((t.name, set(partitions)))
            return written_again(t, partitions)

        manager.on_recreated = on_recreated
        mine = recovery.standby_offsets if standby else recovery.active_offsets
        highwaters = recovery.standby_highwaters if standby else recovery.active_highwaters
        for p, offset in offsets.items():
            recovery.tp_to_table[TP(topic, p)] = table
            mine[TP(topic, p)] = offset  # type: ignore[assignment]
        await recovery._build_highwaters(Consumer({TP(topic, p): e for p, e in ends.items()}),
                                         {TP(topic, p) for p in ends}, highwaters,
                                         "standby" if standby else "active")
        return ({tp.partition: v for tp, v in mine.items()}, calls,
                {tp.partition: v for tp, v in highwaters.items()}, table)

    after, calls, highwaters, table = asyncio.run(run())
    return after, calls, highwaters, table.rewinds._value.get()


def test_a_partition_ending_below_what_was_read_is_read_again_from_its_start(tmp_path: Path) -> None:
    # partition 1: read up to 796, recreated with 264 records (last offset 263); 2: emptied; 3: grew on
    after, calls, highwaters, rewinds = recovered(tmp_path, {1: 796, 2: 10, 3: 40}, {1: 264, 2: 0, 3: 60})
    assert highwaters == {1: 263, 2: -1, 3: 59}
    assert after == {1: -1, 2: -1, 3: 40}  # what Faust's check compares: nothing read above the last offset
    assert calls == [("node-window", {1, 2})]
    assert rewinds == 2  # the table's rewrite ran: rtt_worker_changelog_rewinds_total{table="node-window"}


def test_partitions_read_within_their_end_are_left_as_they_are(tmp_path: Path) -> None:
    after, calls, _, rewinds = recovered(tmp_path, {0: -1, 1: 263, 2: None}, {0: 0, 1: 264, 2: 5})
    assert after == {0: -1, 1: 263, 2: None}
    assert (calls, rewinds) == ([], 0)


def test_a_recreated_standby_partition_is_read_again_and_nothing_is_written(tmp_path: Path) -> None:
    after, calls, _, rewinds = recovered(tmp_path, {4: 500}, {4: 12}, standby=True)
    assert after == {4: -1}
    assert (calls, rewinds) == ([], 0)


def recovery_line(tmp_path: Path, caplog: pytest.LogCaptureFixture, on_recreated: Any,
                  table_name: str = "node-window") -> tuple[logging.LogRecord, float]:
    """The line logged for partition 1 of ``table_name``'s changelog recreated (read up to 796, 264 records now)
    with ``on_recreated`` as the manager's, and rtt_worker_changelog_rewrite_failures_total{table} after."""
    async def run() -> float:
        s = Settings.from_env({}, models_dir=str(tmp_path / "models"))
        app = create_app(s, id=f"t-{tmp_path.name}",
                         options=dataclasses.replace(WorkerOptions(), datadir=str(tmp_path / "w")))
        manager = app.tables
        assert isinstance(manager, ChangelogTableManager)
        if on_recreated != "default":
            manager.on_recreated = on_recreated
        recovery = manager.recovery
        table = manager[table_name]
        tp = TP(table.changelog_topic.get_topic_name(), 1)
        recovery.tp_to_table[tp] = table
        recovery.active_offsets[tp] = 796
        with caplog.at_level(logging.WARNING, logger="app.streams.changelog"):
            await recovery._build_highwaters(Consumer({tp: 264}), {tp}, recovery.active_highwaters, "active")
        return float(manager.rewrite_failures.labels(table_name)._value.get())

    caplog.clear()
    failures = asyncio.run(run())
    [record] = [r for r in caplog.records if "restart below what this worker read" in r.getMessage()]
    return record, failures


def test_the_line_says_the_state_is_marked_to_be_written_again_when_it_is(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    record, failures = recovery_line(tmp_path, caplog, "default")
    assert record.levelno == logging.WARNING and failures == 0
    assert record.getMessage().endswith("read again from their start; the state held of them is marked to be "
                                        "written again")


def test_the_line_says_nothing_is_written_again_when_nothing_handles_the_table(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    record, _ = recovery_line(tmp_path, caplog, lambda table, partitions: False)
    assert "nothing kept of them is written again (table node-window keeps none)" in record.getMessage()
    record, _ = recovery_line(tmp_path, caplog, None)
    assert "the state held of them is" not in record.getMessage()


def test_a_failure_to_mark_them_is_one_error_line_and_counted(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    def boom(table: Any, partitions: set[int]) -> bool:
        raise RuntimeError("boom")

    record, failures = recovery_line(tmp_path, caplog, boom)
    assert record.levelno == logging.ERROR
    assert "marking the state held of them to be written again failed: RuntimeError('boom')" in record.getMessage()
    assert failures == 1  # rtt_worker_changelog_rewrite_failures_total{table="node-window"}: one partition
