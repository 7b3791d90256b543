"""``tune_gc``: the serving process's collector settings, applied once the service has started."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer
from extkit import fixture, make_service

from app.extender.server import build_app, tune_gc


@pytest.fixture
def restore_gc() -> Iterator[tuple[int, int, int]]:
    old = gc.get_threshold()
    try:
        yield old
    finally:
        gc.unfreeze()
        gc.set_threshold(*old)


async def test_threshold_raised_and_started_service_frozen(restore_gc: tuple[int, int, int]) -> None:
    service = make_service()
    app = build_app(service)
    tune_gc(app, 12_345)
    assert gc.get_threshold() == (12_345, *restore_gc[1:])
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        publisher = service.publisher  # created by service.start(): the freeze must come after it
        assert publisher is not None and gc.get_freeze_count() > 0
        assert not any(o is publisher for o in gc.get_objects())  # frozen objects are out of every generation
        resp = await client.post("/prioritize", data=orjson.dumps(fixture("args_nodes_gctf.json")),
                                 headers={"Content-Type": "application/json"})
        assert resp.status == 200 and (await resp.json())[0] == {"Host": "gpu-4090-1", "Score": 10}


@pytest.mark.parametrize("gen0", [0, -5])
def test_gen0_below_one_is_rejected_naming_it(gen0: int, restore_gc: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="gen0"):
        tune_gc(build_app(make_service()), gen0)
    assert gc.get_threshold() == restore_gc
