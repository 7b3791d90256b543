"""``rttsched models`` on a registry whose record of a version stays while its blob is gone or changed (a real
redis-server, a models directory).

A blob deleted behind the registry's back (a Redis key evicted, a file removed): ``list`` and ``show`` mark the
version with ``?`` (``show``: state ``no-blob``), say on stderr in one line which version and where, and exit 2,
without reading any blob. A blob changed in place is found by ``--verify`` only, which reads every kept blob and
checks its sha256 (``show``: state ``bad-blob``). The table stays aligned; every other key is listed as before.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from models_cli import models_cli, registry_for_cli

from app.config import Settings
from app.registry.base import MISSING_BLOB, ModelStore
from app.registry.directory import DirectoryModelStore
from app.registry.redis_store import RedisModelStore

pytestmark = pytest.mark.integration

KEY = "gCTF:gpu"
# key -> the blobs saved, each promoted: the last is current
REGISTRY = {KEY: (b"one", b"two", b"three"), "upload:cpu": (b"u1",)}
HEAD = ("KEY", "CURRENT", "SHA256", "SAVED (UTC)", "ROWS", "RMSE MS", "MAPE", "KEPT", "ANNOUNCED")
STORES = pytest.mark.parametrize("registry", ["redis", "directory"], indirect=True)


@pytest.fixture
def registry(request: pytest.FixtureRequest, kafka_settings: Settings, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Any:
    with registry_for_cli(request, kafka_settings, tmp_path, monkeypatch) as store:
        for key, blobs in REGISTRY.items():
            for blob in blobs:
                record = store.save(key, blob, fmt="json", features=["a__mean"], params={},
                                    metrics={"rmse_ms": 10.0}, n_samples=7)
                store.promote(key, record.version)
        yield store


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Any]:
    return models_cli(capsys)


def blob_at(store: ModelStore, version: int) -> str:
    if isinstance(store, RedisModelStore):
        return f"{store.namespace}:model:{KEY}:blob:{version}"
    assert isinstance(store, DirectoryModelStore)
    return str(store.path / KEY / f"{version}.json")


def remove_blob(store: ModelStore, version: int) -> None:
    if isinstance(store, RedisModelStore):
        assert store.client.delete(blob_at(store, version)) == 1
    else:
        Path(blob_at(store, version)).unlink()


def change_blob(store: ModelStore, version: int, blob: bytes) -> None:
    if isinstance(store, RedisModelStore):
        store.client.set(blob_at(store, version), blob)
    else:
        Path(blob_at(store, version)).write_bytes(blob)


def line_of(out: str, key: str) -> str:
    return next(x for x in out.splitlines() if x.startswith(key + " "))


def assert_aligned(lines: list[str], head: tuple[str, ...], left: tuple[str, ...]) -> None:
    """Every cell of a left-aligned column of ``head`` starts where its heading does, two spaces after the cell
    before it."""
    starts = {h: lines[0].index(h) for h in head}
    for line in lines[1:]:
        for h in left:
            at = starts[h]
            assert line[at - 2:at] == "  " and line[at] != " ", (h, line, lines[0])


@STORES
async def test_list_and_show_name_a_current_version_whose_blob_is_gone(registry: ModelStore,
                                                                        cli: Callable[..., Any]) -> None:
    remove_blob(registry, 3)
    said = f"model 'gCTF:gpu' version 3: {MISSING_BLOB} ({blob_at(registry, 3)})"

    rc, out, err = await cli("list")
    assert rc == 2, (out, err)
    assert err == f"rttsched models: error: {said}\n"
    line = line_of(out, KEY)
    assert line.split(None, 1)[1].startswith("v3 ? "), line
    assert " 3 ? " in line, line
    assert line_of(out, "upload:cpu").split()[1:2] == ["v1"] and " ?" not in line_of(out, "upload:cpu")
    assert "?: a version's model blob is missing or not the one its record names" in out
    lines = out.splitlines()
    assert_aligned(lines[:3], HEAD, ("CURRENT", "SHA256", "SAVED (UTC)"))

    rc, out, err = await cli("list", "--json")
    assert rc == 2 and err == f"rttsched models: error: {said}\n"
    entries = {m["model_key"]: m for m in orjson.loads(out)}
    assert entries[KEY]["bad_blobs"] == [said] and "unreadable" not in entries[KEY]
    assert entries[KEY]["current"]["version"] == 3 and entries[KEY]["kept"] == [1, 2, 3]
    assert "bad_blobs" not in entries["upload:cpu"]

    rc, out, err = await cli("show", KEY)
    assert rc == 2, (out, err)
    assert err == f"rttsched models: error: {said}\n"
    lines = out.splitlines()
    assert lines[0].startswith(f"{KEY}: current v3 ?, never announced"), lines[0]
    versions = {x.split()[0]: x.split() for x in lines[2:]}
    assert versions["v3"][1] == "current,no-blob" and versions["v3"][2] != "-"  # its record is still shown
    assert versions["v2"][1] != "current,no-blob" and versions["v2"][2] != "-"
    assert_aligned(lines[1:], ("VERSION", "STATE", "SHA256", "SAVED (UTC)"), ("SHA256", "SAVED (UTC)"))

    rc, out, err = await cli("show", KEY, "--json")
    assert rc == 2 and orjson.loads(out)["bad_blobs"] == [said]

    rc, out, err = await cli("show", "upload:cpu")  # a healthy key shows as before
    assert (rc, err) == (0, "") and out.startswith("upload:cpu: current v1, never announced")


@STORES
async def test_a_kept_version_whose_blob_is_gone_is_marked_in_kept(registry: ModelStore,
                                                                    cli: Callable[..., Any]) -> None:
    remove_blob(registry, 1)
    said = f"model 'gCTF:gpu' version 1: {MISSING_BLOB} ({blob_at(registry, 1)})"

    rc, out, err = await cli("list")
    assert rc == 2 and err == f"rttsched models: error: {said}\n", (out, err)
    line = line_of(out, KEY)
    assert line.split()[1:3] != ["v3", "?"] and line.split()[1] == "v3", line
    assert " 3 ? " in line, line

    rc, out, err = await cli("show", KEY)
    assert rc == 2 and err == f"rttsched models: error: {said}\n"
    lines = out.splitlines()
    assert lines[0].startswith(f"{KEY}: current v3, never announced")
    versions = {x.split()[0]: x.split() for x in lines[2:]}
    assert versions["v1"][1] == "no-blob" and versions["v3"][1] == "current"


@STORES
async def test_verify_finds_a_blob_changed_in_place_which_the_plain_list_does_not_read(
        registry: ModelStore, cli: Callable[..., Any]) -> None:
    change_blob(registry, 2, b"twX")  # the same length, other bytes

    rc, plain, err = await cli("list")
    assert (rc, err) == (0, ""), (plain, err)  # the cheap look reads no blob
    assert "?" not in plain

    rc, out, err = await cli("list", "--verify")
    assert rc == 2, (out, err)
    assert err.startswith("rttsched models: error: model 'gCTF:gpu' version 2: its blob has sha256 ") and err.endswith(
        f"...: changed or truncated ({blob_at(registry, 2)})\n") and err.count("\n") == 1, err
    line = line_of(out, KEY)
    assert line.split()[1] == "v3" and " 3 ? " in line, line
    assert "?: a version's model blob is missing or not the one its record names" in out

    rc, out, err = await cli("show", KEY, "--verify")
    assert rc == 2 and err.startswith("rttsched models: error: model 'gCTF:gpu' version 2: its blob has sha256 ")
    versions = {x.split()[0]: x.split() for x in out.splitlines()[2:]}
    assert versions["v2"][1] == "bad-blob" and versions["v3"][1] == "current"

    rc, out, err = await cli("show", KEY)  # without --verify, nothing read, nothing found
    assert (rc, err) == (0, "") and "bad-blob" not in out


@STORES
async def test_verify_of_a_healthy_registry_prints_what_list_prints(registry: ModelStore,
                                                                    cli: Callable[..., Any]) -> None:
    rc, plain, err = await cli("list")
    assert (rc, err) == (0, "")
    rc, verified, err = await cli("list", "--verify")
    assert (rc, err) == (0, "") and verified == plain
    rc, out, err = await cli("show", KEY, "--verify")
    assert (rc, err) == (0, "") and "blob" not in out


@pytest.mark.parametrize("registry", ["redis"], indirect=True)
async def test_a_redis_blob_key_of_another_type_is_named(registry: RedisModelStore, cli: Callable[..., Any]) -> None:
    registry.client.delete(blob_at(registry, 3))
    registry.client.hset(blob_at(registry, 3), "x", "1")
    rc, out, err = await cli("list")
    assert rc == 2 and err == (f"rttsched models: error: model 'gCTF:gpu' version 3: its blob is a Redis hash, not a "
                               f"string ({blob_at(registry, 3)})\n"), (out, err)
    assert line_of(out, KEY).split(None, 1)[1].startswith("v3 ? ")


@pytest.mark.parametrize("registry", ["redis"], indirect=True)  # the set of model keys is the Redis store's
async def test_an_escaped_key_beside_a_missing_blob_keeps_the_table_aligned(registry: RedisModelStore,
                                                                             cli: Callable[..., Any]) -> None:
    registry.client.sadd(f"{registry.namespace}:models", "evil\x1b[2J:gpu")
    remove_blob(registry, 3)
    rc, out, err = await cli("list", "--verify")
    assert rc == 2 and "\x1b" not in out and "evil\\x1b[2J:gpu" in out
    lines = out.splitlines()[:4]  # the heading and the rows of the two keys and the escaped one
    assert lines[1].startswith("evil\\x1b[2J:gpu ")
    assert_aligned(lines, HEAD, ("CURRENT", "SHA256", "ANNOUNCED"))
