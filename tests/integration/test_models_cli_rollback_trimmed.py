"""``rttsched models rollback`` after older versions were trimmed (``RTT_MODEL_KEEP=2``), on a real redis-server
and on a models directory, with the embedded broker for model-updates: the reviewer's sequence. v1 (A), v2 (B);
``rollback`` gives v3 (= v1), ``rollback --to 2`` gives v4 (= v2), which trims v1 and v2; a further ``rollback``
goes back to A, kept as v3 ("the model of v1"), instead of saying there is no version older than 2, and from A
it goes no further: never back to B, the model rolled back from.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from models_cli import models_cli, registry_for_cli

from app.config import Settings
from app.registry.base import ModelStore, sha256_hex
from app.trainer.announcements import read_announced

pytestmark = pytest.mark.integration

KEY = "rb:cpu"


@pytest.fixture(params=["redis", "directory"])
def registry(request: pytest.FixtureRequest, kafka_settings: Settings, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Iterator[ModelStore]:
    """The test's registry (keeping 2 versions) holding v1 (A) and v2 (B), and the environment that points
    ``rttsched`` at it and at the test's topics."""
    monkeypatch.setenv("RTT_MODEL_KEEP", "2")
    with registry_for_cli(request, kafka_settings, tmp_path, monkeypatch) as store:
        for i, blob in enumerate([b"model-A", b"model-B"], 1):
            store.save(KEY, blob, fmt="json", features=["x"], params={}, metrics={}, n_samples=100, replacing=i - 1)
        yield store


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Any]:
    """``rttsched models ARGS`` in this process (in a thread: it runs its own event loop): exit status, stdout,
    stderr."""
    return models_cli(capsys)


async def test_a_second_rollback_goes_further_back_after_versions_were_trimmed(
        registry: ModelStore, cli: Callable[..., Any]) -> None:
    rc, out, err = await cli("rollback", KEY, "--yes")
    assert rc == 0, err
    assert f"{KEY}: v2 -> v3 (the model of v1" in out
    rc, out, err = await cli("rollback", KEY, "--to", "2", "--yes")
    assert rc == 0, err
    assert f"{KEY}: v3 -> v4 (the model of v2" in out
    assert [(r.version, r.restores) for r in registry.versions(KEY)] == [(3, 1), (4, 2)]  # v1, v2 trimmed

    rc, out, err = await cli("show", KEY)
    assert rc == 0 and "the model of v1" in out

    # the model served before B's is A, kept as v3: gone back to, saved again as v5
    rc, out, err = await cli("rollback", KEY, "--yes")
    assert (rc, err) == (0, ""), out
    assert f"{KEY}: current v4" in out and "back to v3 (the model of v1, sha256" in out  # the plan it showed
    assert f"{KEY}: v4 -> v5 (the model of v1, sha256 {sha256_hex(b'model-A')[:12]})" in out
    blob, record = registry.load(KEY)
    assert (blob, record.version, record.restores) == (b"model-A", 5, 1)
    announced = (await read_announced(Settings.from_env()))[KEY]
    assert (announced.version, announced.sha256) == (5, sha256_hex(b"model-A"))

    # from A there is nothing further back: not back to B (v4), the model rolled back from
    rc, out, err = await cli("rollback", KEY, "--yes")
    assert rc == 2 and err == f"rttsched models: error: model {KEY!r} has no version older than 1\n", (out, err)
    assert registry.current(KEY).version == 5  # type: ignore[union-attr]
