"""The worker's changelog counters exist at 0 for both tables from its start: one broker wipe finds every partition
recreated at once, and a series first appearing at its final value is no ``increase()`` to RttschedBrokerDataLost
or RttschedChangelogRewriteFailed."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from app.config import Settings
from app.streams.app import create_app
from app.streams.context import context_of
from app.streams.options import WorkerOptions


def test_both_tables_series_are_at_zero_before_any_wipe(tmp_path: Path) -> None:
    settings = Settings.from_env({}, models_dir=str(tmp_path / "models"))
    options = dataclasses.replace(WorkerOptions(), datadir=str(tmp_path))
    app = create_app(settings, id=f"t-{tmp_path.name}", components=[], options=options)
    registry = context_of(app).metrics.registry
    for name in ("rtt_worker_changelog_rewinds_total", "rtt_worker_changelog_rewrite_failures_total"):
        for table in ("node-window", "feedback"):
            assert registry.get_sample_value(name, {"table": table}) == 0.0, (name, table)
