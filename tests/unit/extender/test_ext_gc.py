"""``tune_gc``: the serving process's collector settings; what is alive is frozen once the service is ready."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import orjson
import pytest
from extender_fixtures import fixture, http_client, make_service

from app.extender.server import tune_gc


@pytest.fixture
def restore_gc() -> Iterator[tuple[int, int, int]]:
    old = gc.get_threshold()
    try:
        yield old
    finally:
        gc.unfreeze()
        gc.set_threshold(*old)


async def test_threshold_raised_and_ready_service_frozen(restore_gc: tuple[int, int, int]) -> None:
    gc.unfreeze()
    service = make_service(populate=False)
    tune_gc(service, 12_345)
    assert gc.get_threshold() == (12_345, *restore_gc[1:])
    async with http_client(service) as client:
        publisher = service.publisher
        assert publisher is not None and gc.get_freeze_count() == 0  # not ready yet: nothing frozen
        service.rebuild(force=True)  # the first snapshot: ready
        assert gc.get_freeze_count() > 0
        assert not any(o is publisher for o in gc.get_objects())  # frozen objects are out of every generation
        resp = await client.post("/prioritize", data=orjson.dumps(fixture("args_nodes_gctf.json")))
        assert resp.status == 200 and {r["Score"] for r in await resp.json()} == {5}  # no node data: neutral


@pytest.mark.parametrize("gen0", [0, -5])
def test_gen0_below_one_is_rejected_naming_it(gen0: int, restore_gc: tuple[int, int, int]) -> None:
    with pytest.raises(ValueError, match="gen0"):
        tune_gc(make_service(), gen0)
    assert gc.get_threshold() == restore_gc
