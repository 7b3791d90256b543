"""An app built by :func:`app.streams.app.create_app` is freed once nothing refers to it: ``rttsched worker`` builds
a new one for each try of its start (a broker gone between its wait and Faust's producer), and its context, which
refers to the app (dead letters), is kept on the app itself, not in a process-wide map that kept every app."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

from app.config import Settings
from app.streams.app import create_app
from app.streams.context import context_of
from app.streams.options import WorkerOptions


def test_an_app_nothing_refers_to_is_freed_with_its_context(tmp_path: Path) -> None:
    settings = Settings.from_env({})
    options = WorkerOptions.from_settings(settings, datadir=str(tmp_path))
    app = create_app(settings, id="freed", options=options)
    ctx = context_of(app)
    assert ctx.settings is settings
    freed, registry = weakref.ref(app), weakref.ref(ctx.metrics.registry)
    del app, ctx
    gc.collect()
    assert freed() is None and registry() is None
