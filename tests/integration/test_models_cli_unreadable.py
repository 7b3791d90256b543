"""``rttsched models`` on a registry holding a record it cannot read (a real redis-server, a models directory).

Metadata that is not JSON or lacks its fields, a current pointer that is not a number, a versions key of the wrong
type: ``list`` and ``show`` still print every other key and version, mark the unreadable one with ``?``, say on
stderr in one line which record it is and what is wrong, and exit 2; ``rollback`` refuses in one line (exit status
2) where it needs that record and goes ahead where it does not. Nothing in the registry is changed.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from models_cli import models_cli, registry_for_cli

from app.config import Settings
from app.registry.base import ModelStore
from app.registry.directory import DirectoryModelStore
from app.registry.redis_store import RedisModelStore

pytestmark = pytest.mark.integration

KEY = "gCTF:gpu"
# key -> the blobs saved, each promoted: the last is current
REGISTRY = {KEY: (b"one", b"two", b"three"), "app00001:gpu": (b"a1",), "app00002:gpu": (b"b1", b"b2"),
            "upload:cpu": (b"u1",)}
HEALTHY_ROWS = {"app00001:gpu": ["v1", "1"], "app00002:gpu": ["v2", "2"], "upload:cpu": ["v1", "1"], KEY: ["v3", "3"]}


def fill(store: ModelStore) -> None:
    for key, blobs in REGISTRY.items():
        for blob in blobs:
            record = store.save(key, blob, fmt="json", features=["a__mean"], params={}, metrics={"rmse_ms": 10.0},
                                n_samples=7)
            store.promote(key, record.version)


@pytest.fixture(params=["redis", "directory"])
def registry(request: pytest.FixtureRequest, kafka_settings: Settings, tmp_path: Path,
             monkeypatch: pytest.MonkeyPatch) -> Any:
    """The test's registry, filled (:data:`REGISTRY`), and the environment that points ``rttsched`` at it."""
    with registry_for_cli(request, kafka_settings, tmp_path, monkeypatch) as store:
        fill(store)
        yield store


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[..., Any]:
    """``rttsched models ARGS`` in this process (in a thread: it runs its own event loop): exit status, stdout,
    stderr."""
    return models_cli(capsys)


def corrupt(store: ModelStore, case: str) -> tuple[str, str]:
    """Break one record of ``store`` behind its back as ``case`` says; the key broken and the line that must say so
    (on stderr, after ``rttsched models: error: ``)."""
    if isinstance(store, RedisModelStore):
        def k(key: str, part: str) -> str:
            return f"{store.namespace}:model:{key}:{part}"
        r = store.client
        if case == "not json":
            r.set(k(KEY, "meta:2"), "not json{")
            return KEY, (f"model 'gCTF:gpu' version 2: metadata is not JSON (Expecting value: line 1 column 1 "
                         f"(char 0)) ({k(KEY, 'meta:2')})")
        if case == "no fields":
            r.set(k(KEY, "meta:2"), '{"model_key":"gCTF:gpu"}')
            return KEY, (f"model 'gCTF:gpu' version 2: metadata lacks 'version', 'sha256', 'format', 'features', "
                         f"'created_ts', 'location' ({k(KEY, 'meta:2')})")
        if case == "current not json":
            r.set(k(KEY, "meta:3"), "not json{")
            return KEY, (f"model 'gCTF:gpu' version 3: metadata is not JSON (Expecting value: line 1 column 1 "
                         f"(char 0)) ({k(KEY, 'meta:3')})")
        if case == "current not a number":
            r.set(k("app00002:gpu", "current"), "notanumber")
            return "app00002:gpu", (f"model 'app00002:gpu': its current version 'notanumber' is not a version "
                                    f"number ({k('app00002:gpu', 'current')})")
        if case == "kept meta a hash":  # MGET answers nil for it, as for a version trimmed meanwhile
            r.delete(k(KEY, "meta:2"))
            r.hset(k(KEY, "meta:2"), "version", "2")
            return KEY, f"model 'gCTF:gpu' version 2: its metadata is a Redis hash, not a string ({k(KEY, 'meta:2')})"
        assert case == "versions a string"
        r.set(k("app00001:gpu", "versions"), "foo")
        return "app00001:gpu", (f"model 'app00001:gpu': its set of kept versions is a Redis string, not a sorted "
                                f"set ({k('app00001:gpu', 'versions')})")
    assert isinstance(store, DirectoryModelStore)
    version, text = {"not json": (2, b"{bad\n"), "no fields": (2, b'{"model_key":"gCTF:gpu"}\n'),
                     "current not json": (3, b"{bad\n")}[case]
    path = store.path / KEY / f"{version}.meta.json"
    path.write_bytes(text)
    problem = ("metadata is not JSON (Expecting property name enclosed in double quotes: line 1 column 2 (char 1))"
               if text.startswith(b"{bad") else
               "metadata lacks 'version', 'sha256', 'format', 'features', 'created_ts', 'location'")
    return KEY, f"model 'gCTF:gpu' version {version}: {problem} ({path})"


CASES = ["not json", "no fields", "current not json", "current not a number", "versions a string", "kept meta a hash"]
KEPT_UNREADABLE = ("not json", "no fields", "kept meta a hash")  # version 2, kept, not the current one
# Redis keys: a directory has no such record
REDIS_ONLY = ("current not a number", "versions a string", "kept meta a hash")
# (store, case): every case on Redis, those a directory can have on it too (a store parametrized indirectly)
STORE_CASES = pytest.mark.parametrize(("registry", "case"), [(s, c) for s in ("redis", "directory") for c in CASES
                                                             if s == "redis" or c not in REDIS_ONLY],
                                      indirect=["registry"])


def rows(out: str) -> dict[str, list[str]]:
    """The table's rows by key: CURRENT and KEPT (the cells after the key, and the two before ANNOUNCED)."""
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["KEY", "CURRENT"], out
    by_key = {}
    for line in lines[1:]:
        cells = line.split()
        if cells and cells[0] in REGISTRY:
            by_key[cells[0]] = cells
    return by_key


@STORE_CASES
async def test_list_and_show_print_what_they_can_read_and_name_what_they_cannot(
        registry: ModelStore, cli: Callable[..., Any], case: str) -> None:
    key, said = corrupt(registry, case)

    rc, out, err = await cli("list")
    assert rc == 2, (out, err)
    assert err == f"rttsched models: error: {said}\n"
    listed = rows(out)
    assert sorted(listed) == sorted(REGISTRY)  # every key still listed
    for other in set(REGISTRY) - {key}:
        assert listed[other][1] == HEALTHY_ROWS[other][0] and HEALTHY_ROWS[other][1] in listed[other], listed[other]
    expect = {"not json": ("v3", "3 ?"), "no fields": ("v3", "3 ?"), "kept meta a hash": ("v3", "3 ?"),
              "current not json": ("v3 ?", "3 ?"),
              "current not a number": ("?", "2"), "versions a string": ("v1", "?")}[case]
    line = next(x for x in out.splitlines() if x.startswith(key))
    assert line.split(None, 1)[1].startswith(expect[0]), line
    assert f" {expect[1]} " in line, line
    assert "?: a record of the registry cannot be read" in out

    rc, out, err = await cli("list", "--json")
    assert rc == 2 and err == f"rttsched models: error: {said}\n"
    entries = {m["model_key"]: m for m in orjson.loads(out)}
    assert sorted(entries) == sorted(REGISTRY)
    assert entries[key]["unreadable"] == [said]
    assert entries[key]["kept"] == {"current not a number": [1, 2], "versions a string": None}.get(case, [1, 2, 3])
    assert all("unreadable" not in entries[k] for k in set(REGISTRY) - {key})

    rc, out, err = await cli("show", key)
    assert rc == 2, (out, err)
    assert err == f"rttsched models: error: {said}\n"
    lines = out.splitlines()
    versions = {x.split()[0]: x.split() for x in lines[2:]}
    if case in KEPT_UNREADABLE:
        assert lines[0].startswith(f"{key}: current v3, never announced")
        assert versions["v2"][1:] == ["unreadable", *["-"] * 8]
        assert versions["v1"][2] != "-" and versions["v3"][1] == "current"
    elif case == "current not json":
        assert lines[0].startswith(f"{key}: current v3 ?, never announced")
        assert versions["v3"][1] == "current,unreadable" and sorted(versions) == ["v1", "v2", "v3"]
    elif case == "current not a number":
        assert lines[0].startswith(f"{key}: current ?, never announced") and sorted(versions) == ["v1", "v2"]
    else:
        assert lines[0].startswith(f"{key}: current v1, never announced") and versions == {}

    # a healthy key shows as before
    rc, out, err = await cli("show", "upload:cpu")
    assert (rc, err) == (0, "") and out.startswith("upload:cpu: current v1, never announced")


@STORE_CASES
async def test_a_rollback_refuses_in_one_line_where_it_needs_an_unreadable_record(
        registry: ModelStore, cli: Callable[..., Any], case: str) -> None:
    key, said = corrupt(registry, case)
    unsure = f"{said}: cannot tell whether a rollback goes back to it; name the version to go back to (--to)"
    expect = unsure if case in KEPT_UNREADABLE else said

    rc, out, err = await cli("rollback", key, "--yes")
    assert rc == 2, (out, err)
    assert err == f"rttsched models: error: {expect}\n"
    if case in KEPT_UNREADABLE:
        rc, out, err = await cli("rollback", KEY, "--to", "2", "--yes")
        assert rc == 2 and err.startswith("rttsched models: error: model 'gCTF:gpu' version 2: "), err
        assert err == f"rttsched models: error: {said}\n" or case == "kept meta a hash"
        # the record it needs not: v1's model saved again as v4, made current
        rc, out, err = await cli("rollback", KEY, "--to", "1", "--yes")
        assert rc == 0, (out, err)
        assert f"{KEY}: v3 -> v4 (the model of v1" in out
        assert registry.load(KEY)[0] == b"one"
    else:
        assert registry.keys() == sorted(REGISTRY)  # nothing changed
        rc, out, err = await cli("show", "upload:cpu")
        assert rc == 0 and "current v1" in out


@pytest.mark.parametrize("registry", ["redis"], indirect=True)  # the set of model keys is the Redis store's
async def test_a_key_with_control_characters_is_listed_escaped(registry: Any, cli: Callable[..., Any]) -> None:
    """A key added to the set of model keys by hand, holding ESC: listed with the escape written out, not sent raw
    to the terminal (it could clear the screen or recolour what follows)."""
    registry.client.sadd(f"{registry.namespace}:models", "evil\x1b[2J:gpu")
    _, out, _ = await cli("list")
    assert "\x1b" not in out
    assert "evil\\x1b[2J:gpu" in out
